#!/usr/bin/env python3
"""Writes the HF checkpoint fixtures of tests/interop/hf_fixtures: for each case, the config.json that the installed
transformers' save_pretrained writes and tensors.json, the names, shapes and dtypes of the tensors it puts in
model.safetensors (the weights themselves are not kept: the CTest "HF checkpoints as transformers writes them ..."
fills them with random numbers).

The shapes are small and odd on purpose (heads that do not divide the width, T5's d_kv x heads != d_model, fewer
decoder than encoder layers, a position table longer than any training length), so that a key read wrongly changes
a shape or a number.

Run it once per major version, each in an environment with that transformers (it writes transformers-<major>/):
    python3 tools/hf_fixtures.py                       # e.g. transformers 5.x
    PYTHONPATH=/path/to/transformers4 python3 tools/hf_fixtures.py
"""
import json
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=99, n_positions=40, n_embd=24, n_layer=2, n_head=3,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def bert():
    # BertForMaskedLM with HF's defaults for what it leaves out (pad_token_id 0, gelu).
    from transformers import BertConfig, BertForMaskedLM
    return BertForMaskedLM(BertConfig(vocab_size=99, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                      intermediate_size=40, max_position_embeddings=40))


def bert_nsp():
    # BertForPreTraining (pooler and NSP head), the tanh GELU, three segments and [PAD] at the end of the vocabulary.
    from transformers import BertConfig, BertForPreTraining
    return BertForPreTraining(BertConfig(vocab_size=99, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                         intermediate_size=40, max_position_embeddings=48, type_vocab_size=3,
                                         hidden_act="gelu_new", pad_token_id=95, layer_norm_eps=1e-7))


def t5_config(**kwargs):
    from transformers import T5Config
    return T5Config(vocab_size=99, d_model=20, d_kv=6, num_heads=3, d_ff=28, num_layers=2, num_decoder_layers=1,
                    relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0, **kwargs)


def t5_v1_0():
    from transformers import T5ForConditionalGeneration
    return T5ForConditionalGeneration(t5_config(feed_forward_proj="relu"))


def t5_v1_1():
    # What a user building v1.1 writes: transformers 4.x keeps a head of its own (tie_word_embeddings false),
    # 5.x ties it and turns the d_model^-0.5 scaling off (scale_decoder_outputs false).
    from transformers import T5ForConditionalGeneration
    return T5ForConditionalGeneration(t5_config(feed_forward_proj="gated-gelu", tie_word_embeddings=False))


def save(model, directory):
    try:
        model.save_pretrained(directory, safe_serialization=True)
    except TypeError:  # releases that always write safetensors dropped the argument
        model.save_pretrained(directory)


def t5_v1_1_untied(directory):
    """A v1.1 checkpoint with a head of its own (google/t5-v1_1-*, flan-t5-*: written by 4.x with
    tie_word_embeddings false and lm_head.weight) as transformers 5.x saves it again after loading it."""
    from transformers import T5ForConditionalGeneration
    with tempfile.TemporaryDirectory() as old:
        model = T5ForConditionalGeneration(t5_config(feed_forward_proj="gated-gelu"))
        save(model, old)
        config = json.load(open(os.path.join(old, "config.json")))
        config["tie_word_embeddings"] = False
        config.pop("scale_decoder_outputs", None)
        json.dump(config, open(os.path.join(old, "config.json"), "w"), indent=2)
        weights = load_file(os.path.join(old, "model.safetensors"))
        weights["lm_head.weight"] = torch.randn_like(weights["shared.weight"])
        save_file(weights, os.path.join(old, "model.safetensors"), metadata={"format": "pt"})
        save(T5ForConditionalGeneration.from_pretrained(old), directory)


CASES = {"gpt2": gpt2, "bert": bert, "bert-nsp": bert_nsp, "t5-v1_0": t5_v1_0, "t5-v1_1": t5_v1_1}


def main():
    major = transformers.__version__.split(".")[0]
    out = os.path.join(ROOT, "tests", "interop", "hf_fixtures", f"transformers-{major}")
    cases = dict(CASES)
    if int(major) >= 5:
        cases["t5-v1_1-untied"] = None
    torch.manual_seed(0)
    for name, make in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            if make is None:
                t5_v1_1_untied(tmp)
            else:
                save(make(), tmp)
            target = os.path.join(out, name)
            shutil.rmtree(target, ignore_errors=True)
            os.makedirs(target)
            shutil.copy(os.path.join(tmp, "config.json"), os.path.join(target, "config.json"))
            # One tensor a line: {"name": {"dtype": "F32", "shape": [...]}, ...}
            tensors = {}
            with safe_open(os.path.join(tmp, "model.safetensors"), "pt") as f:
                for key in sorted(f.keys()):
                    t = f.get_slice(key)
                    tensors[key] = {"dtype": t.get_dtype(), "shape": list(t.get_shape())}
            with open(os.path.join(target, "tensors.json"), "w") as f:
                f.write("{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in tensors.items()) + "\n}\n")
            print(f"wrote {target} ({len(tensors)} tensors, transformers {transformers.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
