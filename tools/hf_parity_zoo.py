#!/usr/bin/env python3
"""Parity of Strata's BERT and T5 with HF transformers' BertForMaskedLM (BertForPreTraining) and
T5ForConditionalGeneration, on the GPU.

For BERT and T5 variants from the zoo's mini shapes (configs/zoo/bert-mini.yaml, t5-mini.yaml: 4 layers, hidden 256):
- bert: BertForMaskedLM with bert-mini's ids ([PAD] 256) and 128 positions;
- bert-positions: a position table of 512 (bert-base's) trained at 128 (model.max_position_embeddings), and HF's
  default pad_token_id 0, the model's [PAD] whatever the tokenizer's layout;
- bert-nsp: BertForPreTraining, the pooler and next-sentence head (model.bert_binary_head): token types and NSP
  labels in, "prediction_logits" and "seq_relationship_logits" out, MLM + NSP loss;
- t5-v1.0: the ReLU feed-forward, the head tied to the embedding and the decoder output scaled by d_model^-0.5;
- t5-v1.1: the gated GELU, unscaled, built as T5Config(tie_word_embeddings=False): transformers 4.x gives it a head of
  its own, 5.x ties it (scale_decoder_outputs false), and Strata is told which by `convert --from-hf`;
- t5-v1.1-untied: the gated GELU with a head of its own on any transformers (google/t5-v1_1-*, flan-t5-*; 5.x writes
  it with tie_word_embeddings true, an lm_head.weight of its own and scale_decoder_outputs false):
1. Import. A random-init HF model of that shape is saved with save_pretrained (config.json, model.safetensors) and
   imported with `build/strata convert --from-hf`: the same path a user's HF checkpoint takes.
2. fp32 forward and backward. `build/bench/zoo_parity` builds the config's model and objective as `strata train`
   does, loads the imported weights and traces training micro-batch 0 (data/BatchTrace.h): the model inputs the
   objective made (BERT: [CLS] window [SEP] with 15% masked 80/10/10; T5: span-corrupted input and target ids),
   the logits, the loss, and every gradient under its HF name. HF runs the same inputs (T5's decoder input is the
   labels shifted right on both sides) and the two are compared: logits max |diff| <= 1e-4 x max(1, max |logit|)
   (absolute for O(1) logits, relative for T5 v1.1's larger untied-head logits), loss |diff| <= 1e-4, every
   gradient's relative L2 diff <= 1e-3 (against at least 1e-4 of the largest gradient's norm: BERT's key bias
   has a gradient of exactly zero in exact arithmetic, noise on both sides), and every HF parameter has a Strata
   gradient.
3. 100 bf16 training steps from the imported weights. Strata trains with `build/strata train` on the zoo config
   (checkpoint.load of the imported weights, load_model_only); its objective corrupts each batch on the fly.
   Re-implementing BERT's masking and T5's span corruption bit for bit in Python would test the re-implementation,
   so HF instead trains on the corrupted batches Strata's objective produced: zoo_parity writes the model inputs of
   training micro-batches 0..99, which are what `strata train` with the same config trains on at steps 1..100 (the
   CTest "Trainer::batch hands out the micro-batches strata train trains on" checks that claim). HF trains with
   bf16 autocast over fp32 weights, fused AdamW with the same hyper-parameters and decay rule (weight decay on
   tensors of 2 or more dimensions), the same linear warm-up and gradient clipping. The curves pass when their
   10-step moving averages stay within 2% of each other (single steps carry batch noise that bf16 rounding moves
   slightly, as in hf_parity.py). Every variant trains at lr 5e-4 (--lr sets another): at 1e-3 bert-mini's first
   100 steps are chaotic in every implementation (BENCHMARKS.md, "BERT's bf16 departure": HF's own runs spike
   anywhere from 4.8 to 11.5 at step 34, and Strata fp32 runs from different seeds range from a spike to 11.7 to
   none), so a 2% comparison there compares two draws of the chaos, not two implementations; T5 v1.0 measured a
   3.25% gap at 1e-3 and 0.43% at 5e-4 on the H200. The unscaled v1.1 heads are drawn with standard deviation
   d_model^-0.5 (HF's random init gives 1: first losses of 48 to 107, where bf16's rounding of logits of ~16
   decides the curve; trained v1.1 checkpoints have logits of order one).

Prints a PASS/FAIL table; exit status 1 when a check fails; the work files (each side's curve in <variant>-curves.json,
the logs) stay in the directory it names. About 1-2 minutes on one H200 (mostly start-up); --device cpu with
--steps 30 took 10 minutes on a 2-core development machine, all PASS (fp32 curves: BERT equal to 4 digits through
30 steps, T5 v1.0 within 0.31% on 10-step averages: its ReLU makes tiny differences grow from step 13 on). There, with
transformers 5.24, --steps 20 over bert-positions, bert-nsp, t5-v1.1 (tied and unscaled on 5.x) and t5-v1.1-untied
passed too (10-step averages within 0.02%), and --steps 0 over all seven variants (fp32 checks only) took 3.5 minutes.

Switch Transformers (--variants switch): switch-mini against a random-init SwitchTransformersForConditionalGeneration
with 8 experts in every other block, at capacities that drop no token on either side.

Usage: python3 tools/hf_parity_zoo.py [--variants bert,t5-v1.0,t5-v1.1,...] [--steps 100] [--strata build/strata]
                                      [--parity-binary build/bench/zoo_parity] [--keep DIR] [--device cuda]
                                      [--set KEY=VALUE]...
--set adds a config override to every variant's Strata side (e.g. --variants bert --set model.fp32_residual=true:
BERT with its residual stream in fp32, as autocast keeps HF's).
--device cpu is a smoke test of the script where no GPU is: Strata computes bf16 configs in fp32 on the CPU, so HF
trains in fp32 there too (no autocast) and the curves compare fp32 with fp32.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


# The variants checked: (zoo config, its --set overrides, the HF config's keys that differ between them). A T5's
# head (tied or not, scaled or not) is set on the Strata side from the HF model built (t5_head_overrides).
VARIANTS = {
    "bert": ("bert-mini", [], {}),
    "bert-positions": ("bert-mini", ["model.max_position_embeddings=512", "model.pad_token_id=0"],
                       dict(max_position_embeddings=512, pad_token_id=0)),
    "bert-nsp": ("bert-mini", ["model.bert_binary_head=true"], {}),
    # v1.0: ReLU feed-forward, the head tied to the embedding (the decoder output scaled by d_model^-0.5 first).
    "t5-v1.0": ("t5-mini", ["model.activation=relu"], dict(feed_forward_proj="relu", tie_word_embeddings=True)),
    # v1.1: gated GELU, no scaling; a head of its own on 4.x, tied on 5.x.
    "t5-v1.1": ("t5-mini", [], dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
    # v1.1 with a head of its own on every release (hf_model unties it where transformers tied it).
    "t5-v1.1-untied": ("t5-mini", [], dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
    # Switch Transformers (SwitchTransformersForConditionalGeneration): switch-mini, 8 top-1 experts in every other
    # block. A capacity no token overflows on either side (Strata: factor 8 = E/k over the batch; HF: 128 per
    # sequence), and no auxiliary losses in Strata's loss, since HF's forward without labels adds none.
    "switch": ("switch-mini", ["model.moe_capacity_factor=8", "model.moe_eval_capacity_factor=8",
                               "model.moe_aux_loss_coef=0", "model.moe_z_loss_coef=0"], {}),
}


def hf_model(variant):
    """A random-init HF model of the zoo's mini shape (the same numbers as configs/zoo/<arch>-mini.yaml)."""
    from transformers import BertConfig, BertForMaskedLM, T5Config, T5ForConditionalGeneration
    torch.manual_seed(0)
    if variant == "switch":
        from transformers import SwitchTransformersConfig, SwitchTransformersForConditionalGeneration
        cfg = SwitchTransformersConfig(
            vocab_size=384, d_model=256, d_kv=64, d_ff=640, num_layers=4, num_decoder_layers=4,
            num_sparse_encoder_layers=2, num_sparse_decoder_layers=2, num_heads=4, num_experts=8,
            expert_capacity=128, router_bias=False, router_jitter_noise=0.0, router_dtype="float32",
            router_ignore_padding_tokens=False, relative_attention_num_buckets=32, relative_attention_max_distance=128,
            dropout_rate=0.0, layer_norm_epsilon=1e-6, dense_act_fn="relu", tie_word_embeddings=True,
            pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
        try:
            return SwitchTransformersForConditionalGeneration(cfg, attn_implementation="eager")
        except TypeError:
            return SwitchTransformersForConditionalGeneration(cfg)
    if variant.startswith("bert"):
        # Ids: bytes 0..255, [PAD] 256, [CLS] 257, [SEP] 258, [MASK] 259 (MaskedLmObjective).
        keys = dict(max_position_embeddings=128, pad_token_id=256)
        keys.update(VARIANTS[variant][2])
        cfg = BertConfig(vocab_size=260, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         intermediate_size=1024, type_vocab_size=2, hidden_act="gelu", hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12, initializer_range=0.02, **keys)
        if variant == "bert-nsp":
            from transformers import BertForPreTraining as cls
        else:
            cls = BertForMaskedLM
    else:
        # Ids as ByT5 ([PAD] 0 = decoder start, [EOS] 1), sentinels from 383 down (SpanCorruptionObjective).
        cfg = T5Config(vocab_size=384, d_model=256, d_kv=64, d_ff=640, num_layers=4, num_decoder_layers=4,
                       num_heads=4, relative_attention_num_buckets=32, relative_attention_max_distance=128,
                       dropout_rate=0.0, layer_norm_epsilon=1e-6, pad_token_id=0, eos_token_id=1,
                       decoder_start_token_id=0, n_positions=128, **VARIANTS[variant][2])
        cls = T5ForConditionalGeneration
    try:
        model = cls(cfg, attn_implementation="eager")
    except TypeError:
        model = cls(cfg)
    if variant == "t5-v1.1-untied" and t5_head_tied(model):
        # transformers 5.x ties every T5 head: a head of its own, as a 4.x v1.1 checkpoint loaded into 5.x has
        # (save_pretrained then writes lm_head.weight beside shared.weight, and from_pretrained keeps them apart).
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight))
    if variant.startswith("t5") and not getattr(model.config, "scale_decoder_outputs", model.config.tie_word_embeddings):
        # An unscaled head (v1.1) from HF's random init has standard deviation 1 over a d_model-wide normed
        # output: logits of standard deviation ~16 and a first loss near 100, where bf16's rounding of the logits
        # decides the curve. Trained v1.1 checkpoints produce logits of order one; the head (the shared table when
        # tied) is drawn with standard deviation d_model^-0.5 for that, on both sides (Strata imports this model).
        d = model.config.d_model
        with torch.no_grad():
            head = model.shared.weight if t5_head_tied(model) else model.lm_head.weight
            head.normal_(0.0, d ** -0.5)
    return model


