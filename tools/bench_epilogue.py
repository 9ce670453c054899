#!/usr/bin/env python3
"""The GELU MLP's GEMMs, bf16: Strata (bench_epilogue: plain cuBLASLt GEMMs and the epilogue-fused forms it uses)
beside torch's mm/addmm and its GELU kernels (eager, and the forward/backward GELU passes torch.compile emits),
same shapes, one run, one GPU. Shows which epilogues pay against a plain GEMM plus a separate pass.

Usage: python3 tools/bench_epilogue.py [--binary build/bench/bench_epilogue] [--iters 20]
PyTorch is the peer only; Strata itself never runs Python.
"""
import argparse
import subprocess

import torch
import torch.nn.functional as F
from peer_timing import median_ms

SHAPES = [(16384, 768, 3072), (8192, 2048, 8192)]  # GPT-2 124M (micro batch 32) and GPT-3 1.3B (16), seq 512


def torch_times(t, d, f, iters):
    r = lambda *s, std=1.0: torch.randn(*s, device="cuda", dtype=torch.bfloat16) * std
    x, w1, b1, w2, b2 = r(t, d), r(f, d, std=0.02), r(f, std=0.02), r(d, f, std=0.02), r(d, std=0.02)
    pre, g, dpre = r(t, f), r(t, d), r(t, f)
    h = F.gelu(pre, approximate="tanh")
    gelu_c = torch.compile(lambda p: F.gelu(p, approximate="tanh"))
    gelu_bwd = torch.compile(lambda gg, p: torch.ops.aten.gelu_backward(gg, p, approximate="tanh"))
    return {
        "fc_plain": median_ms(lambda: x @ w1.T, iters),
        "fc_bias": median_ms(lambda: F.linear(x, w1, b1), iters),
        "gelu_pass": median_ms(lambda: gelu_c(pre), iters),
        "proj_bias": median_ms(lambda: F.linear(h, w2, b2), iters),
        "dh_plain": median_ms(lambda: g @ w2, iters),
        "gelu_backward_pass": median_ms(lambda: gelu_bwd(dpre, pre), iters),
        "dw2_plain": median_ms(lambda: g.T @ h, iters),
        "dw1_plain": median_ms(lambda: dpre.T @ x, iters),
        "dx_plain": median_ms(lambda: dpre @ w1, iters),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build/bench/bench_epilogue")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    out = subprocess.run([args.binary, "--iters", str(args.iters), *[f"{t},{d},{f}" for t, d, f in SHAPES]],
                         check=True, capture_output=True, text=True).stdout
    strata = {}
    for line in out.splitlines():
        p = line.split()
        if p and p[0] == "epi":
            strata.setdefault(tuple(map(int, p[1:4])), {})[p[4]] = float(p[5])
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    for t, d, f in SHAPES:
        s, tt = strata[(t, d, f)], torch_times(t, d, f, args.iters)
        flops = 2.0 * t * d * f
        print(f"\n### T={t} D={d} F={f} (ms; TFLOP/s for GEMMs)")
        print("| step | Strata ms | Strata TFLOP/s | torch ms | torch TFLOP/s |")
        print("|---|---|---|---|---|")
        for name, ms in s.items():
            pt = tt.get(name)
            gemm = "gelu" not in name or "aux" in name
            sf = f"{flops / ms / 1e9:.0f}" if gemm else "-"
            tf = f"{flops / pt / 1e9:.0f}" if pt and gemm else "-"
            print(f"| {name} | {ms:.3f} | {sf} | {pt if pt else float('nan'):.3f} | {tf} |")
        fused = s["fc_gelu_aux_bias"] + s["dh_dgelu"] + s["dw2_bgrad"] + s["dw1_bgrad"]
        split = s["fc_bias"] + s["gelu_pass"] + s["dh_plain"] + s["gelu_backward_pass"] + s["dw2_bgrad"] + s["dw1_bgrad"]
        print(f"\nStrata's fused fc/dh/dW path {fused:.3f} ms against plain GEMMs + separate GELU passes {split:.3f} ms "
              f"(proj and dx the same in both)")


if __name__ == "__main__":
    main()
