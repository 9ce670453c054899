#!/usr/bin/env python3
"""FP8 against bf16 over a long run: GPT-2 124M trained twice from the same seed on the same batches, once with
precision.fp8: true and once without, then the fp8-trained model evaluated in bf16 by HF transformers.

1. The curves: both runs' training losses as 10-step averages; the worst and the last relative gap of fp8 to bf16.
2. The meaning: the fp8 run's last checkpoint goes through `strata convert --hf` into `GPT2LMHeadModel`, which
   evaluates it in bf16 (no FP8 anywhere) over every window of the held-out split; its loss is set beside the fp8
   run's own last validation loss. The bf16 run's checkpoint is evaluated the same way, as the reference.

The corpus is byte tokens of a text file (so the held-out split is the file's last bytes, as Strata splits it:
`data.val_fraction`): the embedded tiny Shakespeare (1.1 MB, which a 124M model passes over many times in 2,000
steps and starts to memorise), or with --corpus a file or a folder, whose .py, .txt, .rst and .md files are
joined in path order into one file, installed packages left out (`--corpus stdlib`: this Python's standard
library, tens of MB of source and docs on any machine with Python, so the run stays within about one pass).

Usage: python3 tools/fp8_curve.py [--binary build/strata] [--steps 2000] [--batch 16] [--seq 512] [--lr 6e-4]
                                  [--corpus PATH|stdlib] [--out DIR]
Exit status 1 when a 10-step average or the HF evaluation misses its tolerance (--tol, default 1 %).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_SHAKESPEARE = os.path.join(ROOT, "data", "tinyshakespeare.txt")
VAL_FRACTION = 0.1


def corpus_file(spec, out):
    """The corpus as one text file: spec itself, or a folder's text files joined (see the top)."""
    if not spec:
        return TINY_SHAKESPEARE
    if spec == "stdlib":
        import sysconfig
        spec = sysconfig.get_paths()["stdlib"]
    if os.path.isfile(spec):
        return spec
    if not os.path.isdir(spec):
        sys.exit(f"--corpus {spec}: neither a file nor a folder")
    paths = []
    for root, dirs, files in os.walk(spec):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__"))
        paths += [os.path.join(root, f) for f in sorted(files) if f.endswith((".py", ".txt", ".rst", ".md"))]
    joined = os.path.join(out, "corpus.txt")
    with open(joined, "wb") as w:
        for path in paths:
            with open(path, "rb") as r:
                w.write(r.read())
            w.write(b"\n")
    print(f"corpus: {len(paths)} files of {spec}, {os.path.getsize(joined) / 1e6:.1f} MB", file=sys.stderr)
    return joined