def t5_head_tied(model):
    return model.lm_head.weight.data_ptr() == model.shared.weight.data_ptr()


def t5_head_overrides(model):
    """Strata's keys for the HF model's head: tied or not, the decoder output scaled by d_model^-0.5 or not (4.x
    scales exactly when the config ties; 5.x says so in scale_decoder_outputs)."""
    cfg = model.config
    scaled = getattr(cfg, "scale_decoder_outputs", cfg.tie_word_embeddings)
    return [f"model.untie_embeddings_and_output_weights={'false' if t5_head_tied(model) else 'true'}",
            f"model.scale_decoder_outputs={'true' if scaled else 'false'}"]


def load_hf(arch, directory):
    from transformers import BertForMaskedLM, BertForPreTraining, T5ForConditionalGeneration
    cls = BertForPreTraining if arch == "bert-nsp" else BertForMaskedLM if arch.startswith("bert") else \
        T5ForConditionalGeneration
    if arch == "switch":
        from transformers import SwitchTransformersForConditionalGeneration as cls
    try:
        return cls.from_pretrained(directory, attn_implementation="eager")
    except TypeError:
        return cls.from_pretrained(directory)


def run(cmd, log):
    with open(log, "w") as out:
        r = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.stdout.write(open(log).read()[-4000:])
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}")


