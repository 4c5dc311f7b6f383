"""The recovery policy's settings are declared once (model/policy_schema.py, decision
0444): parsing, layering, JSON, the API's JSON Schema, run's options and the docs table
all come from that one declaration, under one name per setting."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard._commands._policy_options import add_policy_options, policy_error, policy_values
from trainguard.controller.local_options import RunOptions
from trainguard.controller.policies import merge, parse_policy, resolve
from trainguard.diagnose.detectors import HangConfig
from trainguard.model.plan import RecoveryPolicy
from trainguard.model.policy_schema import (
    BY_NAME,
    FLAG_ALIASES,
    GROUPS,
    RUN_SETTINGS,
    SETTINGS,
    PolicyDocument,
    PolicyError,
    Setting,
    document_keys,
    json_schema,
    parse_document,
    run_document,
)

ROOT = Path(__file__).resolve().parents[2]

# --- one name per setting ---------------------------------------------------------------


def test_every_document_field_but_the_name_is_a_declared_setting() -> None:
    names = [f.name for f in dataclasses.fields(PolicyDocument)]
    assert names == ["name", *(s.name for s in SETTINGS)]


def test_the_engine_policy_uses_the_settings_names() -> None:
    # Every RecoveryPolicy field but the job's own device counts is a setting of the
    # same name, and its built-in default is the setting's default.
    for f in dataclasses.fields(RecoveryPolicy):
        if f.name in ("need", "min_need"):
            continue
        assert f.name in BY_NAME, f.name
        assert BY_NAME[f.name].default == f.default


def test_the_hang_detector_uses_the_settings_names_and_defaults() -> None:
    hang = {f.name: f.default for f in dataclasses.fields(HangConfig) if f.name != "window"}
    assert hang == {n: BY_NAME[n].default for n in hang}


def test_older_spellings_are_flags_of_run_settings_only() -> None:
    for flag, name in FLAG_ALIASES.items():
        assert BY_NAME[name].run_option, flag
        assert flag != BY_NAME[name].flag


# --- parse ------------------------------------------------------------------------------


def _below(s: Setting) -> Any:
    assert s.minimum is not None
    low = s.minimum if s.exclusive else s.minimum - 1
    return int(low) if s.kind == "int" else float(low)


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.minimum is not None], ids=lambda s: s.name)
def test_a_number_below_a_settings_bound_is_refused_naming_it(s: Setting) -> None:
    bad = _below(s)
    top = s.key.split(".")[0]
    data: dict[str, Any] = {"name": "p"}
    if top in GROUPS:
        sub = s.key.split(".")[1]
        data[top] = {sub: bad, **({"max": 4} if top == "devices" and sub == "min" else {})}
    else:
        data[top] = bad
    with pytest.raises(PolicyError) as info:
        parse_policy(data)
    assert info.value.field == s.key
    assert s.key in str(info.value)


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.kind == "bool"], ids=lambda s: s.name)
def test_a_non_boolean_is_refused_naming_the_setting(s: Setting) -> None:
    with pytest.raises(PolicyError, match=f"'{s.key}': must be true or false"):
        parse_policy({"name": "p", s.key: "yes"})


def test_an_unknown_key_names_the_nearest_setting() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy({"name": "p", "hang_timeout": 5})
    assert info.value.field == "hang_timeout"
    assert "did you mean 'hang_timeout_seconds'" in str(info.value)


def test_grouped_settings_read_their_bare_and_mapping_forms() -> None:
    bare = parse_policy({"name": "p", "backoff": 5, "devices": 4})
    assert (bare.backoff_base_seconds, bare.backoff_max_seconds) == (5.0, None)
    assert (bare.min_devices, bare.max_devices) == (4, 4)
    full = parse_policy({"name": "p", "devices": {"max": 8}, "hang_timeout_seconds": "adaptive"})
    assert (full.min_devices, full.max_devices, full.hang_timeout_seconds) == (8, 8, None)
    with pytest.raises(PolicyError) as info:
        parse_policy({"name": "p", "backoff": -1})
    assert info.value.field == "backoff"


# --- merge and resolve ------------------------------------------------------------------


def test_the_job_document_overrides_the_default_setting_by_setting() -> None:
    default = parse_policy({"name": "default", "max_restarts": 9, "backoff": {"max_seconds": 30}})
    own = parse_policy({"name": "job", "backoff": 2, "hang_timeout_seconds": 7})
    merged = merge(default, own)
    assert merged is not None
    assert (merged.name, merged.max_restarts) == ("job", 9)
    assert (merged.backoff_base_seconds, merged.backoff_max_seconds) == (2.0, 30.0)
    policy = resolve(merged, need=2)
    assert (policy.max_restarts, policy.hang_timeout_seconds, policy.need) == (9, 7.0, 2)


# --- JSON -------------------------------------------------------------------------------


def _value(s: Setting) -> st.SearchStrategy[Any]:
    if s.kind == "bool":
        return st.booleans()
    if s.kind == "choice":
        return st.sampled_from(s.choices)
    if s.kind == "text":
        return st.text(max_size=20)
    low = s.minimum if s.minimum is not None else 0
    high = s.maximum if s.maximum is not None else 1e6
    if s.kind == "int":
        return st.integers(min_value=int(low) + (1 if s.exclusive else 0), max_value=int(high))
    return st.floats(
        min_value=low,
        max_value=high,
        exclude_min=s.exclusive,
        allow_nan=False,
        allow_infinity=False,
    )


@st.composite
def documents(draw: st.DrawFn) -> PolicyDocument:
    values = {s.name: draw(st.none() | _value(s)) for s in SETTINGS}
    for group in GROUPS.values():
        sub, op, other = (group.members.get(k, k) for k in group.order)
        a, b = values[sub], values[other]
        if a is not None and b is not None and (a < b if op == ">=" else a > b):
            values[sub], values[other] = b, a
    if (values["min_devices"] is None) != (values["max_devices"] is None):
        values["min_devices"] = values["max_devices"] = None
    name = draw(st.from_regex(r"[a-z][a-z0-9_-]{0,20}", fullmatch=True))
    return PolicyDocument(name=name, **values)


@settings(max_examples=200, deadline=None)
@given(documents())
def test_a_document_survives_its_json_form(doc: PolicyDocument) -> None:
    assert parse_document(doc.to_json()) == doc
    assert parse_document(json.loads(json.dumps(doc.to_json()))) == doc


@settings(max_examples=100, deadline=None)
@given(documents())
def test_a_merge_over_nothing_is_the_document_and_over_itself_too(doc: PolicyDocument) -> None:
    assert merge(None, doc) == doc == merge(doc, None)
    assert merge(doc, doc) == doc


def test_the_json_schema_has_every_document_key_with_its_bounds() -> None:
    schema = json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"name", *document_keys()}
    assert schema["properties"]["verify_min_rate_ratio"]["maximum"] == 1.0
    assert schema["properties"]["max_restarts"] == {
        "type": "integer",
        "minimum": 0,
        "description": BY_NAME["max_restarts"].help,
    }
    hang = schema["properties"]["hang_timeout_seconds"]["anyOf"]
    assert {"const": "adaptive"} in hang


def test_the_api_schema_of_a_policy_is_the_policy_schema() -> None:
    doc = json.loads((ROOT / "docs" / "openapi.json").read_text(encoding="utf-8"))
    body = doc["components"]["schemas"]["PolicyIn"]["properties"]["policy"]
    assert body["properties"] == json.loads(json.dumps(json_schema()["properties"]))


# --- run's options ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run", exit_on_error=False)
    add_policy_options(p)
    return p


def test_run_has_an_option_per_run_setting_under_its_name_and_old_spelling() -> None:
    options = {a.dest: a.option_strings for a in _parser()._actions if a.dest in BY_NAME}
    assert set(options) == {s.name for s in RUN_SETTINGS}
    for s in RUN_SETTINGS:
        assert options[s.name] == [s.flag, *s.aliases]
    old = _parser().parse_args(["--hang-timeout", "5", "--backoff", "2", "--approvals"])
    new = _parser().parse_args(
        ["--hang-timeout-seconds", "5", "--backoff-base-seconds", "2", "--approvals"]
    )
    assert (
        policy_values(old)
        == policy_values(new)
        == {
            "hang_timeout_seconds": 5.0,
            "backoff_base_seconds": 2.0,
            "approvals": True,
        }
    )
    assert policy_values(_parser().parse_args([])) == {}


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--backoff", "-1"], "--backoff-base-seconds/--backoff: must be >= 0"),
        (["--max-restarts", "1.5"], "--max-restarts: must be an integer >= 0"),
        (["--hang-timeout", "0"], "must be > 0, got 0.0 (policy setting hang_timeout_seconds)"),
        (["--verify-min-rate-ratio", "2"], "must be <= 1, got 2.0"),
        (["--hang-multiple", "nan"], "must be a finite number"),
    ],
)
def test_a_bad_option_value_names_the_option_and_the_setting(argv: list[str], words: str) -> None:
    with pytest.raises(argparse.ArgumentError) as info:
        _parser().parse_args(argv)
    assert words in str(info.value)


def test_run_backoff_above_the_default_cap_raises_the_cap() -> None:
    doc = RunOptions(command=("x",), policy={"backoff_base_seconds": 120.0}).document()
    assert (doc.backoff_base_seconds, doc.backoff_max_seconds) == (120.0, 120.0)


def test_a_cap_below_the_base_names_the_option() -> None:
    with pytest.raises(PolicyError) as info:
        RunOptions(command=("x",), policy={"backoff_max_seconds": 0.5})
    assert policy_error(info.value) == (
        "--backoff-max-seconds: must be >= backoff.base_seconds (1), got 0.5 "
        "(policy setting backoff_max_seconds)"
    )


def test_a_setting_run_has_no_option_for_is_refused() -> None:
    with pytest.raises(PolicyError, match="is not a setting of run"):
        run_document({"placement": "node"}, name="run")


def test_runs_document_pins_its_settings_so_a_stored_default_cannot_change_a_run() -> None:
    default = parse_policy({"name": "default", "max_restarts": 9, "approvals": True})
    doc = merge(default, RunOptions(command=("x",)).document())
    policy = resolve(doc, need=1)
    assert (policy.max_restarts, policy.approvals, policy.wait_for_capacity) == (3, False, False)
    assert policy.approval_timeout_seconds == BY_NAME["approval_timeout_seconds"].run_value


# --- docs -------------------------------------------------------------------------------


def test_the_docs_table_is_generated_from_the_schema() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-policy-docs.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
