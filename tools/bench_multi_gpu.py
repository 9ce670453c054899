#!/usr/bin/env python3
"""Multi-GPU training speed: Strata over N ranks (`mpirun -np N build/strata train`, ZeRO stages 2 and 3 over
NCCL) next to PyTorch FSDP2 (bf16 parameters, fp32 reduce) and DDP, same GPT shapes and per-GPU batch, in one
run. Also runs Strata on one GPU, so scaling is against our own figure from the same command. Prints a
Markdown table of TFLOP/s per GPU, scaling and peak memory.

Usage: python3 tools/bench_multi_gpu.py [--gpus 2] [--sizes 1.3b,6.7b] [--stages 2,3] [--iters 20] [--no-ddp]
Needs mpirun and torchrun; sets NCCL_NVLS_ENABLE=0 (NVLink multicast stays off on the lent machines).
The peers are launched as `torchrun ... tools/bench_multi_gpu.py --worker fsdp2|ddp ...`; PyTorch is the peer only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpt import GPT, SEQ, SHAPES, VOCAB, flops_per_token  # noqa: E402


def worker(kind, size, batch, iters):
    """One torchrun rank of the FSDP2 or DDP peer; rank 0 prints one JSON line."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    layers, d, h, _, _ = SHAPES[size]
    torch.manual_seed(0)
    model = GPT(layers, d, h).cuda()
    n = sum(p.numel() for p in model.parameters())
    autocast = kind == "ddp"
    if kind == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.h:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        step_model = model
    else:
        step_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, VOCAB, (batch, SEQ), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = step_model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    dt = (time.time() - t0) / iters
    peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30], device="cuda")
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        tok = batch * SEQ / dt  # per GPU
        print("RESULT " + json.dumps(dict(ms=dt * 1e3, tflops=tok * flops_per_token(n, layers, d) / 1e12,
                                          mem=peak.item(), world=world)), flush=True)
    dist.destroy_process_group()


def run_peer(kind, gpus, size, batch, iters, env):
    cmd = ["torchrun", "--standalone", f"--nproc_per_node={gpus}", os.path.abspath(__file__), "--worker", kind,
           "--size", size, "--batch", str(batch), "--iters", str(iters)]
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"{kind} peer failed ({out.returncode}):\n" + "\n".join(out.stdout.splitlines()[-30:]), flush=True)
    return None


def run_strata(binary, gpus, cfg, stage, batch, iters, data, env):
    out = tempfile.mkdtemp(prefix="strata-mgpu-")
    cmd = (["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(gpus), "-x", "NCCL_NVLS_ENABLE"]
           if gpus > 1 else []) + [
        binary, "train", cfg, "--set", f"data.path={data}", "--set", "data.format=nanogpt",
        "--set", f"model.seq_length={SEQ}", "--set", f"train.micro_batch_size={batch}",
        "--set", f"train.global_batch_size={batch * gpus}", "--set", f"train.train_iters={iters + 10}",
        "--set", "train.log_interval=10", "--set", "train.eval_interval=0", "--set", "lr_schedule.warmup_iters=0",
        "--set", f"zero_optimization.stage={stage}", "--set", f"train.out_dir={out}", "--set", "train.device=cuda"]
    run = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if run.returncode != 0:
        print(f"strata failed ({run.returncode}):\n" + "\n".join(run.stdout.splitlines()[-30:]), flush=True)
        return None
    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if "loss" in l]
    last = recs[-1]  # the intervals after the first exclude warm-up
    return dict(ms=last["ms_per_iter"], tflops=last["tflops"], mem=last.get("mem_gpu_peak_gb", float("nan")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=["fsdp2", "ddp"])
    ap.add_argument("--size", default="1.3b")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--binary", default="build/strata")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--sizes", default="1.3b")
    ap.add_argument("--stages", default="2,3")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-ddp", action="store_true")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.size, args.batch or SHAPES[args.size][3], args.iters)
    import numpy as np
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    data = os.path.join(tempfile.mkdtemp(), "random.bin")
    np.random.default_rng(0).integers(0, VOCAB, size=20_000_000, dtype=np.uint16).tofile(data)
    print(f"{args.gpus} GPUs, seq {SEQ}, bf16; TFLOP/s per GPU; scaling = per-GPU TFLOP/s over Strata's one-GPU "
          "figure (stage 0) from this run")
    print("| model | batch/GPU | run | TFLOP/s per GPU | scaling | ms/step | peak GiB |")
    print("|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        layers, d, h, batch, cfg = SHAPES[size]
        rows = []
        one = run_strata(args.binary, 1, cfg, 0, batch, args.iters, data, env)
        rows.append(("Strata, 1 GPU, stage 0", one))
        for stage in [int(s) for s in args.stages.split(",")]:
            rows.append((f"Strata, stage {stage}",
                         run_strata(args.binary, args.gpus, cfg, stage, batch, args.iters, data, env)))
        rows.append(("FSDP2 (bf16 params, fp32 reduce)", run_peer("fsdp2", args.gpus, size, batch, args.iters, env)))
        if not args.no_ddp:
            rows.append(("DDP (autocast bf16)", run_peer("ddp", args.gpus, size, batch, args.iters, env)))
        for name, r in rows:
            if r is None:
                print(f"| {size} | {batch} | {name} | failed | | | |", flush=True)
                continue
            scale = f"{r['tflops'] / one['tflops']:.3f}" if one else "-"
            print(f"| {size} | {batch} | {name} | {r['tflops']:.0f} | {scale} | {r['ms']:.0f} | {r['mem']:.1f} |",
                  flush=True)
        results = dict(rows)
        fsdp = results.get("FSDP2 (bf16 params, fp32 reduce)")
        for name, r in rows:
            if name.startswith("Strata, stage") and r and fsdp:
                print(f"{size}: {name} / FSDP2 = {r['tflops'] / fsdp['tflops']:.2f}", flush=True)


if __name__ == "__main__":
    main()
