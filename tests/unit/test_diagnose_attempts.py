"""diagnose on a supervised job's attempt logs (issue 30): one incident per failed attempt,
torchrun's own root-cause block names the culprit, a rank torchrun sent SIGTERM is a victim,
and trainguard's own stop markers are no evidence at all.

The fixtures are ``make demo``'s logs (logs/<job>/attempt-N.log and the simulated kernel
log), with the step lines shortened.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.cli import main
from trainguard.diagnose.correlate import Incident, correlate
from trainguard.diagnose.matcher import hyperscan_available
from trainguard.diagnose.signatures import Classifier
from trainguard.diagnose.timeline import timeline

ENGINES = ["portable", *(["hyperscan"] if hyperscan_available() else [])]

CMD = (
    "/venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 "
    "tests/jobs/tiny_train.py --steps 64 --ckpt-dir ckpt --save-every 4"
)
GLOO = (
    "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "pair.cc:537] Read error [127.0.0.1]:23970: Connection reset by peer. This is typically "
    "caused by a remote worker hanging or bugs in the application."
)

ATTEMPT_0 = f"""# trainguard attempt 0: {CMD}
# CUDA_VISIBLE_DEVICES=0,1
# trainguard: cold start: no standby was parked (first attempt, or it failed to start)
trainguard: starting fresh (no valid checkpoint in ckpt)
step=1 loss=7.482465
step=10 loss=5.721553
[rank0]: Traceback (most recent call last):
[rank0]:   File "tests/jobs/tiny_train.py", line 308, in <module>
[rank0]:     code = main()
{GLOO}
W1204 17:27:22.194000 12449 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 12560 closing signal SIGTERM
# trainguard stopped attempt 0: SIGKILL to process group 12448 after 0.2 s at 2026-12-04T17:27:22Z
# trainguard: attempt 0 stopped in 0.079 s (SIGKILL after 0.2 s)
"""  # noqa: E501

ATTEMPT_1 = f"""# trainguard attempt 1: {CMD}
# CUDA_VISIBLE_DEVICES=0,2 TRAINGUARD_RESUME_FROM=ckpt/step_00000008
W1204 17:27:22.300000 12456 torch/distributed/run.py:874] *****************************************
step=9 loss=3.921647
step=29 loss=1.519857
tiny_train: injecting hang at step 30 (rank 1)
# trainguard stopped attempt 1: SIGKILL to process group 12455 after 0.2 s at 2026-12-04T17:27:30Z
# trainguard: attempt 1 stopped in 0.228 s (SIGKILL after 0.2 s)
"""

SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
=======================================================
tests/jobs/tiny_train.py FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-04_17:27:34
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 13075)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 13075
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_17:27:34
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 13074)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 13074
=======================================================
"""  # noqa: W291

ATTEMPT_2 = f"""# trainguard attempt 2: {CMD}
# CUDA_VISIBLE_DEVICES=0,2 TRAINGUARD_RESUME_FROM=ckpt/step_00000028
W1204 17:27:30.719000 12844 torch/distributed/run.py:874] *****************************************
step=29 loss=0.781089
step=49 loss=4.147002
W1204 17:27:34.754000 12844 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 13075 closing signal SIGTERM
E1204 17:27:34.777000 12844 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 13074) of binary: /venv/bin/python
Traceback (most recent call last):
  File "src/trainguard/schedulers/standby.py", line 356, in <module>
    sys.exit(main(sys.argv[1:]))
  File "torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
{SUMMARY}"""  # noqa: E501

ATTEMPT_3 = f"""# trainguard attempt 3: {CMD}
# CUDA_VISIBLE_DEVICES=0,2 TRAINGUARD_RESUME_FROM=ckpt/step_00000044
step=45 loss=1.062070
step=64 loss=2.668006
done steps=64
done steps=64
"""

KERN = """[    0.000000] Linux version (demo machine)
[  774.060772] NVRM: Xid (PCI:0000:11:00): 79, pid=12561, name=python, GPU has fallen off the bus.
"""

