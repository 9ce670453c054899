#!/usr/bin/env python3
"""ZeRO-3's chunk arena on and off, on the same config, back to back: `build/strata bench CONFIG --iters N --set
zero_optimization.stage=3 --set store.arena=true`, then the same with `store.arena=false`, each its own process (so
neither inherits the other's allocator cache). Prints a Markdown table, one row per run as soon as it is measured:
step time, peak allocated and peak reserved device memory, fragmentation (reserved but unused when the reserve
peaked: NOTE [Fragmentation] in include/strata/core/Allocator.h), failed cudaMalloc calls and flushes of the cache to
retry them, the most chunks gathered at once, and the arena's slots and bytes (part of the allocated bytes: each
slot is sized for the largest chunk, in use or not). The memory figures cover the bench's warm-up and measured
steps; the step time only the measured ones.

Usage: python3 tools/bench_arena.py [CONFIG] [--iters 10] [--set key=value ...] [--binary build/strata]
           [--timeout 600] [--dry-run]
CONFIG defaults to configs/gpt3-1.3b.yaml. Extra --set values go to both runs (e.g. --set
zero_optimization.prefetch_depth=4 --set zero_optimization.chunk_size_mb=32). Runs from the repository root.
"""
import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BENCH_RE = re.compile(r"^bench (\S+): (\d+) measured iterations after (\d+) warm-up \| ([\d.]+) ms/iter \| "
                      r"([\d.]+) tokens/s \| ([\d.]+) TFLOP/s \| MFU ([\d.]+)%(.*)$")


def parse_bench(output):
    """The last `bench ...` line of `strata bench`'s output: ms, tokens/s, TFLOP/s, then every `| name X GiB`
    as name -> GiB and every `| name N` count as name -> int."""
    found = None
    for line in output.splitlines():
        m = BENCH_RE.match(line.strip())
        if m:
            found = m
    if not found:
        return None
    rest = found.group(8)
    out = {"ms": float(found.group(4)), "tokens": float(found.group(5)), "tflops": float(found.group(6))}
    out["gib"] = {k: float(v) for k, v in re.findall(r"\|\s*(\w+) ([\d.]+) GiB", rest)}
    out["counts"] = {k: int(v) for k, v in re.findall(r"\|\s*(\w+) (-?\d+)(?=\s*(?:\||$))", rest)}
    return out


def command(args, arena):
    cmd = [args.binary, "bench", args.config, "--iters", str(args.iters), "--set", "zero_optimization.stage=3"]
    for kv in args.set:
        cmd += ["--set", kv]
    return cmd + ["--set", f"store.arena={'true' if arena else 'false'}"]


def cell(value, fmt="{:.2f}"):
    return "n/a" if value is None else fmt.format(value)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", default="configs/gpt3-1.3b.yaml")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--set", action="append", default=[], help="a config override for both runs")
    ap.add_argument("--binary", default="build/strata")
    ap.add_argument("--timeout", type=float, default=600, help="seconds each run may take")
    ap.add_argument("--dry-run", action="store_true", help="print the two commands and stop")
    args = ap.parse_args()
    os.chdir(ROOT)
    if args.dry_run:
        for arena in (True, False):
            print(" ".join(command(args, arena)))
        return 0
    print(f"ZeRO-3 chunk arena on and off: {args.config}, {args.iters} warm-up + {args.iters} measured iterations"
          + (f", {' '.join(args.set)}" if args.set else ""))
    print()
    print("| store.arena | ms/iter | tokens/s | peak allocated GiB | peak reserved GiB | fragmentation GiB | "
          "failed cudaMalloc | cache flushes | chunks gathered at most | arena slots | arena GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    sys.stdout.flush()
    failed = False
    for arena in (True, False):
        cmd = command(args, arena)
        start = time.time()
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=args.timeout)
            output, status = p.stdout, p.returncode
        except subprocess.TimeoutExpired as e:
            # The output captured so far comes as bytes whatever `text` says.
            captured = e.stdout or b""
            output = captured.decode(errors="replace") if isinstance(captured, bytes) else captured
            status = None
        r = parse_bench(output) if status == 0 else None
        if r is None:
            failed = True
            why = "timed out" if status is None else f"exit status {status}"
            tail = [line for line in output.splitlines() if line.strip()][-3:]
            print(f"| {str(arena).lower()} | failed ({why}; {' / '.join(tail)}) ||||||||||")
            sys.stdout.flush()
            continue
        g, c = r["gib"], r["counts"]
        print(f"| {str(arena).lower()} | {r['ms']:.1f} | {r['tokens']:.0f} | {cell(g.get('gpu_peak'))} | "
              f"{cell(g.get('reserved_peak'))} | {cell(g.get('frag'))} | {cell(c.get('alloc_failures'), '{}')} | "
              f"{cell(c.get('alloc_retries'), '{}')} | {cell(c.get('gathered_peak'), '{}')} | "
              f"{cell(c.get('arena_slots'), '{}') if arena else '-'} | {cell(g.get('arena')) if arena else '-'} |")
        sys.stdout.flush()
        print(f"<!-- {' '.join(cmd)}: {time.time() - start:.0f} s -->", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
