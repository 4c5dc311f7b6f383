"""Dry run: one training step of the user's own job, on all its ranks, before the real run.

``trainguard preflight --dry-run -- torchrun ... train.py`` starts the command with
``TRAINGUARD_DRY_RUN=1``; :func:`trainguard.train.report_progress` stops the job
cleanly after its first reported step. The job also gets ``TRAINGUARD_PROGRESS``
(a private ``file:`` sink), ``TRAINGUARD_DEVICES`` and, on GPUs,
``CUDA_VISIBLE_DEVICES`` restricted to the devices under test — the same contract
as an attempt under ``trainguard run`` (no ``TRAINGUARD_ATTEMPT``: this is not an
attempt).

Pass: exit status 0 *and* at least one step seen — a progress report, or a
``step=N``-style line for jobs that do not use :mod:`trainguard.train`. A job that
exits 0 without a step proved nothing. On failure the reason names the first
failure signature in the job's output (the diagnosis classifier), else its last
line. The whole process tree is stopped (SIGTERM, then SIGKILL) at the timeout.

The dry run uses the job's own configuration: point it at a scratch checkpoint
directory if the job would save a checkpoint after its first step.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence

from trainguard.diagnose.signatures import Classifier
from trainguard.model.devices import Device
from trainguard.model.progress import ProgressEvent
from trainguard.preflight.results import CheckResult, CheckStatus

CHECK = "dry_run"
DRY_RUN_ENV = "TRAINGUARD_DRY_RUN"
GRACE_S = 5.0
TAIL_BYTES = 64 * 1024
_STEP_RE = re.compile(r"\b(?:step|iteration|iter)[ =:]+(?P<step>\d+)\b", re.IGNORECASE)


def _progress(path: str) -> tuple[list[int], set[int]]:
    steps: list[int] = []
    ranks: set[int] = set()
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    ev = ProgressEvent.from_json(line)
                except ValueError:
                    continue  # a torn or foreign line proves nothing
                if ev.event == "progress":
                    steps.append(ev.step)
                    ranks.add(ev.rank)
    except OSError:
        pass
    return steps, ranks


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def dry_run(
    command: Sequence[str],
    devices: Sequence[Device],
    kind: str,
    timeout_s: float,
    *,
    cwd: str | None = None,
) -> CheckResult:
    """Run ``command`` once in dry-run mode; ``dry_run/one_step`` (node level)."""
    cmd = list(command)
    method = f"{' '.join(cmd)[:300]} with {DRY_RUN_ENV}=1, timeout {timeout_s:g} s"
    if not cmd:
        return CheckResult(
            CHECK,
            "one_step",
            CheckStatus.NOT_APPLICABLE,
            None,
            method=method,
            reason="no command given",
        )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tg-dryrun-") as tmp:
        progress = os.path.join(tmp, "progress.jsonl")
        out_path = os.path.join(tmp, "output.log")
        env = dict(os.environ)
        env[DRY_RUN_ENV] = "1"
        env["TRAINGUARD_PROGRESS"] = f"file:{progress}"
        env["TRAINGUARD_DEVICES"] = json.dumps(
            [{"uuid": d.uuid, "pci_bus_id": d.pci_bus_id} for d in devices]
        )
        env.pop("TRAINGUARD_ATTEMPT", None)
        env.pop("TRAINGUARD_RESUME_FROM", None)
        if kind == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(d.uuid for d in devices)
        timed_out = False
        with open(out_path, "wb") as out:
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                return CheckResult(
                    CHECK,
                    "one_step",
                    CheckStatus.FAIL,
                    None,
                    method=method,
                    reason=f"cannot start {cmd[0]!r}: {exc}",
                    duration_s=time.perf_counter() - started,
                )
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop(proc)
                code = proc.returncode
            else:
                _stop(proc)  # stragglers of the tree (torchrun workers)
        with open(out_path, "rb") as fh:
            size = os.path.getsize(out_path)
            fh.seek(max(0, size - TAIL_BYTES))
            text = fh.read().decode("utf-8", errors="replace")
        steps, ranks = _progress(progress)
    duration = time.perf_counter() - started
    printed = [int(m.group("step")) for m in _STEP_RE.finditer(text)]
    clf = Classifier()
    signals = [m for m in clf.feed(text) + clf.finish() if m.kind not in ("cancelled",)]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    details = {
        "exit_code": code,
        "timed_out": timed_out,
        "progress_steps": sorted(set(steps))[:20],
        "progress_ranks": sorted(ranks),
        "printed_steps": sorted(set(printed))[:20],
        "output_tail": lines[-20:],
    }
    stepped = bool(steps or printed)
    if not timed_out and code == 0 and stepped:
        first = min(steps or printed)
        who = f" from rank(s) {sorted(ranks)}" if ranks else ""
        return CheckResult(
            CHECK,
            "one_step",
            CheckStatus.PASS,
            None,
            code,
            0,
            "==",
            "exit status",
            method,
            f"exited 0 after step {first}{who}",
            duration,
            details,
        )
    if timed_out:
        reason = f"no exit within {timeout_s:g} s (stopped)"
    elif code == 0:
        reason = (
            "exited 0 without reporting a step: does the job call "
            "trainguard.train.report_progress() or print step=N?"
        )
    else:
        reason = f"exited {code}"
    hint = next((m for m in signals if m.kind != "killed"), None)
    if hint is not None and code != 0:
        reason += f": {hint.kind}: {hint.text.strip()[:200]}"
    elif lines and code != 0:
        reason += f": {lines[-1].strip()[:200]}"
    return CheckResult(
        CHECK,
        "one_step",
        CheckStatus.FAIL,
        None,
        code,
        0,
        "==",
        "exit status",
        method,
        reason,
        duration,
        details,
    )
