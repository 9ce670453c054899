#!/usr/bin/env python3
"""Strata's SentencePiece tokenizer against HF's T5Tokenizer on a few hundred lines of mixed text.

Strata: `build/strata tokenize LINE.txt OUT.bin --tokenizer sentencepiece --vocab-file MODEL`, one line at a time
(SentencePiece turns the newline between lines into a word boundary, so lines are encoded apart, as HF's are).
HF: transformers' T5Tokenizer over the same .model, each line's ids without the </s> it appends
(add_special_tokens=False). The lines are tools/wordpiece_check.py's: 300 lines of tiny Shakespeare, the 50
sentences of tools/embed_check.py, and lines of accents, Greek, Cyrillic, CJK, kana, Hangul, emoji and controls.
Exit status 1 on any difference (the first one is shown).

Usage: python3 tools/sentencepiece_check.py MODEL [--strata build/strata]   (MODEL: e.g. a T5 checkpoint's
spiece.model), or --train MODEL first to make a T5-style model (unigram, NFKC, <pad> 0, </s> 1, <unk> 2, 2000
pieces) with the python sentencepiece trainer from tiny Shakespeare and the mixed lines. Needs transformers with
the sentencepiece package, and a Strata built with libsentencepiece-dev.
Measured on the dev machine (2026-12-01; Debian's libsentencepiece 0.1.97 in Strata, PyPI's sentencepiece 0.2.3
and transformers 5.24 in a venv, no torch): `--train` model, 370 lines, 4548 tokens, all equal.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def train(model):
    import sentencepiece as spm
    from wordpiece_check import lines
    root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    text = open(os.path.join(root, "data", "tinyshakespeare.txt"), encoding="utf-8").read().split("\n")
    corpus = [l for l in text if l.strip()][:20000] + lines() * 20
    prefix = model[:-len(".model")] if model.endswith(".model") else model
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_prefix=prefix, vocab_size=2000,
                                   model_type="unigram", character_coverage=1.0, pad_id=0, eos_id=1, unk_id=2,
                                   bos_id=-1, normalization_rule_name="nmt_nfkc", minloglevel=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--strata", default="build/strata")
    ap.add_argument("--train", action="store_true", help="train a T5-style model into MODEL first")
    args = ap.parse_args()
    if args.train:
        train(args.model)
    from transformers import T5Tokenizer
    from wordpiece_check import lines
    tmp = tempfile.mkdtemp(prefix="strata-sentencepiece-")
    # transformers 5 builds T5Tokenizer from a directory holding spiece.model (vocab_file= alone gives an empty
    # vocabulary there).
    os.makedirs(os.path.join(tmp, "model"))
    shutil.copy(args.model, os.path.join(tmp, "model", "spiece.model"))
    tokenizer = T5Tokenizer.from_pretrained(os.path.join(tmp, "model"), legacy=True, extra_ids=0)
    total = 0
    for i, line in enumerate(lines()):
        path, out = os.path.join(tmp, "line.txt"), os.path.join(tmp, "line.bin")
        with open(path, "w", encoding="utf-8") as f:
            f.write(line)
        subprocess.run([args.strata, "tokenize", path, out, "--tokenizer", "sentencepiece", "--vocab-file",
                        args.model, "--threads", "1"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        strata = np.fromfile(out, dtype=np.uint16).astype(np.int64).tolist()
        hf = tokenizer(line, add_special_tokens=False)["input_ids"]
        total += len(hf)
        if strata != hf:
            print(f"FAIL at line {i}: {line[:80]!r}")
            print("  HF:    ", tokenizer.convert_ids_to_tokens(hf[:16]))
            print("  Strata:", tokenizer.convert_ids_to_tokens(strata[:16]))
            return 1
    print(f"{i + 1} lines, {total} tokens: Strata's SentencePiece ids equal HF's T5Tokenizer: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
