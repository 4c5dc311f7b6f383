"""Classification throughput: ``trainguard classify`` against ``grep -c -E``, same file, same run.

Generates three realistic training/kernel logs (default 5 million lines each): a
quiet one (``generated``: about one failure line per 10,000, real lines from
tests/corpus/signatures.yaml and a few Python tracebacks among progress bars, NCCL
INFO lines, checkpoint messages and kernel noise), one with 30 % chatter that shares
words with failures (``chatter30``), and one where 2.5 % of the lines carry a
signature as a busy, healthy cluster repeats them (``signatures``: corrected AER
reports, c10d connect retries, EDAC CEs, XIDs, NCCL warnings). Then times, whole
command against whole command:

* ``trainguard classify --json FILE`` (output captured) with the Hyperscan matcher,
* the same with ``--engine portable`` (the fallback without Hyperscan),
* ``grep -c -E`` with the equivalent pattern set (every rule pattern and the
  traceback marker, translated to POSIX ERE; case-insensitive rules spelled
  with ``[xX]`` classes so one grep run matches exactly what the rules do),
* for reference, a line-by-line Python loop over ``classify_line`` on the first
  500,000 lines (in process).

``--baseline-src DIR`` times another tree's trainguard (e.g. a checkout of main's
``src/``: the code before a change) in the same run, on the same files; ``--only LOG``
benches one log.
Each command runs ``--repeat`` times (default 3; the slow portable fallback
``--portable-repeat``, default 1); the best wall time and the best CPU time (user +
system, the fairer figure on a shared machine) count; the first run of ``trainguard
classify`` fills its Hyperscan database cache.
Run: ``.venv/bin/python bench/classify_throughput.py [--lines N]``. Writes
bench/results/classify_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainguard.diagnose.rules import MARKERS, RULES  # noqa: E402
from trainguard.diagnose.signatures import classify_line  # noqa: E402

RESULTS = ROOT / "bench" / "results"
LOGS = ("generated", "chatter30", "signatures")


# --- the log -----------------------------------------------------------------------------


def _noise_line(rng: random.Random, step: int) -> str:
    r = rng.random()
    host = f"node{rng.randrange(1, 65):02d}"
    rank = rng.randrange(0, 64)
    if r < 0.30:
        return (
            f"[rank{rank}]: step={step} loss={rng.uniform(1.5, 3.5):.4f} lr=3.0e-04 "
            f"grad_norm={rng.uniform(0.2, 2.0):.3f} tokens/s={rng.randrange(150000, 200000)} "
            f"mem={rng.uniform(30, 70):.1f}GiB"
        )
    if r < 0.45:
        pct = rng.randrange(0, 100)
        return (
            f"Epoch {step // 1000}:  {pct}%|{'█' * (pct // 10)}{' ' * (10 - pct // 10)}| "
            f"{step % 1000}/1000 [02:13<02:43,  3.37it/s, loss={rng.uniform(0.1, 2):.3f}, v_num=12]"
        )
    if r < 0.62:
        return (
            f"{host}:{rng.randrange(1000, 99999)}:{rng.randrange(1000, 99999)} [{rank % 8}] "
            f"NCCL INFO Channel {rng.randrange(0, 32):02d}/32 :    0   1   2   3   4   5   6   7"
        )
    if r < 0.70:
        return (
            f"{host}:{rng.randrange(1000, 99999)}:{rng.randrange(1000, 99999)} [{rank % 8}] "
            f"NCCL INFO comm 0x{rng.getrandbits(40):x} rank {rank} nranks 64 cudaDev {rank % 8} "
            f"busId {rng.choice(['18000', '2a000', '3a000', '5d000'])} - Init COMPLETE"
        )
    if r < 0.78:
        ts = f"{rng.uniform(1, 999999):.6f}"
        return rng.choice(
            [
                f"[{ts:>13}] mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE",
                f"[{ts:>13}] EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode.",
                f"[{ts:>13}] NVRM: GPU at PCI:0000:c1:00: GPU-8a47641b-dff6-f09f-618c-c3eb58fb430d",
                f"[{ts:>13}] IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready",
                f"[{ts:>13}] nvidia-uvm: Loaded the UVM driver, major device number 511.",
            ]
        )
    if r < 0.86:
        return (
            f"Nov 29 12:{rng.randrange(60):02d}:{rng.randrange(60):02d} {host} "
            f"systemd[1]: Started Session {rng.randrange(1, 9999)} of User train."
        )
    if r < 0.92:
        return (
            f"[2025-11-29 12:00:{rng.randrange(60):02d},{rng.randrange(1000):03d}] [INFO] "
            f"[logging.py:96:log_dist] [Rank 0] step={step}, skipped=0, lr=[0.0001], "
            "mom=[(0.9, 0.999)]"
        )
    if r < 0.96:
        return (
            f"Saved checkpoint at step {step} to /ckpt/step_{step:08d} ({rng.uniform(2, 30):.1f} s)"
        )
    return (
        "/usr/lib/python3.10/site-packages/torch/utils/data/dataloader.py:558: UserWarning: "
        "This DataLoader will create 16 worker processes in total."
    )


def _chatter_line(rng: random.Random, step: int) -> str:
    """Healthy lines that share words with failures (issue 15's second log)."""
    host = f"node{rng.randrange(1, 65):02d}"
    rank = rng.randrange(0, 64)
    pid = f"{host}:{rng.randrange(1000, 99999)}:{rng.randrange(1000, 99999)} [{rank % 8}]"
    gpu = rng.randrange(8)
    r = rng.random()
    if r < 0.40:
        return rng.choice(
            [
                f"{pid} NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; "
                f"OOB ib0:10.0.0.{rank}<0>",
                f"{pid} NCCL INFO Channel {rng.randrange(32):02d}/0 : {rank}[{rank % 8}] -> "
                f"{(rank + 1) % 64}[{(rank + 1) % 8}] [send] via NET/IB/0/GDRDMA",
                f"{pid} NCCL INFO NCCL_IB_TIMEOUT set by environment to 22.",
                f"{pid} NCCL INFO Connected all rings",
                f"{pid} NCCL INFO [Service thread] Connection closed by localRank {rank % 8}",
                f"{pid} NCCL INFO comm 0x{rng.getrandbits(40):x} rank {rank} nranks 64 cudaDev "
                f"{rank % 8} busId 3a000 commId 0x{rng.getrandbits(60):x} - Init COMPLETE",
                f"{pid} NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)",
                f"{pid} NCCL INFO Using network IB",
            ]
        )
    if r < 0.50:
        return rng.choice(
            [
                f"{pid} NCCL WARN NUMA auto balancing enabled which can lead to variability",
                f"{pid} NCCL WARN Ignoring NCCL_P2P_LEVEL=NVL, NCCL_P2P_DISABLE is set",
            ]
        )
    if r < 0.80:
        return rng.choice(
            [
                f"GPU {gpu}: 0 uncorrectable ECC errors, {rng.randrange(5)} correctable",
                f"[health] gpu={gpu} ECC errors: 0 retired pages: none",
                f"[health] node={host} no XID errors in the last {rng.randrange(1, 60)} min",
                f"dcgm gpu={gpu} xid_errors=0 pcie_replay=0 nvlink_crc_errors=0",
                f"Volatile Uncorr. ECC: 0, Aggregate Uncorr. ECC: 0 (GPU {gpu})",
                f"nvlink: link {rng.randrange(18)} replay errors=0 recovery errors=0",
            ]
        )
    return rng.choice(
        [
            f"[rank{rank}]: eval step={step} Validation Error: {rng.uniform(0, 1):.4f}",
            f"epoch {step // 1000} Top-1 Error: {rng.uniform(10, 40):.2f} "
            f"Top-5 Error: {rng.uniform(1, 10):.2f}",
            f"metrics: MeanSquaredError: {rng.uniform(0, 1):.4f} "
            f"MeanAbsoluteError: {rng.uniform(0, 1):.4f}",
            f"reconstruction Error: {rng.uniform(0, 0.01):.5f}",
        ]
    )


def _signature_line(rng: random.Random, step: int) -> str:
    """A line that carries a signature, as a busy but healthy cluster repeats them:
    corrected AER reports, c10d connect retries during rendezvous, EDAC CEs, XIDs of a
    few cards, NCCL warnings (the third log: 2-3 % of its lines)."""
    ts = f"[{100000 + step / 1000:.6f}]"
    port, gpu = rng.choice([("0000:00:03.1", "0000:c1:00.0"), ("0000:80:01.1", "0000:41:00.0")])
    host = f"node{rng.randrange(1, 9):02d}"
    r = rng.random()
    if r < 0.35:
        return rng.choice(
            [
                f"{ts} pcieport {port}: AER: Corrected error received: {gpu}",
                f"{ts} nvidia {gpu}: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
                "(Receiver ID)",
                f"{ts} pcieport {port}: AER: Multiple Corrected error received: {gpu}",
            ]
        )
    if r < 0.60:
        us = f"{rng.randrange(1000000):06d}"
        return (
            f"[W1129 12:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{us} socket.cpp:558] "
            f"[c10d] The client socket has failed to connect to [{host}]:29500 "
            "(errno: 111 - Connection refused)."
        )
    if r < 0.70:
        return (
            f"Nov 29 12:{rng.randrange(60):02d}:{rng.randrange(60):02d} {host} kernel: "
            f"EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 "
            "slot:0 page:0x12345 offset:0x0 grain:32 syndrome:0x0)"
        )
    if r < 0.80:
        xid, msg = rng.choice(
            [
                (92, "High single-bit ECC error rate"),
                (63, "Row Remapper: New row marked for remapping, reset gpu to activate."),
                (13, "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"),
            ]
        )
        pid = rng.randrange(9999)
        return f"{ts} NVRM: Xid (PCI:{gpu[:-2]}): {xid}, pid={pid}, name=python, {msg}"
    return (
        f"{host}:{rng.randrange(1000, 99999)}:{rng.randrange(1000, 99999)} [{rng.randrange(8)}] "
        "NCCL WARN NET/IB : Got completion from peer 10.0.0.7<48017> with status=12 "
        "opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.8 remoteGids::ffff:10.0.0.7"
    )


def _failure_block(rng: random.Random, corpus: list[str]) -> list[str]:
    if rng.random() < 0.1:
        rank = rng.randrange(0, 64)
        return [
            f"[rank{rank}]: Traceback (most recent call last):",
            f'[rank{rank}]:   File "/home/u/train.py", line {rng.randrange(10, 900)}, in <module>',
            f"[rank{rank}]:     main()",
            f"[rank{rank}]: ValueError: batch {rng.randrange(99999)} has no labels",
        ]
    return [rng.choice(corpus)]


def generate(
    path: Path, lines: int, every: int, seed: int, chatter: float = 0.0, signatures: float = 0.0
) -> dict[str, int]:
    """The log; ``chatter`` is the share of lines from :func:`_chatter_line`,
    ``signatures`` the share from :func:`_signature_line`."""
    import yaml

    corpus = [
        e["text"]
        for e in yaml.safe_load((ROOT / "tests" / "corpus" / "signatures.yaml").read_text())
    ]
    rng = random.Random(seed)
    written = failures = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        buf: list[str] = []
        while written < lines:
            if rng.randrange(every) == 0:
                block = _failure_block(rng, corpus)
                failures += 1
            elif signatures and rng.random() < signatures:
                block = [_signature_line(rng, written)]
                failures += 1
            else:
                line = (
                    _chatter_line(rng, written)
                    if chatter and rng.random() < chatter
                    else _noise_line(rng, written)
                )
                block = [line]
            buf.extend(block)
            written += len(block)
            if len(buf) >= 50000:
                fh.write("\n".join(buf) + "\n")
                buf.clear()
        if buf:
            fh.write("\n".join(buf) + "\n")
    return {"lines": written, "failure_blocks": failures, "bytes": path.stat().st_size}


# --- the equivalent grep pattern set ----------------------------------------------------


def _to_ere(pattern: str, caseless: bool) -> str:
    """Translate the shared regex subset to GNU ERE (see diagnose/rules.py)."""
    out: list[str] = []
    i = 0
    in_class = False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            n = pattern[i + 1]
            i += 2
            if n == "d":
                out.append("0-9" if in_class else "[0-9]")
            elif n == "w":
                out.append("[:alnum:]_" if in_class else "[[:alnum:]_]")
            elif n == "S":
                out.append("[^[:space:]]")
            elif n == "t":
                out.append("\t")
            elif n == "b":
                out.append("\\b")
            elif n in "\"'":
                out.append(n)
            elif in_class:
                out.append(n)  # inside a bracket a backslash is literal in ERE
            else:
                out.append("\\" + n)
            continue
        if c == "(" and pattern.startswith("(?:", i):
            out.append("(")
            i += 3
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        if caseless and c.isalpha() and c.isascii() and not in_class:
            # Classes in the caseless rules already list both cases (A-Za-z, A-Fa-f).
            out.append(f"[{c.lower()}{c.upper()}]")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def grep_patterns() -> list[str]:
    pats = [_to_ere(p, r.caseless) for r in RULES for p in r.patterns]
    pats += [_to_ere(p, False) for p, _ in MARKERS]
    return pats


# --- timing -------------------------------------------------------------------------------


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _best(
    cmd: list[str], repeat: int, env: dict[str, str] | None = None
) -> tuple[float, float, bytes]:
    """Best wall time and best CPU time (user + system) of ``repeat`` runs, and the output
    of the last one. On a shared machine the CPU time is the fairer figure: it does not
    count the time the command waited for a core."""
    best = best_cpu = float("inf")
    out = b""
    for _ in range(repeat):
        cpu0 = _children_cpu()
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, check=False, env=env)
        dt = time.perf_counter() - t0
        cpu = _children_cpu() - cpu0
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"{cmd[:3]} failed ({proc.returncode}): {proc.stderr[:500]!r}")
        best, best_cpu = min(best, dt), min(best_cpu, cpu)
        out = proc.stdout
    return best, best_cpu, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=5_000_000)
    ap.add_argument("--every", type=int, default=10_000, help="one failure per N lines")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--portable-repeat", type=int, default=1, help="runs of the slow fallback")
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--keep", action="store_true", help="keep the generated logs")
    ap.add_argument(
        "--chatter", type=float, default=0.30, help="share of chatter lines in the second log"
    )
    ap.add_argument(
        "--signatures",
        type=float,
        default=0.025,
        help="share of signature lines in the third log (repeating, as a busy cluster's)",
    )
    ap.add_argument(
        "--baseline-src",
        type=Path,
        help="another tree's src/ (e.g. main's) timed in the same run, for before/after",
    )
    ap.add_argument("--only", choices=LOGS, action="append", help="bench only these logs")
    args = ap.parse_args()

    grep = shutil.which("grep")
    if grep is None:
        print("grep not found", file=sys.stderr)
        return 2
    results: dict[str, object] = {
        "env": {"LC_ALL": os.environ.get("LC_ALL"), "LANG": os.environ.get("LANG")}
    }
    shapes = {
        "generated": (0.0, 0.0, "quiet: one failure per 10,000 lines"),
        "chatter30": (args.chatter, 0.0, "NCCL chatter, zero counters, benign Error:"),
        "signatures": (0.0, args.signatures, "signature lines: AER, c10d retries, XIDs"),
    }
    for name in args.only or LOGS:
        chatter, sigs, what = shapes[name]
        print(f"--- log {name!r} ({max(chatter, sigs):.1%} {what})")
        results[name] = _bench_log(args, grep, name, chatter, sigs)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "classify_throughput.json").write_text(json.dumps(results, indent=2))
    return 0


