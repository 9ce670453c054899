#!/usr/bin/env python3
"""GPT training speed: Strata (`build/strata train`) and a nanoGPT-style PyTorch peer, eager and torch.compile,
same shapes, one GPU, one run. Prints a Markdown table.

Usage: python3 tools/bench_gpt.py [--sizes 124m,1.3b] [--iters 30] [--skip-compile] [--skip-fp8]
                                 [--fp8-lm-head] [--profile | --profile-gpu]
--profile also prints Strata's op profile (STRATA_PROFILE=1) and the eager peer's top CUDA kernels.
The fp8 columns are Strata with precision.fp8: true (the Linear layers' GEMMs in FP8; with --fp8-lm-head the
LM head's too, precision.fp8_lm_head) against the same bf16 peers; TFLOP/s counts the model's FLOPs alike for all.
The token stream is random GPT-2-sized ids (speed does not depend on the text). PyTorch is the peer only.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {  # name: (layers, hidden, heads, micro batch, config)
    "124m": (12, 768, 12, 32, "configs/gpt2-124m.yaml"),
    "1.3b": (24, 2048, 16, 16, "configs/gpt3-1.3b.yaml"),
    "2.7b": (32, 2560, 32, 16, "configs/gpt3-2.7b.yaml"),
    "6.7b": (32, 4096, 32, 8, "configs/gpt3-6.7b.yaml"),
}
SEQ, VOCAB = 512, 50304


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, d, h):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, d), nn.Embedding(SEQ, d)
        self.h = nn.ModuleList(Block(d, h) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, VOCAB).float(), targets.view(-1))


def flops_per_token(n_params, layers, d):
    return 6 * n_params + 12 * layers * d * SEQ


def peer(layers, d, h, batch, iters, compile_model, profile=False):
    torch.manual_seed(0)
    model = GPT(layers, d, h).cuda()
    n = sum(p.numel() for p in model.parameters())  # the head is tied to wte: counted once
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step_model = torch.compile(model) if compile_model else model
    x = torch.randint(0, VOCAB, (batch, SEQ), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    dt = (time.time() - t0) / iters
    tok = batch * SEQ / dt
    if profile:
        from torch.profiler import profile as tprofile, ProfilerActivity
        with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        kind = "compile" if compile_model else "eager"
        print(f"{kind} peer, 3 steps, top CUDA kernels:\n"
              + prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=60))
    result = dict(ms=dt * 1e3, tok=tok, tflops=tok * flops_per_token(n, layers, d) / 1e12,
                  mem=torch.cuda.max_memory_allocated() / 2**30, params=n)
    # Hand the memory back: the next Strata run is another process and needs the whole GPU.
    del model, opt, step_model, x
    import gc
    gc.collect()
    torch.cuda.empty_cache()
    return result


def strata(binary, cfg, batch, iters, data, profile=False, gemm_backend=None, fp8=False, fp8_lm_head=False):
    out = tempfile.mkdtemp(prefix="strata-bench-")
    cmd = [binary, "train", cfg, "--set", f"data.path={data}", "--set", "data.format=nanogpt",
           "--set", f"model.seq_length={SEQ}", "--set", f"train.micro_batch_size={batch}",
           "--set", f"train.global_batch_size={batch}", "--set", f"train.train_iters={iters + 10}",
           "--set", "train.log_interval=10", "--set", "train.eval_interval=0", "--set", "lr_schedule.warmup_iters=0",
           "--set", f"train.out_dir={out}", "--set", "train.device=cuda"]
    if fp8:
        cmd += ["--set", "precision.fp8=true"]
        if fp8_lm_head:
            cmd += ["--set", "precision.fp8_lm_head=true"]
    env = dict(os.environ, STRATA_PROFILE=profile or "0")
    if gemm_backend:
        env["STRATA_GEMM_BACKEND"] = gemm_backend
    run = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, env=env, text=True)
    if profile:
        lines = run.stdout.splitlines()
        start = next((i for i, l in enumerate(lines) if "profile of" in l), None)
        if start is not None:
            end = next(i for i in range(start, len(lines)) if lines[i].startswith("total"))
            print("\n".join(lines[start:end + 1]))
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if "loss" in l]
    last = recs[-1]  # intervals after the first exclude warm-up
    return dict(ms=last["ms_per_iter"], tok=last["tokens_per_s"], tflops=last["tflops"],
                mem=last.get("mem_gpu_peak_gb", float("nan")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build/strata")
    ap.add_argument("--sizes", default="124m")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--profile", action="store_true", help="Strata's op profile (synchronised) and the eager peer's")
    ap.add_argument("--profile-gpu", action="store_true",
                    help="Strata's op profile timed with events (STRATA_PROFILE=gpu) and the compile peer's kernels")
    ap.add_argument("--skip-fp8", action="store_true", help="no Strata run with precision.fp8: true")
    ap.add_argument("--fp8-lm-head", action="store_true", help="the fp8 run's LM head in FP8 too")
    ap.add_argument("--gemm-backends", default="",
                    help="comma list of STRATA_GEMM_BACKEND values (lt, cublas): one Strata row each, same peers")
    args = ap.parse_args()
    data = os.path.join(tempfile.mkdtemp(), "random.bin")
    np.random.default_rng(0).integers(0, VOCAB, size=20_000_000, dtype=np.uint16).tofile(data)
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  seq {SEQ}, bf16")
    print("| model | batch | Strata TFLOP/s | Strata fp8 TFLOP/s | eager TFLOP/s | compile TFLOP/s | Strata/eager "
          "| Strata/compile | Strata fp8/compile | tokens/s Strata / fp8 / eager / compile "
          "| peak GiB Strata / fp8 / eager / compile |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.sizes.split(","):
        layers, d, h, batch, cfg = SHAPES[name]
        mode = "gpu" if args.profile_gpu else "1" if args.profile else None
        backends = [b for b in args.gemm_backends.split(",") if b] or [None]
        runs = [(b, strata(args.binary, cfg, batch, args.iters, data, mode, b)) for b in backends]
        f = None
        if not args.skip_fp8:
            try:
                f = strata(args.binary, cfg, batch, args.iters, data, mode, None, fp8=True,
                           fp8_lm_head=args.fp8_lm_head)
            except subprocess.CalledProcessError as e:  # the bf16 columns still print
                print(f"Strata fp8 at {name} failed with exit status {e.returncode}", file=sys.stderr)
        e = peer(layers, d, h, batch, args.iters, False, args.profile)
        c = peer(layers, d, h, batch, args.iters, True, args.profile_gpu) if not args.skip_compile else None
        ct = f"{c['tflops']:.0f}" if c else "-"
        ft = f"{f['tflops']:.0f}" if f else "-"
        fr = f"{f['tflops'] / c['tflops']:.2f}" if f and c else "-"
        for b, s in runs:
            cr = f"{s['tflops'] / c['tflops']:.2f}" if c else "-"
            label = f"{name} (gemm {b})" if b else name
            print(f"| {label} | {batch} | {s['tflops']:.0f} | {ft} | {e['tflops']:.0f} | {ct} "
                  f"| {s['tflops'] / e['tflops']:.2f} | {cr} | {fr} "
                  f"| {s['tok']:.0f} / {f['tok'] if f else 0:.0f} / {e['tok']:.0f} / {c['tok'] if c else 0:.0f} "
                  f"| {s['mem']:.1f} / {f['mem'] if f else 0:.1f} / {e['mem']:.1f} / {c['mem'] if c else 0:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