def eval_iters(corpus, seq, batch):
    """Enough evaluation batches to cover the held-out split about 1.5 times (HF evaluates every window)."""
    windows = int(os.path.getsize(corpus) * VAL_FRACTION) // seq
    return max(20, min(1000, -(-3 * windows // (2 * batch))))


def train(args, fp8, out):
    cmd = [args.binary, "train", os.path.join(ROOT, "configs/gpt2-124m.yaml"), "--overwrite",
           "--set", f"data.path={args.corpus}", "--set", "data.format=text", "--set", "data.tokenizer=byte",
           "--set", f"data.val_fraction={VAL_FRACTION}",
           "--set", f"train.train_iters={args.steps}", "--set", f"model.seq_length={args.seq}",
           "--set", f"train.micro_batch_size={args.batch}", "--set", f"train.global_batch_size={args.batch}",
           "--set", "train.log_interval=1", "--set", f"train.eval_interval={max(1, args.steps // 4)}",
           "--set", f"train.eval_iters={eval_iters(args.corpus, args.seq, args.batch)}",
           "--set", "train.sample_length=0",
           "--set", f"optimizer.lr={args.lr}", "--set", f"lr_schedule.warmup_iters={max(1, args.steps // 20)}",
           "--set", f"lr_schedule.decay_iters={args.steps}",
           "--set", f"train.out_dir={out}", "--set", f"checkpoint.save={out}/checkpoints",
           "--set", f"precision.fp8={'true' if fp8 else 'false'}"]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    with open(os.path.join(out + ".log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        sys.exit(f"strata train (fp8={fp8}) failed with {rc}: see {out}.log")
    steps, vals = {}, {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "val_loss" in r:
                vals[r["step"]] = r["val_loss"]
            elif "loss" in r:
                steps[r["step"]] = r
    return steps, vals


def hf_val_loss(binary, checkpoint_root, seq, hf_dir, corpus):
    subprocess.run([binary, "convert", checkpoint_root, hf_dir, "--hf"], check=True, stdout=subprocess.DEVNULL)
    model = GPT2LMHeadModel.from_pretrained(hf_dir, torch_dtype=torch.bfloat16).cuda().eval()
    data = np.frombuffer(open(corpus, "rb").read(), dtype=np.uint8).astype(np.int64)
    val = data[len(data) - int(len(data) * VAL_FRACTION):]
    windows = [val[i:i + seq + 1] for i in range(0, len(val) - seq - 1, seq)]
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(windows), 16):
            batch = torch.tensor(np.stack(windows[i:i + 16])).cuda()
            logits = model(batch[:, :-1]).logits.float()
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1), reduction="sum")
            total += loss.item()
            count += batch[:, 1:].numel()
    return total / count


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build/strata"))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--tol", type=float, default=0.01)
    ap.add_argument("--corpus", default="", help="a text file, a folder of text files, or stdlib")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp()
    os.makedirs(out, exist_ok=True)
    corpus_name = os.path.basename(args.corpus.rstrip("/")) if args.corpus else "tiny Shakespeare"
    args.corpus = corpus_file(args.corpus, out)
    bf16, bf16_val = train(args, False, os.path.join(out, "bf16"))
    fp8, fp8_val = train(args, True, os.path.join(out, "fp8"))

    def avg(run, end):
        return sum(run[s]["loss"] for s in range(end - 9, end + 1)) / 10

    def speed(run):
        ms = [run[s]["ms_per_iter"] for s in sorted(run) if s > 10]
        tok = [run[s]["tokens_per_s"] for s in sorted(run) if s > 10]
        return sorted(ms)[len(ms) // 2], sorted(tok)[len(tok) // 2]

    ends = [s for s in range(10, args.steps + 1, 10) if all(t in bf16 and t in fp8 for t in range(s - 9, s + 1))]
    gaps = [(abs(avg(fp8, s) - avg(bf16, s)) / avg(bf16, s), s) for s in ends]
    worst, worst_at = max(gaps)
    print(f"GPU: {torch.cuda.get_device_name()}; GPT-2 124M, {corpus_name} bytes "
          f"({os.path.getsize(args.corpus) / 1e6:.1f} MB), batch {args.batch} x {args.seq}, "
          f"lr {args.lr}, {args.steps} steps")
    print("\n| step | bf16 loss (10-step avg) | fp8 loss (10-step avg) | gap |")
    print("|---|---|---|---|")
    shown = sorted(set([ends[0]] + [s for s in ends if s % max(10, (args.steps // 10) // 10 * 10) == 0] + [worst_at]))
    for s in shown:
        a, b = avg(bf16, s), avg(fp8, s)
        print(f"| {s} | {a:.4f} | {b:.4f} | {100 * (b - a) / a:+.2f}% |")
    last_gap = gaps[-1][0]
    print(f"\nworst gap of 10-step averages: {100 * worst:.2f}% at step {worst_at}; last: {100 * last_gap:.2f}%")
    bms, btok = speed(bf16)
    fms, ftok = speed(fp8)
    print(f"median speed: bf16 {bms:.1f} ms/step ({btok:.0f} tokens/s), fp8 {fms:.1f} ms/step ({ftok:.0f} tokens/s)")

    last = max(fp8_val)
    hf_fp8 = hf_val_loss(args.binary, os.path.join(out, "fp8", "checkpoints"), args.seq, os.path.join(out, "hf-fp8"),
                         args.corpus)
    hf_bf16 = hf_val_loss(args.binary, os.path.join(out, "bf16", "checkpoints"), args.seq,
                          os.path.join(out, "hf-bf16"), args.corpus)
    print("\n| model | Strata val loss (its own precision) | HF bf16 val loss | gap |")
    print("|---|---|---|---|")
    print(f"| trained in fp8 | {fp8_val[last]:.4f} | {hf_fp8:.4f} | {100 * (hf_fp8 - fp8_val[last]) / fp8_val[last]:+.2f}% |")
    print(f"| trained in bf16 | {bf16_val[last]:.4f} | {hf_bf16:.4f} | "
          f"{100 * (hf_bf16 - bf16_val[last]) / bf16_val[last]:+.2f}% |")
    hf_gap = abs(hf_fp8 - fp8_val[last]) / fp8_val[last]
    print(f"\nHF bf16 evaluation, fp8-trained against bf16-trained model: {hf_fp8:.4f} against {hf_bf16:.4f} "
          f"({100 * (hf_fp8 - hf_bf16) / hf_bf16:+.2f}%)")
    print("\n| step | bf16 val loss | fp8 val loss | gap |")
    print("|---|---|---|---|")
    for s in sorted(set(bf16_val) & set(fp8_val)):
        print(f"| {s} | {bf16_val[s]:.4f} | {fp8_val[s]:.4f} | {100 * (fp8_val[s] - bf16_val[s]) / bf16_val[s]:+.2f}% |")
    ok = worst <= args.tol and hf_gap <= args.tol and math.isfinite(hf_fp8)
    print(f"\n{'FP8 CURVE OK' if ok else 'FP8 CURVE MISSED'}: worst 10-step gap {100 * worst:.2f}%, "
          f"HF bf16 evaluation of the fp8 model {100 * hf_gap:.2f}% from its fp8 validation (tolerance {100 * args.tol:.0f}%)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
