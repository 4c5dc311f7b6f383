"""In-memory snapshots: each rank's latest state in host shared memory, cheap enough every step.

``CheckpointManager(..., memory_snapshots=True)`` and ``ckpt.snapshot(step, state)``
(docs/train.md, decision 0260). Each rank keeps its state (replicated *and* per-rank:
a rank on another host cannot read rank 0's memory) in two **slots** under
``<base>/trainguard-<uid>/<job key>/rank_<r>/``, where ``<base>`` is ``/dev/shm`` (or
``TRAINGUARD_SNAPSHOT_DIR``) and the job key is the run id the supervisor gives every
attempt (``TRAINGUARD_SNAPSHOT_KEY``), else derived from the checkpoint directory,
so that the next attempt of the same job finds them. Files in ``/dev/shm`` outlive
the process that wrote them, not the host. Everything there is private to the job's
user (directories 0700, files 0600, checked before use) and each slot's manifest is
sealed with the run's secret (:mod:`trainguard.train._private`, decision 0411): a
snapshot another user planted, or one of another run, is refused, never restored.

A slot is written exactly like a disk checkpoint, and read back by the same rules:
``state.pt`` + ``rank_<r>.pt`` (+ parts), each hashed while written, and the
manifest (sizes, sha256) written last. The slots are written alternately: the
manifest of the one being written is first removed, so the other always holds the
newest complete snapshot, and a writer killed halfway leaves a slot without a
manifest (or one whose files do not hash to it), which is never valid. The state
files are overwritten in place (fresh tmpfs pages cost as much as the write).
``resume()`` restores the newest step for which *every* rank has a valid slot, when
that step is newer than the newest valid disk checkpoint
(:mod:`trainguard.train.restore`).

One snapshot costs the training loop a copy of every tensor into reused host
staging buffers (:class:`~trainguard.train.state.HostStager`); serialising and
hashing into the slot happens in a background thread. A snapshot waits for the
previous one to finish: every rank then has a snapshot of every step it was asked
for, so that the ranks' slots have a step in common (skipping a busy snapshot on
one rank and not on another could leave none).

Host memory per rank: staging buffers (1x the state) + two slots (2x) = 3x the
rank's tensor bytes, in RAM; the slots count as shared memory (``Shmem`` in
``/proc/meminfo``). The first snapshot refuses (:class:`SnapshotMemoryError`) when
``MemAvailable`` or the free space of the slot directory cannot hold that.

**Flush on the way down** (:class:`FlushOnSignal`, decision 0261). When the
supervisor stops a job (a hang), it first sends ``SIGUSR1``
(``TRAINGUARD_SNAPSHOT_SIGNAL``) to every rank: the rank makes sure its newest
snapshot (the last completed step it was asked for) is complete in its slot, from a
thread of its own, so this works while the training thread is stuck in a collective,
and then writes ``flushed.json`` beside its slots and logs one line. The
supervisor waits a bounded time, then kills as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trainguard
from trainguard.checkpoints import validate
from trainguard.model.checkpoint import MANIFEST_NAME, Manifest, ManifestFile
from trainguard.model.snapshot import (
    DEFAULT_SIGNAL,
    FLUSHED_FILE,
    SNAPSHOT_DIR_ENV,
    SNAPSHOT_KEY_ENV,
    SNAPSHOT_SIGNAL_ENV,
    flush_signal_for,
    rank_dir_name,
    snapshot_base_for,
)
from trainguard.train import _hooks
from trainguard.train._fsio import WrittenFile, write_atomic, write_small_durable
from trainguard.train._private import (
    SEAL_NAME,
    Seal,
    SnapshotTrustError,
    check_chain,
    check_private,
    check_slot_files,
    ensure_private,
    run_secret,
    user_dir,
)
from trainguard.train._split import _nbytes, _tensors
from trainguard.train.state import REPLICATED_FILE, HostStager, rank_file

log = logging.getLogger("trainguard.train")

SLOTS = ("slot0", "slot1")
KIND = "memory_snapshot"
# A buddy copy of rank r's slots is kept as BUDDY_PREFIX + rank_dir_name(r).
BUDDY_PREFIX = "buddy_of_"
# Host RAM one rank's snapshots need, in multiples of its state's tensor bytes.
RAM_FACTOR = 3
SHM_FACTOR = 2
# With buddy copies: the copy's two slots (shm) + one file in flight on each side.
BUDDY_EXTRA = (3, 2)
# Non-tensor state (pickled dicts, RNG states) is not counted in the tensor bytes.
_SLACK_BYTES = 64 << 20

SaveTree = Callable[..., list[WrittenFile]]


class SnapshotMemoryError(RuntimeError):
    """The host cannot hold this rank's memory snapshots; nothing was allocated."""


