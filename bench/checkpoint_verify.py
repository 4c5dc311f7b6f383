"""Checkpoint verification throughput versus raw sequential read of the same bytes.

Writes a trainguard-format checkpoint (default ~1 GiB in 4 rank files), then times,
in the same run and on the same files:

- raw sequential read (16 MiB ``readinto``, no hashing) — the disk-speed baseline;
- full verification (``trainguard.checkpoints.validate(path, "full")``: sizes + sha256);
- full verification one file at a time (no parallel hashing across files);
- quick verification (manifest + sizes only).

Each is measured cold (page cache dropped with ``/proc/sys/vm/drop_caches`` when
permitted; otherwise this is noted and every figure is warm) and warm.
Target (issue 2): full / raw throughput >= 0.8.

    .venv/bin/python bench/checkpoint_verify.py [--size-gib 1.0] [--files 4] [--repeat 3]

Prints a table and writes bench/results/checkpoint_verify.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from trainguard.checkpoints import validate
from trainguard.checkpoints._fs import READ_BUFFER_BYTES, sha256_file
from trainguard.model.checkpoint import MANIFEST_NAME, Manifest, ManifestFile

RESULTS = Path(__file__).resolve().parent / "results" / "checkpoint_verify.json"


def make_checkpoint(root: Path, total_bytes: int, files: int) -> Path:
    d = root / "step_00000001"
    d.mkdir(parents=True)
    per_file = total_bytes // files
    block = os.urandom(8 << 20)
    entries = []
    for i in range(files):
        rel = f"rank_{i}.pt"
        digest = hashlib.sha256()
        with (d / rel).open("wb") as fh:
            left = per_file
            while left:
                # Vary each block so no two blocks are identical (defeats dedup anywhere).
                chunk = (i.to_bytes(4, "little") + left.to_bytes(8, "little") + block)[
                    : min(left, len(block))
                ]
                fh.write(chunk)
                digest.update(chunk)
                left -= len(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        entries.append(ManifestFile(rel, per_file, digest.hexdigest()))
    manifest = Manifest(
        step=1,
        world_size=files,
        created_at=time.time(),
        trainguard_version="bench",
        files=tuple(entries),
    )
    (d / MANIFEST_NAME).write_text(manifest.to_json())
    return d


def drop_caches() -> str | None:
    """Drop the page cache; returns None on success, else why it could not."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return None
    except OSError as exc:
        return f"cannot drop page cache ({exc.strerror}); all figures are warm-cache"


def raw_read(d: Path) -> int:
    buf = bytearray(READ_BUFFER_BYTES)
    total = 0
    for p in sorted(d.glob("rank_*.pt")):
        with p.open("rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                total += n
    return total


def full_verify(d: Path) -> int:
    info = validate(d, "full")
    assert info.valid, info.reason
    return info.size_bytes


def full_one_file_at_a_time(d: Path) -> int:
    manifest = Manifest.from_json((d / MANIFEST_NAME).read_text())
    total = 0
    for f in manifest.files:
        digest, n = sha256_file(d / f.path, f.path)
        assert digest == f.sha256
        total += n
    return total


def quick_verify(d: Path) -> int:
    info = validate(d, "quick")
    assert info.valid, info.reason
    return info.size_bytes


def sha256_memory_speed() -> float:
    data = os.urandom(256 << 20)
    t = time.perf_counter()
    hashlib.sha256(data).digest()
    return len(data) / (time.perf_counter() - t)


def measure(fn: Callable[[Path], int], d: Path, cold: bool, repeat: int) -> tuple[float, int]:
    """Median seconds over ``repeat`` runs (cache dropped before each run when ``cold``)."""
    times = []
    n = 0
    for _ in range(repeat):
        if cold:
            drop_caches()
        else:
            fn(d)  # warm up the cache with this very read
        t = time.perf_counter()
        n = fn(d)
        times.append(time.perf_counter() - t)
    return statistics.median(times), n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="tg-bench-verify-", dir=args.dir))
    notes: list[str] = []
    try:
        d = make_checkpoint(base, int(args.size_gib * (1 << 30)), args.files)
        cache_problem = drop_caches()
        cold_possible = cache_problem is None
        if cache_problem:
            notes.append(cache_problem)
        cases = [
            ("raw sequential read", raw_read),
            ("full verify (sha256)", full_verify),
            ("full verify, one file at a time", full_one_file_at_a_time),
            ("quick verify (sizes)", quick_verify),
        ]
        rows = []
        for cache in ("cold", "warm") if cold_possible else ("warm",):
            baseline = None
            for label, fn in cases:
                secs, nbytes = measure(fn, d, cache == "cold", args.repeat)
                gibps = nbytes / secs / (1 << 30)
                if baseline is None:
                    baseline = gibps
                rows.append(
                    {
                        "cache": cache,
                        "case": label,
                        "seconds": secs,
                        "bytes": nbytes,
                        "GiB_per_s": gibps,
                        "ratio_to_raw": gibps / baseline,
                    }
                )
        sha_speed = sha256_memory_speed()
    finally:
        shutil.rmtree(base, ignore_errors=True)

    load = os.getloadavg()[0]
    print(
        f"checkpoint: {args.size_gib:g} GiB in {args.files} files; "
        f"buffer {READ_BUFFER_BYTES >> 20} MiB; cpus {os.cpu_count()}; load {load:.1f}; "
        f"sha256 in memory {sha_speed / (1 << 30):.2f} GiB/s (one core)"
    )
    if load > (os.cpu_count() or 1) / 2:
        notes.append(
            "other work is running (load average above half the CPUs): sha256-bound ratios are low"
        )
    print(f"{'cache':<6} {'case':<34} {'seconds':>8} {'GiB/s':>7} {'vs raw':>7}")
    for r in rows:
        print(
            f"{r['cache']:<6} {r['case']:<34} {r['seconds']:8.3f} {r['GiB_per_s']:7.2f} "
            f"{r['ratio_to_raw']:7.2f}"
        )
    for n in notes:
        print(f"note: {n}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "size_gib": args.size_gib,
                "files": args.files,
                "repeat": args.repeat,
                "buffer_bytes": READ_BUFFER_BYTES,
                "cpus": os.cpu_count(),
                "load_average_1min": load,
                "machine": platform.platform(),
                "sha256_memory_GiB_per_s": sha_speed / (1 << 30),
                "rows": rows,
                "notes": notes,
                "target": "full verify / raw read >= 0.8",
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
