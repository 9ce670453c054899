// Name mapping between Strata's GPT and HF transformers' GPT2LMHeadModel. Both store linear weights as [in,
// out] (HF's Conv1D), so tensors map one to one without transposes; HF's lm_head.weight is tied to wte.
#pragma once

#include <string>

#include "models/gpt/Gpt.h"

namespace strata::models {

// "h.3.attn.qkv.weight" -> "transformer.h.3.attn.c_attn.weight"; throws on a name with no HF counterpart.
std::string gptNameToHf(const std::string& strataName);
// The inverse; returns "" for HF names Strata does not keep (lm_head.weight, attn.bias/masked_bias buffers).
std::string gptNameFromHf(const std::string& hfName);
// The config.json of HF's GPT2LMHeadModel for `config` (gelu_new, tied head), so that
// GPT2LMHeadModel.from_pretrained loads a `strata convert --hf` directory. `eosTokenId` < 0 leaves the
// bos/eos ids unset (a byte-level vocabulary has no GPT-2 <|endoftext|>). Throws for a GPT HF cannot
// represent (no biases).
std::string gptHfConfigJson(const GptConfig& config, int64_t eosTokenId);

}  // namespace strata::models