@dataclass(frozen=True)
class SnapshotResult:
    """One ``snapshot()`` call as seen by the training loop."""

    step: int
    slot: str  # the slot directory being written
    state_bytes: int  # tensor bytes staged
    stall_seconds: float  # how long snapshot() blocked (wait for the previous + copy)


@dataclass(frozen=True)
class Slot:
    """A valid slot (manifest present, sizes right; hashes are checked while loading)."""

    path: Path
    step: int
    manifest: bytes


def job_key(root: Path) -> str:
    """What names a job's snapshots: ``TRAINGUARD_SNAPSHOT_KEY``, else the checkpoint
    directory (the next attempt of the job uses the same one)."""
    explicit = os.environ.get(SNAPSHOT_KEY_ENV, "")
    if explicit:
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in explicit)[:64]
    return hashlib.sha256(str(root.absolute()).encode()).hexdigest()[:16]


def snapshot_base(rank: int, base: str | os.PathLike[str] | None = None) -> Path:
    """Where snapshots live: ``base``, else ``TRAINGUARD_SNAPSHOT_DIR``, else /dev/shm.

    ``{rank}`` in it is replaced by the rank (tests give ranks separate "hosts")."""
    if base is not None:
        return Path(str(base).replace("{rank}", str(rank)))
    return snapshot_base_for(rank, os.environ)


def tree_bytes(tree: Any) -> int:
    """Bytes of the distinct tensors in ``tree``: what staging and each slot hold."""
    found: dict[int, Any] = {}
    _tensors(tree, found)
    return sum(_nbytes(t) for t in found.values())


def mem_available() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(
    state_bytes: int,
    where: Path,
    held: int,
    ram_factor: int = RAM_FACTOR,
    shm_factor: int = SHM_FACTOR,
) -> None:
    """Refuse (SnapshotMemoryError) unless the host can hold this rank's snapshots.

    ``held``: bytes our own slots already occupy (they are replaced, not added)."""
    need_ram = ram_factor * state_bytes + _SLACK_BYTES
    need_shm = shm_factor * state_bytes + _SLACK_BYTES
    gib = 1 << 30
    available = mem_available()
    if available is not None and available + held < need_ram:
        raise SnapshotMemoryError(
            f"memory snapshots need {need_ram / gib:.2f} GiB of host RAM on this rank "
            f"({ram_factor}x its {state_bytes / gib:.2f} GiB of state: staging, two slots"
            f"{', a buddy copy and transfer buffers' if ram_factor > RAM_FACTOR else ''}), "
            f"MemAvailable is {(available + held) / gib:.2f} GiB; snapshot less often is no "
            "help: turn memory_snapshots off or give the job more memory"
        )
    st = os.statvfs(where)
    free = st.f_bavail * st.f_frsize
    if free + held < need_shm:
        raise SnapshotMemoryError(
            f"memory snapshots need {need_shm / gib:.2f} GiB free in {where} "
            f"({shm_factor} slots of {state_bytes / gib:.2f} GiB), "
            f"it has {(free + held) / gib:.2f} GiB; "
            f"enlarge it (docker --shm-size) or point {SNAPSHOT_DIR_ENV} elsewhere"
        )


