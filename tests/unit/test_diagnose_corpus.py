"""Recall per kind on the corpus of real failure lines, and silence on ordinary output.

The corpus (tests/corpus/signatures.yaml) cites the public source of every line.
Both matcher engines must find every line, with the expected fields, and report
nothing on tests/corpus/noise.txt.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.diagnose.matcher import hyperscan_available
from trainguard.diagnose.signatures import Classifier, classify_line
from trainguard.model.signature import KINDS

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
ENTRIES: list[dict[str, Any]] = yaml.safe_load((CORPUS / "signatures.yaml").read_text())
NOISE = [
    line
    for line in (CORPUS / "noise.txt").read_text(encoding="utf-8").splitlines()
    if line and not line.startswith("# ")
]
ENGINES = ["portable", *(["hyperscan"] if hyperscan_available() else [])]
FIELDS = ("xid", "pci_bus_id", "rank", "host", "job_id", "severity", "action")


def test_corpus_is_well_formed() -> None:
    assert len(ENTRIES) >= 100
    for e in ENTRIES:
        assert e["kind"] in KINDS, e
        assert e.get("source"), f"uncited corpus line: {e['text']!r}"
    # Every kind except the traceback-only app_error case is covered by single lines.
    assert set(KINDS) <= {e["kind"] for e in ENTRIES}
    assert len(NOISE) >= 80


def _check(entry: dict[str, Any], got: Any) -> list[str]:
    problems = []
    if got is None:
        return [f"not recognised (want {entry['kind']}): {entry['text']!r}"]
    if got.kind != entry["kind"]:
        problems.append(f"kind {got.kind} != {entry['kind']}: {entry['text']!r}")
    for name in FIELDS:
        if name in entry:
            value = getattr(got, name)
            value = getattr(value, "value", value)
            if value != entry[name]:
                problems.append(f"{name} {value!r} != {entry[name]!r}: {entry['text']!r}")
    return problems


def test_recall_per_kind_single_lines() -> None:
    problems: list[str] = []
    for e in ENTRIES:
        problems += _check(e, classify_line(e["text"]))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("engine", ENGINES)
def test_recall_per_kind_streaming(engine: str) -> None:
    """The whole corpus as one stream: every line found, in order, by both engines."""
    text = "\n".join(e["text"] for e in ENTRIES) + "\n"
    matches = Classifier(engine).feed(text)
    by_line = {m.lineno: m for m in matches}
    problems: list[str] = []
    recall: Counter[str] = Counter()
    for i, e in enumerate(ENTRIES, start=1):
        p = _check(e, by_line.get(i))
        problems += p
        if not p:
            recall[e["kind"]] += 1
    total = Counter(e["kind"] for e in ENTRIES)
    assert recall == total, "\n".join(problems)
    assert len(matches) == len(ENTRIES)


@pytest.mark.parametrize("engine", ENGINES)
def test_no_false_positives_on_noise(engine: str) -> None:
    noise_text = "\n".join(NOISE) + "\n"
    assert [m.text for m in Classifier(engine).feed(noise_text)] == []
    assert [line for line in NOISE if classify_line(line) is not None] == []


def test_every_corpus_line_contains_an_anchor_of_its_rule() -> None:
    """The portable prefilter is sound only if each rule's anchors are necessary."""
    from trainguard.diagnose.rules import RULES

    missing = []
    for e in ENTRIES:
        for rule in RULES:
            if rule.matches(e["text"]) and rule.anchors:
                low = e["text"].lower()
                if not any(a in low for a in rule.anchors):
                    missing.append(f"{rule.name}: {e['text']!r}")
    assert not missing, "\n".join(missing)
