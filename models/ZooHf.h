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
// The model.* keys (dotted, YAML text) of the model an HF config.json describes (model_type gpt2, bert, t5,
// switch_transformers), as transformers 4.x and 5.x write it: every key that changes what the model computes
// is read (HF's default where the file leaves it out), and a value the zoo cannot build is refused, naming
// the key. `weights`, the checkpoint's tensors, decide T5's head where the config cannot: transformers 5.x
// writes tie_word_embeddings true for every T5 and keeps an lm_head.weight that differs from shared.weight
// apart (without them the config's word is taken). The position table's size is
// model.max_position_embeddings; seq_length is set to it (T5: to n_positions where the file has one) as a
// length to run at.
std::map<std::string, std::string> modelConfigFromHf(const std::string& configJson,
                                                     const std::map<std::string, Tensor>* weights = nullptr);

}  // namespace strata::models
