"""Job progress tokens in the store (decision 0403), on SQLite and PostgreSQL: only the
hash is kept, a token counts while its job is not over, one token is revoked alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trainguard.api.auth import hash_token
from trainguard.api.identity import JobTokens
from trainguard.model.records import JobState
from trainguard.store import Store
from trainguard.store.fleet import FleetStore

T0 = 1_764_400_000.0


@pytest.fixture
def fleet(store_target: str) -> Iterator[FleetStore]:
    store = Store.open(store_target, at=T0)
    yield FleetStore(store)
    store.close()


def test_a_jobs_token_is_stored_hashed_and_dies_with_its_job(fleet: FleetStore) -> None:
    tokens = JobTokens(fleet.tokens)
    a = tokens.issue("job-a", at=T0, actor="operator:alice")
    b = tokens.issue("job-b", at=T0, actor="operator:alice")
    extra = tokens.issue("job-b", at=T0, actor="operator:alice")
    stored = fleet.tokens.live_job_tokens()
    assert sorted(stored.values()) == ["job-a", "job-b", "job-b"]
    assert not {a, b, extra} & set(stored)  # hashes only
    # Another server (the same store) knows them after a refresh.
    other = JobTokens(fleet.tokens)
    assert other.lookup(a) is None
    other.refresh()
    who = other.lookup(a)
    assert who is not None and who.name == "job-a" and who.may_post_progress("job-a")
    # A failed submit revokes its own token, not the job's others.
    tokens.revoke(extra)
    assert tokens.lookup(extra) is None and tokens.lookup(b) is not None
    # Over with the job: a job that is stopped (or completed) keeps no live token.
    fleet.store.jobs.create_job(name="a", command=("python",), need=1, at=T0, job_id="job-a")
    assert fleet.tokens.live_job_tokens().get(hash_token(a)) == "job-a"
    fleet.store.jobs.update_job_state("job-a", JobState.STOPPED, at=T0 + 1, reason="done")
    other.refresh()
    assert other.lookup(a) is None and other.lookup(b) is not None
    assert sorted(fleet.tokens.live_job_tokens().values()) == ["job-b"]
