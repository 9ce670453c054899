#!/usr/bin/env python3
"""Strata's CPU AdamW kernel beside PyTorch's fused CPU AdamW, in one run, on the same number of parameters.

Runs bench/cpu_adamw_bench.cpp (build/bench/bench_cpu_adamw) with and without the bf16 parameter copy, each way
of storing (--stores; NOTE [CPU AdamW stores] in src/ops/cpu/CpuAdamW.cpp) timed back to back at each thread
count, then torch.optim.AdamW(fused=True) on one fp32 CPU parameter of the same size at the same thread counts,
and repeats that --rounds times, alternating, so that a slow spell of the host falls on both sides. Each figure
is the median over the rounds of each round's median step; the ratios divide Strata's by torch's of the same
invocation.

Bytes per parameter: Strata reads master, m, v and the gradient (16 B) and writes master, m, v and the bf16
copy of the parameter (14 B): 30 B, the update the trainer runs. Without the copy it moves what PyTorch's fused
step moves: 28 B, the like-for-like kernel comparison. Gparam/s is the figure to compare; GB/s says how close
each comes to the host's memory bandwidth.

Stores: plain (ordinary stores), copy (the parameter copy streamed, non-temporal; the default) and stream
(master, m and v streamed too). With the copy off, plain and copy are the same code.

Usage: python3 tools/bench_cpu_adam.py [--binary build/bench/bench_cpu_adamw] [--params 268435456]
                                       [--threads 8,16] [--repeats 5] [--rounds 3] [--isa best]
                                       [--split static] [--stores plain,copy,stream] [--prefetch 0]
--split static|steal picks how Strata's threads share the update (NOTE [CPU AdamW split]); STRATA_CPU_PIN=all in
the environment also pins Strata's calling thread. --prefetch 0,512 adds software-prefetch variants (elements
ahead), printed as STORES+pfN.
"""
import argparse
import statistics
import subprocess
import sys
import time

TORCH_BYTES = 28.0
LABELS = {"plain": "plain stores", "copy": "copy streamed", "stream": "all streamed"}


def run_strata(args, copy):
    """{(threads, variant): dict(isa, gparams, gbs)} of one bench_cpu_adamw run."""
    cmd = [args.binary, "--params", str(args.params), "--threads", args.threads, "--repeats", str(args.repeats),
           "--isa", args.isa, "--copy", copy, "--split", args.split, "--stores", args.stores,
           "--prefetch", args.prefetch]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write("".join(line + "\n" for line in proc.stdout.splitlines() if line.startswith(("cpu_adamw", "#"))))
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"bench_cpu_adamw failed with status {proc.returncode}")
    rows = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 9 and parts[0] == "cpu_adamw":
            _, isa, threads, params, ms, gparams, gbs, stores, prefetch = parts
            variant = stores if prefetch == "0" else f"{stores}+pf{prefetch}"
            rows[(int(threads), variant)] = dict(isa=isa, gparams=float(gparams), gbs=float(gbs))
    if not rows:
        sys.exit("bench_cpu_adamw printed no cpu_adamw lines")
    return rows


class Torch:
    def __init__(self, n):
        import torch

        self.torch = torch
        self.n = n
        torch.manual_seed(0)
        self.p = torch.nn.Parameter(torch.empty(n, dtype=torch.float32).uniform_(-0.5, 0.5))
        self.p.grad = torch.empty(n, dtype=torch.float32).uniform_(-0.01, 0.01)
        self.opt = torch.optim.AdamW([self.p], lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)

    def run(self, thread_counts, repeats):
        rows = {}
        for threads in thread_counts:
            self.torch.set_num_threads(threads)
            self.opt.step()  # warm-up (the first step also allocates exp_avg and exp_avg_sq)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                self.opt.step()
                times.append((time.perf_counter() - start) * 1e3)
            ms = statistics.median(times)
            rows[threads] = dict(gparams=self.n / (ms * 1e-3) / 1e9, gbs=self.n * TORCH_BYTES / (ms * 1e-3) / 1e9)
            print(f"torch_fused_adamw {threads} {self.n} {ms:.3f} {rows[threads]['gparams']:.3f} "
                  f"{rows[threads]['gbs']:.1f}", flush=True)
        return rows