DEMO = {
    "attempt-0.log": ATTEMPT_0,
    "attempt-1.log": ATTEMPT_1,
    "attempt-2.log": ATTEMPT_2,
    "attempt-3.log": ATTEMPT_3,
    "kern.log": KERN,
}


def _diagnose(files: dict[str, str], engine: str = "portable") -> list[Incident]:
    findings = []
    for name, text in files.items():
        matches = Classifier(engine).feed_all([text])
        matches.sort(key=lambda m: m.lineno or 0)
        findings += timeline(matches, source=name, year=2026)
    return correlate(findings)


def _files(inc: Incident) -> set[str]:
    return {f.source.split(":")[0] for f in (inc.root, *inc.symptoms, *inc.context)}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_demo_logs_make_one_incident_per_failure(engine: str) -> None:
    xid, gloo, killed = _diagnose(DEMO, engine)
    assert (xid.kind, xid.culprit.pci_bus_id, _files(xid)) == ("xid", "0000:11:00.0", {"kern.log"})
    # Rank 0 says its peer reset the connection; the attempt ran 2 ranks (its header's
    # --nproc-per-node 2): rank 1, the one on the card that fell off the bus, went away.
    assert (gloo.kind, gloo.culprit.rank, gloo.root.source, _files(gloo)) == (
        "collective_error",
        1,
        "attempt-0.log:10",
        {"attempt-0.log"},
    )
    assert gloo.summary == "collective_error: rank 1 went away: rank 0 lost the connection to it"
    # torchrun's "Root Cause (first observed failure)" names rank 0 (SIGKILL); rank 1 got
    # torchrun's SIGTERM afterwards and is a victim, though its entry comes first.
    assert (killed.kind, killed.culprit.rank, killed.root.source) == (
        "killed",
        0,
        "attempt-2.log:31",
    )
    assert killed.root.signal == 9 and killed.root.details["root_cause"] is True
    assert _files(killed) == {"attempt-2.log"}
    assert {f.details["attempt"] for f in (killed.root, *killed.symptoms)} == {2}


@pytest.mark.parametrize("engine", ENGINES)
def test_our_stop_markers_and_what_follows_are_no_evidence(engine: str) -> None:
    for inc in _diagnose(DEMO, engine):
        for f in (inc.root, *inc.symptoms, *inc.context):
            assert "# trainguard" not in f.message
            assert not f.details.get("trainguard_stop")
            assert not f.details.get("after_trainguard_stop")
    # An attempt trainguard stopped, with no failure line of its own: no incident.
    assert _diagnose({"attempt-1.log": ATTEMPT_1}, engine) == []


def test_the_lines_of_each_attempt_say_which_attempt() -> None:
    matches = Classifier("portable").feed_all([ATTEMPT_0 + ATTEMPT_2])
    assert [(m.lineno, m.details.get("attempt")) for m in matches if m.kind != "killed"] == [
        (10, 0),
        (25, 2),  # raise ChildFailedError(
        (26, 2),  # ...errors.ChildFailedError:
    ]


def test_the_cli_prints_the_root_cause_rank_and_no_marker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "logs" / "job-6d9f19ef9a77"
    job.mkdir(parents=True)
    paths = []
    for name, text in DEMO.items():
        p = (tmp_path if name == "kern.log" else job) / name
        p.write_text(text)
        paths.append(str(p))
    assert main(["diagnose", "--json", *paths]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(i["kind"], i["culprit"].get("rank")) for i in out] == [
        ("xid", None),
        ("collective_error", 1),
        ("killed", 0),
    ]
    assert main(["diagnose", *paths]) == 0
    text = capsys.readouterr().out
    assert "trainguard stopped attempt" not in text
    third = text.split("incident 3:")[1]
    assert "SIGTERM" not in third.split("root:")[0]  # the culprit and why
    assert "  why:     killed (symptom evidence, torchrun's first observed failure): " in third
    assert "[killed: a victim, not the cause] exitcode  : -15 (pid: 13075)" in third


