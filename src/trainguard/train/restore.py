"""``resume()``: restore a job from the checkpoint the control plane chose, or the newest valid one.

Order of choice:

1. ``TRAINGUARD_RESUME_FROM`` is set: that checkpoint, verified first. When it is
   not a valid trainguard checkpoint, :class:`ResumeError` is raised: a job told to
   resume must never silently train from scratch;
2. else a resume request ``<dir>/.trainguard-resume.json`` written by the control plane
   before it requeued the job (Slurm cannot change a requeued job's environment;
   decision 0103), when it names this attempt (``SLURM_RESTART_COUNT`` and
   ``SLURM_JOB_ID`` inside a Slurm job, else ``TRAINGUARD_ATTEMPT``): that checkpoint,
   verified first, exactly like ``TRAINGUARD_RESUME_FROM``. A request for another
   attempt is stale and ignored (logged);
3. else the newest valid trainguard checkpoint in the directory (the catalog's
   order, newest first; each candidate is verified before it is used);
4. else a fresh start.

With a process group, rank 0 chooses and broadcasts its choice, with the manifest
bytes it read, so that every rank restores the same checkpoint against the same
manifest. The choice is logged in one line and sent as a ``resumed`` progress event.

**One pass** (decision 0162). Verification is not a separate read: each rank reads
each file it restores once, checks its size and sha256 against the manifest and
``torch.load``s those same bytes (:mod:`trainguard.train._oneload`), so what was
hashed is what is loaded. The ranks then agree: if any rank's file failed, no rank
restores anything; a ``latest`` choice falls back to the next older checkpoint, a
requested one raises. When the supervisor verified the checkpoint it passes the
sha256 of the manifest it verified (``TRAINGUARD_RESUME_DIGEST``, or the resume
request's ``env``): the job checks that the manifest it reads has that digest
(refusing to resume otherwise) and then needs no pass of its own before loading.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainguard.checkpoints import scan, validate
from trainguard.checkpoints._fs import CheckFailed, read_small
from trainguard.model.checkpoint import (
    MANIFEST_NAME,
    RESUME_DIGEST_ENV,
    Manifest,
    ManifestFile,
    manifest_digest,
)
from trainguard.model.resume_request import RESUME_REQUEST_NAME
from trainguard.model.snapshot import rank_dir_name
from trainguard.train._dist import DistContext
from trainguard.train._lookup import Plan, plans, uncovered
from trainguard.train._oneload import FileRejected, Loaded, load_files, torch_loader
from trainguard.train._split import join
from trainguard.train.locate import RESUME_ENV, ResumeError
from trainguard.train.locate import resume_request as _resume_request
from trainguard.train.manager import META_KEY, CheckpointManager
from trainguard.train.progress import emit
from trainguard.train.snapshot import SLOTS, Slot, Snapshots
from trainguard.train.state import REPLICATED_FILE, TrainState, rank_file

log = logging.getLogger("trainguard.train")

Source = Literal["env", "request", "latest", "fresh", "memory"]


@dataclass(frozen=True)
class ResumeResult:
    """What :func:`resume` did."""

    # "env": TRAINGUARD_RESUME_FROM; "request": .trainguard-resume.json; "latest": newest
    # valid; "memory": the ranks' memory snapshots (newer than any of those); "fresh"
    source: Source
    path: str | None  # the checkpoint restored; None for a fresh start
    step: int  # the restored step (0 for a fresh start): continue with step + 1
    epoch: int | None = None
    saved_world_size: int | None = None
    values: dict[str, Any] = field(default_factory=dict)  # saved plain (non-stateful) values
    skipped: tuple[str, ...] = ()  # newer checkpoints passed over, with the reason
    manifest_sha256: str | None = None  # sha256 of the manifest restored against
    # True when the supervisor's TRAINGUARD_RESUME_DIGEST named that manifest.
    digest_matched: bool = False
    hashed_bytes: int = 0  # bytes this rank hashed while loading (0 with verify="quick")

    @property
    def resumed(self) -> bool:
        return self.source != "fresh"


@dataclass(frozen=True)
class _Choice:
    source: Source
    path: str | None
    error: str | None = None
    skipped: tuple[str, ...] = ()
    manifest: bytes = b""  # the manifest as rank 0 read it: every rank checks against it
    digest_matched: bool = False


def _read_manifest(path: Path) -> bytes:
    try:
        return read_small(path / MANIFEST_NAME, MANIFEST_NAME)
    except CheckFailed as exc:
        raise ResumeError(f"cannot read the manifest of {path}: {exc}") from exc


def _requested(source: Source, path: str, what: str, verify: str, expected: str | None) -> _Choice:
    """The checkpoint the supervisor named. With its digest, the manifest read here must
    be the one it verified, and no pass of our own precedes the load; without, a quick
    check (structure, sizes, links) first: the load hashes every byte it uses."""
    where = Path(path).absolute()
    if expected:
        try:
            raw = read_small(where / MANIFEST_NAME, MANIFEST_NAME)
        except CheckFailed as exc:
            return _Choice(source, path, f"{what}={path} is not a valid checkpoint: {exc}")
        got = manifest_digest(raw)
        if got != expected.lower():
            return _Choice(
                source,
                path,
                f"{what}={path}: its manifest changed since the supervisor verified it "
                f"(sha256 {got[:12]}…, {RESUME_DIGEST_ENV} says {expected[:12]}…); "
                "refusing to resume from a checkpoint nobody verified",
            )
        return _Choice(source, str(where), manifest=raw, digest_matched=True)
    info = validate(path, verify="quick")
    if not info.valid:
        return _Choice(source, path, f"{what}={path} is not a valid checkpoint: {info.reason}")
    if info.format != "trainguard":
        return _Choice(
            source,
            path,
            f"{what}={path} is a valid {info.format} checkpoint, not a trainguard one; "
            "restore it with the code that wrote it",
        )
    return _Choice(source, str(where), manifest=_read_manifest(where))


def _choose(root: Path, verify: str, passed: tuple[str, ...], skipped: tuple[str, ...]) -> _Choice:
    """Rank 0's choice; ``passed`` are paths already tried this call (they failed to load)."""
    env = os.environ.get(RESUME_ENV, "")
    if env:
        return _requested("env", env, RESUME_ENV, verify, os.environ.get(RESUME_DIGEST_ENV))
    request = _resume_request(root) if root.is_dir() else None
    if request is not None:
        # Only the request's own digest: the environment may be a stale earlier attempt's.
        digest = request.env.get(RESUME_DIGEST_ENV)
        return _requested("request", request.checkpoint, RESUME_REQUEST_NAME, verify, digest)
    if not root.is_dir():
        return _Choice("fresh", None, skipped=skipped)
    out = list(skipped)
    for info in scan(root, verify="quick"):
        name = Path(info.path).name
        if info.path in passed:
            continue
        if not info.valid:
            out.append(f"{name}: {info.reason}")
            continue
        if info.format != "trainguard":
            out.append(f"{name}: {info.format} checkpoint, not restorable by trainguard.train")
            continue
        # Full verification happens while loading (one pass), on every rank.
        return _Choice(
            "latest", info.path, skipped=tuple(out), manifest=_read_manifest(Path(info.path))
        )
    return _Choice("fresh", None, skipped=tuple(out))


