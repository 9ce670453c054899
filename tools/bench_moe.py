#!/usr/bin/env python3
"""GPT-MoE and recomputation on one GPU: Strata (`build/strata train`) beside a PyTorch peer, same shapes, one run.

Usage: python3 tools/bench_moe.py [--mode moe|recompute|all] [--iters 20] [--skip-compile] [--profile]

--mode moe: the GPT-3 1.3B shape dense, and with 8 experts (top-1, capacity 1.25) in every other block, so
  both have ~1.3B active parameters; tokens/s and TFLOP/s (active FLOPs) for Strata and an eager PyTorch
  peer (and torch.compile, which may fail on the data-dependent dispatch: then '-'). The MoE overhead is the
  MoE step's time beyond the dense step's: router, top-k, dispatch and combine gathers (the expert GEMMs do
  the dense MLP's FLOPs or fewer). --profile prints Strata's op profile of both, with the matmul share.
--mode recompute: train.recompute none / selective / full at 1.3B (batch 16) and 6.7B (batch 8): peak GPU
  memory and tokens/s.
The token stream is random GPT-2-sized ids (speed does not depend on the text). PyTorch is the peer only.
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SEQ, VOCAB = 512, 50304
EXPERTS, CAPACITY = 8, 1.25


def strata(binary, cfg, batch, iters, data, sets=(), profile=False):
    out = tempfile.mkdtemp(prefix="strata-bench-")
    cmd = [binary, "train", cfg, "--set", f"data.path={data}", "--set", "data.format=nanogpt",
           "--set", f"model.seq_length={SEQ}", "--set", f"train.micro_batch_size={batch}",
           "--set", f"train.global_batch_size={batch}", "--set", f"train.train_iters={iters + 10}",
           "--set", "train.log_interval=10", "--set", "train.eval_interval=0", "--set", "lr_schedule.warmup_iters=0",
           "--set", f"train.out_dir={out}", "--set", "train.device=cuda"]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, STRATA_PROFILE="1" if profile else "0")
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    if run.returncode != 0:
        print(f"strata failed ({run.returncode}): {' '.join(sets)}\n" + "\n".join(run.stdout.splitlines()[-15:]))
        return None
    if profile:
        lines = run.stdout.splitlines()
        start = next((i for i, l in enumerate(lines) if "profile of" in l), None)
        if start is not None:
            end = next(i for i in range(start, len(lines)) if lines[i].startswith("total"))
            print("\n".join(lines[start:end + 1]))
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if "loss" in l]
    last = recs[-1]  # intervals after the first exclude warm-up
    return dict(ms=last["ms_per_iter"], tok=last["tokens_per_s"], tflops=last["tflops"],
                mem=last.get("mem_gpu_peak_gb", float("nan")), dropped=last.get("moe_dropped", 0.0))


class Mlp(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc, self.fc_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return self.fc_proj(F.gelu(self.fc(x), approximate="tanh"))


class MoE(nn.Module):
    """Switch top-1 with capacity: fp32 router, tokens sorted by expert, one expert call per expert, dropped
    tokens give zero (the residual carries them), Switch load-balancing loss."""

    def __init__(self, d, experts):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(Mlp(d) for _ in range(experts))

    def forward(self, x):
        B, T, C = x.shape
        xf = x.reshape(-1, C)
        n, E = xf.shape[0], len(self.experts)
        with torch.autocast("cuda", enabled=False):
            probs = F.softmax(F.linear(xf.float(), self.router.weight.float()), dim=-1)
        weight, choice = probs.max(dim=-1)
        capacity = max(1, int(np.ceil(CAPACITY * n / E)))
        order = torch.argsort(choice, stable=True)
        counts = torch.bincount(choice, minlength=E)
        starts = torch.cumsum(counts, 0) - counts
        rank_in_expert = torch.arange(n, device=x.device) - starts[choice[order]]
        keep = order[rank_in_expert < capacity]
        y = torch.zeros_like(xf)
        kept_choice = choice[keep]
        for e, expert in enumerate(self.experts):
            idx = keep[kept_choice == e]
            if idx.numel():
                y.index_copy_(0, idx, expert(xf[idx]) * weight[idx, None].to(x.dtype))
        f = torch.bincount(choice, minlength=E).float() / n
        self.aux = E * (f * probs.mean(0)).sum()
        return y.view(B, T, C)


class Block(nn.Module):
    def __init__(self, d, h, moe):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = MoE(d, EXPERTS) if moe else Mlp(d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers, d, h, moe):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, d), nn.Embedding(SEQ, d)
        self.h = nn.ModuleList(Block(d, h, moe and (i + 1) % 2 == 0) for i in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        loss = F.cross_entropy(logits.view(-1, VOCAB).float(), targets.view(-1))
        aux = [b.mlp.aux for b in self.h if isinstance(b.mlp, MoE)]
        return loss + 0.01 * sum(aux) if aux else loss


def peer(layers, d, h, batch, iters, moe, compile_model):
    torch.manual_seed(0)
    model = GPT(layers, d, h, moe).cuda()
    active = sum(p.numel() for n, p in model.named_parameters() if ".experts." not in n or ".experts.0." in n)
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

    try:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        t0 = time.time()
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    except Exception as e:  # torch.compile of the data-dependent dispatch
        print(f"peer ({'compile' if compile_model else 'eager'}, moe={moe}) failed: {type(e).__name__}: "
              f"{str(e).splitlines()[0][:200]}")
        return None
    finally:
        mem = torch.cuda.max_memory_allocated() / 2**30
    dt = (time.time() - t0) / iters
    tok = batch * SEQ / dt
    result = dict(ms=dt * 1e3, tok=tok, tflops=tok * (6 * active + 12 * layers * d * SEQ) / 1e12, mem=mem)
    del model, opt, step_model, x
    import gc
    gc.collect()
    torch.cuda.empty_cache()
    return result


def fmt(r, key, spec):
    return format(r[key], spec) if r else "-"


def moe_mode(args, data):
    layers, d, h, batch, cfg = 24, 2048, 16, 16, "configs/gpt3-1.3b.yaml"
    moe_sets = [f"model.moe_num_experts={EXPERTS}", "model.moe_top_k=1", "model.moe_every=2",
                f"model.moe_capacity_factor={CAPACITY}"]
    print(f"\nGPT-3 1.3B shape (24 x 2048), seq {SEQ}, batch {batch}, bf16, AdamW; MoE: {EXPERTS} experts, top-1, "
          f"capacity {CAPACITY}, every other block")
    print("| model | Strata tokens/s | eager tokens/s | compile tokens/s | Strata TFLOP/s (active) | Strata/eager "
          "| Strata/compile | peak GiB Strata / eager | Strata dropped |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = {}
    for name, moe in (("dense 1.3B", False), ("MoE 8x, 1.3B active", True)):
        s = strata(args.binary, cfg, batch, args.iters, data, moe_sets if moe else (), args.profile)
        e = peer(layers, d, h, batch, args.iters, moe, False)
        c = peer(layers, d, h, batch, args.iters, moe, True) if not args.skip_compile else None
        rows[name] = s
        ratio = lambda a, b: f"{a['tok'] / b['tok']:.2f}" if a and b else "-"
        print(f"| {name} | {fmt(s, 'tok', '.0f')} | {fmt(e, 'tok', '.0f')} | {fmt(c, 'tok', '.0f')} "
              f"| {fmt(s, 'tflops', '.0f')} | {ratio(s, e)} | {ratio(s, c)} | {fmt(s, 'mem', '.1f')} / "
              f"{fmt(e, 'mem', '.1f')} | {fmt(s, 'dropped', '.3f')} |", flush=True)
    dense, moe = rows.get("dense 1.3B"), rows.get("MoE 8x, 1.3B active")
    if dense and moe:
        print(f"\nStrata MoE overhead: {moe['ms'] - dense['ms']:.0f} ms of a {moe['ms']:.0f} ms step "
              f"({(moe['ms'] - dense['ms']) / moe['ms'] * 100:.1f}%), over 12 MoE layers")


def recompute_mode(args, data):
    print(f"\nRecomputation, seq {SEQ}, bf16, AdamW, one H200")
    print("| model | batch | recompute | tokens/s | TFLOP/s | peak GPU GiB | tokens/s vs none |")
    print("|---|---|---|---|---|---|---|")
    shapes = [("1.3B", "configs/gpt3-1.3b.yaml", 16), ("6.7B", "configs/gpt3-6.7b.yaml", 8)]
    shapes += [("6.7B", "configs/gpt3-6.7b.yaml", b) for b in args.big_batches]
    for name, cfg, batch in shapes:
        base = None
        for mode in ("none", "selective", "full"):
            s = strata(args.binary, cfg, batch, args.iters, data, [f"train.recompute={mode}"])
            base = base or s
            rel = f"{s['tok'] / base['tok']:.2f}" if s and base else "-"
            print(f"| {name} | {batch} | {mode} | {fmt(s, 'tok', '.0f')} | {fmt(s, 'tflops', '.0f')} "
                  f"| {fmt(s, 'mem', '.1f')} | {rel} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build/strata")
    ap.add_argument("--mode", default="all", choices=["moe", "recompute", "all"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--big-batches", type=lambda v: [int(b) for b in v.split(",") if b], default=[],
                    help="recompute mode: further 6.7B micro batches (where recomputation makes room)")
    args = ap.parse_args()
    data = os.path.join(tempfile.mkdtemp(), "random.bin")
    np.random.default_rng(0).integers(0, VOCAB, size=20_000_000, dtype=np.uint16).tofile(data)
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    if args.mode in ("moe", "all"):
        moe_mode(args, data)
    if args.mode in ("recompute", "all"):
        recompute_mode(args, data)


if __name__ == "__main__":
    main()
