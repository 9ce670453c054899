// The zoo's models in HF transformers' form, by spec: which HF tensor each part of each parameter is, the
// config.json HF's from_pretrained reads, and the other way, the model section an HF config.json describes.
// `strata convert --hf` / `--from-hf` go through these for every architecture.
#pragma once

#include <map>
#include <string>

#include "models/HfLayout.h"
#include "models/Zoo.h"

namespace strata::models {

// GPT2LMHeadModel, BertForMaskedLM (BertForPreTraining with the NSP head) or T5ForConditionalGeneration.
HfLayout hfLayout(const ModelSpec& spec);
std::string hfModelClass(const ModelSpec& spec);
// `eosTokenId` < 0 leaves a GPT's bos/eos unset (the other architectures have their own).
std::string hfConfigJson(const ModelSpec& spec, int64_t eosTokenId = -1);
// Whether every HF tensor of `layout` is a whole parameter as Strata stores it (a rename): such a layout
// converts tensor by tensor, without building the model.
bool isRenameOnly(const HfLayout& layout);
// The model.* keys (dotted, YAML text) of the model an HF config.json describes (model_type gpt2, bert, t5).
std::map<std::string, std::string> modelConfigFromHf(const std::string& configJson);

}  // namespace strata::models
