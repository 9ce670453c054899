// T5 <-> HF transformers' T5ForConditionalGeneration: which HF tensor each part of each Strata parameter is.
// HF keeps q, k, v (and the cross-attention's k, v) apart and stores Linear weights [out, in]; the relative
// attention bias lives in block 0's first layer of each stack; encoder.embed_tokens and decoder.embed_tokens
// (and lm_head when tied) are copies of "shared" that the layout leaves out (import ignores them).
#pragma once

#include <string>

#include "models/HfLayout.h"
#include "models/t5/T5.h"

namespace strata::models {

HfLayout t5HfLayout(const T5Config& config);
// HF's config.json (feed_forward_proj "relu" or "gated-gelu", tie_word_embeddings per the version).
std::string t5HfConfigJson(const T5Config& config);

}  // namespace strata::models