DEVICE = "cuda"


def hf_logits(arch, model, inputs):
    """HF's outputs by the trace's names ("logits", or BertForPreTraining's "prediction_logits" and
    "seq_relationship_logits") and the loss Strata's objective takes on Strata's model inputs: the mean masked
    cross-entropy (fp32, -100 ignored), plus the next-sentence cross-entropy with the NSP head."""
    ids, labels = inputs["input_ids"].to(DEVICE), inputs["labels"].to(DEVICE)
    if arch == "bert-nsp":
        out = model(input_ids=ids, token_type_ids=inputs["token_type_ids"].to(DEVICE))
        outputs = {"prediction_logits": out.prediction_logits, "seq_relationship_logits": out.seq_relationship_logits}
        nsp = F.cross_entropy(out.seq_relationship_logits.float(), inputs["next_sentence_label"].to(DEVICE).reshape(-1))
    elif arch.startswith("bert"):
        outputs, nsp = {"logits": model(input_ids=ids).logits}, 0.0
    else:
        outputs = {"logits": model(input_ids=ids, decoder_input_ids=model._shift_right(labels)).logits}
        nsp = 0.0
    logits = outputs["prediction_logits" if arch == "bert-nsp" else "logits"]
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    return outputs, loss + nsp


# The model inputs each side takes by HF argument name (the trace's and the --inputs file's keys).
INPUTS = ("input_ids", "labels", "token_type_ids", "next_sentence_label")


