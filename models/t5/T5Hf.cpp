#include "models/t5/T5Hf.h"

#include <nlohmann/json.hpp>

#include <cmath>

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
      if (c.moeNumExperts > 0 && c.isMoeLayer(i)) {
        dense(ff + "mlp.router.classifier", ours + "ff.router");
        for (int64_t e = 0; e < c.moeNumExperts; ++e) {
          std::string hfExpert = ff + "mlp.experts.expert_" + std::to_string(e) + ".";
          std::string expert = ours + "ff.experts." + std::to_string(e) + ".";
          dense(hfExpert + "wi", expert + "fc");
          dense(hfExpert + "wo", expert + "proj");
        }
        continue;
      }
      if (c.moeNumExperts > 0) {
        dense(ff + "mlp.wi", ours + "ff.fc");
        dense(ff + "mlp.wo", ours + "ff.proj");
        continue;
      }
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

int64_t switchSparseLayers(const T5Config& c, int64_t layers) {
  int64_t sparse = 0;
  for (int64_t i = 0; i < layers; ++i) sparse += c.isMoeLayer(i) ? 1 : 0;
  STRATA_USER_CHECK(
      sparse > 0 && layers / sparse == c.moeEvery,
      "HF's SwitchTransformers puts a sparse layer every num_layers / num_sparse_layers blocks: "
      "{} layers with model.moe_every {} ({} sparse) have no HF form",
      layers, c.moeEvery, sparse);
  return sparse;
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
                   {"dropout_rate", c.dropout},
                   {"layer_norm_epsilon", c.layerNormEps},
                   {"initializer_factor", c.initFactor},
                   {"feed_forward_proj", c.gatedGelu ? "gated-gelu" : "relu"},
                   {"tie_word_embeddings", c.tieWordEmbeddings},
                   {"scale_decoder_outputs", c.scaleDecoderOutputs},
                   {"is_encoder_decoder", true},
                   {"pad_token_id", 0},
                   {"eos_token_id", 1},
                   {"decoder_start_token_id", 0},
                   {"torch_dtype", "float32"}};
  if (c.moeNumExperts > 0) {
    // Switch Transformers: T5's keys, and its experts'.
    STRATA_USER_CHECK(c.scaleDecoderOutputs == c.tieWordEmbeddings,
                      "HF's SwitchTransformers scales the decoder output exactly when its head is tied: "
                      "model.scale_decoder_outputs {} with {} head has no HF form",
                      c.scaleDecoderOutputs ? "true" : "false", c.tieWordEmbeddings ? "a tied" : "an untied");
    j["architectures"] = {"SwitchTransformersForConditionalGeneration"};
    j["model_type"] = "switch_transformers";
    j.erase("scale_decoder_outputs");
    j["num_sparse_encoder_layers"] = switchSparseLayers(c, c.numLayers);
    j["num_sparse_decoder_layers"] = switchSparseLayers(c, c.decoderLayers());
    j["num_experts"] = c.moeNumExperts;
    j["expert_capacity"] = std::max<int64_t>(
        1, int64_t(std::ceil(c.moeCapacityFactor * double(c.seqLength) / double(c.moeNumExperts))));
    j["router_bias"] = false;
    j["router_jitter_noise"] = 0.0;
    j["router_dtype"] = "float32";
    j["router_ignore_padding_tokens"] = false;
    j["router_z_loss_coef"] = c.moeZLossCoef;
    j["router_aux_loss_coef"] = c.moeAuxLossCoef;
    j["dense_act_fn"] = "relu";
  }
  return j.dump(2) + "\n";
}

}  // namespace strata::models
