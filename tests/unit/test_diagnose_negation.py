"""The negation / zero-count guard: zero and negated counters never raise a finding.

Property tests over the phrases counter-style rules match (docs/signatures.md,
"Severity and negation"): a zero or "no"/"none" count is silent at any severity, the
same phrase with a non-zero count is found, and the guard judges only the matched
phrase (a failure later on the same line still counts).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainguard.diagnose.rules import negated
from trainguard.diagnose.signatures import classify_line

classify_line("compile the matcher once, outside the timed examples")

PHRASES = st.sampled_from(
    [
        ("uncorrectable ECC errors", "ecc_error"),
        ("Input/output errors", "storage_error"),
        ("oom-kill events", "host_oom"),
    ]
)
ZERO_BEFORE = st.sampled_from(["0", "no", "No", "zero", "00"])
ZERO_AFTER = st.sampled_from(["0", "none", "None", "no", "false", "n/a"])
SEP = st.sampled_from([": ", "=", " : ", ":\t"])
PREFIX = st.sampled_from(["", "GPU 3: ", "[health] node7 ", "Nov 29 12:00:01 node7 dcgm: "])


@given(PREFIX, ZERO_BEFORE, PHRASES)
def test_a_zero_count_before_the_phrase_is_silent(prefix: str, zero: str, phrase: tuple) -> None:
    assert classify_line(f"{prefix}{zero} {phrase[0]}") is None


@given(PREFIX, PHRASES, SEP, ZERO_AFTER)
def test_a_zero_value_after_the_phrase_is_silent(
    prefix: str, phrase: tuple, sep: str, zero: str
) -> None:
    assert classify_line(f"{prefix}{phrase[0]}{sep}{zero}") is None


@given(PREFIX, st.integers(1, 10**6), PHRASES)
def test_a_non_zero_count_is_found(prefix: str, n: int, phrase: tuple) -> None:
    m = classify_line(f"{prefix}{n} {phrase[0]}")
    assert m is not None and m.kind == phrase[1]


@given(st.integers(0, 99))
def test_only_the_matched_phrase_is_judged(n: int) -> None:
    # "0 correctable" before the phrase names another counter: still a real failure.
    m = classify_line(f"{n} correctable, 3 uncorrectable ECC errors")
    assert m is not None and m.kind == "ecc_error"
    assert classify_line("RuntimeError: CUDA error: no kernel image is available") is not None


def test_negated_reads_both_sides() -> None:
    text = "ECC errors: 0 (no uncorrectable ECC error)"
    assert negated(text, 0, 10)  # "ECC errors" followed by ": 0"
    start = text.index("uncorrectable")
    assert negated(text, start, start + len("uncorrectable ECC error"))
