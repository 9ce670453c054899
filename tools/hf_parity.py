#!/usr/bin/env python3
"""Parity of Strata's GPT-2 124M with HF transformers' GPT2LMHeadModel, in fp32 on the GPU.

1. Export: Strata's initial weights (configs/gpt2-124m.yaml, its seed) are written in HF's layout and names, loaded
   into GPT2LMHeadModel, and both run one forward and backward on the same tokens: logits, loss and every
   parameter's gradient are compared.
2. Import: HF's own initial weights are loaded into Strata and compared the same way.

Usage: python3 tools/hf_parity.py [--binary build/bench/gpt_parity] [--batch 2] [--seq 128]
Exit status 1 when a tolerance is missed (logits: max abs diff <= 1e-4; gradients: relative L2 diff <= 1e-3).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 50304


def hf_model():
    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=VOCAB,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     layer_norm_epsilon=1e-5, tie_word_embeddings=True)
    try:
        model = GPT2LMHeadModel(cfg, attn_implementation="eager")
    except TypeError:
        model = GPT2LMHeadModel(cfg)
    return model.cuda().float().eval()


def hf_run(model, tokens):
    x, y = tokens[:, :-1].cuda(), tokens[:, 1:].cuda()
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=x).logits
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach() for n, p in model.named_parameters()}
    return logits.detach(), loss.detach(), grads


def compare(title, strata, logits, loss, grads):
    ok = True
    dl = (strata["logits"].cuda() - logits).abs().max().item()
    dloss = abs(strata["loss"].item() - loss.item())
    print(f"{title}: logits max |diff| {dl:.2e} (<= 1e-4), loss Strata {strata['loss'].item():.6f} "
          f"HF {loss.item():.6f} |diff| {dloss:.2e}")
    ok &= dl <= 1e-4 and dloss <= 1e-4
    worst, worst_name = 0.0, ""
    for name, g in grads.items():
        s = strata["grad." + name].cuda()
        rel = ((s - g).norm() / g.norm().clamp_min(1e-30)).item()
        if rel > worst:
            worst, worst_name = rel, name
    print(f"{title}: {len(grads)} gradients, worst relative L2 diff {worst:.2e} ({worst_name}) (<= 1e-3)")
    ok &= worst <= 1e-3
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build/bench/gpt_parity")
    ap.add_argument("--config", default="configs/gpt2-124m.yaml")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tmp = tempfile.mkdtemp(prefix="strata-parity-")
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, VOCAB, size=(args.batch, args.seq + 1)))
    tok_path = os.path.join(tmp, "tokens.bin")
    tokens.numpy().astype(np.int64).tofile(tok_path)
    common = [args.binary, "--config", args.config, "--tokens", tok_path, "--batch", str(args.batch),
              "--seq", str(args.seq), "--device", "cuda"]

    # 1. Strata's weights into HF.
    exported, dump = os.path.join(tmp, "strata_init.safetensors"), os.path.join(tmp, "strata_out.safetensors")
    subprocess.run(common + ["--export", exported, "--dump", dump], check=True)
    model = hf_model()
    missing, unexpected = model.load_state_dict(load_file(exported), strict=False)
    assert not unexpected, unexpected
    assert all(k == "lm_head.weight" or k.endswith("attn.bias") or k.endswith("masked_bias") for k in missing), missing
    model.tie_weights()
    ok = compare("export (Strata init -> HF)", load_file(dump), *hf_run(model, tokens))

    # 2. HF's weights into Strata.
    fresh = hf_model()
    hf_weights = {k: v.detach().cpu().contiguous() for k, v in fresh.state_dict().items()
                  if k.startswith("transformer.") and not k.endswith("attn.bias") and not k.endswith("masked_bias")}
    imported, dump2 = os.path.join(tmp, "hf_init.safetensors"), os.path.join(tmp, "strata_out2.safetensors")
    save_file(hf_weights, imported)
    subprocess.run(common + ["--import", imported, "--dump", dump2], check=True)
    ok &= compare("import (HF init -> Strata)", load_file(dump2), *hf_run(fresh, tokens))
    print("PARITY OK" if ok else "PARITY FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
