// BERT <-> HF transformers (BertForMaskedLM, or BertForPreTraining with the NSP head): which HF tensor each
// part of each Strata parameter is. HF keeps query/key/value apart and stores Linear weights [out, in], so
// attn.qkv splits three ways and every dense weight is transposed; embeddings and norms map as they are.
// cls.predictions.decoder.weight is tied to the word embeddings and cls.predictions.decoder.bias to
// cls.predictions.bias, so neither is in the layout (import ignores them).
#pragma once

#include <string>

#include "models/HfLayout.h"
#include "models/bert/Bert.h"

namespace strata::models {

HfLayout bertHfLayout(const BertConfig& config);
// HF's config.json for `config` (BertForMaskedLM, or BertForPreTraining when config.nspHead).
std::string bertHfConfigJson(const BertConfig& config);

}  // namespace strata::models