def _say(message: str, rank: int) -> None:
    """The one line saying what resume did: logged, and on stderr when logging is unset.

    On stderr by rank 0 only: every rank restores the same checkpoint (the supervisor
    checks that each one did, from its ``resumed`` event), so N copies of the line would
    say nothing more; one event, one line."""
    log.info(message)
    if rank == 0 and not logging.getLogger().hasHandlers() and not log.handlers:
        sys.stderr.write(message + "\n")  # one write: a whole line, never glued to another
        sys.stderr.flush()


def _load_error(path: Path, name: str, exc: BaseException, weights_only: bool) -> ResumeError:
    hint = (
        " (the state holds objects torch.load(weights_only=True) refuses; pass "
        "weights_only=False if you trust this checkpoint)"
        if weights_only and "weights_only" in str(exc)
        else ""
    )
    return ResumeError(f"cannot load {path / name}: {type(exc).__name__}: {exc}{hint}")


def _rank_files(manifest: Manifest, rank: int, world_size: int) -> list[ManifestFile]:
    """The files this rank restores: the replicated file, its own, and their parts."""
    mains = [REPLICATED_FILE]
    if rank_file(rank) in {f.path for f in manifest.files}:
        mains.append(rank_file(rank))
    stems = tuple(m.removesuffix(".pt") + ".part" for m in mains)
    return [
        f
        for f in manifest.files
        if f.path in mains or (f.path.startswith(stems) and f.path.endswith(".pt"))
    ]


