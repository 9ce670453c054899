#!/usr/bin/env python3
"""bf16 GEMM: Strata (bench_gemm, cuBLASLt) and torch.matmul side by side, same shapes, one run, one GPU.

Usage: python3 tools/bench_gemm.py [--binary build/bench/bench_gemm] [--iters 50]
Prints a Markdown table. PyTorch is the peer only; Strata itself never runs Python.
"""
import argparse
import subprocess

import torch

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 6144, 2048), (8192, 8192, 2048), (8192, 2048, 8192)]
NAMES = {
    (4096, 4096, 4096): "4096³",
    (8192, 8192, 8192): "8192³",
    (8192, 6144, 2048): "GPT-1.3B qkv: 8192×2048 → 6144",
    (8192, 8192, 2048): "GPT-1.3B fc1: 8192×2048 → 8192",
    (8192, 2048, 8192): "GPT-1.3B fc2: 8192×8192 → 2048",
}


def torch_ms(m, n, k, iters):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, b)
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build/bench/bench_gemm")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    shape_args = [f"{m},{n},{k}" for m, n, k in SHAPES]
    out = subprocess.run([args.binary, "--iters", str(args.iters), *shape_args], check=True, capture_output=True,
                         text=True).stdout
    strata = {}
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "gemm":
            strata[(int(f[1]), int(f[2]), int(f[3]))] = (float(f[5]), float(f[6]), float(f[7]))
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print("| shape (M×K → N) | Strata TFLOP/s | torch TFLOP/s | Strata / torch | sampled rel. error |")
    print("|---|---|---|---|---|")
    for m, n, k in SHAPES:
        ms = torch_ms(m, n, k, args.iters)
        t_tflops = 2 * m * n * k / (ms * 1e-3) / 1e12
        s_ms, s_tflops, err = strata[(m, n, k)]
        print(f"| {NAMES[(m, n, k)]} | {s_tflops:.0f} | {t_tflops:.0f} | {s_tflops / t_tflops:.3f} | {err:.1e} |")


if __name__ == "__main__":
    main()
