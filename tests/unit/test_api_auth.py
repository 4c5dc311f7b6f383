"""Token files: roles, hashed entries, clear errors; the client-side token readers."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trainguard.agent.client import AgentError, read_token_file
from trainguard.api.auth import (
    Principal,
    Role,
    TokenFileError,
    TokenTable,
    add_token,
    create_token_file,
    hash_token,
    read_token,
)

OP = "operator-token-0123456789"
VIEW = "viewer-token-0123456789ab"


def test_plain_and_hashed_tokens_authenticate_to_their_principal() -> None:
    table = TokenTable.from_mapping(
        {
            OP: {"role": "operator", "name": "alice"},
            f"sha256:{hash_token(VIEW)}": {"role": "viewer", "name": "grafana"},
            "agent-token-for-n17-xxxxx": {"role": "agent", "name": "n17"},
        }
    )
    assert table.authenticate(OP) == Principal("alice", Role.OPERATOR)
    assert table.authenticate(VIEW) == Principal("grafana", Role.VIEWER)
    assert table.authenticate("agent-token-for-n17-xxxxx") == Principal("n17", Role.AGENT)
    assert table.authenticate("nope-nope-nope-nope") is None
    assert table.authenticate("") is None
    assert table.roles() == {"operator": 1, "viewer": 1, "agent": 1}


def test_agent_tokens_report_only_for_their_host_unless_wildcard() -> None:
    assert Principal("n17", Role.AGENT).may_report_for("n17")
    assert not Principal("n17", Role.AGENT).may_report_for("n18")
    assert Principal("*", Role.AGENT).may_report_for("anything")
    assert not Principal("n17", Role.OPERATOR).may_report_for("n17")
    assert Principal("alice", Role.OPERATOR).actor == "operator:alice"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "expected a mapping"),
        ({OP: {"role": "admin", "name": "x"}}, "role 'admin' is not one of"),
        ({OP: {"role": "viewer"}}, "'name' is required"),
        ({OP: "viewer"}, "expected {role"),
        ({"short": {"role": "viewer", "name": "x"}}, "shorter than 16"),
        ({"sha256:abc": {"role": "viewer", "name": "x"}}, "64 hex digits"),
        (
            {
                OP: {"role": "viewer", "name": "a"},
                f"sha256:{hash_token(OP)}": {"role": "viewer", "name": "b"},
            },
            "listed twice",
        ),
    ],
)
def test_malformed_token_files_are_refused_with_the_entry_named(data: object, message: str) -> None:
    with pytest.raises(TokenFileError, match=r"entry|expected") as err:
        TokenTable.from_mapping(data, "tokens.yaml")
    assert message in str(err.value)
    assert "tokens.yaml" in str(err.value)


def test_load_yaml_and_json_and_garbage(tmp_path: Path) -> None:
    y = tmp_path / "t.yaml"
    y.write_text(f'"{OP}": {{role: operator, name: alice}}\n')
    assert TokenTable.load(y).authenticate(OP) is not None
    j = tmp_path / "t.json"
    j.write_text(f'{{"{OP}": {{"role": "operator", "name": "alice"}}}}')
    assert TokenTable.load(j).authenticate(OP) is not None
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TokenFileError, match="not valid JSON"):
        TokenTable.load(bad)
    with pytest.raises(TokenFileError, match="cannot read"):
        TokenTable.load(tmp_path / "missing.yaml")


def test_created_token_file_is_private_and_holds_no_agent_token(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "tokens.yaml"
    tokens = create_token_file(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    table = TokenTable.load(path)
    assert {table.authenticate(t).role.value for t in tokens.values()} == {  # type: ignore[union-attr]
        "operator",
        "viewer",
    }
    # Each host gets its own agent token; the any-host one is never created (0402).
    assert table.roles() == {"operator": 1, "viewer": 1}
    with pytest.raises(FileExistsError):
        create_token_file(path)  # never overwrites an operator's file


def test_add_token_issues_one_hosts_agent_token_and_refuses_the_any_host_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens.yaml"
    create_token_file(path)
    table = TokenTable.load(path)
    token = add_token(path, Role.AGENT, "n7")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert table.authenticate(token) is None
    assert table.reload_if_changed(now=1e9)  # a running serve takes it at first use
    who = table.authenticate(token)
    assert who == Principal("n7", Role.AGENT) and who.may_report_for("n7")
    assert not who.may_report_for("n8") and not who.may_post_progress("job-1")
    assert who.token_id == hash_token(token)[:12] and token not in str(who.describe())
    with pytest.raises(TokenFileError, match="by hand"):
        add_token(path, Role.AGENT, "*")
    with pytest.raises(TokenFileError, match="not written in a token file"):
        add_token(path, Role.JOB, "job-1")
    fresh = tmp_path / "new" / "tokens.yaml"
    add_token(fresh, Role.AGENT, "n1")  # created, private
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o600
    assert TokenTable.load(fresh).agent_hosts() == {"n1"}


def test_a_token_file_cannot_grant_the_job_role() -> None:
    with pytest.raises(TokenFileError, match="issued by submit"):
        TokenTable.from_mapping({"job-token-0123456789": {"role": "job", "name": "j"}})


def test_progress_is_posted_by_the_jobs_own_token_or_a_fleet_proxy() -> None:
    job = Principal("job-a", Role.JOB)
    assert job.may_post_progress("job-a") and not job.may_post_progress("job-b")
    assert not job.may_report_for("n1") and not job.fleet_proxy
    proxy = Principal("*", Role.AGENT)
    assert proxy.fleet_proxy and proxy.may_post_progress("job-b")
    assert not Principal("n1", Role.AGENT).may_post_progress("job-a")


def test_client_token_readers(tmp_path: Path) -> None:
    alone = tmp_path / "tok"
    alone.write_text("# my token\n" + OP + "\n")
    assert read_token(alone) == OP
    assert read_token_file(alone) == OP
    single = tmp_path / "single.yaml"
    single.write_text(f'"{OP}": {{role: agent, name: n1}}\n')
    assert read_token(single) == OP
    assert read_token_file(single) == OP
    many = tmp_path / "many.yaml"
    many.write_text(f'"{OP}": {{role: agent, name: n1}}\n"{VIEW}": {{role: viewer, name: v}}\n')
    with pytest.raises(TokenFileError):
        read_token(many)
    with pytest.raises(AgentError):
        read_token_file(many)
