"""The classes of issue 15 on line shapes beyond the corpora (built for the class, not a line)."""

from __future__ import annotations

import pytest

from trainguard.diagnose.signatures import Classifier, classify_line


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("Gradient of parameter layer1.weight is NaN", "nan_loss"),
        ("WARNING: gradients contain NaN, skipping step", "nan_loss"),
        ("NaN detected in gradients at step 1234", "nan_loss"),
        ("json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)", "app_error"),
        ("[rank3]: ValueError: too many values to unpack (expected 2)", "app_error"),
        ("ib0: lost carrier", "network_error"),
        ("mlx5_core 0000:c1:00.1 ibp193s0f1: Link down", "network_error"),
        ("beegfs: Communication error: Connection refused (node: storage01)", "storage_error"),
        ("sacct: 4242.0  python  NODE_FAIL  0:0", "node_failure"),
    ],
)
def test_class_member_is_found(text: str, kind: str) -> None:
    m = classify_line(text)
    assert m is not None and m.kind == kind


@pytest.mark.parametrize(
    "text",
    [
        "Gradient of x is finite",
        "XID errors: 0",
        "ECC Errors: Volatile: SRAM Uncorrectable: 0 DRAM Uncorrectable: 0",
        "0 uncorrectable errors detected",
        "error_count=0",
        "Error: none",
    ],
)
def test_healthy_line_is_silent(text: str) -> None:
    assert classify_line(text) is None


def test_an_exception_type_is_recorded_with_and_without_its_traceback() -> None:
    alone = classify_line("omegaconf.errors.ConfigKeyError: Key 'lr' not in struct")
    assert alone is not None and alone.details["exception"] == "omegaconf.errors.ConfigKeyError"
    text = "Traceback (most recent call last):\n  File \"t.py\", line 1\nKeyError: 'x'\n"
    [m] = Classifier("portable").feed_all([text])
    assert m.lineno == 3 and m.details["exception"] == "KeyError"


def test_an_unfinished_traceback_is_reported_by_its_head_at_the_end() -> None:
    [m] = Classifier("portable").feed_all(["[rank2]: Traceback (most recent call last):\n"])
    assert m.kind == "app_error" and m.rank == 2 and m.details.get("traceback_head")