def _assemble(path: Path, name: str, loaded: dict[str, Loaded]) -> Any:
    """``name``'s tree with its part files joined back (written in parallel by the manager)."""
    tree = loaded[name].obj
    meta = tree.get(META_KEY) if isinstance(tree, dict) else None
    names = list(meta.get("parts") or []) if isinstance(meta, dict) else []
    if not names:
        return tree
    missing = [n for n in names if n not in loaded]
    if missing:
        raise ResumeError(f"{path}/{name} refers to parts the manifest does not list: {missing}")
    try:
        return join(tree, [loaded[n].obj for n in names])
    except ValueError as exc:
        raise ResumeError(f"{path}/{name}: {exc}") from exc


@dataclass
class _Attempt:
    """One rank's outcome of loading the chosen checkpoint (nothing restored yet)."""

    error: str | None = None
    replicated: Any = None
    per_rank: Any = None
    hashed: int = 0
    # The checkpoint is fine but does not fit this job (world size, not ours): no
    # older checkpoint would be chosen instead, the caller must decide.
    mismatch: bool = False


def _load_checkpoint(
    path: Path,
    manifest: Manifest,
    dist: DistContext,
    verify: str,
    weights_only: bool,
    map_location: Any,
) -> _Attempt:
    files = _rank_files(manifest, dist.rank, dist.world_size)
    listed = {f.path for f in manifest.files}
    if REPLICATED_FILE not in listed:
        return _Attempt(
            f"{path} was not written by trainguard.train (no {REPLICATED_FILE})", mismatch=True
        )
    if rank_file(dist.rank) not in listed and manifest.world_size == dist.world_size:
        return _Attempt(f"{path} has no {rank_file(dist.rank)} for rank {dist.rank}")
    load = torch_loader(weights_only, map_location)
    try:
        loaded = load_files(
            path, files, verify=verify == "full", load=load, weights_only=weights_only
        )
    except FileRejected as exc:
        return _Attempt(str(exc))
    except Exception as exc:  # torch.load on bytes that matched the manifest
        bad = next((f.path for f in files if f.path in str(exc)), files[0].path)
        return _Attempt(str(_load_error(path, bad, exc, weights_only)))
    try:
        replicated = _assemble(path, REPLICATED_FILE, loaded)
        per_rank = None
        if rank_file(dist.rank) in loaded:
            per_rank = _assemble(path, rank_file(dist.rank), loaded)
    except ResumeError as exc:
        return _Attempt(str(exc))
    meta = replicated.get(META_KEY, {}) if isinstance(replicated, dict) else {}
    if meta.get("step") != manifest.step:
        return _Attempt(
            f"{path}: state says step {meta.get('step')}, manifest says {manifest.step}"
        )
    hashed = sum(x.nbytes for x in loaded.values()) if verify == "full" else 0
    return _Attempt(None, replicated, per_rank, hashed)


def resume(
    target: CheckpointManager | str | os.PathLike[str],
    state: TrainState | dict[str, Any],
    *,
    verify: str = "full",
    weights_only: bool = True,
    map_location: Any = "cpu",
    allow_world_size_change: bool = False,
) -> ResumeResult:
    """Restore ``state`` from ``TRAINGUARD_RESUME_FROM``, else the newest valid checkpoint
    of ``target`` (a manager or its directory), else leave it as is (fresh start).

    Every rank must call it. ``verify="full"`` hashes every byte it restores while
    loading it (one read per file, files in parallel) and restores nothing unless
    every rank's files match the manifest; ``"quick"`` checks sizes only. A
    checkpoint written by a different number of ranks is refused unless
    ``allow_world_size_change`` (then replicated state is restored everywhere, and
    per-rank state only on ranks that existed before).
    """
    if verify not in ("full", "quick"):
        raise ValueError(f"verify must be 'full' or 'quick', not {verify!r}")
    if isinstance(target, CheckpointManager):
        root, dist = target.root, target.dist
    else:
        root, dist = Path(target).absolute(), DistContext.detect()
    ts = TrainState.coerce(state)
    snaps = target.snapshots if isinstance(target, CheckpointManager) else None
    result = _resume(
        root, dist, ts, snaps, verify, weights_only, map_location, allow_world_size_change
    )
    if isinstance(target, CheckpointManager) and target.snapshots is not None:
        # Slots ahead of the restored step belong to a timeline the job left behind,
        # wherever on the host they lie; no rank trains on (and sends a buddy copy of
        # its next step) before every rank has removed them.
        target.snapshots.discard_newer_than(result.step)
        dist.gather(None)
    return result


