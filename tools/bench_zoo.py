#!/usr/bin/env python3
"""BERT-large and T5-base training speed: Strata (`build/strata bench`) beside HF transformers' BertForPreTraining and
T5ForConditionalGeneration, eager and torch.compile, same shapes and batch, one GPU, one run. Prints a Markdown table.

Shapes: configs/zoo/bert-large.yaml (24 layers, hidden 1024, seq 512, MLM + NSP heads, dropout 0.1) and
configs/zoo/t5-base.yaml (v1.0: 12 + 12 layers, d_model 768, ReLU, tied head, encoder 512 / decoder 128, dropout 0.1).
Both sides train in bf16 (Strata: bf16 parameters with fp32 masters; HF: bf16 autocast over fp32 weights) with fused
AdamW, on micro-batches of the configs' size (16 unless --bert-batch / --t5-batch say otherwise).

The HF peers get the batch Strata's own objective makes (`build/bench/zoo_parity --inputs`, one micro-batch of the
config on random tokens): BERT's [CLS] A [SEP] B [SEP] with 15% masked, token types and next-sentence labels; T5's
span-corrupted encoder input and targets (the decoder input is the targets shifted right). So both sides run the same
sequence lengths, the same number of MLM labels and the same heads.

Throughput counts what Strata's trainer counts: B x model.seq_length tokens per step (the encoder's 512 for T5), and
TFLOP/s = tokens/s x the architecture's own training FLOPs per token (`strata info` prints it: BERT 6 x the
multiplied parameters + 12 L d s; T5 per encoder token, with the decoder's and cross-attention's work at 128 targets),
the same number for both sides. (T5's span corruption fills 114 of the 128 decoder positions at these lengths, and
the formula counts 128: both sides' TFLOP/s carry the same few percent of credit for it.) Peak memory: torch.cuda.max_memory_allocated for HF, Strata's own allocator peak.

Usage: python3 tools/bench_zoo.py [--models bert-large,t5-base] [--iters 20] [--skip-compile]
About 4-5 minutes on one H200 with torch.compile (the compiles take most of it), under 2 without.
"""
import argparse
import gc
import json
import os
import re
import subprocess
import tempfile
import time

import torch
from safetensors.torch import load_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CONFIGS = {"bert-large": "configs/zoo/bert-large.yaml", "t5-base": "configs/zoo/t5-base.yaml"}


def strata_info(binary, config, batch):
    text = subprocess.run([binary, "info", config, "--set", f"train.micro_batch_size={batch}"], check=True,
                          capture_output=True, text=True).stdout
    flops = float(re.search(r"^FLOPs/token\s+(\S+)", text, re.M).group(1))
    params = int(re.search(r"^parameters\s+(\d+)", text, re.M).group(1))
    return flops, params


def strata_batch(parity_binary, config, batch, tmp):
    """One micro-batch as Strata's objective makes it for the config (model inputs by HF argument names)."""
    path = os.path.join(tmp, "batch.safetensors")
    # The inputs do not depend on the depth: one layer per stack builds fast on the CPU.
    subprocess.run([parity_binary, "--config", config, "--set", "train.device=cpu", "--set", "model.num_layers=1",
                    "--set", "model.decoder_num_layers=1", "--set",
                    f"train.micro_batch_size={batch}", "--set", f"train.out_dir={os.path.join(tmp, 'parity')}",
                    "--inputs", path, "--batches", "1"], check=True, stdout=subprocess.DEVNULL)
    return {k[:-2]: v.cuda() for k, v in load_file(path).items()}  # "input_ids.0" -> "input_ids"


def strata_bench(binary, config, batch, iters, tmp):
    env = dict(os.environ, TMPDIR=tmp)  # strata bench writes its metrics under $TMPDIR/strata-bench
    subprocess.run([binary, "bench", config, "--iters", str(iters), "--set", "train.device=cuda",
                    "--set", f"train.micro_batch_size={batch}", "--set", f"train.global_batch_size={batch}"],
                   check=True, stdout=subprocess.DEVNULL, env=env)
    recs = [json.loads(l) for l in open(os.path.join(tmp, "strata-bench", "metrics.jsonl")) if '"loss"' in l]
    last = recs[-1]  # the measured interval (the first one holds the warm-up)
    return dict(ms=last["ms_per_iter"], tok=last["tokens_per_s"], tflops=last["tflops"],
                mem=last.get("mem_gpu_peak_gb", float("nan")))


