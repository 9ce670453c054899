#!/usr/bin/env python3
"""Strata's CPU AdamW kernel beside PyTorch's fused CPU AdamW, in one run, on the same number of parameters.

Runs bench/cpu_adamw_bench.cpp (build/bench/bench_cpu_adamw) twice, then torch.optim.AdamW(fused=True) on
one fp32 CPU parameter of the same size, at the same thread counts, and prints a markdown table with all
three and the ratios.

Bytes per parameter: Strata reads master, m, v and the gradient (16 B) and writes master, m, v and the bf16
copy of the parameter (14 B): 30 B, the update the trainer runs. Without the copy (the second run) it moves
what PyTorch's fused step moves: 28 B, the like-for-like kernel comparison. Gparam/s is the figure to
compare; GB/s says how close each comes to the host's memory bandwidth.

Usage: python3 tools/bench_cpu_adam.py [--binary build/bench/bench_cpu_adamw] [--params 268435456]
                                       [--threads 1,2,4,8,16] [--repeats 5] [--isa best] [--split static]
--split static|steal picks how Strata's threads share the update (NOTE [CPU AdamW split]); STRATA_CPU_PIN=all in
the environment also pins Strata's calling thread.
"""
import argparse
import statistics
import subprocess
import sys
import time

TORCH_BYTES = 28.0


def run_strata(args, copy):
    cmd = [args.binary, "--params", str(args.params), "--threads", args.threads, "--repeats", str(args.repeats),
           "--isa", args.isa, "--copy", copy, "--split", args.split]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"bench_cpu_adamw failed with status {proc.returncode}")
    rows = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 7 and parts[0] == "cpu_adamw":
            _, isa, threads, params, ms, gparams, gbs = parts
            rows[int(threads)] = dict(isa=isa, ms=float(ms), gparams=float(gparams), gbs=float(gbs))
    if not rows:
        sys.exit("bench_cpu_adamw printed no cpu_adamw lines")
    return rows


def run_torch(args, thread_counts):
    import torch

    n = args.params
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.empty(n, dtype=torch.float32).uniform_(-0.5, 0.5))
    p.grad = torch.empty(n, dtype=torch.float32).uniform_(-0.01, 0.01)
    opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    rows = {}
    for threads in thread_counts:
        torch.set_num_threads(threads)
        opt.step()  # warm-up (the first step also allocates exp_avg and exp_avg_sq)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            opt.step()
            times.append((time.perf_counter() - start) * 1e3)
        ms = statistics.median(times)
        rows[threads] = dict(ms=ms, gparams=n / (ms * 1e-3) / 1e9, gbs=n * TORCH_BYTES / (ms * 1e-3) / 1e9)
        print(f"torch_fused_adamw {threads} {n} {ms:.3f} {rows[threads]['gparams']:.3f} {rows[threads]['gbs']:.1f}",
              flush=True)
    return rows, torch.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/bench/bench_cpu_adamw")
    ap.add_argument("--params", type=int, default=256 << 20)
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--isa", default="best", help="best, avx512, avx2 or scalar (one path: the table has one column)")
    ap.add_argument("--split", default="static", choices=["static", "steal"],
                    help="how Strata's threads share the update (one split: the table has one column)")
    args = ap.parse_args()
    thread_counts = [int(t) for t in args.threads.split(",")]

    with_copy = run_strata(args, "bf16")
    no_copy = run_strata(args, "none")
    torch_rows, torch_version = run_torch(args, thread_counts)

    isa = next(iter(with_copy.values()))["isa"]
    print()
    print(f"CPU AdamW, {args.params} fp32 parameters, median of {args.repeats} steps. Strata: path {isa}, with the "
          f"bf16 parameter copy (30 B/param) and without it (28 B/param); torch {torch_version} "
          f"AdamW(fused=True) ({TORCH_BYTES:.0f} B/param). Gparam/s (GB/s).")
    print()
    print("| threads | Strata + bf16 copy | Strata, no copy | torch fused | Strata + copy / torch | "
          "Strata no copy / torch |")
    print("|---:|---:|---:|---:|---:|---:|")
    for t in thread_counts:
        s, n, p = with_copy.get(t), no_copy.get(t), torch_rows.get(t)
        if s is None or n is None or p is None:
            continue
        print(f"| {t} | {s['gparams']:.2f} ({s['gbs']:.0f}) | {n['gparams']:.2f} ({n['gbs']:.0f}) | "
              f"{p['gparams']:.2f} ({p['gbs']:.0f}) | {s['gparams'] / p['gparams']:.2f}x | "
              f"{n['gparams'] / p['gparams']:.2f}x |")

if __name__ == "__main__":
    main()