def _elastic(first: tuple[int, int, str], root: tuple[int, int, str] | None) -> str:
    """A ChildFailedError block: ``first`` under Failures:, ``root`` under Root Cause."""

    def entry(rank: int, code: int, t: str) -> str:
        name = {9: "SIGKILL", 15: "SIGTERM"}[-code]
        return (
            f"[{rank}]:\n  time      : 2026-12-04_{t}\n  host      : node{rank}\n"
            f"  rank      : {rank} (local_rank: 0)\n  exitcode  : {code} (pid: 10{rank})  "
            f"({name})\n  error_file: <N/A>\n"
            f"  traceback : Signal {-code} ({name}) received by PID 10{rank}\n"
        )

    text = (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        + "=" * 40
        + "\ntrain.py FAILED\n"
        + "-" * 40
        + "\nFailures:\n"
        + entry(*first)
    )
    if root is not None:
        text += "-" * 40 + "\nRoot Cause (first observed failure):\n" + entry(*root)
    return text + "=" * 40 + "\n"


def test_the_root_cause_block_beats_an_earlier_sigterm_entry() -> None:
    # torchrun's summary times have whole seconds: the SIGTERM victim can even look earlier.
    log = "# trainguard attempt 4: torchrun train.py\n" + _elastic(
        (3, -15, "17:27:33"), (5, -9, "17:27:34")
    )
    (inc,) = _diagnose({"attempt-4.log": log})
    assert (inc.kind, inc.culprit.rank, inc.culprit.host, inc.root.signal) == (
        "killed",
        5,
        "node5",
        9,
    )


def test_without_a_root_cause_block_a_sigterm_rank_is_a_victim() -> None:
    log = (
        "[rank3]: exitcode  : -15 (pid: 103)  (SIGTERM)\n"
        "[rank3]: traceback : Signal 15 (SIGTERM) received by PID 103\n"
        "[rank5]: exitcode  : -9 (pid: 105)  (SIGKILL)\n"
    )
    (inc,) = _diagnose({"rank-logs.txt": log})
    assert (inc.culprit.rank, inc.root.signal) == (5, 9)
    # A job torchrun itself was told to stop: its root cause block names a SIGTERM rank,
    # and with nothing else that rank is what the evidence names.
    stopped = _elastic((1, -15, "17:27:34"), (0, -15, "17:27:34"))
    (inc,) = _diagnose({"attempt-0.log": "# trainguard attempt 0: x\n" + stopped})
    assert (inc.culprit.rank, inc.root.signal, inc.root.details["root_cause"]) == (0, 15, True)


def test_failures_of_two_attempts_seconds_apart_are_two_incidents() -> None:
    def attempt(n: int, t: str) -> str:
        return (
            f"# trainguard attempt {n}: torchrun train.py\n"
            f"[rank1]:[E1204 {t} ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed\n"
            "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
        )

    a, b = _diagnose({"attempt-0.log": attempt(0, "17:27:22.1"), "a1": attempt(1, "17:27:25.1")})
    assert (a.root.details["attempt"], b.root.details["attempt"]) == (0, 1)
    assert (a.kind, b.kind) == ("cuda_error", "cuda_error")
    # Without timestamps the lines of both files get order-only times that interleave.
    plain = {
        "attempt-0.log": "# trainguard attempt 0: x\n[rank1]: RuntimeError: CUDA error: boom\n",
        "attempt-1.log": "# trainguard attempt 1: x\n[rank0]: RuntimeError: CUDA error: boom\n",
    }
    assert [i.culprit.rank for i in _diagnose(plain)] == [1, 0]
    # One log holding two attempts (a concatenation) splits at the header too.
    assert len(_diagnose({"all.log": plain["attempt-0.log"] + plain["attempt-1.log"]})) == 2


def test_a_kernel_line_joins_the_attempt_it_happened_in() -> None:
    xid = (
        "2026-12-04T17:27:21.900000+00:00 node1 kernel: NVRM: Xid (PCI:0000:11:00): 79, "
        "pid=12561, name=python, GPU has fallen off the bus.\n"
    )
    failed_2 = "# trainguard attempt 2: x\n" + _elastic((1, -15, "17:27:34"), (0, -9, "17:27:34"))
    incidents = _diagnose({"attempt-0.log": ATTEMPT_0, "attempt-2.log": failed_2, "kern": xid})
    assert [(i.kind, _files(i)) for i in incidents] == [
        ("xid", {"attempt-0.log", "kern"}),
        ("killed", {"attempt-2.log"}),
    ]


