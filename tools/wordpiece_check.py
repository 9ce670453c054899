#!/usr/bin/env python3
"""Strata's WordPiece tokenizer against HF's on a few hundred lines of mixed text.

Strata: `build/strata tokenize LINES --tokenizer wordpiece --vocab-file VOCAB_DIR/vocab.txt` (uint16 ids, the whole file
as one text: the basic tokenizer splits at whitespace, so that is the lines' ids one after another). HF: transformers'
AutoTokenizer for VOCAB_DIR (tokenizer.json where there is one, else BertTokenizer over vocab.txt), each line's ids
without [CLS]/[SEP], concatenated. The lines: the first 300 non-empty lines of tiny Shakespeare, tools/embed_check.py's
50 sentences, and lines of accents, Greek, Cyrillic, CJK, kana, Hangul, emoji, controls and odd punctuation.
Exit status 1 on any difference (the first one is shown in context).

Usage: python3 tools/wordpiece_check.py VOCAB_DIR [--strata build/strata]   (VOCAB_DIR: e.g. all-MiniLM-L6-v2's)
Needs transformers (no torch). Measured on the dev machine (2026-12-01) with all-MiniLM-L6-v2's vocabulary and
transformers 5.24 (BertTokenizer from tokenizer.json): 370 lines, 4126 tokens, all equal.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

EXTRA = [
    "Crème brûlée, jalapeño, façade, coöperate, Zoë, Ångström, Øre, Æther, Straße",
    "ΆΈΉΊΌΎΏ άέήίόύώ ΐΰ — Ελληνικά: Καλημέρα κόσμε; τελικό σίγμα: λόγος",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Йод, ёлка",
    "中文分词测试：我们今天去公园玩。繁體中文測試",
    "ひらがな カタカナ がぎぐげご ぱぴぷぺぽ ｶﾀｶﾅ 日本語のテキストです。",
    "한국어 텍스트: 안녕하세요, 세계! 띄어쓰기",
    "Emoji 😀🚀🎉 and symbols ©®™ ±×÷ ∑∫√ ≤≥≠ → ← ↑ ↓",
    "Fullwidth ＡＢＣ ａｂｃ １２３ ！？",
    "Greek question mark\u037e and middle dot\u0387 and ano teleia",
    "Compatibility ideographs \uf900\uf901\ufa0e and circled Ⓐ Ⓑ and roman Ⅻ ⅻ",
    "Controls\u0001\u0002 zero\u200bwidth\u200d joiners \ufeff bom and soft\u00adhyphen",
    "Combining: e\u0301 a\u0308 n\u0303 o\u0302 (decomposed accents)",
    "Tabs\tand\u00a0non-breaking\u3000ideographic spaces",
    "Vietnamese: Tiếng Việt có dấu, người, được, những",
    "Turkish İstanbul ıi, Lithuanian, Armenian Բարեւ, Georgian ქართული",
    "Arabic العربية and Hebrew עברית and Hindi हिन्दी and Thai ภาษาไทย",
    "URLs https://example.com/a_b-c?x=1&y=2#frag and e-mail first.last+tag@example.co.uk",
    "Numbers 3.14159 1,234,567 1e-10 0xFF 50% $9.99 €5 £3 ¥100",
    "unaffable unbelievably antidisestablishmentarianism " + "a" * 120,
    "Mixed___underscores---dashes...ellipses!!!???",
]


def lines():
    text = open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8").read().split("\n")
    shakespeare = [l for l in text if l.strip()][:300]
    from embed_check import SENTENCES
    return shakespeare + SENTENCES + EXTRA


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("vocab_dir")
    ap.add_argument("--strata", default="build/strata")
    args = ap.parse_args()
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(args.vocab_dir)
    all_lines = lines()
    tmp = tempfile.mkdtemp(prefix="strata-wordpiece-")
    path, out = os.path.join(tmp, "lines.txt"), os.path.join(tmp, "lines.bin")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(all_lines) + "\n")
    subprocess.run([args.strata, "tokenize", path, out, "--tokenizer", "wordpiece", "--vocab-file",
                    os.path.join(args.vocab_dir, "vocab.txt"), "--threads", "1"], check=True,
                   stdout=subprocess.DEVNULL)
    strata = np.fromfile(out, dtype=np.uint16).astype(np.int64).tolist()
    hf, owner = [], []
    for i, line in enumerate(all_lines):
        ids = tokenizer(line, add_special_tokens=False)["input_ids"]
        hf += ids
        owner += [i] * len(ids)
    n = min(len(strata), len(hf))
    first = next((k for k in range(n) if strata[k] != hf[k]), None)
    if first is None and len(strata) == len(hf):
        print(f"{len(all_lines)} lines, {len(hf)} tokens: Strata's WordPiece ids equal HF's ({type(tokenizer).__name__}): PASS")
        return 0
    k = first if first is not None else n
    line = owner[min(k, len(owner) - 1)]
    print(f"FAIL: first difference at token {k} (line {line}: {all_lines[line][:80]!r})")
    print("  HF:    ", tokenizer.convert_ids_to_tokens(hf[max(0, k - 3):k + 5]))
    print("  Strata:", tokenizer.convert_ids_to_tokens(strata[max(0, k - 3):k + 5]))
    return 1


if __name__ == "__main__":
    sys.exit(main())
