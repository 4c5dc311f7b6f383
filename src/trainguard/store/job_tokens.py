"""Job progress tokens: the hash of each managed job's own token (decision 0403).

``POST /v1/jobs/submit`` issues a token that may post progress for that job and
nothing else, and hands it to the job in its environment. Only the token's
SHA-256 is kept; a token counts while its job is not over (completed or stopped),
so it dies with the job without anyone deleting it.
"""

from __future__ import annotations

from trainguard.store import sql
from trainguard.store.fleet_base import FleetBase


class JobTokenStore(FleetBase):
    """The hashes of the jobs' progress tokens."""

    def add_job_token(self, token_hash: str, job_id: str, *, at: float, actor: str) -> None:
        self.db.execute(
            sql.INSERT_JOB_TOKEN,
            {"token_hash": token_hash, "job_id": job_id, "at": float(at), "actor": actor},
        )

    def delete_job_token(self, token_hash: str) -> int:
        return self.db.execute(sql.DELETE_JOB_TOKEN, {"token_hash": token_hash})

    def live_job_tokens(self) -> dict[str, str]:
        """Token hash -> job id, for every job that is not over."""
        return {
            str(r["token_hash"]): str(r["job_id"])
            for r in self.db.fetch_all(sql.SELECT_LIVE_JOB_TOKENS)
        }


__all__ = ["JobTokenStore"]