def fp32_parity(arch, model, trace, rows):
    model.to(DEVICE).float().train()  # dropout is 0; train mode as training runs it
    model.zero_grad(set_to_none=True)
    inputs = {k: v for k, v in trace.items() if k in INPUTS}
    outputs, loss = hf_logits(arch, model, inputs)
    loss.backward()
    for name, logits in outputs.items():
        assert name in trace, f"the Strata trace has no {name} (it has {sorted(trace)})"
        s_logits = trace[name].to(DEVICE)
        assert s_logits.shape == logits.shape, (name, s_logits.shape, logits.shape)
        dl = (s_logits - logits.detach()).abs().max().item()
        scale = max(1.0, logits.detach().abs().max().item())
        rows.append((arch, f"fp32 {name} max |diff|", f"{dl:.2e} (max |logit| {scale:.1f})", f"<= {1e-4 * scale:.1e}",
                     dl <= 1e-4 * scale))
    dloss = abs(trace["loss"].item() - loss.item())
    rows.append((arch, "fp32 loss |diff|", f"{dloss:.2e} (Strata {trace['loss'].item():.6f}, HF {loss.item():.6f})",
                 "<= 1e-4", dloss <= 1e-4))
    params = dict(model.named_parameters(remove_duplicate=False))
    grads = {}
    for key, g_strata in trace.items():
        if not key.startswith("grad."):
            continue
        name = key[len("grad."):]
        assert name in params, f"HF has no parameter {name}"
        g = params[name].grad
        if g is None:
            # HF's Switch layer calls only the experts that got tokens; an idle one's gradient is zero, which
            # is what Strata's (run on a zero row) must be too.
            assert arch == "switch" and ".experts." in name, f"HF's {name} got no gradient"
            g = torch.zeros_like(params[name])
        grads[name] = (g_strata.to(DEVICE), g)
    # A gradient that is zero in exact arithmetic (BERT's key bias: the softmax ignores a constant added to a
    # query's scores) is rounding noise on both sides; its difference is measured against 1e-4 of the largest
    # gradient's norm instead of its own.
    floor = 1e-4 * max(g.norm().item() for _, g in grads.values())
    worst, worst_name, count = 0.0, "", 0
    for name, (g_strata, g) in grads.items():
        rel = ((g_strata - g).norm() / g.norm().clamp_min(floor)).item()
        count += 1
        if rel > worst:
            worst, worst_name = rel, name
    # Every HF parameter (aliases of tied ones aside) has a Strata gradient.
    seen = {k[len("grad."):] for k in trace if k.startswith("grad.")}
    missing = [n for n, p in model.named_parameters()
               if not any(alias in seen for alias, q in params.items() if q is p)]
    rows.append((arch, f"fp32 gradients, worst relative L2 of {count}", f"{worst:.2e} ({worst_name})", "<= 1e-3",
                 worst <= 1e-3 and not missing))
    if missing:
        rows.append((arch, "HF parameters without a Strata gradient", ", ".join(missing), "none", False))


