"""The jobs the control plane manages: scheduler job, partition, policy, opted in or not."""

from __future__ import annotations

from trainguard.model.fleet import FleetJob
from trainguard.store import rows, sql
from trainguard.store.errors import NotFound, StoreError
from trainguard.store.fleet_base import FleetBase


class FleetJobStore(FleetBase):
    """The jobs the control plane manages (opted in through the scheduler)."""

    def add_fleet_job(self, job: FleetJob) -> FleetJob:
        with self.store.transaction():
            self.store.jobs.get_job(job.job_id)
            try:
                self.db.execute(
                    sql.INSERT_FLEET_JOB,
                    {
                        "job_id": job.job_id,
                        "scheduler_ref": job.scheduler_ref,
                        "partition_name": job.partition,
                        "policy": job.policy,
                        "opted_in": 1 if job.opted_in else 0,
                        "registered_at": job.registered_at,
                    },
                )
            except self.db.dialect.integrity_errors as exc:
                raise StoreError(
                    f"job {job.job_id!r} or scheduler job {job.scheduler_ref!r} is already managed"
                ) from exc
            return job

    def update_fleet_job(self, job: FleetJob) -> FleetJob:
        with self.store.transaction():
            changed = self.db.execute(
                sql.UPDATE_FLEET_JOB,
                {
                    "job_id": job.job_id,
                    "partition_name": job.partition,
                    "policy": job.policy,
                    "opted_in": 1 if job.opted_in else 0,
                },
            )
            if not changed:
                raise NotFound(f"job {job.job_id!r} is not managed")
            return self.get_fleet_job(job.job_id)

    def get_fleet_job(self, job_id: str) -> FleetJob:
        row = self.db.fetch_one(sql.SELECT_FLEET_JOB, {"job_id": job_id})
        if row is None:
            raise NotFound(f"job {job_id!r} is not managed")
        return rows.fleet_job(row)

    def find_fleet_job(self, scheduler_ref: str) -> FleetJob | None:
        row = self.db.fetch_one(sql.SELECT_FLEET_JOB_BY_REF, {"scheduler_ref": scheduler_ref})
        return None if row is None else rows.fleet_job(row)

    def list_fleet_jobs(self) -> list[FleetJob]:
        return [rows.fleet_job(r) for r in self.db.fetch_all(sql.SELECT_FLEET_JOBS, {})]


__all__ = ["FleetJobStore"]