def test_a_lost_peer_is_named_only_when_the_world_is_known() -> None:
    line = (
        "[rank2]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] "
        "Connection closed by peer [10.0.0.3]:28048\n"
    )
    two = "# trainguard attempt 0: torchrun --nproc_per_node=2 train.py\n"
    (inc,) = _diagnose({"a": two + line.replace("rank2", "rank0")})
    assert inc.culprit.rank == 1 and inc.root.details["world_size"] == 2
    # Three ranks, two of them lost their peer: the third went away.
    three = "# trainguard attempt 0: torchrun --nproc-per-node 3 train.py\n"
    (inc,) = _diagnose({"a": three + line + line.replace("rank2", "rank0")})
    assert inc.culprit.rank == 1
    assert inc.summary.endswith("rank 1 went away: ranks 0, 2 lost the connection to it")
    # Three ranks, one report: which peer is not known; the reporting rank stays named.
    (inc,) = _diagnose({"a": three + line})
    assert (inc.culprit.rank, inc.confidence) == (2, 0.35)
    # Several nodes: the header's --nproc-per-node is not the world.
    many = "# trainguard attempt 0: torchrun --nnodes 2 --nproc-per-node 2 train.py\n"
    (inc,) = _diagnose({"a": many + line.replace("rank2", "rank0")})
    assert "world_size" not in inc.root.details and inc.culprit.rank == 0


def test_run_and_serve_name_the_lost_peer_too() -> None:
    from trainguard.diagnose.attribution import attribute
    from trainguard.signals.inventory import simulated

    matches = Classifier("portable").feed_all([ATTEMPT_0])
    findings = timeline(matches, source="output", year=2026)
    devices = simulated(2)
    got = attribute(findings, devices, failed_at=max(f.at for f in findings))
    assert (got.culprit.rank, got.culprit.device_uuid) == (1, devices[1].uuid)
    assert got.summary == "collective error: rank 1 went away: rank 0 lost the connection to it"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from(["cuda", "gloo", "kill", "term"])),
        min_size=1,
        max_size=12,
    )
)
def test_no_incident_mixes_attempts(lines: list[tuple[int, str]]) -> None:
    """However the failure lines of attempts interleave in time, an incident's lines are of
    one attempt, and trainguard's stop markers are never among them."""
    text = {
        "cuda": "[rank{r}]: RuntimeError: CUDA error: an illegal memory access was encountered",
        "gloo": "[rank{r}]: RuntimeError: [gloo/tcp/pair.cc:598] Connection closed by peer",
        "kill": "[rank{r}]: exitcode  : -9 (pid: 10{r})  (SIGKILL)",
        "term": "[rank{r}]: exitcode  : -15 (pid: 10{r})  (SIGTERM)",
    }
    logs: dict[str, list[str]] = {}
    for n, (attempt, kind) in enumerate(lines):
        log = logs.setdefault(f"attempt-{attempt}.log", [f"# trainguard attempt {attempt}: x"])
        log.append(f"2026-12-04T17:27:{n:02d}Z " + text[kind].format(r=n % 3))
    for name, log in logs.items():
        log.append(f"# trainguard stopped attempt {name[8]}: SIGTERM to process group 1 at now")
        log.append("[rank0]: exitcode  : -15 (pid: 100)  (SIGTERM)")
    incidents = _diagnose({k: "\n".join(v) + "\n" for k, v in logs.items()})
    assert len(incidents) == len(logs)
    for inc in incidents:
        found = (inc.root, *inc.symptoms, *inc.context)
        assert len({f.details["attempt"] for f in found}) == 1
        assert not any(f.details.get("trainguard_stop") for f in found)
        assert not any(f.details.get("after_trainguard_stop") for f in found)