def _dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def check_slot(path: Path, world_size: int, seal: Seal, rank: int) -> Slot | str | None:
    """``path`` as a valid slot of ``rank``; None: no complete slot there (never
    written, or a write cut short); a string: refused, and why (not ours alone, or
    not sealed by this run). The caller has checked the directories above ``path``.

    Ownership and modes first, then the catalog's quick rules (manifest written last
    and parseable, every listed file there with its size), its kind, and the seal."""
    why = check_private(path)
    if why is None and os.path.lexists(path):
        why = check_slot_files(path)
    if why is not None:
        return f"memory snapshot refused: {why}"
    if not (path / MANIFEST_NAME).is_file():
        return None
    info = validate(path, verify="quick")
    if not info.valid or info.format != "trainguard":
        return None
    try:
        raw = (path / MANIFEST_NAME).read_bytes()
        manifest = Manifest.from_json(raw.decode())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if manifest.extra.get("kind") != KIND:
        return None
    try:
        sealed = (path / SEAL_NAME).read_bytes()
    except FileNotFoundError:
        return f"memory snapshot {path} refused: it has no seal ({SEAL_NAME})"
    if not seal.verify(raw, sealed):
        return (
            f"memory snapshot {path} refused: its seal does not match this run "
            "(written by another run of the job, or planted)"
        )
    if manifest.world_size != world_size or manifest.extra.get("rank") != rank:
        return None
    return Slot(path, manifest.step, raw)


def read_slots(
    path: Path, world_size: int, seal: Seal, rank: int, refused: list[str]
) -> list[Slot]:
    """The valid slots in the directory ``path`` (a rank's, or a buddy copy's), newest
    step first; why a slot was refused is appended to ``refused``."""
    out: list[Slot] = []
    for name in SLOTS:
        got = check_slot(path / name, world_size, seal, rank)
        if isinstance(got, str):
            refused.append(got)
        elif got is not None:
            out.append(got)
    return sorted(out, key=lambda s: -s.step)