def strata_curve(args, arch, config, sets, ckpt, tmp, steps, lr, warmup):
    out = os.path.join(tmp, f"{arch}-train")
    run([args.strata, "train", config] + sets + ["--set", f"checkpoint.load={ckpt}", "--set", "checkpoint.load_model_only=true",
         "--set", "checkpoint.save=", "--set", f"train.device={DEVICE}", "--set", f"train.train_iters={steps}",
         "--set", "train.log_interval=1", "--set", "train.eval_interval=0", "--set", "train.sample_length=0",
         "--set", f"train.out_dir={out}", "--set", f"optimizer.lr={lr}", "--set", f"optimizer.min_lr={lr}",
         "--set", "lr_schedule.style=constant", "--set", f"lr_schedule.warmup_iters={warmup}",
         "--set", "precision.dtype=bf16"], os.path.join(tmp, f"{arch}-train.log"))
    return [json.loads(l)["loss"] for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]


def yaml_value(config, block, key):
    """A top-level block's scalar or list from the zoo config (flat YAML; no PyYAML needed)."""
    inside = False
    for line in open(config):
        if not line.startswith(" ") and line.strip().endswith(":"):
            inside = line.strip()[:-1] == block
        elif inside and line.strip().startswith(key + ":"):
            return json.loads(line.split(":", 1)[1].split("#")[0].strip())
    raise KeyError(f"{block}.{key} in {config}")