def hf_model(name):
    from transformers import BertConfig, BertForPreTraining, T5Config, T5ForConditionalGeneration
    torch.manual_seed(0)
    if name == "bert-large":
        cfg = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                         intermediate_size=4096, max_position_embeddings=512, type_vocab_size=2, hidden_act="gelu",
                         hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, layer_norm_eps=1e-12)
        return BertForPreTraining(cfg)
    cfg = T5Config(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_decoder_layers=12,
                   num_heads=12, relative_attention_num_buckets=32, relative_attention_max_distance=128,
                   dropout_rate=0.1, layer_norm_epsilon=1e-6, feed_forward_proj="relu", tie_word_embeddings=True,
                   pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    return T5ForConditionalGeneration(cfg)


def hf_bench(name, inputs, batch, seq, flops_per_token, iters, compile_model):
    model = hf_model(name).cuda().train()
    n = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, fused=True)
    step_model = torch.compile(model) if compile_model else model
    torch.cuda.reset_peak_memory_stats()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
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
    tok = batch * seq / dt
    result = dict(ms=dt * 1e3, tok=tok, tflops=tok * flops_per_token / 1e12,
                  mem=torch.cuda.max_memory_allocated() / 2**30, params=n)
    del model, opt, step_model
    gc.collect()
    torch.cuda.empty_cache()  # the next Strata run is another process and needs the whole GPU
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default="build/strata")
    ap.add_argument("--parity-binary", default="build/bench/zoo_parity")
    ap.add_argument("--models", default="bert-large,t5-base")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--bert-batch", type=int, default=16)
    ap.add_argument("--t5-batch", type=int, default=16)
    ap.add_argument("--skip-compile", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="strata-bench-zoo-")
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  bf16, fused AdamW")
    rows = []
    for name in args.models.split(","):
        config = os.path.join(ROOT, CONFIGS[name])
        batch = args.bert_batch if name == "bert-large" else args.t5_batch
        seq = 512
        flops, params = strata_info(args.binary, config, batch)
        inputs = strata_batch(args.parity_binary, config, batch, tmp)
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in inputs.items())
        try:
            s = strata_bench(args.binary, config, batch, args.iters, tmp)
        except subprocess.CalledProcessError as err:  # the other model's row still comes
            print(f"{name}: strata bench failed ({err.returncode}); rerun it by hand to see why", flush=True)
            continue
        e = hf_bench(name, inputs, batch, seq, flops, args.iters, False)
        c = hf_bench(name, inputs, batch, seq, flops, args.iters, True) if not args.skip_compile else None
        print(f"{name}: {params / 1e6:.0f}M parameters (HF {e['params'] / 1e6:.0f}M), {flops:.4g} FLOPs/token; "
              f"batch {shapes}", flush=True)
        rows.append((name, batch, s, e, c))
    print()
    print("| model | batch | Strata TFLOP/s | eager TFLOP/s | compile TFLOP/s | Strata/eager | Strata/compile "
          "| tokens/s Strata / eager / compile | ms/step Strata / eager / compile | peak GiB Strata / eager / compile |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, batch, s, e, c in rows:
        f = lambda r, k, fmt: format(r[k], fmt) if r else "-"
        cr = f"{s['tflops'] / c['tflops']:.2f}" if c else "-"
        print(f"| {name} | {batch} | {s['tflops']:.0f} | {e['tflops']:.0f} | {f(c, 'tflops', '.0f')} "
              f"| {s['tflops'] / e['tflops']:.2f} | {cr} "
              f"| {s['tok']:.0f} / {e['tok']:.0f} / {f(c, 'tok', '.0f')} "
              f"| {s['ms']:.0f} / {e['ms']:.0f} / {f(c, 'ms', '.0f')} "
              f"| {s['mem']:.1f} / {e['mem']:.1f} / {f(c, 'mem', '.1f')} |", flush=True)


if __name__ == "__main__":
    main()