def _resume(
    root: Path,
    dist: DistContext,
    ts: TrainState,
    snaps: Snapshots | None,
    verify: str,
    weights_only: bool,
    map_location: Any,
    allow_world_size_change: bool,
) -> ResumeResult:
    passed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    not_memory: str | None = None  # why memory snapshots were on and not used
    while True:
        choice: _Choice
        if dist.rank == 0 or not dist.collectives:
            try:
                choice = _choose(root, verify, passed, skipped)
            except ResumeError as exc:
                choice = _Choice("fresh", None, str(exc))
            except Exception as exc:
                choice = _Choice("fresh", None, f"cannot choose a checkpoint in {root}: {exc}")
        else:
            choice = _Choice("fresh", None)
        choice = dist.broadcast(choice)
        if choice.error:
            raise ResumeError(choice.error)
        if snaps is not None and not passed:
            from_memory = _from_memory(
                snaps, ts, dist, _disk_step(choice), verify, weights_only, map_location
            )
            snaps = None  # one look: a fallback to older disk checkpoints stays on disk
            if isinstance(from_memory, ResumeResult):
                return from_memory
            not_memory = from_memory
        if choice.path is None:
            for item in choice.skipped if dist.rank == 0 else ():
                log.warning("trainguard: passed over %s", item)
            _say(f"trainguard: starting fresh (no valid checkpoint in {root})", dist.rank)
            emit("resumed", 0, metrics=_metrics({"source": "fresh"}, not_memory))
            return ResumeResult(source="fresh", path=None, step=0, skipped=choice.skipped)
        path = Path(choice.path)
        attempt = _try(
            path, choice, dist, verify, weights_only, map_location, allow_world_size_change
        )
        outcomes = dist.gather((attempt.error, attempt.mismatch))
        errors = [e for e, _ in outcomes if e]
        if not errors:
            break
        mismatch = [e for e, m in outcomes if e and m]
        if mismatch:
            raise ResumeError(mismatch[0])
        if choice.source != "latest":
            what = RESUME_ENV if choice.source == "env" else RESUME_REQUEST_NAME
            raise ResumeError(f"{what}={choice.path} is not a valid checkpoint: {errors[0]}")
        passed += (choice.path,)
        skipped = (*choice.skipped, f"{path.name}: {errors[0]}")
    for item in choice.skipped if dist.rank == 0 else ():
        log.warning("trainguard: passed over %s", item)
    manifest = Manifest.from_json(choice.manifest.decode())
    try:
        values = ts.restore(attempt.replicated, attempt.per_rank)
    except (KeyError, RuntimeError, ValueError) as exc:
        raise ResumeError(
            f"restoring {path} into this job failed (state partly restored; do not "
            f"train on): {type(exc).__name__}: {exc}"
        ) from exc
    source: Source = choice.source
    described = {"env": RESUME_ENV, "request": RESUME_REQUEST_NAME}
    checked = (
        "manifest digest matches the supervisor's, files hashed while loading"
        if choice.digest_matched
        else ("files hashed while loading" if verify == "full" else "sizes checked only")
    )
    _say(
        f"trainguard: resumed from {path} (step {manifest.step}, "
        f"source={described.get(source, 'newest valid checkpoint')}; {checked})",
        dist.rank,
    )
    emit(
        "resumed",
        manifest.step,
        checkpoint=str(path),
        metrics=_metrics({"source": source, "epoch": manifest.epoch}, not_memory),
    )
    return ResumeResult(
        source=source,
        path=str(path),
        step=manifest.step,
        epoch=manifest.epoch,
        saved_world_size=manifest.world_size,
        values=values,
        skipped=choice.skipped,
        manifest_sha256=manifest_digest(choice.manifest),
        digest_matched=choice.digest_matched,
        hashed_bytes=attempt.hashed,
    )


