"""Run the CLI under a pseudo-terminal, as a person at a terminal would (tests only)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from collections.abc import Mapping
from pathlib import Path


def cli_on_pty(
    *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """Exit status and everything written to the terminal (stdout and stderr both)."""
    master, slave = pty.openpty()
    # A wide terminal, so that rich does not wrap or cut what the tests look for.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 400, 0, 0))
    full = {**os.environ, "COLUMNS": "400", "TERM": "xterm", "NO_COLOR": "1", **(env or {})}
    full.pop("TRAINGUARD_NO_PROGRESS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli", *args],
        stdout=slave,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env=full,
    )
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    code = proc.wait(timeout=30)
    os.close(master)
    return code, out.decode("utf-8", "replace")