def _tg(src: Path) -> tuple[list[str], dict[str, str]]:
    """The command and environment that time the trainguard of ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    return [sys.executable, "-m", "trainguard.cli", "classify", "--json"], env


def _bench_log(args: argparse.Namespace, grep: str, name: str, chatter: float, sigs: float) -> dict:
    log = RESULTS / f"classify_log_{name}_{args.lines}.txt"
    t0 = time.perf_counter()
    info = generate(log, args.lines, args.every, args.seed, chatter, sigs)
    gen_s = time.perf_counter() - t0
    n = info["lines"]
    print(
        f"generated {n:,} lines, {info['bytes'] / 1e6:.0f} MB, "
        f"{info['failure_blocks']} failure blocks in {gen_s:.1f} s"
    )

    pats = grep_patterns()
    grep_cmd = [grep, "-c", "-E", *[a for p in pats for a in ("-e", p)], str(log)]

    rows = []
    grep_s, grep_cpu, grep_out = _best(grep_cmd, args.repeat)
    rows.append(("grep -c -E (equivalent patterns)", grep_s, grep_cpu, int(grep_out.strip() or 0)))
    results: dict[str, object] = {"lines": n, "bytes": info["bytes"], "grep_patterns": len(pats)}
    trees = [("", ROOT / "src")]
    if args.baseline_src is not None:
        trees.append(("baseline ", args.baseline_src.resolve()))
    for tag, src in trees:
        tg, env = _tg(src)
        for engine, repeat in (("hyperscan", args.repeat), ("portable", args.portable_repeat)):
            s, cpu, out = _best([*tg, "--engine", engine, str(log)], repeat, env)
            label = f"{tag}trainguard classify --engine {engine}"
            rows.append((label, s, cpu, out.count(b"\n")))

    # Reference: what a line-by-line Python regex loop does, on a prefix of the file.
    sample = 500_000
    with open(log, encoding="utf-8") as fh:
        head = [next(fh) for _ in range(min(sample, n))]
    t0 = time.perf_counter()
    loop_found = sum(1 for line in head if classify_line(line) is not None)
    loop_s = time.perf_counter() - t0

    print()
    print(
        f"{'command':53} {'seconds':>8} {'lines/s':>12} {'vs grep':>8} "
        f"{'cpu s':>7} {'cpu vs grep':>11} {'lines':>7}"
    )
    for label, s, cpu, count in rows:
        rate = n / s
        ratio = grep_s / s
        cpu_ratio = grep_cpu / cpu
        print(
            f"{label:53} {s:8.2f} {rate:12,.0f} {ratio:8.2f} {cpu:7.2f} {cpu_ratio:11.2f} "
            f"{count:7d}"
        )
        key = label.split(" (")[0].replace(" ", "_").replace("-", "")
        results[key] = {
            "seconds": s,
            "lines_per_s": rate,
            "ratio_to_grep": ratio,
            "cpu_seconds": cpu,
            "cpu_ratio_to_grep": cpu_ratio,
            "found": count,
        }
    loop_rate = len(head) / loop_s
    print(
        f"{'python loop classify_line (first 500k lines)':53} {loop_s:8.2f} "
        f"{loop_rate:14,.0f} {loop_rate / (n / grep_s):8.2f} {loop_found:7d}"
    )
    print()
    results["python_line_loop"] = {
        "lines": len(head),
        "seconds": loop_s,
        "lines_per_s": loop_rate,
        "ratio_to_grep": loop_rate / (n / grep_s),
    }
    if not args.keep:
        log.unlink()
    return results


if __name__ == "__main__":
    sys.exit(main())
