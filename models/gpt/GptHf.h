// Name mapping between Strata's GPT and HF transformers' GPT2LMHeadModel. Both store linear weights as [in,
// out] (HF's Conv1D), so tensors map one to one without transposes; HF's lm_head.weight is tied to wte.
#pragma once

#include <string>

namespace strata::models {

// "h.3.attn.qkv.weight" -> "transformer.h.3.attn.c_attn.weight"; throws on a name with no HF counterpart.
std::string gptNameToHf(const std::string& strataName);
// The inverse; returns "" for HF names Strata does not keep (lm_head.weight, attn.bias/masked_bias buffers).
std::string gptNameFromHf(const std::string& hfName);

}  // namespace strata::models
