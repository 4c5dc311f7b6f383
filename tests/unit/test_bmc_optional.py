"""trainguard imports and its CLI builds without the optional sushy library; using a BMC
without it is one clear error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CODE = r"""
import sys
sys.modules["sushy"] = None  # as if not installed: every import of it fails
import trainguard, trainguard.cli
import trainguard.schedulers.redfish as r
import trainguard.controller.node_recovery
trainguard.cli.build_parser()
ep = r.BmcEndpoint(node="n1", address="http://127.0.0.1:9", credentials=r.Path(sys.argv[1]))
try:
    r.RedfishBmc(ep).read()
except r.BmcError as exc:
    print("ERR", exc)
"""


def test_without_sushy(tmp_path: Path) -> None:
    cred = tmp_path / "c"
    cred.write_text("u\np\n")
    os.chmod(cred, 0o600)
    src = Path(__file__).resolve().parents[2] / "src"
    proc = subprocess.run(
        [sys.executable, "-c", CODE, str(cred), str(tmp_path / "l")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(src)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ERR talking to a BMC needs the sushy library: pip install 'trainguard[bmc]'" in (
        proc.stdout
    )
