"""``CheckpointManager``: atomic, optionally asynchronous, distributed-aware checkpoint saves.

One save of step N (docs/train.md has the full protocol and its reasoning):

1. every rank collects its state; with ``async_save`` every tensor is copied to
   host memory now, and that copy is all the training loop waits for;
2. the ranks agree on ``ROOT/.tmp-step_N-<token>/`` (rank 0 draws the token and
   broadcasts it from the training thread);
3. rank 0 writes the replicated state ``state.pt``; every rank writes
   ``rank_<r>.pt``; each file is hashed while written and fsynced; each rank then
   writes ``.part-rank_<r>.json`` (its files with sizes and sha256) atomically, or
   ``.failed-rank_<r>.json`` when its write failed;
4. rank 0 waits for every rank's part marker (files on the shared directory, so no
   collective is needed and the background thread may do it), checks the sizes,
   removes the markers, writes ``trainguard-manifest.json`` last and fsyncs it and
   the directory, renames the directory to ``ROOT/step_<8-digit N>/`` and fsyncs
   ``ROOT``;
5. rank 0 validates the new checkpoint with :mod:`trainguard.checkpoints`, sends a
   ``checkpoint_saved`` progress event and applies retention.

A failure anywhere leaves no directory under a checkpoint's name: the temporary
directory is removed (or, after a crash, left hidden for the clean-up of stale
writers). A failed asynchronous save is logged at once and raised as
:class:`CheckpointWriteError` from the next ``save()``, ``wait()`` or ``close()``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import torch

import trainguard
from trainguard.checkpoints import validate
from trainguard.model.checkpoint import MANIFEST_NAME, Manifest, ManifestFile
from trainguard.train import _buddy, _hooks
from trainguard.train._dist import DistContext
from trainguard.train._fsio import (
    HashingWriter,
    WrittenFile,
    _write_all,
    fsync_dir,
    write_small_durable,
)
from trainguard.train._split import split
from trainguard.train.errors import CheckpointWriteError
from trainguard.train.progress import emit
from trainguard.train.retention import (
    SUPERSEDED_PREFIX,
    TMP_PREFIX,
    apply_retention,
    clean_stale,
    final_name,
    write_writer_record,
)
from trainguard.train.snapshot import FlushOnSignal, SnapshotResult, Snapshots, flush_signal
from trainguard.train.state import REPLICATED_FILE, HostStager, TrainState, rank_file
from trainguard.train.stop import StopOnSignal, planned_stop

log = logging.getLogger("trainguard.train")

LAYOUT = "trainguard.train/1"
# A state is cut into parts of at least this size (see trainguard.train._split).
PART_BYTES = 128 << 20
META_KEY = "__trainguard__"


@dataclass(frozen=True)
class SaveResult:
    """One finished save, as seen by this rank."""

    step: int
    path: str  # the checkpoint directory (on ranks > 0: where rank 0 puts it)
    rank: int
    bytes_written: int  # by this rank
    stall_seconds: float  # how long save() blocked the training loop
    save_seconds: float  # from save() to this rank's work done (rank 0: checkpoint valid)
    valid: bool  # rank 0: validated by the catalog; other ranks: their part is written


@dataclass
class _Job:
    step: int
    epoch: int | None
    tmp: Path
    replicated: dict[str, Any] | None
    per_rank: dict[str, Any]
    started: float  # monotonic, at save()
    stall: float | None = None  # async: time save() blocked; sync: None (all of it)


class CheckpointManager:
    """Writes checkpoints of one job into ``root``; see the module docstring.

    ``keep``: how many valid checkpoints retention keeps (the newest is never deleted).
    ``async_save``: return from :meth:`save` once the state is in host memory.
    ``rank`` / ``world_size``: default to the initialised process group, else the
    ``RANK`` / ``WORLD_SIZE`` environment, else a single process.
    ``part_timeout``: how long rank 0 waits for the other ranks' parts.
    ``retention_verify``: catalog mode used before deleting anything (``quick`` checks
    manifest and sizes; ``full`` re-hashes every kept checkpoint on every save).
    ``stale_seconds``: age after which a temporary directory of an unknown writer
    (another host, no record) counts as abandoned.
    ``writers``: how many files a large state is split into, written and hashed in
    parallel (default: the CPU count, at most 4); states under 256 MiB stay one file.
    ``memory_snapshots``: enable :meth:`snapshot` (host shared memory, 3x the rank's
    state; :mod:`trainguard.train.snapshot`); ``snapshot_dir``: where (default
    ``TRAINGUARD_SNAPSHOT_DIR``, else ``/dev/shm``).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        keep: int = 3,
        async_save: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        part_timeout: float = 600.0,
        retention_verify: str = "quick",
        stale_seconds: float = 3600.0,
        writers: int | None = None,
        memory_snapshots: bool = False,
        snapshot_dir: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1 (the newest valid checkpoint is kept)")
        if retention_verify not in ("quick", "full"):
            raise ValueError("retention_verify must be 'quick' or 'full'")
        self.root = Path(root).absolute()
        self.keep = keep
        self.async_save = async_save
        self.dist = DistContext.detect(rank, world_size)
        self.part_timeout = part_timeout
        self.retention_verify = retention_verify
        self.stale_seconds = stale_seconds
        self.writers = max(1, writers if writers is not None else min(4, os.cpu_count() or 1))
        self._clock = clock
        self._stager = HostStager()
        self._thread: threading.Thread | None = None
        self._error: CheckpointWriteError | None = None
        self._last: SaveResult | None = None
        self._closed = False
        self._lock = threading.Lock()
        self.root.mkdir(parents=True, exist_ok=True)
        if self.dist.rank == 0:
            clean_stale(self.root, now=time.time(), stale_seconds=stale_seconds)
        self.snapshots: Snapshots | None = None
        self._flush: FlushOnSignal | None = None
        self._stop: StopOnSignal | None = None  # installed by the first stop_requested()
        if memory_snapshots:
            self.snapshots = Snapshots(
                self.root,
                rank=self.rank,
                world_size=self.world_size,
                save_tree=self._save_tree,
                base=snapshot_dir,
                clock=clock,
            )
            if _buddy.wanted(self.world_size):
                self._link_buddy(self.snapshots)
            signum = flush_signal()
            if signum is not None:
                self._flush = FlushOnSignal(self.snapshots, signum)
                self._flush.install()

    def _link_buddy(self, snaps: Snapshots) -> None:
        """Exchange buddy endpoints and the job's secret (every rank builds the manager
        at the same point, so this is the one collective of the constructor)."""
        if not self.dist.collectives:
            log.warning("trainguard: buddy copies of snapshots need a process group; off")
            return
        secret = bytes(self.dist.broadcast(secrets.token_bytes(16)))
        link = _buddy.BuddyLink(snaps, self.rank, self.world_size, secret)
        endpoints = self.dist.gather(link.endpoint)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
        buddy = _buddy.buddy_of(self.rank, self.world_size, local)
        link.connect_to(buddy, endpoints[buddy])
        snaps.buddy = link

    # --- public ------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    @property
    def last_saved(self) -> SaveResult | None:
        """The last save that finished on this rank (None before the first)."""
        return self._last

    def save(
        self, step: int, state: TrainState | Mapping[str, Any], *, epoch: int | None = None
    ) -> SaveResult | None:
        """Save ``state`` as the checkpoint of ``step``. Every rank must call it.

        Synchronous: returns when the checkpoint is valid (rank 0) or this rank's part
        is durable and rank 0 has finished (with a process group). Asynchronous:
        returns ``None`` once the state is in host memory. Either way it first waits
        for the previous save; if that one failed, its :class:`CheckpointWriteError`
        is raised after this save has been started (async) or done (sync), so that
        every rank takes part in every save.
        """
        if self._closed:
            raise RuntimeError("CheckpointManager is closed")
        if step < 0:
            raise ValueError("step must be >= 0")
        started = self._clock()
        # A failure of the previous async save is raised only after this save has
        # started: raising first would skip this save's collective on this rank
        # while the other ranks enter it, and the job would deadlock.
        previous = self._join_pending()
        ts = TrainState.coerce(state)
        replicated, per_rank = ts.collect()
        meta = {
            "step": int(step),
            "epoch": epoch,
            "rank": self.rank,
            "world_size": self.world_size,
            "trainguard_version": trainguard.__version__,
            "layout": LAYOUT,
        }
        per_rank[META_KEY] = meta
        if self.rank == 0:
            replicated[META_KEY] = meta
        else:
            replicated = {}  # replicated state is rank 0's to write
        token = self.dist.temp_token(step)
        tmp = self.root / f"{TMP_PREFIX}{step:08d}-{token}"
        job = _Job(
            step=int(step),
            epoch=epoch,
            tmp=tmp,
            replicated=replicated if self.rank == 0 else None,
            per_rank=per_rank,
            started=started,
        )
        if not self.async_save:
            if previous is not None:
                try:
                    self._save_sync(job)
                except CheckpointWriteError as exc:
                    log.error("trainguard: %s", exc)
                raise previous
            return self._save_sync(job)
        staged = self._stager.stage({"replicated": job.replicated, "per_rank": job.per_rank})
        job.replicated, job.per_rank = staged["replicated"], staged["per_rank"]
        job.stall = self._clock() - started
        thread = threading.Thread(
            target=self._run_async, args=(job,), name=f"trainguard-save-{step}", daemon=False
        )
        with self._lock:
            self._thread = thread
        thread.start()
        if previous is not None:
            raise previous
        return None

    def snapshot(
        self, step: int, state: TrainState | Mapping[str, Any], *, epoch: int | None = None
    ) -> SnapshotResult:
        """Keep ``state`` of ``step`` in this rank's memory snapshot; every rank calls it.

        Returns once the state is copied to host staging buffers (after the previous
        snapshot finished writing); the slot is written in the background. Needs no
        collective. Raises :class:`~trainguard.train.snapshot.SnapshotMemoryError` on
        the first call when the host cannot hold the snapshots.
        """
        if self.snapshots is None:
            raise RuntimeError("snapshot() needs CheckpointManager(..., memory_snapshots=True)")
        if self._closed:
            raise RuntimeError("CheckpointManager is closed")
        if step < 0:
            raise ValueError("step must be >= 0")
        started = self._clock()
        replicated, per_rank = TrainState.coerce(state).collect()
        meta = {
            "step": int(step),
            "epoch": epoch,
            "rank": self.rank,
            "world_size": self.world_size,
            "trainguard_version": trainguard.__version__,
            "layout": LAYOUT,
            "kind": "memory_snapshot",
        }
        replicated[META_KEY] = meta
        per_rank[META_KEY] = meta
        nbytes = self.snapshots.take(int(step), replicated, per_rank)
        return SnapshotResult(
            step=int(step),
            slot=str(self.snapshots.slot_path(1 - (self.snapshots.next_slot or 0))),
            state_bytes=int(nbytes),
            stall_seconds=self._clock() - started,
        )

    def stop_requested(
        self, step: int, state: TrainState | Mapping[str, Any], *, epoch: int | None = None
    ) -> bool:
        """Call after every step, on every rank: True once the job should stop by plan.

        The first call installs the handler of the stop signal
        (``TRAINGUARD_STOP_SIGNAL``, default SIGTERM: Slurm's at a time limit or a
        preemption; ``none`` turns planned stops off). When it came to any rank (the
        ranks agree with one small all-reduce per call), ``step`` is saved unless it
        already was (a synchronous save, bounded), rank 0 prints the planned-stop line
        and every rank gets True: leave the training loop and exit. Work lost at the
        stop: the step being trained when the signal came is finished and saved.
        """
        if self._closed:
            raise RuntimeError("CheckpointManager is closed")
        if self._stop is None:
            self._stop = StopOnSignal.from_env()
        if not self._stop.active:
            return False
        if not self.dist.any(self._stop.requested):
            return False
        planned_stop(self, int(step), state, epoch)
        return True

    def request_stop(self) -> None:
        """Ask for a planned stop from inside the job (as the stop signal would)."""
        if self._stop is None:
            self._stop = StopOnSignal.from_env()
        self._stop.request()

    def wait(self) -> SaveResult | None:
        """Wait for a pending asynchronous save (or retention); raise a save's failure."""
        error = self._join_pending()
        if error is not None:
            raise error
        return self._last

    def _join_pending(self) -> CheckpointWriteError | None:
        """Join the background thread, if any; return (and forget) its save's failure."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()
            with self._lock:
                if self._thread is thread:
                    self._thread = None
        with self._lock:
            error, self._error = self._error, None
        return error

    def close(self, *, keep_snapshots: bool = False) -> None:
        """Wait for a pending save (raising its failure); further saves are refused.

        Memory snapshots are removed (the job is done with them) unless
        ``keep_snapshots``; leaving a ``with`` block on an exception keeps them."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            if self._flush is not None:
                self._flush.uninstall()
            if self._stop is not None:
                self._stop.uninstall()
            if self.snapshots is not None:
                if keep_snapshots:
                    self.snapshots.wait()
                else:
                    self.snapshots.remove()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        # Already failing: finish the pending save but do not mask the original error;
        # the memory snapshots are what the next attempt restores from.
        try:
            self.close(keep_snapshots=True)
        except CheckpointWriteError as err:
            log.error("trainguard: %s", err)

    # --- sync / async drivers ------------------------------------------------------
    def _save_sync(self, job: _Job) -> SaveResult:
        own: BaseException | None = None
        result: SaveResult | None = None
        try:
            result = self._write(job)
        except BaseException as exc:
            own = exc
        if self.dist.collectives:
            # Every rank learns rank 0's outcome; this also keeps the ranks in step.
            verdict = self.dist.broadcast(None if own is None else f"rank 0: {own}")
            if own is None and verdict is not None and self.rank != 0:
                own = CheckpointWriteError(f"checkpoint of step {job.step} failed on {verdict}")
        if own is not None:
            if isinstance(own, CheckpointWriteError):
                raise own
            raise CheckpointWriteError(
                f"checkpoint of step {job.step} failed: {type(own).__name__}: {own}"
            ) from own
        assert result is not None
        self._last = result
        return result

    def _run_async(self, job: _Job) -> None:
        try:
            self._last = self._write(job)
        except BaseException as exc:
            log.error(
                "trainguard: asynchronous checkpoint of step %d failed: %s: %s",
                job.step,
                type(exc).__name__,
                exc,
            )
            error = CheckpointWriteError(
                f"asynchronous checkpoint of step {job.step} failed: {type(exc).__name__}: {exc}"
            )
            error.__cause__ = exc
            with self._lock:
                self._error = error

    # --- the write protocol ----------------------------------------------------------
    def _stall(self, job: _Job) -> float:
        """Seconds the training loop was blocked by this save (so far, for a sync save)."""
        return job.stall if job.stall is not None else self._clock() - job.started

    def _write(self, job: _Job) -> SaveResult:
        rank = self.rank
        written: list[WrittenFile] = []
        try:
            # Any rank may get here first; the token is fresh, so the directory is ours.
            job.tmp.mkdir(parents=False, exist_ok=True)
            if rank == 0:
                written.append(write_writer_record(job.tmp))
            if job.replicated is not None:
                written += self._save_tree(job.replicated, job.tmp, REPLICATED_FILE)
            written += self._save_tree(job.per_rank, job.tmp, rank_file(rank))
            _hooks.crash_point("after_shard_write")
            marker = {"rank": rank, "files": [f.to_dict() for f in written]}
            _publish(job.tmp / _part_marker(rank), json.dumps(marker).encode())
        except BaseException as exc:
            self._fail(job, exc)
            raise
        job.replicated = None
        job.per_rank = {}
        nbytes = sum(f.size for f in written)
        if rank != 0:
            return SaveResult(
                step=job.step,
                path=str(self.root / final_name(job.step)),
                rank=rank,
                bytes_written=nbytes,
                stall_seconds=self._stall(job),
                save_seconds=self._clock() - job.started,
                valid=True,
            )
        try:
            final = self._finalize(job)
        except BaseException as exc:
            self._fail(job, exc)
            raise
        save_seconds = self._clock() - job.started
        info = validate(final, verify="quick")
        if not info.valid:
            raise CheckpointWriteError(
                f"checkpoint {final} was written but the catalog rejects it: {info.reason}"
            )
        log.info(
            "trainguard: checkpoint step %d saved to %s in %.2f s (training stalled %.3f s)",
            job.step,
            final,
            save_seconds,
            self._stall(job),
        )
        emit(
            "checkpoint_saved",
            job.step,
            checkpoint=str(final),
            metrics={
                "save_seconds": round(save_seconds, 6),
                "stall_seconds": round(self._stall(job), 6),
                "size_bytes": info.size_bytes,
                "async": self.async_save,
            },
        )
        if self.async_save:
            self._retain(final)  # already off the training thread
        else:
            # The checkpoint is valid: the training loop need not wait for old ones to
            # be deleted (slow on big files). The next save() or wait() joins this.
            housekeeping = threading.Thread(
                target=self._retain, args=(final,), name="trainguard-retention", daemon=False
            )
            with self._lock:
                self._thread = housekeeping
            housekeeping.start()
        return SaveResult(
            step=job.step,
            path=str(final),
            rank=0,
            bytes_written=nbytes,
            stall_seconds=self._stall(job),
            save_seconds=save_seconds,
            valid=True,
        )

    def _retain(self, newest: Path) -> None:
        """Retention and clean-up after ``newest`` became valid; trouble is only logged."""
        try:
            apply_retention(
                self.root,
                keep=self.keep,
                newest=newest,
                verify=self.retention_verify,
                now=time.time(),
                stale_seconds=self.stale_seconds,
            )
            clean_stale(self.root, now=time.time(), stale_seconds=self.stale_seconds)
        except Exception as exc:  # retention trouble never fails a good save
            log.warning("trainguard: retention failed: %s: %s", type(exc).__name__, exc)

    def _save_tree(
        self,
        tree: dict[str, Any],
        tmp: Path,
        name: str,
        *,
        crash_phase: str = "during_write",
        reuse: bool = False,
    ) -> list[WrittenFile]:
        """Write ``tree`` as ``name``, its large tensors spread over parallel part files."""
        cut = split(tree, max_parts=self.writers, part_bytes=PART_BYTES)
        if not cut.parts:
            return [self._torch_save(tree, tmp, name, crash_phase, reuse)]
        stem = name.removesuffix(".pt")
        names = [f"{stem}.part{i}.pt" for i in range(len(cut.parts))]
        skeleton = dict(cut.skeleton)
        skeleton[META_KEY] = {**skeleton[META_KEY], "parts": names}
        with ThreadPoolExecutor(len(names), thread_name_prefix="trainguard-part") as pool:
            futures = [
                pool.submit(self._torch_save, part, tmp, part_name, crash_phase, reuse)
                for part, part_name in zip(cut.parts, names, strict=True)
            ]
            try:
                main = self._torch_save(skeleton, tmp, name, crash_phase, reuse)
            finally:
                done = [f.result() for f in futures]  # raises the first part's failure
        return [main, *done]

    def _torch_save(
        self,
        obj: Any,
        tmp: Path,
        name: str,
        crash_phase: str = "during_write",
        reuse: bool = False,
    ) -> WrittenFile:
        writer = HashingWriter(tmp / name, name, crash_phase=crash_phase, reuse=reuse)
        try:
            _save_without_crc(obj, writer)
            return writer.close()
        except BaseException as exc:
            writer.abort()
            if writer.failure is not None and writer.failure is not exc:
                raise writer.failure from exc
            raise

    def _collect_parts(self, job: _Job) -> list[WrittenFile]:
        """Rank 0: wait until every rank's part marker is there; return all their files."""
        deadline = self._clock() + self.part_timeout
        delay = 0.005
        while True:
            parts: dict[int, list[WrittenFile]] = {}
            for r in range(self.world_size):
                failed = job.tmp / _failed_marker(r)
                if failed.exists():
                    try:
                        why = json.loads(failed.read_text()).get("error", "?")
                    except (OSError, ValueError):
                        why = "unknown error"
                    raise CheckpointWriteError(f"rank {r} failed to write its part: {why}")
                marker = job.tmp / _part_marker(r)
                try:
                    data = json.loads(marker.read_text())
                except FileNotFoundError:
                    continue
                parts[r] = [
                    WrittenFile(str(f["path"]), int(f["size"]), str(f["sha256"]))
                    for f in data["files"]
                ]
            if len(parts) == self.world_size:
                break
            if self._clock() > deadline:
                missing = sorted(set(range(self.world_size)) - set(parts))
                raise CheckpointWriteError(
                    f"ranks {missing} did not finish their part of step {job.step} "
                    f"within {self.part_timeout:.0f} s"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        files = [f for r in sorted(parts) for f in parts[r]]
        for f in files:
            size = (job.tmp / f.path).stat().st_size
            if size != f.size:
                raise CheckpointWriteError(
                    f"file {f.path}: {size} bytes on disk, rank said {f.size}"
                )
        return files

    def _finalize(self, job: _Job) -> Path:
        files = self._collect_parts(job)
        for r in range(self.world_size):
            (job.tmp / _part_marker(r)).unlink()
        _hooks.crash_point("before_manifest")
        manifest = Manifest(
            step=job.step,
            epoch=job.epoch,
            world_size=self.world_size,
            created_at=time.time(),
            trainguard_version=trainguard.__version__,
            files=tuple(ManifestFile(f.path, f.size, f.sha256) for f in files),
            save_seconds=round(self._clock() - job.started, 6),
            extra={
                "layout": LAYOUT,
                "replicated_file": REPLICATED_FILE,
                "stall_seconds": round(self._stall(job), 6),
                "async": self.async_save,
            },
        )
        data = manifest.to_json().encode()
        fd = os.open(
            job.tmp / MANIFEST_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644
        )
        try:
            half = len(data) // 2
            _write_all(fd, memoryview(data)[:half])
            _hooks.crash_point("during_manifest")
            _write_all(fd, memoryview(data)[half:])
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(job.tmp)
        _hooks.crash_point("after_manifest_before_rename")
        final = self.root / final_name(job.step)
        aside: Path | None = None
        if final.exists():
            # Re-saving a step (a rolled-back run reached it again): move the old one
            # aside so the rename cannot fail; clean_stale puts it back after a crash.
            aside = self.root / f"{SUPERSEDED_PREFIX}{final.name}-{secrets.token_hex(4)}"
            os.rename(final, aside)
        os.rename(job.tmp, final)
        _hooks.crash_point("after_rename_before_dir_fsync")
        fsync_dir(self.root)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        return final

    def _fail(self, job: _Job, exc: BaseException) -> None:
        """Make sure a failed save leaves nothing that could pass for a checkpoint."""
        if self.rank == 0:
            shutil.rmtree(job.tmp, ignore_errors=True)
            return
        # If even this fails, rank 0 times out waiting for this rank's part.
        with contextlib.suppress(OSError):
            _publish(
                job.tmp / _failed_marker(self.rank),
                json.dumps({"rank": self.rank, "error": f"{type(exc).__name__}: {exc}"}).encode(),
            )


def _part_marker(rank: int) -> str:
    return f".part-rank_{rank:05d}.json"


def _failed_marker(rank: int) -> str:
    return f".failed-rank_{rank:05d}.json"


def _publish(path: Path, data: bytes) -> None:
    """Write a marker so that a reader sees all of it or nothing (write, fsync, rename)."""
    partial = path.with_name(path.name + ".partial")
    write_small_durable(partial, data)
    os.rename(partial, path)


_crc_lock = threading.Lock()


@functools.cache
def _crc_switch_is_thread_local() -> bool:
    """Whether torch's ``compute_crc32`` switch is per thread (a ContextVar in torch 2.13)."""
    from torch.utils.serialization import config

    before = config.save.compute_crc32
    seen: list[bool] = []
    config.save.compute_crc32 = not before
    try:
        probe = threading.Thread(target=lambda: seen.append(config.save.compute_crc32))
        probe.start()
        probe.join()
    finally:
        config.save.compute_crc32 = before
    return bool(seen) and seen[0] == before


def _save_without_crc(obj: Any, writer: HashingWriter) -> None:
    """torch.save without zip CRC32: our sha256 covers the bytes, and CRC costs ~40 %.

    Where torch's switch is per thread, each writer thread flips its own; where it is
    process-global (older torch), one lock held for the whole save keeps the user's
    setting intact (and our saves then run one at a time).
    """
    try:
        from torch.utils.serialization import config
    except ImportError:  # older torch: no switch, CRC stays on
        torch.save(obj, cast("IO[bytes]", writer))
        return
    lock = contextlib.nullcontext() if _crc_switch_is_thread_local() else _crc_lock
    with lock:
        previous = config.save.compute_crc32
        config.save.compute_crc32 = False
        try:
            torch.save(obj, cast("IO[bytes]", writer))
        finally:
            config.save.compute_crc32 = previous
