"""trainguard's own stop of an attempt is never a root cause (issue 15).

The local scheduler writes ``STOP_MARKER`` into the attempt log before it sends
SIGTERM; the kills, exit codes, launcher summaries and collective errors that follow
in that log are that stop's doing. Real failures before the marker still win.
"""

from __future__ import annotations

from trainguard.diagnose.correlate import correlate
from trainguard.diagnose.signatures import Classifier
from trainguard.diagnose.timeline import timeline
from trainguard.model.signature import STOP_MARKER

TAIL = [
    f"{STOP_MARKER} 2: SIGTERM to process group 4242 at 2026-12-01T22:00:00Z",
    "W1201 22:00:00.100000 4243 torch/distributed/elastic/agent/server/api.py:704] "
    "Received 15 death signal, shutting down workers",
    "W1201 22:00:00.110000 4243 torch/distributed/elastic/multiprocessing/api.py:900] "
    "Sending process 4250 closing signal SIGTERM",
    "[rank1]:[E1201 22:00:00.2 ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed: "
    "Connection reset by peer",
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4243 got signal: 15",
    "E1201 22:00:01.000000 4243 torch/distributed/elastic/multiprocessing/api.py:874] "
    "failed (exitcode: -15) local_rank: 0 (pid: 4250) of binary: /usr/bin/python3",
]
HEAD = ["# trainguard attempt 2: torchrun --nproc-per-node 2 train.py", "step=10 loss=2.1"]


def _incidents(lines: list[str]) -> list:
    c = Classifier("portable")
    matches = c.feed_all(["\n".join(lines) + "\n"])
    matches.sort(key=lambda m: m.lineno or 0)
    return correlate(timeline(matches, source="attempt-2.log", year=2026))


def test_only_our_stop_makes_no_incident() -> None:
    assert _incidents(HEAD + TAIL) == []


def test_the_lines_after_the_marker_are_marked_as_our_doing() -> None:
    matches = Classifier("portable").feed_all(["\n".join(HEAD + TAIL) + "\n"])
    marker = next(m for m in matches if m.details.get("trainguard_stop"))
    after = [m for m in matches if m.lineno and m.lineno > (marker.lineno or 0)]
    assert after and all(m.details.get("after_trainguard_stop") == marker.lineno for m in after)
    assert all(m.severity.value == "warning" for m in after)


def test_a_real_failure_before_our_stop_is_the_root_cause() -> None:
    failure = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "train.py", line 9, in <module>',
        "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    (incident,) = _incidents(HEAD + failure + TAIL)
    assert incident.root.kind == "cuda_error"
    assert incident.root.culprit.rank == 1
    assert not incident.root.details.get("after_trainguard_stop")


def test_a_kill_without_our_marker_still_counts() -> None:
    (incident,) = _incidents(HEAD + TAIL[1:])
    assert incident.root.kind in ("killed", "app_error", "collective_error")
