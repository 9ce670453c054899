#!/usr/bin/env python3
"""Causal attention, bf16: Strata's fused kernel (bench_attention) and torch SDPA (flash / cuDNN backend as
PyTorch picks it) side by side, same shapes, one run. Prints a Markdown table of forward and backward TFLOP/s
(causal FLOPs: half the square).

Usage: python3 tools/bench_attention.py [--binary build/bench/bench_attention] [--iters 20]
"""
import argparse
import subprocess

import torch
import torch.nn.functional as F

SHAPES = [(16, 512, 16, 128), (8, 1024, 16, 128), (4, 2048, 16, 128), (32, 512, 12, 64), (4, 2048, 32, 64)]


def median_ms(fn, iters, reps=10):
    """Median over `iters` samples of the mean of `reps` back-to-back calls: enough queued work that PyTorch's
    per-call host overhead (autograd) does not leave the GPU idle between kernels."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    times.sort()
    return times[len(times) // 2]


def torch_times(B, S, H, D, iters):
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), iters)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    bwd = median_ms(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True), iters)
    return fwd, bwd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build/bench/bench_attention")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    out = subprocess.run([args.binary, "--iters", str(args.iters), *[",".join(map(str, s)) for s in SHAPES]],
                         check=True, capture_output=True, text=True).stdout
    strata = {}
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "attn":
            strata[tuple(int(x) for x in f[1:5])] = tuple(float(x) for x in f[5:9])
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  causal, bf16")
    print("| B, S, H, D | fwd TFLOP/s Strata / torch | ratio | bwd TFLOP/s Strata / torch | ratio |")
    print("|---|---|---|---|---|")
    for s in SHAPES:
        B, S, H, D = s
        flops = 4.0 * B * H * S * S * D / 2
        tf, tb = torch_times(B, S, H, D, args.iters)
        tft, tbt = flops / (tf * 1e-3) / 1e12, 2.5 * flops / (tb * 1e-3) / 1e12
        _, sf, _, sb = strata[s]
        print(f"| {B}, {S}, {H}, {D} | {sf:.0f} / {tft:.0f} | {sf / tft:.2f} | {sb:.0f} / {tbt:.0f} | {sb / tbt:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
