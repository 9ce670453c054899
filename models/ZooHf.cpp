#include "models/ZooHf.h"

#include <nlohmann/json.hpp>

#include "models/bert/BertHf.h"
#include "models/gpt/GptHf.h"
#include "models/t5/T5Hf.h"

namespace strata::models {

HfLayout hfLayout(const ModelSpec& spec) {
  switch (objective(spec.arch)) {
    case Objective::CausalLM: {
      // GPT-2's tensors are Strata's under other names ([in, out] on both sides: HF's Conv1D).
      HfLayout out;
      for (const auto& [name, shape] : parameterShapes(spec)) out.push_back({gptNameToHf(name), name});
      return out;
    }
    case Objective::MaskedLM:
      return bertHfLayout(bertConfig(spec));
    case Objective::SpanCorruption:
      return t5HfLayout(t5Config(spec));
  }
  STRATA_USER_FAIL("model.arch '{}' has no HF form", spec.arch);
}

std::string hfModelClass(const ModelSpec& spec) {
  switch (objective(spec.arch)) {
    case Objective::CausalLM:
      return "GPT2LMHeadModel";
    case Objective::MaskedLM:
      return spec.bertBinaryHead ? "BertForPreTraining" : "BertForMaskedLM";
    case Objective::SpanCorruption:
      return spec.moeNumExperts > 0 ? "SwitchTransformersForConditionalGeneration"
                                    : "T5ForConditionalGeneration";
  }
  return "";
}

std::string hfConfigJson(const ModelSpec& spec, int64_t eosTokenId) {
  switch (objective(spec.arch)) {
    case Objective::CausalLM:
      return gptHfConfigJson(gptConfig(spec), eosTokenId);
    case Objective::MaskedLM:
      return bertHfConfigJson(bertConfig(spec));
    case Objective::SpanCorruption:
      return t5HfConfigJson(t5Config(spec));
  }
  return "";
}

bool isRenameOnly(const HfLayout& layout) {
  for (const HfTensor& t : layout)
    if (t.offset != 0 || t.length != 0 || t.transpose) return false;
  return true;
}

namespace {

std::string yamlText(const nlohmann::json& v) {
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

}  // namespace

std::map<std::string, std::string> modelConfigFromHf(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    STRATA_USER_FAIL("the HF config.json is not JSON: {}", e.what());
  }
  std::string type = j.value("model_type", "");
  std::map<std::string, std::string> out;
  // Strata key <- the first of the HF keys present; `required` stops on none.
  auto take = [&](const std::string& key, std::initializer_list<const char*> hf, bool required = true) {
    for (const char* k : hf)
      if (j.contains(k) && !j[k].is_null()) {
        out["model." + key] = yamlText(j[k]);
        return;
      }
    STRATA_USER_CHECK(!required, "the HF {} config.json has no '{}'", type, *hf.begin());
  };
  if (type == "gpt2") {
    out["model.arch"] = "gpt";
    take("num_layers", {"n_layer"});
    take("hidden_size", {"n_embd"});
    take("num_attention_heads", {"n_head"});
    take("ffn_hidden_size", {"n_inner"}, false);
    take("seq_length", {"n_positions", "n_ctx"});
    take("vocab_size", {"vocab_size"});
    take("layer_norm_eps", {"layer_norm_epsilon"}, false);
    take("dropout", {"resid_pdrop"}, false);
    std::string act = j.value("activation_function", "gelu_new");
    STRATA_USER_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
                      "HF GPT-2 activation_function '{}': Strata's GPT uses the tanh GELU (gelu_new)", act);
  } else if (type == "bert") {
    out["model.arch"] = "bert";
    take("num_layers", {"num_hidden_layers"});
    take("hidden_size", {"hidden_size"});
    take("num_attention_heads", {"num_attention_heads"});
    take("ffn_hidden_size", {"intermediate_size"});
    take("seq_length", {"max_position_embeddings"});
    take("vocab_size", {"vocab_size"});
    take("num_tokentypes", {"type_vocab_size"}, false);
    take("layer_norm_eps", {"layer_norm_eps"}, false);
    take("dropout", {"hidden_dropout_prob"}, false);
    std::string act = j.value("hidden_act", "gelu");
    STRATA_USER_CHECK(act == "gelu" || act == "gelu_new" || act == "relu",
                      "HF BERT hidden_act '{}' is not one Strata has (gelu, gelu_new, relu)", act);
    out["model.activation"] = act == "gelu" ? "gelu" : act == "gelu_new" ? "gelu_tanh" : "relu";
    std::string position = j.value("position_embedding_type", "absolute");
    STRATA_USER_CHECK(position == "absolute",
                      "HF BERT position_embedding_type '{}': Strata's BERT has absolute ones", position);
    bool nsp = false;
    if (j.contains("architectures"))
      for (const auto& a : j["architectures"]) nsp = nsp || a.get<std::string>() == "BertForPreTraining";
    out["model.bert_binary_head"] = nsp ? "true" : "false";
  } else if (type == "t5" || type == "switch_transformers") {
    out["model.arch"] = "t5";
    out["model.bias"] = "false";
    take("num_layers", {"num_layers"});
    take("decoder_num_layers", {"num_decoder_layers"}, false);
    take("hidden_size", {"d_model"});
    take("num_attention_heads", {"num_heads"});
    take("kv_channels", {"d_kv"});
    take("ffn_hidden_size", {"d_ff"});
    take("vocab_size", {"vocab_size"});
    take("relative_attention_num_buckets", {"relative_attention_num_buckets"}, false);
    take("relative_attention_max_distance", {"relative_attention_max_distance"}, false);
    take("layer_norm_eps", {"layer_norm_epsilon"}, false);
    take("seq_length", {"n_positions"}, false);
    take("dropout", {"dropout_rate"}, false);
    if (type == "switch_transformers") {
      // Top-1 experts in every sparse_step-th block; HF's expert_capacity (per sequence) has no Strata form,
      // which sets a capacity factor per batch (model.moe_capacity_factor keeps its default).
      take("moe_num_experts", {"num_experts"});
      out["model.moe_top_k"] = "1";
      int64_t layers = j.value("num_layers", int64_t(12));
      int64_t decoderLayers = j.contains("num_decoder_layers") && !j["num_decoder_layers"].is_null()
                                  ? j["num_decoder_layers"].get<int64_t>()
                                  : layers;
      int64_t sparseEncoder = j.value("num_sparse_encoder_layers", int64_t(0)),
              sparseDecoder = j.value("num_sparse_decoder_layers", int64_t(0));
      STRATA_USER_CHECK(sparseEncoder > 0 && sparseDecoder > 0,
                        "HF switch_transformers config without sparse layers in both stacks "
                        "(num_sparse_encoder_layers {}, num_sparse_decoder_layers {})",
                        sparseEncoder, sparseDecoder);
      int64_t step = layers / sparseEncoder;
      STRATA_USER_CHECK(
          decoderLayers / sparseDecoder == step,
          "HF switch_transformers config with different sparse steps in the encoder ({}) and the "
          "decoder ({}): Strata's model.moe_every is one for both",
          step, decoderLayers / sparseDecoder);
      out["model.moe_every"] = std::to_string(step);
      take("moe_z_loss_coef", {"router_z_loss_coef"}, false);
      take("moe_aux_loss_coef", {"router_aux_loss_coef"}, false);
      STRATA_USER_CHECK(!j.value("router_bias", false),
                        "HF switch_transformers router_bias: Strata's router has none");
      std::string act = j.value("dense_act_fn", "relu");
      STRATA_USER_CHECK(act == "relu", "HF switch_transformers dense_act_fn '{}': Strata's experts are ReLU",
                        act);
    }
    std::string ff = j.value("feed_forward_proj", "relu");
    STRATA_USER_CHECK(ff == "relu" || ff == "gated-gelu",
                      "HF T5 feed_forward_proj '{}': Strata's T5 has relu (v1.0) and gated-gelu (v1.1)", ff);
    out["model.activation"] = ff == "gated-gelu" ? "gated_gelu" : "relu";
    out["model.untie_embeddings_and_output_weights"] =
        j.value("tie_word_embeddings", true) ? "false" : "true";
  } else {
    STRATA_USER_FAIL("HF model_type '{}' is not in Strata's zoo (gpt2, bert, t5, switch_transformers)", type);
  }
  return out;
}

}  // namespace strata::models
