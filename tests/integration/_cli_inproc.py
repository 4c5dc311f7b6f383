"""Run ``trainguard.cli.main`` in the test process, the way ``python -m trainguard.cli``
would run it, and hand back a ``subprocess.CompletedProcess`` with its exit status,
stdout and stderr.

For tests about a command's message and exit status, not about the process boundary:
a fresh interpreter costs a start-up and, for the commands that import it, torch (seconds
each on a loaded 2-core machine). What one call changes in the process is put back
afterwards: the environment, the working directory, signal handlers, the root logger's
handlers and level (``serve``, ``agent`` and ``slurm watch`` call ``logging.basicConfig``
with the captured stream). stdin reads as empty, as with ``stdin=subprocess.DEVNULL``;
stdout and stderr are not terminals, as with a pipe.

The files that use it keep at least one real-process test per command, so that the entry
point itself stays covered.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from trainguard.cli import main

_SIGNALS = tuple(
    s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None
)


@contextlib.contextmanager
def _restored_process_state(
    env: Mapping[str, str | None], cwd: Path | str | None
) -> Iterator[None]:
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_signals = {s: signal.getsignal(s) for s in _SIGNALS}
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    saved_stdin = sys.stdin
    try:
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin = io.StringIO("")
        yield
    finally:
        sys.stdin = saved_stdin
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for s, handler in saved_signals.items():
            if handler is not None:
                signal.signal(s, handler)
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def run_main(
    argv: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str | None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``trainguard ARGV`` in this process. ``env`` entries are set (``None``: removed) for
    the call only; ``TRAINGUARD_DEBUG`` and ``TRAINGUARD_SERVER`` are removed unless given."""
    full_env: dict[str, str | None] = {"TRAINGUARD_DEBUG": None, "TRAINGUARD_SERVER": None}
    full_env.update(env or {})
    # Text streams over bytes, as a pipe would be: some commands write to ``.buffer``.
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    with (
        _restored_process_state(full_env, cwd),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code: object = main(list(argv))
        except SystemExit as exc:  # argparse's usage errors, a command's own sys.exit
            code = exc.code
            if isinstance(code, str):
                print(code, file=sys.stderr)
                code = 1
    returncode = 0 if code is None else int(code)  # type: ignore[call-overload]
    return subprocess.CompletedProcess(["trainguard", *argv], returncode, _text(out), _text(err))


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    raw = stream.buffer
    assert isinstance(raw, io.BytesIO)
    return raw.getvalue().decode("utf-8", errors="replace")
