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


def test_created_token_file_is_private_and_has_one_token_per_role(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "tokens.yaml"
    tokens = create_token_file(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    table = TokenTable.load(path)
    assert {table.authenticate(t).role.value for t in tokens.values()} == {  # type: ignore[union-attr]
        "operator",
        "viewer",
        "agent",
    }
    with pytest.raises(FileExistsError):
        create_token_file(path)  # never overwrites an operator's file


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
