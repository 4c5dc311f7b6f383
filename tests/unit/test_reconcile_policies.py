"""Recovery policy documents: validation with errors that name the field, layering, resolution."""

from __future__ import annotations

import pytest

from trainguard.controller.policies import (
    PolicyError,
    load_policy_text,
    merge,
    parse_policy,
    resolve,
)
from trainguard.model.fleet import PolicyDocument
from trainguard.model.plan import RecoveryPolicy

FULL = """
name: big-pretrain
description: 8 GPUs, elastic down to 4
max_restarts: 5
backoff: {base_seconds: 10, max_seconds: 300}
futile_after: 3
allow_quarantine: false
devices: {min: 4, max: 8}
hang_timeout_seconds: 600
verify_window_seconds: 60
verify_min_rate_ratio: 0.5
placement: node
isolate_network_after: 3
"""


def test_a_full_document_parses_and_resolves() -> None:
    doc = load_policy_text(FULL)
    assert doc == PolicyDocument(
        name="big-pretrain",
        description="8 GPUs, elastic down to 4",
        max_restarts=5,
        backoff_base_seconds=10.0,
        backoff_max_seconds=300.0,
        futile_after=3,
        allow_quarantine=False,
        min_devices=4,
        max_devices=8,
        hang_timeout_seconds=600.0,
        verify_window_seconds=60.0,
        verify_min_rate_ratio=0.5,
        placement="node",
        isolate_network_after=3,
    )
    policy = resolve(doc, need=2)
    assert policy == RecoveryPolicy(
        max_restarts=5,
        backoff_base_seconds=10.0,
        backoff_max_seconds=300.0,
        futile_after=3,
        allow_quarantine=False,
        need=8,
        min_need=4,
        hang_timeout_seconds=600.0,
        verify_window_seconds=60.0,
        verify_min_rate_ratio=0.5,
        placement="node",
        isolate_network_after=3,
    )
    # Round trip through the stored JSON form.
    assert parse_policy(doc.to_json()) == doc


def test_json_and_short_forms() -> None:
    doc = load_policy_text(
        '{"name": "p", "devices": 4, "backoff": 2.5, "hang_timeout_seconds": "adaptive"}'
    )
    assert (doc.min_devices, doc.max_devices, doc.backoff_base_seconds) == (4, 4, 2.5)
    assert doc.hang_timeout_seconds is None
    policy = resolve(doc, need=1, min_need=1)
    assert (policy.need, policy.min_need) == (4, None)  # a fixed count is not elastic


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("name: p\nmax_restart: 3", "max_restart", "did you mean 'max_restarts'"),
        ("name: p\nmax_restarts: three", "max_restarts", "integer"),
        ("name: p\nmax_restarts: -1", "max_restarts", ">= 0"),
        ("name: p\nmax_restarts: true", "max_restarts", "integer"),
        ("name: p\nfutile_after: 0", "futile_after", ">= 1"),
        ("name: p\nallow_quarantine: yes please", "allow_quarantine", "true or false"),
        ("name: p\nbackoff: {base_seconds: ten}", "backoff.base_seconds", "number"),
        (
            "name: p\nbackoff: {base_seconds: 10, max_seconds: 5}",
            "backoff.max_seconds",
            ">= backoff.base_seconds",
        ),
        ("name: p\nbackoff: {base: 1}", "backoff.base", "not a backoff field"),
        ("name: p\ndevices: {min: 8, max: 4}", "devices.min", "<= devices.max"),
        ("name: p\ndevices: {min: 2}", "devices.max", "required"),
        ("name: p\ndevices: 0", "devices", ">= 1"),
        ("name: p\ndevices: {min: 1, max: 2, step: 1}", "devices.step", "not a devices field"),
        ("name: p\nhang_timeout_seconds: 0", "hang_timeout_seconds", "> 0"),
        ("name: p\nhang_timeout_seconds: .inf", "hang_timeout_seconds", "finite"),
        ("name: p\nverify_window_seconds: -3", "verify_window_seconds", "> 0"),
        ("name: p\nverify_min_rate_ratio: 1.5", "verify_min_rate_ratio", "<= 1"),
        ("max_restarts: 3", "name", "required"),
        ("name: 'has space'", "name", "spaces"),
        ("name: [1, 2]", "name", "non-empty string"),
        ("- just\n- a list", "(document)", "mapping"),
        ("name: p\n  bad: : indentation", "(document)", "not valid YAML"),
        ("name: p\ndescription: 3", "description", "string"),
        ("name: p\nplacement: rack", "placement", "device, node"),
        ("name: p\nisolate_network_after: 0", "isolate_network_after", ">= 1"),
        ("name: p\nisolate_network_after: 1.5", "isolate_network_after", "integer"),
    ],
)
def test_errors_name_the_field(text: str, field: str, words: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy_text(text)
    assert info.value.field == field
    assert f"field {field!r}" in str(info.value) and words in str(info.value)


def test_name_must_match_where_it_is_stored() -> None:
    with pytest.raises(PolicyError, match="stored as 'other'"):
        load_policy_text("name: p", name="other")
    assert load_policy_text("max_restarts: 2", name="given").name == "given"


def test_oversized_and_undecodable_documents_are_refused() -> None:
    with pytest.raises(PolicyError, match="larger than"):
        load_policy_text("name: p\ndescription: " + "x" * 70000)
    with pytest.raises(PolicyError, match="UTF-8"):
        load_policy_text(b"name: \xff\xfe")


def test_the_job_document_overrides_the_operator_default() -> None:
    default = parse_policy({"name": "default", "max_restarts": 10, "verify_window_seconds": 30})
    job = parse_policy({"name": "mine", "max_restarts": 2, "devices": {"min": 2, "max": 4}})
    merged = merge(default, job)
    assert merged is not None
    policy = resolve(merged, need=4)
    assert (policy.max_restarts, policy.verify_window_seconds, policy.need, policy.min_need) == (
        2,
        30.0,
        4,
        2,
    )
    assert merge(None, job) == job and merge(default, None) == default
    assert resolve(None, need=3) == RecoveryPolicy(need=3)


def test_a_base_backoff_above_the_default_cap_raises_the_cap() -> None:
    policy = resolve(parse_policy({"name": "p", "backoff": 120}), need=1)
    assert policy.backoff_base_seconds == 120 and policy.backoff_max_seconds == 120
