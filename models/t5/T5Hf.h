// T5 <-> HF transformers' T5ForConditionalGeneration: which HF tensor each part of each Strata parameter is.
// HF keeps q, k, v (and the cross-attention's k, v) apart and stores Linear weights [out, in]; the relative
// attention bias lives in block 0's first layer of each stack; encoder.embed_tokens and decoder.embed_tokens
// (and lm_head when tied) are copies of "shared" that the layout leaves out (import ignores them).
// A T5 with mixture-of-experts layers is HF's SwitchTransformersForConditionalGeneration: the same names,
// except each feed-forward is "mlp" (dense: mlp.wi, mlp.wo; sparse: mlp.router.classifier and
// mlp.experts.expert_<e>.wi/.wo).
#pragma once

#include <string>

#include "models/HfLayout.h"
#include "models/t5/T5.h"

namespace strata::models {

HfLayout t5HfLayout(const T5Config& config);
// HF's config.json (feed_forward_proj "relu" or "gated-gelu"; tie_word_embeddings and scale_decoder_outputs
// as transformers 5.x writes them, which 4.x reads right for v1.0 (tied, scaled) and v1.1 (untied, unscaled):
// a tied unscaled or untied scaled head needs transformers 5); a switch_transformers one for a T5 with
// experts (expert_capacity: the per-sequence capacity that moe_capacity_factor gives a sequence of seq_length
// tokens).
std::string t5HfConfigJson(const T5Config& config);
// The number of sparse layers HF's SwitchTransformersConfig takes for a stack of `layers`
// (num_sparse_*_layers), after checking that HF's sparse step (layers / that number) is the config's
// moe_every.
int64_t switchSparseLayers(const T5Config& config, int64_t layers);

}  // namespace strata::models