def median_rows(rounds):
    """Per key, the median over rounds of gparams and gbs."""
    out = {}
    for key in rounds[0]:
        values = [r[key] for r in rounds if key in r]
        out[key] = dict(gparams=statistics.median(v["gparams"] for v in values),
                        gbs=statistics.median(v["gbs"] for v in values))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/bench/bench_cpu_adamw")
    ap.add_argument("--params", type=int, default=256 << 20)
    ap.add_argument("--threads", default="8,16")
    ap.add_argument("--repeats", type=int, default=5, help="timed steps per measurement (median)")
    ap.add_argument("--rounds", type=int, default=3, help="Strata and torch alternately, this many times")
    ap.add_argument("--isa", default="best", help="best, avx512, avx2 or scalar (one path)")
    ap.add_argument("--split", default="static", choices=["static", "steal"],
                    help="how Strata's threads share the update (one split)")
    ap.add_argument("--stores", default="plain,copy,stream", help="Strata's ways of storing, one column each")
    ap.add_argument("--prefetch", default="0", help="software prefetch distances in elements, 0: none")
    args = ap.parse_args()
    thread_counts = [int(t) for t in args.threads.split(",")]

    import torch

    peer = Torch(args.params)
    with_copy, no_copy, torch_rounds = [], [], []
    for r in range(args.rounds):
        print(f"# round {r + 1} of {args.rounds}", flush=True)
        with_copy.append(run_strata(args, "bf16"))
        no_copy.append(run_strata(args, "none"))
        torch_rounds.append(peer.run(thread_counts, args.repeats))
    isa = next(iter(with_copy[0].values()))["isa"]
    with_copy, no_copy, torch_rows = median_rows(with_copy), median_rows(no_copy), median_rows(torch_rounds)

    variants = []
    for threads, variant in with_copy:
        if variant not in variants:
            variants.append(variant)
    print()
    print(f"CPU AdamW, {args.params} fp32 parameters; medians over {args.rounds} alternating rounds of the median of "
          f"{args.repeats} steps. Strata (path {isa}, split {args.split}) with the bf16 parameter copy (30 B/param)"
          f" and without it (28 B/param), per way of storing; torch {torch.__version__} AdamW(fused=True) "
          f"({TORCH_BYTES:.0f} B/param). Gparam/s (GB/s), and Strata / torch.")
    def label(variant):
        stores, _, prefetch = variant.partition("+")
        return LABELS.get(stores, stores) + (f", {prefetch}" if prefetch else "")

    for title, rows in (("Strata with the bf16 copy (30 B/param)", with_copy),
                        ("Strata without the copy (28 B/param; plain and copy streamed are the same code)", no_copy)):
        print()
        print(title + ":")
        print()
        print(f"| threads | torch fused | " + " | ".join(label(v) for v in variants) + " | " +
              " | ".join(f"{label(v)} / torch" for v in variants) + " |")
        print("|---:|---:|" + "---:|" * (2 * len(variants)))
        for t in thread_counts:
            p = torch_rows.get(t)
            cells = [rows.get((t, v)) for v in variants]
            if p is None or any(c is None for c in cells):
                continue
            print(f"| {t} | {p['gparams']:.2f} ({p['gbs']:.0f}) | " +
                  " | ".join(f"{c['gparams']:.2f} ({c['gbs']:.0f})" for c in cells) + " | " +
                  " | ".join(f"**{c['gparams'] / p['gparams']:.2f}x**" for c in cells) + " |")


if __name__ == "__main__":
    main()
