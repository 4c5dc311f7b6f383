"""``trainguard classify`` and ``trainguard diagnose`` as whole commands, on real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
CMD = [sys.executable, "-m", "trainguard.cli"]


CACHE = tempfile.mkdtemp(prefix="trainguard-test-cache-")


def _run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    # The compiled Hyperscan database is cached: keep the tests' copy out of $HOME.
    env = {**os.environ, "XDG_CACHE_HOME": CACHE}
    return subprocess.run([*CMD, *args], input=stdin, capture_output=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def mixed_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """Noise with every corpus line inserted, plus a traceback and a partial last line."""
    entries = yaml.safe_load((CORPUS / "signatures.yaml").read_text())
    noise = [
        ln
        for ln in (CORPUS / "noise.txt").read_text(encoding="utf-8").splitlines()
        if ln and not ln.startswith("# ")
    ]
    lines: list[str] = []
    expected: list[dict] = []
    for i, e in enumerate(entries):
        lines.append(noise[i % len(noise)])
        lines.append(e["text"])
        expected.append({"line": len(lines), "kind": e["kind"]})
    lines += ["Traceback (most recent call last):", '  File "t.py", line 1', "KeyError: 'x'"]
    expected.append({"line": len(lines), "kind": "app_error"})
    path = tmp_path_factory.mktemp("logs") / "mixed.log"
    # The last line has no newline: it must still be classified.
    path.write_text("\n".join(lines), encoding="utf-8")
    return path, expected


@pytest.mark.parametrize("engine", ["hyperscan", "portable"])
def test_classify_json_lines(engine: str, mixed_log: tuple[Path, list[dict]]) -> None:
    path, expected = mixed_log
    proc = _run("classify", "--json", "--engine", engine, str(path))
    assert proc.returncode == 0, proc.stderr.decode()
    records = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [{"line": r["line"], "kind": r["kind"]} for r in records] == expected
    for r in records:
        assert r["file"] == str(path)
        assert r["severity"] in ("fatal", "error", "warning")
        assert {"domain", "action", "xid", "pci_bus_id", "rank", "host", "job_id"} <= r.keys()
    xid79 = next(r for r in records if r["xid"] == 79)
    assert xid79["pci_bus_id"] == "0000:c1:00.0" and xid79["domain"] == "hardware"


def test_engines_agree_and_stdin_works(mixed_log: tuple[Path, list[dict]]) -> None:
    path, _ = mixed_log
    hs = _run("classify", "--json", "--engine", "hyperscan", str(path)).stdout
    pt = _run("classify", "--json", "--engine", "portable", str(path)).stdout
    assert hs == pt
    piped = _run("classify", "--json", "-", stdin=path.read_bytes())
    got = [json.loads(x) for x in piped.stdout.decode().splitlines()]
    want = [json.loads(x) for x in hs.decode().splitlines()]
    assert [(r["line"], r["kind"]) for r in got] == [(r["line"], r["kind"]) for r in want]
    assert {r["file"] for r in got} == {"-"}


def test_exit_codes_and_plain_output(tmp_path: Path) -> None:
    quiet = tmp_path / "quiet.log"
    quiet.write_text("step=1 loss=2.0\nstep=2 loss=1.9\n")
    assert _run("classify", str(quiet)).returncode == 1
    missing = _run("classify", str(tmp_path / "nope.log"), str(quiet))
    assert missing.returncode == 2 and b"nope.log" in missing.stderr
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 1000 + b"\nSegmentation fault (core dumped)\n")
    plain = _run("classify", str(garbage))
    assert plain.returncode == 0
    assert plain.stdout.decode().split("\t")[1] == "segfault"


def test_diagnose_names_the_rank_that_never_arrived() -> None:
    d = CORPUS / "scenarios" / "nccl_rank5_behind"
    proc = _run(
        "diagnose", "--json", "--year", "2025", "--rank-map", str(d / "rank_map.yaml"),
        str(d / "job.out"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    [incident] = json.loads(proc.stdout)
    assert incident["kind"] == "collective_timeout"
    assert incident["culprit"] == {
        "device_uuid": None,
        "pci_bus_id": "0000:2a:00.0",
        "rank": 5,
        "host": "node2",
    }
    assert any("last completed NCCL work: 806" in e for e in incident["evidence"])


def test_diagnose_across_kernel_log_and_job_output() -> None:
    d = CORPUS / "scenarios" / "xid79_node7"
    proc = _run(
        "diagnose", "--year", "2025", "--rank-map", str(d / "rank_map.json"),
        str(d / "kernel.log"), str(d / "job.out"),
    )  # fmt: skip
    out = proc.stdout.decode()
    assert proc.returncode == 0 and out.count("incident ") == 1
    assert "incident 1: xid (hardware)" in out
    assert "rank 3, host node7, device 0000:c1:00.0" in out
    assert "action:  reboot_node" in out
    bad_map = _run("diagnose", "--rank-map", str(d / "kernel.log"), str(d / "job.out"))
    assert bad_map.returncode == 2


def test_hyperscan_database_cache_is_written_and_reused(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("NVRM: Xid (PCI:0000:c1:00): 79, GPU has fallen off the bus.\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    cmd = [*CMD, "classify", "--engine", "hyperscan", str(log)]
    first = subprocess.run(cmd, capture_output=True, env=env, timeout=60)
    [db] = list((tmp_path / "cache" / "trainguard").glob("hyperscan-*.db"))
    db.write_bytes(b"corrupt")  # a bad cache entry must not break classification
    second = subprocess.run(cmd, capture_output=True, env=env, timeout=60)
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout and b"xid" in first.stdout