def hf_curve(arch, hf_dir, batches, steps, config, lr, warmup):
    model = load_hf(arch, hf_dir).to(DEVICE).float().train()
    wd = yaml_value(config, "optimizer", "weight_decay")
    betas = tuple(yaml_value(config, "optimizer", "betas"))
    clip = yaml_value(config, "optimizer", "clip_grad")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=betas, eps=1e-8, fused=DEVICE == "cuda")
    losses = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        inputs = {k: batches[f"{k}.{step}"] for k in INPUTS if f"{k}.{step}" in batches}
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=DEVICE == "cuda"):
            _, loss = hf_logits(arch, model, inputs)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def compare_curves(arch, strata_loss, hf_loss, steps, rows, tmp, window=10):
    with open(os.path.join(tmp, f"{arch}-curves.json"), "w") as f:
        json.dump({"strata": strata_loss, "hf": hf_loss}, f)
    ok_len = len(strata_loss) == steps and len(hf_loss) == steps
    rel = [abs(a - b) / b for a, b in zip(strata_loss, hf_loss)]
    avg = lambda v: [sum(v[i:i + window]) / window for i in range(len(v) - window + 1)]
    rel_avg = [abs(a - b) / b for a, b in zip(avg(strata_loss), avg(hf_loss))]
    at = [i for i in (0, 9, 49, steps - 1) if i < min(len(strata_loss), len(hf_loss))]
    print(f"{arch}: loss at steps {[i + 1 for i in at]}: Strata {[round(strata_loss[i], 3) for i in at]} "
          f"HF {[round(hf_loss[i], 3) for i in at]}; worst single-step gap {max(rel):.2%}")
    dtype = "bf16" if DEVICE == "cuda" else "fp32 (CPU)"
    rows.append((arch, f"{dtype} curves, {steps} steps, {window}-step averages", f"worst gap {max(rel_avg):.2%}",
                 "<= 2%", ok_len and max(rel_avg) <= 0.02))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default="bert,bert-positions,bert-nsp,t5-v1.0,t5-v1.1,t5-v1.1-untied",
                    help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=None,
                    help="peak learning rate for every variant (default 5e-4)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--strata", default="build/strata")
    ap.add_argument("--parity-binary", default="build/bench/zoo_parity")
    ap.add_argument("--keep", help="keep the work files in this directory")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test (fp32 curves)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every variant's Strata side (repeatable)")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tmp = args.keep or tempfile.mkdtemp(prefix="strata-zoo-parity-")
    os.makedirs(tmp, exist_ok=True)
    rows = []
    for arch in args.variants.split(","):
        name, overrides, _ = VARIANTS[arch]
        model = hf_model(arch)
        if arch.startswith("t5"):
            overrides = overrides + t5_head_overrides(model)
            print(f"{arch}: HF's head is {'tied' if t5_head_tied(model) else 'its own'}: Strata with "
                  f"{' '.join(overrides)}")
        config = os.path.join(ROOT, "configs", "zoo", f"{name}.yaml")
        sets = [a for kv in overrides + args.set for a in ("--set", kv)]
        hf_dir, ckpt = os.path.join(tmp, f"{arch}-hf"), os.path.join(tmp, f"{arch}-ckpt")
        shutil.rmtree(ckpt, ignore_errors=True)
        try:
            model.save_pretrained(hf_dir, safe_serialization=True)
        except TypeError:  # transformers releases that always write safetensors dropped the argument
            model.save_pretrained(hf_dir)
        assert os.path.exists(os.path.join(hf_dir, "model.safetensors")), os.listdir(hf_dir)
        run([args.strata, "convert", "--from-hf", hf_dir, ckpt], os.path.join(tmp, f"{arch}-convert.log"))
        trace_path = os.path.join(tmp, f"{arch}-trace.safetensors")
        inputs_path = os.path.join(tmp, f"{arch}-in.safetensors")
        run([args.parity_binary, "--config", config] + sets + ["--set", f"train.device={DEVICE}", "--set",
             f"train.out_dir={os.path.join(tmp, arch + '-parity')}", "--load", ckpt, "--trace", trace_path,
             "--inputs", inputs_path, "--batches", str(max(args.steps, 1))], os.path.join(tmp, f"{arch}-parity.log"))
        fp32_parity(arch, model, load_file(trace_path), rows)
        del model
        if args.steps > 0:
            lr = args.lr if args.lr is not None else 5e-4
            strata_loss = strata_curve(args, arch, config, sets, ckpt, tmp, args.steps, lr, args.warmup)
            hf_loss = hf_curve(arch, hf_dir, load_file(inputs_path), args.steps, config, lr, args.warmup)
            compare_curves(arch, strata_loss, hf_loss, args.steps, rows, tmp)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    print()
    print("| arch | check | measured | tolerance | result |")
    print("|---|---|---|---|---|")
    for arch, what, measured, tol, ok in rows:
        print(f"| {arch} | {what} | {measured} | {tol} | {'PASS' if ok else 'FAIL'} |")
    ok = all(r[-1] for r in rows)
    print("\nZOO PARITY " + ("PASS" if ok else "FAIL") + f" (work files in {tmp})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