def _metrics(metrics: dict[str, Any], not_memory: str | None) -> dict[str, Any]:
    """A disk (or fresh) restore's event says why memory snapshots were not used."""
    return metrics if not_memory is None else {**metrics, "memory_not_used": not_memory}


def _try(
    path: Path,
    choice: _Choice,
    dist: DistContext,
    verify: str,
    weights_only: bool,
    map_location: Any,
    allow_world_size_change: bool,
) -> _Attempt:
    """Load (never restore) the chosen checkpoint on this rank; the error, if any, is
    agreed on by all ranks before anything is restored."""
    try:
        manifest = Manifest.from_json(choice.manifest.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        return _Attempt(f"manifest damaged: {exc}")
    if manifest.world_size != dist.world_size and not allow_world_size_change:
        return _Attempt(
            f"{path} was saved by {manifest.world_size} rank(s), this job has "
            f"{dist.world_size}; pass allow_world_size_change=True to restore the "
            "replicated state anyway",
            mismatch=True,
        )
    try:
        return _load_checkpoint(path, manifest, dist, verify, weights_only, map_location)
    except Exception as exc:  # a verdict for every rank, never a lone crash
        return _Attempt(f"cannot load {path}: {type(exc).__name__}: {exc}")


def _disk_step(choice: _Choice) -> int:
    """The step of rank 0's disk choice (-1 for a fresh start)."""
    if choice.path is None:
        return -1
    try:
        return Manifest.from_json(choice.manifest.decode()).step
    except (UnicodeDecodeError, ValueError):
        return -1


def _from_memory(
    snaps: Snapshots,
    ts: TrainState,
    dist: DistContext,
    disk_step: int,
    verify: str,
    weights_only: bool,
    map_location: Any,
) -> ResumeResult | str:
    """Restore the newest step every shard has a valid memory snapshot of somewhere,
    when it is newer than ``disk_step``; else why not (said in one line), to go on
    with the disk.

    Copies are found by the shard they hold, not by where they lie (decision 0505):
    each rank reports every valid slot its host holds, and :func:`plans` says which
    rank reads shard ``r``'s copy for new rank ``r`` (itself when its host has one)."""
    try:
        mine = snaps.on_host()
    except Exception as exc:  # an unreadable slot directory: as good as no snapshot
        log.warning("trainguard: cannot read memory snapshots in %s: %s", snaps.job_dir, exc)
        mine = {}
    seen = [
        {int(k): set(v) for k, v in view.items()}
        for view in dist.gather({k: sorted(s.step for s in v) for k, v in mine.items()})
    ]
    reasons: list[str] = []
    for plan in plans(seen, disk_step):
        slot = next((s for s in mine.get(dist.rank, []) if s.step == plan.step), None)
        if plan.moved:
            slot = _fetch_copies(snaps, dist, plan, mine)
        if slot is None:  # a copy that did not arrive: no complete set at this step
            errors = dist.gather(f"rank {dist.rank}: no slot of step {plan.step}")
            reasons.append(f"step {plan.step}: {errors[0]}")
            continue
        manifest = Manifest.from_json(slot.manifest.decode())
        try:
            attempt = _load_checkpoint(
                slot.path, manifest, dist, verify, weights_only, map_location
            )
        except Exception as exc:
            attempt = _Attempt(f"cannot load {slot.path}: {type(exc).__name__}: {exc}")
        errors = [e for e in dist.gather(attempt.error) if e]
        if errors:
            reasons.append(f"step {plan.step}: {errors[0]}")
            continue
        try:
            values = ts.restore(attempt.replicated, attempt.per_rank)
        except (KeyError, RuntimeError, ValueError) as exc:
            raise ResumeError(
                f"restoring the memory snapshot {slot.path} into this job failed (state "
                f"partly restored; do not train on): {type(exc).__name__}: {exc}"
            ) from exc
        return _restored_from_memory(
            snaps, dist, plan, slot, manifest, disk_step, verify, values, attempt.hashed, reasons
        )
    why = _why_not_memory(snaps, dist, seen, disk_step, reasons)
    _say(f"trainguard: not restoring from memory: {why}; using the disk", dist.rank)
    return why


def _restored_from_memory(
    snaps: Snapshots,
    dist: DistContext,
    plan: Plan,
    slot: Slot,
    manifest: Manifest,
    disk_step: int,
    verify: str,
    values: dict[str, Any],
    hashed: int,
    reasons: list[str],
) -> ResumeResult:
    """Say where every rank's state came from, send the event, build the result."""
    fetched = list(plan.moved)
    # Ranks whose copy was on their host but not among their own slots: a rendezvous
    # renumbered them (or their buddy's copy was on their host).
    placed = dist.gather(slot.path.parent.name == rank_dir_name(dist.rank))
    moved_here = [r for r, own in enumerate(placed) if not own and r not in fetched]
    checked = "files hashed while loading" if verify == "full" else "sizes checked only"
    disk = f"step {disk_step}" if disk_step >= 0 else "none"
    via = f"; rank(s) {fetched} from their buddy's copy" if fetched else ""
    if moved_here:
        via += f"; rank(s) {moved_here} renumbered: from the copy of their shard on their host"
    _say(
        f"trainguard: restored step {plan.step} from memory snapshot ({snaps.job_dir}, "
        f"all {dist.world_size} rank(s) valid{via}; {checked}; newest disk checkpoint: "
        f"{disk})",
        dist.rank,
    )
    emit(
        "resumed",
        plan.step,
        checkpoint=str(slot.path),
        metrics={
            "source": "memory",
            "epoch": manifest.epoch,
            "disk_step": disk_step,
            "from_other_host": fetched,
            "renumbered": moved_here,
        },
    )
    return ResumeResult(
        source="memory",
        path=str(slot.path),
        step=plan.step,
        epoch=manifest.epoch,
        saved_world_size=manifest.world_size,
        values=values,
        skipped=tuple(reasons),
        manifest_sha256=manifest_digest(slot.manifest),
        hashed_bytes=hashed,
    )


def _why_not_memory(
    snaps: Snapshots,
    dist: DistContext,
    seen: list[dict[int, set[int]]],
    disk_step: int,
    reasons: list[str],
) -> str:
    """Why no memory snapshot is restored, in words (the same on every rank)."""
    if reasons:
        why = "no complete valid set of memory snapshots: " + "; ".join(reasons)
    else:
        missing = uncovered(seen)
        complete = plans(seen, -1)
        if missing and len(missing) < len(seen):
            copies = " and no buddy copy on any host" if snaps.buddy is not None else ""
            lost = " with their buddy's: two nodes lost together" if copies else ""
            why = f"rank(s) {missing} have no valid memory snapshot{copies} (host lost{lost}?)"
        elif missing:
            why = "no memory snapshot"
        elif complete:
            why = f"memory snapshots (step {complete[0].step}) are not newer than the disk"
        else:
            why = "the ranks' memory snapshots have no step in common"
    refused = [r for rs in dist.gather(list(snaps.refused)) for r in rs]
    if refused:
        shown = "; ".join(refused[:3]) + ("; ..." if len(refused) > 3 else "")
        why = f"{why} ({len(refused)} refused: {shown})"
    return why


def _fetch_copies(
    snaps: Snapshots, dist: DistContext, plan: Plan, mine: dict[int, list[Slot]]
) -> Slot | None:
    """Ranks whose host has no copy of their shard at ``plan.step`` receive it from the
    rank ``plan`` names (over the process group, every rank walking the same plan in
    rank order) and install it as their own slot; returns this rank's slot to load."""
    import torch.distributed as tdist

    from trainguard.train._buddy import install, read_files

    for rank in plan.moved:
        source = plan.sources[rank]
        if dist.rank == source:
            copy = next(s for s in mine[rank] if s.step == plan.step)
            tdist.send_object_list([copy.path.name, read_files(copy.path)], dst=rank)
        elif dist.rank == rank:
            box: list[Any] = [None, None]
            tdist.recv_object_list(box, src=source)
            if str(box[0]) not in SLOTS:
                raise ResumeError(f"rank {source} sent a buddy copy named {box[0]!r}")
            snaps.ensure_dir(snaps.dir)
            install(snaps.dir / str(box[0]), box[1])
            log.warning(
                "trainguard: rank %d's memory snapshot of step %d restored from rank %d's copy",
                rank,
                plan.step,
                source,
            )
    return next((s for s in snaps.on_host().get(dist.rank, []) if s.step == plan.step), None)
