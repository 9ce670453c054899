#!/usr/bin/env python3
"""`strata convert --hf` end to end: HF transformers loads the converted directory and continues text as Strata does.

1. Trains gpt-nano briefly with `build/strata train` and saves a checkpoint.
2. `strata convert CKPT OUT_DIR --hf` writes model.safetensors and config.json.
3. transformers' GPT2LMHeadModel.from_pretrained(OUT_DIR) must load every weight (no missing or unexpected keys
   but the causal-mask buffers), and its greedy continuation of a prompt, in fp32 on the CPU, must equal
   `strata generate --temperature 0 --top-k 1 --device cpu` token for token.

Usage: python3 tools/hf_load_check.py [--binary build/strata] [--iters 300] [--tokens 64]
Exit status 1 when a check fails.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
from transformers import GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build/strata")
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", default="ROMEO:\n")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="strata-hf-load-")
    ckpt = os.path.join(work, "ckpt")
    subprocess.run([args.binary, "train", "configs/gpt-nano.yaml", "--set", f"train.out_dir={work}/run",
                    "--set", f"checkpoint.save={ckpt}", "--set", f"train.train_iters={args.iters}",
                    "--set", "train.eval_interval=0", "--set", "train.sample_length=0", "--set",
                    "lr_schedule.warmup_iters=20"], check=True, stdout=subprocess.DEVNULL)
    hf_dir = os.path.join(work, "hf")
    subprocess.run([args.binary, "convert", ckpt, hf_dir, "--hf"], check=True)
    model, info = GPT2LMHeadModel.from_pretrained(hf_dir, output_loading_info=True)
    model = model.float().eval()
    missing = [k for k in info["missing_keys"] if not k.endswith(("attn.bias", "attn.masked_bias"))]
    unexpected = info["unexpected_keys"]
    ok = not missing and not unexpected and not info.get("mismatched_keys")
    print(f"from_pretrained: {sum(p.numel() for p in model.parameters())} parameters, missing {missing}, "
          f"unexpected {unexpected}, mismatched {info.get('mismatched_keys')}")

    ids = list(args.prompt.encode())
    x = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(args.tokens):
            logits = model(input_ids=x[:, -model.config.n_positions:]).logits
            x = torch.cat([x, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    hf_text = bytes(x[0, len(ids):].tolist()).decode("latin-1")
    out = subprocess.run([args.binary, "generate", ckpt, "--prompt", args.prompt, "--tokens", str(args.tokens),
                          "--temperature", "0", "--top-k", "1", "--device", "cpu"], check=True,
                         capture_output=True).stdout
    start = len(args.prompt.encode())
    strata_text = out[start:start + args.tokens].decode("latin-1")
    same = 0
    while same < min(len(hf_text), len(strata_text)) and hf_text[same] == strata_text[same]:
        same += 1
    print(f"greedy continuation of {args.prompt!r}: {same} of {args.tokens} tokens equal")
    print(f"  HF:     {hf_text!r}\n  Strata: {strata_text!r}")
    ok &= same == args.tokens
    print("hf load check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
