#include "models/bert/BertHf.h"

#include <nlohmann/json.hpp>

namespace strata::models {

HfLayout bertHfLayout(const BertConfig& c) {
  int64_t C = c.hiddenSize;
  HfLayout out{{"bert.embeddings.word_embeddings.weight", "embeddings.word.weight"},
               {"bert.embeddings.position_embeddings.weight", "embeddings.position.weight"},
               {"bert.embeddings.token_type_embeddings.weight", "embeddings.token_type.weight"},
               {"bert.embeddings.LayerNorm.weight", "embeddings.ln.weight"},
               {"bert.embeddings.LayerNorm.bias", "embeddings.ln.bias"}};
  auto dense = [&](const std::string& hf, const std::string& ours, int64_t offset = 0, int64_t length = 0) {
    out.push_back({hf + ".weight", ours + ".weight", offset, length, true});
    out.push_back({hf + ".bias", ours + ".bias", offset, length, false});
  };
  auto norm = [&](const std::string& hf, const std::string& ours) {
    out.push_back({hf + ".weight", ours + ".weight"});
    out.push_back({hf + ".bias", ours + ".bias"});
  };
  for (int64_t i = 0; i < c.numLayers; ++i) {
    std::string hf = "bert.encoder.layer." + std::to_string(i) + ".",
                ours = "layer." + std::to_string(i) + ".";
    dense(hf + "attention.self.query", ours + "attn.qkv", 0, C);
    dense(hf + "attention.self.key", ours + "attn.qkv", C, C);
    dense(hf + "attention.self.value", ours + "attn.qkv", 2 * C, C);
    dense(hf + "attention.output.dense", ours + "attn.proj");
    norm(hf + "attention.output.LayerNorm", ours + "ln_1");
    dense(hf + "intermediate.dense", ours + "mlp.fc");
    dense(hf + "output.dense", ours + "mlp.proj");
    norm(hf + "output.LayerNorm", ours + "ln_2");
  }
  dense("cls.predictions.transform.dense", "cls.transform");
  norm("cls.predictions.transform.LayerNorm", "cls.ln");
  out.push_back({"cls.predictions.bias", "cls.bias"});
  if (c.nspHead) {
    dense("bert.pooler.dense", "pooler");
    dense("cls.seq_relationship", "nsp");
  }
  return out;
}

std::string bertHfConfigJson(const BertConfig& c) {
  const char* act = c.activation == nn::Activation::GeluErf    ? "gelu"
                    : c.activation == nn::Activation::GeluTanh ? "gelu_new"
                                                               : "relu";
  nlohmann::json j{{"architectures", {c.nspHead ? "BertForPreTraining" : "BertForMaskedLM"}},
                   {"model_type", "bert"},
                   {"vocab_size", c.vocabSize},
                   {"hidden_size", c.hiddenSize},
                   {"num_hidden_layers", c.numLayers},
                   {"num_attention_heads", c.numHeads},
                   {"intermediate_size", c.ffn()},
                   {"hidden_act", act},
                   {"hidden_dropout_prob", c.dropout},
                   {"attention_probs_dropout_prob", c.dropout},
                   {"max_position_embeddings", c.positions()},
                   {"type_vocab_size", c.typeVocabSize},
                   {"initializer_range", c.initStd},
                   {"layer_norm_eps", c.layerNormEps},
                   {"pad_token_id", c.padId()},
                   {"position_embedding_type", "absolute"},
                   {"tie_word_embeddings", true},
                   {"torch_dtype", "float32"}};
  return j.dump(2) + "\n";
}

}  // namespace strata::models
