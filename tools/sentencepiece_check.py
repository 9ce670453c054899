#!/usr/bin/env python3
"""Strata's SentencePiece tokenizer against HF's T5Tokenizer on a few hundred lines of mixed text.

Strata: `build/strata tokenize LINE.txt OUT.bin --tokenizer sentencepiece --vocab-file MODEL`, one line at a time
(SentencePiece turns the newline between lines into a word boundary, so lines are encoded apart, as HF's are).
HF: transformers' T5Tokenizer over the same .model, each line's ids without the </s> it appends
(add_special_tokens=False). The lines are tools/wordpiece_check.py's: 300 lines of tiny Shakespeare, the 50
sentences of tools/embed_check.py, and lines of accents, Greek, Cyrillic, CJK, kana, Hangul, emoji and controls.
Exit status 1 on any difference (the first one is shown).

Usage: python3 tools/sentencepiece_check.py MODEL [--strata build/strata]   (MODEL: e.g. a T5 checkpoint's
spiece.model). Needs transformers with the sentencepiece package, and a Strata built with libsentencepiece-dev.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--strata", default="build/strata")
    args = ap.parse_args()
    from transformers import T5Tokenizer
    from wordpiece_check import lines
    tokenizer = T5Tokenizer(vocab_file=args.model, legacy=True, extra_ids=0)
    tmp = tempfile.mkdtemp(prefix="strata-sentencepiece-")
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
