#include "models/gpt/GptHf.h"

#include <array>
#include <nlohmann/json.hpp>
#include <utility>

#include "strata/core/Error.h"

namespace strata::models {
namespace {

// Strata infix -> HF infix, inside "h.<i>.".
const std::array<std::pair<const char*, const char*>, 6> kBlockNames = {{{"attn.qkv.", "attn.c_attn."},
                                                                         {"attn.proj.", "attn.c_proj."},
                                                                         {"mlp.fc.", "mlp.c_fc."},
                                                                         {"mlp.proj.", "mlp.c_proj."},
                                                                         {"ln_1.", "ln_1."},
                                                                         {"ln_2.", "ln_2."}}};

bool startsWith(const std::string& s, const std::string& p) {
  return s.rfind(p, 0) == 0;
}

}  // namespace

std::string gptNameToHf(const std::string& name) {
  if (name == "wte.weight" || name == "wpe.weight" || startsWith(name, "ln_f.")) return "transformer." + name;
  if (startsWith(name, "h.")) {
    size_t dot = name.find('.', 2);
    std::string head = name.substr(0, dot + 1), rest = name.substr(dot + 1);
    for (const auto& [ours, theirs] : kBlockNames)
      if (startsWith(rest, ours))
        return "transformer." + head + theirs + rest.substr(std::string(ours).size());
  }
  STRATA_FAIL("GPT parameter '{}' has no HF GPT-2 counterpart", name);
}

std::string gptNameFromHf(const std::string& hf) {
  if (!startsWith(hf, "transformer.")) return "";
  std::string name = hf.substr(12);
  if (name == "wte.weight" || name == "wpe.weight" || startsWith(name, "ln_f.")) return name;
  if (startsWith(name, "h.")) {
    size_t dot = name.find('.', 2);
    std::string head = name.substr(0, dot + 1), rest = name.substr(dot + 1);
    for (const auto& [ours, theirs] : kBlockNames)
      if (startsWith(rest, theirs)) return head + ours + rest.substr(std::string(theirs).size());
  }
  return "";
}

std::string gptHfConfigJson(const GptConfig& c, int64_t eosTokenId) {
  STRATA_USER_CHECK(c.bias,
                    "HF's GPT-2 always has biases; a model.bias=false GPT cannot be exported with --hf");
  nlohmann::json j{{"architectures", {"GPT2LMHeadModel"}},
                   {"model_type", "gpt2"},
                   {"vocab_size", c.vocabSize},
                   {"n_positions", c.positions()},
                   {"n_ctx", c.positions()},
                   {"n_embd", c.hiddenSize},
                   {"n_layer", c.numLayers},
                   {"n_head", c.numHeads},
                   {"n_inner", c.ffnHiddenSize > 0 ? nlohmann::json(c.ffnHiddenSize) : nlohmann::json()},
                   {"activation_function", "gelu_new"},
                   {"layer_norm_epsilon", c.layerNormEps},
                   {"resid_pdrop", c.dropout},
                   {"embd_pdrop", c.dropout},
                   {"attn_pdrop", c.dropout},
                   {"initializer_range", c.initStd},
                   {"tie_word_embeddings", true},
                   {"scale_attn_weights", true},
                   {"torch_dtype", "float32"}};
  if (eosTokenId >= 0) {
    j["bos_token_id"] = eosTokenId;
    j["eos_token_id"] = eosTokenId;
  } else {
    j["bos_token_id"] = nullptr;
    j["eos_token_id"] = nullptr;
  }
  return j.dump(2) + "\n";
}

}  // namespace strata::models