class Snapshots:
    """One rank's two snapshot slots and the background writer that fills them."""

    def __init__(
        self,
        root: Path,
        *,
        rank: int,
        world_size: int,
        save_tree: SaveTree,
        base: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.top = user_dir(snapshot_base(rank, base))
        key = job_key(root)
        self.job_dir = self.top / key
        self.dir = self.job_dir / rank_dir_name(rank)
        # Why nothing here may be used (a path or secret file not ours alone); the
        # job then trains on and restores from the disk only.
        self.distrust: str | None = None
        self.refused: list[str] = []  # slots refused by the last slots() / held()
        self._said: set[str] = set()
        self.seal = Seal(b"", key)
        try:
            self.seal = Seal(run_secret(root), key)
        except (SnapshotTrustError, OSError) as exc:
            self._distrust(str(exc))
        self._save_tree = save_tree
        self._clock = clock
        self._stager = HostStager()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._checked_bytes: int | None = None
        self._next_slot: int | None = None
        self.last_written: int | None = None  # step of the newest slot this process wrote
        self.resumed_at: int | None = None  # the step resume() restored (or started from)
        # Buddy copies (trainguard.train._buddy.BuddyLink), set by the manager.
        self.buddy: Any = None

    def _distrust(self, why: str) -> None:
        if self.distrust is None:
            log.error("trainguard: %s; memory snapshots off, the disk checkpoints only", why)
        self.distrust = why

    def note_refused(self, whys: list[str]) -> None:
        """Add ``whys`` to ``refused``, each logged once per process."""
        for why in whys:
            self.refused.append(why)
            if why not in self._said and why != self.distrust:
                self._said.add(why)
                log.warning("trainguard: %s", why)

    def check_dir(self, path: Path) -> str | None:
        """Why the directory ``path`` (under the job's) may not be used; None: it may."""
        if self.distrust is not None:
            return self.distrust
        why = check_chain(self.top, path)
        return None if why is None else f"memory snapshots refused: {why}"

    def ensure_dir(self, path: Path) -> None:
        """Create ``path`` (under the job's directory) private; SnapshotTrustError if it
        or a directory above it is not ours alone."""
        if self.distrust is not None:
            raise SnapshotTrustError(self.distrust)
        ensure_private(self.top, path)

    # --- reading --------------------------------------------------------------------
    def slots(self) -> list[Slot]:
        """This rank's valid slots, newest step first (refusals in ``refused``)."""
        self.refused = []
        why = self.check_dir(self.dir)
        if why is not None:
            self.note_refused([why])
            return []
        refused: list[str] = []
        found = read_slots(self.dir, self.world_size, self.seal, self.rank, refused)
        self.note_refused(refused)
        return found

    def on_host(self) -> dict[int, list[Slot]]:
        """Every valid slot this host holds, by the shard it holds (the manifest's
        rank, decision 0505), newest step first, one per step: this rank's own, those
        other ranks wrote here (now, or before a rendezvous renumbered them) and the
        buddy copies held here, in that order of preference. Refusals in ``refused``."""
        self.refused = []
        why = self.check_dir(self.job_dir)
        if why is not None:
            self.note_refused([why])
            return {}
        out: dict[int, dict[int, Slot]] = {}
        for path in self._host_dirs():
            try:
                shard = int(path.name.rsplit("_", 1)[1])
            except ValueError:
                continue
            why = self.check_dir(path)
            if why is not None:
                self.note_refused([why])
                continue
            refused: list[str] = []
            for slot in read_slots(path, self.world_size, self.seal, shard, refused):
                out.setdefault(shard, {}).setdefault(slot.step, slot)
            self.note_refused(refused)
        return {s: sorted(v.values(), key=lambda x: -x.step) for s, v in out.items()}

    def discard_newer_than(self, step: int) -> None:
        """Drop slots ahead of ``step`` (a timeline the job just abandoned by resuming):
        every slot on this host, whichever rank wrote it, so that a later restore never
        mixes the two timelines. Every rank of the job must be past its own resume
        before any trains on (the caller's barrier): a copy of the next step could
        otherwise arrive before this removes what it takes for the old one."""
        self.wait()
        self.resumed_at = step
        for path in self._host_dirs():
            for name, got in self._steps(path).items():
                if got > step:
                    shutil.rmtree(path / name, ignore_errors=True)

    def _steps(self, path: Path) -> dict[str, int]:
        """slot name -> step of the slots in ``path`` sealed by this run, by the manifest
        and its seal alone: for removal, never for loading (a full check would race
        with the other ranks of this host removing the same slots, and warn)."""
        if self.check_dir(path) is not None:
            return {}
        out: dict[str, int] = {}
        for name in SLOTS:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                raw = (path / name / MANIFEST_NAME).read_bytes()
                if self.seal.verify(raw, (path / name / SEAL_NAME).read_bytes()):
                    out[name] = Manifest.from_json(raw.decode()).step
        return out

    def _host_dirs(self) -> list[Path]:
        """The slot directories of this job on this host: this rank's first, then the
        other ranks', then the buddy copies."""
        own = rank_dir_name(self.rank)
        try:
            found = sorted(self.job_dir.glob("rank_*"), key=lambda d: (d.name != own, d.name))
            found += sorted(self.job_dir.glob(f"{BUDDY_PREFIX}rank_*"))
        except OSError:
            return []
        return found

    # --- writing --------------------------------------------------------------------
    def take(self, step: int, replicated: dict[str, Any], per_rank: dict[str, Any]) -> int:
        """Wait for the previous snapshot, stage this one, start writing it; returns the
        bytes staged. Raises SnapshotMemoryError before the first allocation."""
        self.wait()
        nbytes = tree_bytes(replicated) + tree_bytes(per_rank)
        if self.distrust is not None:
            return 0
        if self._checked_bytes is None or nbytes > self._checked_bytes:
            try:
                self.ensure_dir(self.dir)
            except SnapshotTrustError as exc:
                self._distrust(str(exc))
                return 0
            extra = BUDDY_EXTRA if self.buddy is not None else (0, 0)
            check_memory(
                nbytes,
                self.dir,
                _dir_bytes(self.dir),
                RAM_FACTOR + extra[0],
                SHM_FACTOR + extra[1],
            )
            self._checked_bytes = nbytes
        if self._next_slot is None:
            newest = self.slots()
            # Keep the newest valid slot (a restart may need it) and write the other.
            self._next_slot = 0 if not newest or newest[0].path.name != SLOTS[0] else 1
        staged = self._stager.stage({"replicated": replicated, "per_rank": per_rank})
        index = self._next_slot
        self._next_slot = 1 - index
        thread = threading.Thread(
            target=self._run,
            args=(step, index, staged["replicated"], staged["per_rank"]),
            name=f"trainguard-snapshot-{step}",
            daemon=True,  # a half-written slot is never valid: no need to hold the exit
        )
        self._thread = thread
        thread.start()
        return nbytes

    @property
    def next_slot(self) -> int | None:
        """Index of the slot the next snapshot goes to (None before the first)."""
        return self._next_slot

    def slot_path(self, index: int) -> Path:
        return self.dir / SLOTS[index]

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the snapshot being written; False if still writing after ``timeout``.

        A failed snapshot is logged when it fails and not raised: the previous slot
        stays valid, and a snapshot is an optimisation over the disk checkpoint."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():
            return False
        self._thread = None
        return True

    def _run(self, step: int, index: int, replicated: Any, per_rank: Any) -> None:
        try:
            self._write(step, index, replicated, per_rank)
        except BaseException as exc:
            log.error(
                "trainguard: memory snapshot of step %d failed (the previous one stays): %s: %s",
                step,
                type(exc).__name__,
                exc,
            )
            self._error = exc

    def _write(self, step: int, index: int, replicated: Any, per_rank: Any) -> None:
        final = self.slot_path(index)
        # Removing the slot's manifest first is what makes the alternation safe: from
        # here on only the other slot is valid, until this one's manifest is back.
        # The state files are then overwritten in place: on tmpfs, writing into pages
        # a file already has costs half of writing into fresh ones (measured).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(final / MANIFEST_NAME)
        self.ensure_dir(final)
        started = self._clock()
        phase = "snapshot_during_write"
        files = self._save_tree(replicated, final, REPLICATED_FILE, crash_phase=phase, reuse=True)
        files += self._save_tree(
            per_rank, final, rank_file(self.rank), crash_phase=phase, reuse=True
        )
        listed = {f.path for f in files}
        for stale in final.iterdir():  # parts of an older, differently cut state
            if stale.name not in listed:
                with contextlib.suppress(OSError):
                    stale.unlink()
        _hooks.crash_point("snapshot_before_manifest")
        manifest = Manifest(
            step=step,
            world_size=self.world_size,
            created_at=time.time(),
            trainguard_version=trainguard.__version__,
            files=tuple(ManifestFile(f.path, f.size, f.sha256) for f in files),
            save_seconds=round(self._clock() - started, 6),
            extra={"kind": KIND, "rank": self.rank, "layout": "trainguard.train/1"},
        )
        partial = final / f".{MANIFEST_NAME}.partial"
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        raw = manifest.to_json().encode()
        write_small_durable(partial, raw, mode=0o600)
        # The seal first: a manifest in place is complete only with its seal beside it.
        write_atomic(final / SEAL_NAME, self.seal.sign(raw), mode=0o600)
        os.rename(partial, final / MANIFEST_NAME)  # all of it or none of it
        self.last_written = step
        if self.buddy is not None:
            try:
                self.buddy.send(final)
            except Exception as exc:  # the own slot is fine; only the copy is missing
                log.warning(
                    "trainguard: buddy copy of the step-%d snapshot not sent: %s: %s",
                    step,
                    type(exc).__name__,
                    exc,
                )

    # --- end of the job -------------------------------------------------------------
    def remove(self) -> None:
        """The job completed: its snapshots are of no further use (frees the memory)."""
        self.wait()
        if self.buddy is not None:
            self.buddy.close()
        if self.check_dir(self.job_dir) is not None:
            return  # not ours alone: nothing in it is removed (it may lead elsewhere)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.buddy is not None:
            self.buddy.remove_held()
        if self.resumed_at is not None:
            # Slots another rank left here before a rendezvous moved it (decision 0505):
            # nothing newer than this attempt's start, so no rank of it writes there.
            for path in self._host_dirs():
                steps = self._steps(path)
                if path != self.dir and steps and max(steps.values()) <= self.resumed_at:
                    shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.job_dir.rmdir()  # the last rank of this host removes the job directory


def flush_signal() -> signal.Signals | None:
    """The signal that asks for a flush: ``TRAINGUARD_SNAPSHOT_SIGNAL`` (a name such as
    ``SIGUSR2``, or ``none``), default SIGUSR1."""
    raw = os.environ.get(SNAPSHOT_SIGNAL_ENV, "").strip().upper() or DEFAULT_SIGNAL
    sig = flush_signal_for(os.environ)
    if sig is None and raw not in ("NONE", "OFF", "0", "FALSE", "NO"):
        log.warning(
            "trainguard: %s=%s is not a signal; flush on signal off", SNAPSHOT_SIGNAL_ENV, raw
        )
    return sig


class FlushOnSignal:
    """On the flush signal, complete the newest snapshot and say so (decision 0261).

    Python runs a signal handler only in the main thread, between bytecodes: a main
    thread stuck inside a collective never gets there. So the handler is also
    reached through ``signal.set_wakeup_fd`` (written by the C-level handler at
    delivery, whatever the main thread does) and a watcher thread; whichever comes
    first starts the flush, once. Installed only from the main thread, only over
    the default disposition (a job's own handler is left alone, and said so), and
    the wakeup fd only when nobody else (asyncio) holds it.
    """

    def __init__(self, snaps: Snapshots, signum: signal.Signals, timeout: float = 60.0) -> None:
        self.snaps = snaps
        self.signum = signum
        self.timeout = timeout
        self._lock = threading.Lock()
        self._flusher: threading.Thread | None = None
        self._pair: tuple[socket.socket, socket.socket] | None = None
        self._watcher: threading.Thread | None = None
        self.installed = False

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        current = signal.getsignal(self.signum)
        owner = getattr(current, "__self__", None)
        if isinstance(owner, FlushOnSignal):
            # An earlier manager of this process that was never closed: this one
            # takes over (its sockets must not be garbage-collected while registered).
            owner.uninstall()
            current = signal.getsignal(self.signum)
        if current not in (signal.SIG_DFL, None):
            log.warning(
                "trainguard: %s already has a handler; memory snapshots will not flush on it",
                self.signum.name,
            )
            return False
        signal.signal(self.signum, self._handler)
        self.installed = True
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        if previous != -1:  # someone else's (asyncio): give it back, handler only
            signal.set_wakeup_fd(previous)
            reader.close()
            writer.close()
            return True
        self._pair = (reader, writer)
        self._watcher = threading.Thread(
            target=self._watch, name="trainguard-flush-signal", daemon=True
        )
        self._watcher.start()
        return True

    def uninstall(self) -> None:
        if not self.installed or threading.current_thread() is not threading.main_thread():
            return
        signal.signal(self.signum, signal.SIG_DFL)
        self.installed = False
        if self._pair is not None:
            signal.set_wakeup_fd(-1)
            for sock in self._pair:
                sock.close()  # the watcher's recv fails and it ends
            self._pair = None

    def _handler(self, signum: int, frame: Any) -> None:
        self.trigger()

    def _watch(self) -> None:
        assert self._pair is not None
        reader = self._pair[0]
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            if self.signum.value in data:
                self.trigger()

    def trigger(self) -> None:
        """Start the flush (once at a time)."""
        with self._lock:
            if self._flusher is not None and self._flusher.is_alive():
                return
            self._flusher = threading.Thread(
                target=self._flush, name="trainguard-flush", daemon=True
            )
            self._flusher.start()

    def join(self, timeout: float | None = None) -> None:
        flusher = self._flusher
        if flusher is not None:
            flusher.join(timeout)

    def _flush(self) -> None:
        started = time.monotonic()
        complete = self.snaps.wait(self.timeout)
        step = self.snaps.last_written
        record = {
            "step": step,
            "complete": complete,
            "pid": os.getpid(),
            "time": time.time(),
            "seconds": round(time.monotonic() - started, 6),
        }
        with contextlib.suppress(OSError, SnapshotTrustError):
            self.snaps.ensure_dir(self.snaps.dir)
            write_atomic(self.snaps.dir / FLUSHED_FILE, json.dumps(record).encode(), mode=0o600)
        log.warning(
            "trainguard: %s: rank %d memory snapshot %s (step %s) in %.3f s",
            self.signum.name,
            self.snaps.rank,
            "complete" if complete else "still being written",
            step,
            record["seconds"],
        )
