#include "models/t5/T5Hf.h"

#include <nlohmann/json.hpp>

namespace strata::models {

HfLayout t5HfLayout(const T5Config& c) {
  int64_t I = c.innerSize();
  HfLayout out{{"shared.weight", "shared.weight"}};
  auto dense = [&](const std::string& hf, const std::string& ours, int64_t offset = 0, int64_t length = 0) {
    out.push_back({hf + ".weight", ours + ".weight", offset, length, true});
  };
  auto stack = [&](const std::string& name, int64_t layers, bool decoder) {
    out.push_back({name + ".block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                   name + ".relative_bias.weight"});
    for (int64_t i = 0; i < layers; ++i) {
      std::string hf = name + ".block." + std::to_string(i) + ".layer.";
      std::string ours = name + ".block." + std::to_string(i) + ".";
      out.push_back({hf + "0.layer_norm.weight", ours + "attn_norm.weight"});
      dense(hf + "0.SelfAttention.q", ours + "attn.qkv", 0, I);
      dense(hf + "0.SelfAttention.k", ours + "attn.qkv", I, I);
      dense(hf + "0.SelfAttention.v", ours + "attn.qkv", 2 * I, I);
      dense(hf + "0.SelfAttention.o", ours + "attn.proj");
      std::string ff = hf + "1.";
      if (decoder) {
        out.push_back({hf + "1.layer_norm.weight", ours + "cross_norm.weight"});
        dense(hf + "1.EncDecAttention.q", ours + "cross.q");
        dense(hf + "1.EncDecAttention.k", ours + "cross.kv", 0, I);
        dense(hf + "1.EncDecAttention.v", ours + "cross.kv", I, I);
        dense(hf + "1.EncDecAttention.o", ours + "cross.proj");
        ff = hf + "2.";
      }
      out.push_back({ff + "layer_norm.weight", ours + "ff_norm.weight"});
      if (c.gatedGelu) {
        dense(ff + "DenseReluDense.wi_0", ours + "ff.gate");
        dense(ff + "DenseReluDense.wi_1", ours + "ff.up");
      } else {
        dense(ff + "DenseReluDense.wi", ours + "ff.fc");
      }
      dense(ff + "DenseReluDense.wo", ours + "ff.proj");
    }
    out.push_back({name + ".final_layer_norm.weight", name + ".final_norm.weight"});
  };
  stack("encoder", c.numLayers, false);
  stack("decoder", c.decoderLayers(), true);
  if (!c.tieWordEmbeddings) out.push_back({"lm_head.weight", "lm_head.weight"});
  return out;
}

std::string t5HfConfigJson(const T5Config& c) {
  nlohmann::json j{{"architectures", {"T5ForConditionalGeneration"}},
                   {"model_type", "t5"},
                   {"vocab_size", c.vocabSize},
                   {"d_model", c.hiddenSize},
                   {"d_kv", c.headDim},
                   {"d_ff", c.ffnHiddenSize},
                   {"num_layers", c.numLayers},
                   {"num_decoder_layers", c.decoderLayers()},
                   {"num_heads", c.numHeads},
                   {"relative_attention_num_buckets", c.relativeAttentionNumBuckets},
                   {"relative_attention_max_distance", c.relativeAttentionMaxDistance},
                   {"n_positions", c.seqLength},
                   {"dropout_rate", c.dropout},
                   {"layer_norm_epsilon", c.layerNormEps},
                   {"initializer_factor", c.initFactor},
                   {"feed_forward_proj", c.gatedGelu ? "gated-gelu" : "relu"},
                   {"tie_word_embeddings", c.tieWordEmbeddings},
                   {"is_encoder_decoder", true},
                   {"pad_token_id", 0},
                   {"eos_token_id", 1},
                   {"decoder_start_token_id", 0},
                   {"torch_dtype", "float32"}};
  return j.dump(2) + "\n";
}

}  // namespace strata::models
