#!/usr/bin/env python3
"""The LM head and cross-entropy, forward + backward, bf16: Strata (bench_head, the chunked fused head) beside
PyTorch's `x @ w.T` + F.cross_entropy on fp32 logits (as the GPT peer of bench_gpt.py computes its loss), eager
and torch.compile, same shapes, one run, one GPU.

Usage: python3 tools/bench_head.py [--binary build/bench/bench_head] [--iters 10] [--chunks 0,4096,8192,16384]
Prints a Markdown table per shape and Strata's parts. PyTorch is the peer only; Strata itself never runs Python.
"""
import argparse
import subprocess

import torch
import torch.nn.functional as F
from peer_timing import median_ms

SHAPES = [(16384, 50304, 768), (16384, 50304, 2048)]  # GPT-2 124M and GPT-3 1.3B, micro batch 32/16 x 512


def peer_ms(n, v, c, iters, compiled):
    x = (torch.randn(n, c, device="cuda", dtype=torch.bfloat16) * 0.5).requires_grad_()
    w = (torch.randn(v, c, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")

    def head(x, w, t):
        return F.cross_entropy((x @ w.T).float(), t)

    fn = torch.compile(head) if compiled else head

    def step():
        fn(x, w, t).backward()
        x.grad = None
        w.grad = None

    ms = median_ms(step, iters)
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return ms, peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build/bench/bench_head")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--chunks", default="0,4096,8192,16384")
    args = ap.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    cases = [",".join(str(f) for f in (n, v, c, *chunks)) for n, v, c in SHAPES]
    out = subprocess.run([args.binary, "--iters", str(args.iters), *cases], check=True, capture_output=True,
                         text=True).stdout
    heads, parts = {}, {}
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "head":
            heads.setdefault(tuple(map(int, f[1:4])), []).append((int(f[4]), float(f[5])))
        elif f and f[0] == "part":
            parts.setdefault(tuple(map(int, f[1:4])), []).append((int(f[4]), f[5], float(f[6])))
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    for n, v, c in SHAPES:
        flops = 6.0 * n * v * c
        eager, eager_gib = peer_ms(n, v, c, args.iters, False)
        comp, comp_gib = peer_ms(n, v, c, args.iters, True)
        print(f"\n### N={n} V={v} C={c}: forward + backward")
        print("| what | ms | TFLOP/s | / compile |")
        print("|---|---|---|---|")
        for chunk, ms in heads[(n, v, c)]:
            name = f"Strata, chunk rows {chunk}" if chunk else "Strata, default chunks"
            print(f"| {name} | {ms:.3f} | {flops / ms / 1e9:.0f} | {comp / ms:.3f} |")
        print(f"| torch eager (peak {eager_gib:.1f} GiB) | {eager:.3f} | {flops / eager / 1e9:.0f} | {comp / eager:.3f} |")
        print(f"| torch.compile (peak {comp_gib:.1f} GiB) | {comp:.3f} | {flops / comp / 1e9:.0f} | 1.000 |")
        print("\n| Strata part (all rows) | chunk rows | ms |")
        print("|---|---|---|")
        for rows, name, ms in parts[(n, v, c)]:
            print(f"| {name} | {rows} | {ms:.3f} |")


if __name__ == "__main__":
    main()
