"""The line-classification API: single lines, streaming, tracebacks, fields, findings."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from trainguard.diagnose.signatures import Classifier, classify_line, classify_text, to_finding
from trainguard.model.findings import Domain, Severity

ENGINES = ["portable", "hyperscan"]


def test_xid_current_and_old_formats() -> None:
    new = classify_line(
        "NVRM: Xid (PCI:0000:c1:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    )
    old = classify_line(
        "[ 4711.123456] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
    )
    assert new is not None and old is not None
    assert (new.kind, new.xid, new.pci_bus_id) == ("xid", 79, "0000:c1:00.0")
    assert (old.kind, old.xid, old.pci_bus_id) == ("xid", 79, "0000:02:00.0")
    assert new.domain is Domain.HARDWARE and new.severity is Severity.FATAL
    assert new.action == "reboot_node"
    assert new.details["pid"] == "1234"
    assert old.timestamp == "4711.123456"


def test_application_xid_is_not_hardware() -> None:
    m = classify_line("NVRM: Xid (PCI:0000:3b:00): 13, pid=77, name=python, Graphics Exception")
    assert m is not None and m.domain is Domain.APPLICATION and m.details["quarantine"] == "repeat"


def test_xid_154_acts_on_the_stated_action() -> None:
    m = classify_line(
        "Nov 29 12:00:01 node7 kernel: NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action "
        "changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    )
    assert m is not None
    assert (m.xid, m.action, m.host, m.details["recovery_action"]) == (
        154,
        "reboot_node",
        "node7",
        2,
    )


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "cuda_oom"),
        ("RuntimeError: CUDA error: out of memory", "cuda_oom"),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_error"),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "ecc_error"),
        ("Segmentation fault (core dumped)", "segfault"),
        ("Signal 9 (SIGKILL) received by PID 4242", "killed"),
        ("*** JOB 123 ON n7 CANCELLED AT 2026-04-22T03:14:17 DUE TO TIME LIMIT ***", "time_limit"),
    ],
)
def test_kinds(line: str, kind: str) -> None:
    m = classify_line(line)
    assert m is not None and m.kind == kind


def test_noise_is_silent() -> None:
    for line in (
        "step=120 loss=2.31",
        "NCCL INFO Channel 00/02 :    0   1",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar 5 2024",
        "Saving checkpoint to /ckpt/step_00000100",
    ):
        assert classify_line(line) is None


def test_watchdog_fields() -> None:
    m = classify_line(
        "[rank3]:[E1129 12:00:01.123 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective"
        " operation timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=600000) ran for 600027 milliseconds before timing out."
    )
    assert m is not None and m.kind == "collective_timeout" and m.rank == 3
    assert m.details["seq"] == 1234 and m.details["op"] == "ALLREDUCE"
    n = classify_line(
        "[PG ID 0 PG GUID 0(default_pg) Rank 2] Timeout at NCCL work: 145, last enqueued NCCL "
        "work: 145, last completed NCCL work: 144."
    )
    assert n is not None and n.rank == 2
    assert (n.details["last_enqueued"], n.details["last_completed"]) == (145, 144)


def test_signature_is_stable_across_numbers() -> None:
    a = classify_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    b = classify_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB.")
    assert a is not None and b is not None and a.signature == b.signature


@pytest.mark.parametrize("engine", ENGINES)
def test_streaming_keeps_partial_lines_and_finds_traceback_final_lines(engine: str) -> None:
    text = (
        "step 1\n"
        "[rank1]: Traceback (most recent call last):\n"
        "[rank0]: Traceback (most recent call last):\n"
        '[rank1]:   File "train.py", line 3, in <module>\n'
        '[rank0]:   File "train.py", line 3, in <module>\n'
        '[rank1]:     raise ValueError("bad")\n'
        "[rank1]: ValueError: bad value 3\n"
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB\n"
        "INFO: not an exception\n"
    )
    whole = classify_text(text, engine)
    c = Classifier(engine)
    pieces: list = []
    for i in range(0, len(text), 7):  # feed in awkward 7-byte pieces
        pieces.extend(c.feed(text[i : i + 7].encode()))
    pieces.extend(c.finish())
    assert [(m.lineno, m.kind, m.rank) for m in whole] == [
        (7, "app_error", 1),
        (8, "cuda_oom", 0),
    ]
    assert [(m.lineno, m.kind, m.rank) for m in pieces] == [
        (m.lineno, m.kind, m.rank) for m in whole
    ]
    assert whole[0].details["exception"] == "ValueError"


def test_to_finding() -> None:
    m = classify_line("NVRM: Xid (PCI:0000:c1:00): 48, pid=1, name=python, DBE (double bit error)")
    assert m is not None
    f = to_finding(m, at=100.0, source="kernel")
    assert f.kind == "xid" and f.xid == 48 and f.culprit.pci_bus_id == "0000:c1:00.0"
    assert f.at == 100.0 and f.signature == m.signature and f.evidence == (m.text,)


def test_garbage_does_not_crash() -> None:
    c = Classifier("portable")
    assert c.feed(b"\xff\xfe\x00garbage\n" * 3 + b"\x80" * 10) == []
    assert c.finish() == []
    assert c.lines == 4


def _generated_log(rng: random.Random) -> bytes:
    """Random noise, corpus lines and interleaved tracebacks."""
    corpus = Path(__file__).resolve().parents[1] / "corpus"
    failures = [e["text"] for e in yaml.safe_load((corpus / "signatures.yaml").read_text())]
    noise = [
        ln
        for ln in (corpus / "noise.txt").read_text(encoding="utf-8").splitlines()
        if ln and not ln.startswith("# ")
    ]
    lines: list[str] = []
    for _ in range(3000):
        r = rng.random()
        if r < 0.05:
            lines.append(rng.choice(failures))
        elif r < 0.07:
            k = rng.randrange(4)
            lines += [f"[rank{k}]: Traceback (most recent call last):", f'[rank{k}]:   File "x"']
            lines.append(f"[rank{k}]: KeyError: 'k{rng.randrange(9)}'")
        else:
            lines.append(rng.choice(noise))
    return ("\n".join(lines) + "\n").encode()


def test_engines_and_chunkings_agree_on_a_generated_log() -> None:
    """The generated log fed whole and in random pieces, to every engine."""
    from trainguard.diagnose.matcher import hyperscan_available

    rng = random.Random(7)
    data = _generated_log(rng)

    def run(engine: str, sizes: list[int]) -> list[tuple[int | None, str, str]]:
        c = Classifier(engine)
        out, pos = [], 0
        for n in sizes:
            out += c.feed(data[pos : pos + n])
            pos += n
        out += c.feed(data[pos:]) + c.finish()
        return [(m.lineno, m.kind, m.signature) for m in out]

    whole = run("portable", [])
    pieces = [rng.randrange(1, 5000) for _ in range(200)]
    assert run("portable", pieces) == whole
    if hyperscan_available():
        assert run("hyperscan", []) == whole
        assert run("hyperscan", pieces) == whole
    assert sum(1 for _, kind, _ in whole if kind == "app_error") > 10


@pytest.mark.parametrize("seed", [7, 11])
def test_portable_anchor_search_methods_agree(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """RE2 (google-re2) and the stdlib ``bytes.find`` passes classify alike."""
    pytest.importorskip("re2")
    from trainguard.diagnose import matcher

    data = _generated_log(random.Random(seed))
    found: dict[str, list[tuple[int | None, str, str]]] = {}
    for use_re2 in (True, False):
        prefilter = matcher.PortablePrefilter(use_re2=use_re2)
        monkeypatch.setitem(matcher._CACHE, "portable", prefilter)
        c = Classifier("portable")
        out = c.feed(data) + c.finish()
        found[prefilter.method] = [(m.lineno, m.kind, m.signature) for m in out]
        # Every line RE2 names is a line the find passes name, with no more rules.
        if use_re2:
            ac_masks = dict(prefilter.scan(data))
        else:
            find_masks = dict(prefilter.scan(data))
    assert found["re2"] == found["bytes.find"] and found["bytes.find"]
    assert set(ac_masks) <= set(find_masks)
    assert all(mask & ~find_masks[line] == 0 for line, mask in ac_masks.items())
