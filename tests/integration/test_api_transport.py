"""``trainguard serve``'s files and transport (issue 14), as a real process: HTTPS with
uvicorn's own TLS on loopback, a private state directory and database (0700/0600,
``-wal``/``-shm`` included), a warning for a token file others may read, a loud one
for plain HTTP off loopback, and a refused ``--database`` in a missing directory."""

from __future__ import annotations

import dataclasses
import re
import shutil
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from _api_procs import OP, Proc, cli_env, wait_for, write_tokens

from trainguard.api.server import ServeOptions, is_loopback, serve


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made with the openssl command."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@pytest.mark.slow
def test_serve_over_https_with_a_private_default_state_directory(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    tokens = write_tokens(tmp_path)
    tokens.chmod(0o644)  # readable by others: warned about, still used
    proc = Proc(
        [
            *(sys.executable, "-m", "trainguard.cli", "serve", "--port", "0", "--no-controller"),
            *("--tls-cert", str(cert), "--tls-key", str(key), "--token-file", str(tokens)),
        ],
        tmp_path / "serve.log",
        cwd=tmp_path,  # the default database: .trainguard/state.db in the working directory
    )
    try:
        port = int(
            wait_for(
                lambda: (
                    (m := re.search(r"listening on https://127\.0\.0\.1:(\d+)", proc.output()))
                    and m.group(1)
                ),
                30,
                "the https listening line",
            )
        )
        trust = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=trust) as client:
            assert client.get("/healthz").json()["ok"] is True
            r = client.get("/v1/status", headers={"Authorization": f"Bearer {OP}"})
            assert r.status_code == 200
            assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
            r = client.get("/v1/status")
            assert r.status_code == 401  # the token checks hold over TLS too
        with pytest.raises(httpx.HTTPError):  # no plain HTTP on the TLS port
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        output = proc.output()
        assert f"token file {tokens} is readable by other users (mode 0644)" in output
        assert "WARNING: serving plain HTTP" not in output
        state = tmp_path / ".trainguard"
        assert _mode(state) == 0o700
        assert _mode(state / "state.db") == 0o600
        for extra in ("state.db-wal", "state.db-shm"):
            if (state / extra).exists():
                assert _mode(state / extra) == 0o600, extra
    finally:
        proc.stop()


def test_serve_refuses_a_database_in_a_missing_directory_and_creates_nothing(
    tmp_path: Path,
) -> None:
    target = tmp_path / "no" / "such" / "dir" / "state.db"
    out = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "serve", "--port", "0", "--database", str(target)],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert f"the directory {target.parent} does not exist" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "no").exists()


def test_tls_options_must_come_together_and_exist(tmp_path: Path) -> None:
    said: list[str] = []
    (tmp_path / "db").mkdir()
    base = ServeOptions(database=str(tmp_path / "db" / "state.db"), port=0)
    for bad, message in (
        (dict(tls_cert=str(tmp_path / "cert.pem")), "go together"),
        (dict(tls_cert=str(tmp_path / "c"), tls_key=str(tmp_path / "k")), "no such file"),
    ):
        with pytest.raises(ValueError, match=message):
            serve(ServeOptions(**{**base.__dict__, **bad}), say=said.append)
    assert not (tmp_path / "db" / "state.db").exists()  # refused before anything was made


def test_plain_http_off_loopback_is_refused_or_warned_about_loudly(tmp_path: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    assert not is_loopback("gpu-head.example")
    (tmp_path / "db").mkdir()
    said: list[str] = []
    # 192.0.2.1 (TEST-NET-1) is on no interface here: the bind fails after the warning,
    # so the test never listens off loopback.
    options = ServeOptions(
        host="192.0.2.1", port=0, database=str(tmp_path / "db" / "state.db"), controller=False
    )
    with pytest.raises(ValueError, match="--insecure-bind"):  # ServeError: nothing made
        serve(options, say=said.append)
    assert not said and not (tmp_path / "db" / "state.db").exists()
    with pytest.raises(OSError):
        serve(dataclasses.replace(options, insecure_bind=True), say=said.append)
    [warning, notice] = [m for m in said if m.startswith(("WARNING", "NOTE"))]
    assert "plain HTTP on 192.0.2.1" in warning and "--tls-cert" in warning
    assert "/metrics needs no token" in notice and "GPU UUIDs" in notice
