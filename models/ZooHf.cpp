#include "models/ZooHf.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <type_traits>

#include "models/bert/BertHf.h"
#include "models/gpt/GptHf.h"
#include "models/t5/T5Hf.h"

namespace strata::models {
namespace {

// Refuses a zoo model that no HF transformers class computes.
void checkHfForm(const ModelSpec& spec) {
  STRATA_USER_CHECK(objective(spec.arch) != Objective::CausalLM || spec.moeNumExperts == 0,
                    "a GPT with mixture-of-experts blocks (model.moe_num_experts {}) has no HF transformers "
                    "architecture to export to (--hf); `strata convert CHECKPOINT OUT.safetensors` merges "
                    "its weights into one file under Strata's own names (h.<i>.mlp.router.weight, "
                    "h.<i>.mlp.experts.<e>.fc.weight, ...)",
                    spec.moeNumExperts);
}

}  // namespace

HfLayout hfLayout(const ModelSpec& spec) {
  checkHfForm(spec);
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
  checkHfForm(spec);
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
  checkHfForm(spec);
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

// One HF config.json, read key by key with HF's own default where the file leaves a key out (transformers
// writes only some of them, and its defaults are not Strata's: BERT's layer_norm_eps is 1e-12). A key whose
// value the zoo cannot build is refused, naming the key, the value and what Strata has instead.
class HfConfig {
 public:
  explicit HfConfig(const std::string& text) {
    try {
      j_ = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      STRATA_USER_FAIL("the HF config.json is not JSON: {}", e.what());
    }
    STRATA_USER_CHECK(j_.is_object(), "the HF config.json is not a JSON object");
    type_ = j_.value("model_type", "");
  }

  const std::string& type() const { return type_; }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  bool isNull(const char* key) const { return j_.contains(key) && j_[key].is_null(); }

  template <class T>
  T get(const char* key, T fallback) const {
    if (!has(key)) return fallback;
    try {
      return j_[key].get<T>();
    } catch (const nlohmann::json::exception&) {
      STRATA_USER_FAIL("the HF {} config.json's '{}' is {}, not {}", type_, key, j_[key].dump(),
                       std::is_same_v<T, bool>          ? "true or false"
                       : std::is_same_v<T, std::string> ? "a string"
                                                        : "a number");
    }
  }
  template <class T>
  T required(const char* key) const {
    STRATA_USER_CHECK(has(key), "the HF {} config.json has no '{}'", type_, key);
    return get<T>(key, T());
  }
  // Refuses any value of `key` but `supported` (absent: HF's `fallback`), saying why.
  template <class T>
  void expect(const char* key, T fallback, T supported, const std::string& why) const {
    T value = get<T>(key, fallback);
    STRATA_USER_CHECK(value == supported, "the HF {} config.json's '{}' is {}: {}", type_, key, text(value),
                      why);
  }
  bool listsArchitecture(const std::string& name) const {
    if (!j_.contains("architectures") || !j_["architectures"].is_array()) return false;
    for (const auto& a : j_["architectures"])
      if (a.is_string() && a.get<std::string>() == name) return true;
    return false;
  }

  template <class T>
  static std::string text(const T& v) {
    if constexpr (std::is_same_v<T, bool>) {
      return v ? "true" : "false";
    } else if constexpr (std::is_same_v<T, std::string>) {
      return v;
    } else {
      return nlohmann::json(v).dump();
    }
  }

 private:
  nlohmann::json j_;
  std::string type_;
};

// Whether two tensors hold the same numbers (bit for bit in one dtype).
bool sameValues(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  Tensor x = a.to(Device::cpu(), DType::F32).contiguous(), y = b.to(Device::cpu(), DType::F32).contiguous();
  return std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
}

// The model's dropout: Strata has one rate where HF may name several; they must agree.
double oneDropout(const HfConfig& hf, std::initializer_list<const char*> keys, double fallback) {
  double rate = hf.get<double>(*keys.begin(), fallback);
  for (const char* key : keys)
    STRATA_USER_CHECK(hf.get<double>(key, fallback) == rate,
                      "the HF {} config.json's '{}' ({}) differs from its '{}' ({}): Strata's model.dropout "
                      "is one rate for all of them; make them equal in config.json",
                      hf.type(), key, hf.get<double>(key, fallback), *keys.begin(), rate);
  return rate;
}

void readGpt2(const HfConfig& hf, std::map<std::string, std::string>& out) {
  out["model.arch"] = "gpt";
  out["model.num_layers"] = HfConfig::text(hf.required<int64_t>("n_layer"));
  out["model.hidden_size"] = HfConfig::text(hf.required<int64_t>("n_embd"));
  out["model.num_attention_heads"] = HfConfig::text(hf.required<int64_t>("n_head"));
  out["model.vocab_size"] = HfConfig::text(hf.required<int64_t>("vocab_size"));
  out["model.ffn_hidden_size"] = HfConfig::text(hf.get<int64_t>("n_inner", 0));  // null: 4 x n_embd
  int64_t positions = hf.get<int64_t>("n_positions", hf.get<int64_t>("n_ctx", 1024));
  out["model.max_position_embeddings"] = HfConfig::text(positions);
  out["model.seq_length"] = HfConfig::text(positions);
  out["model.layer_norm_eps"] = HfConfig::text(hf.get<double>("layer_norm_epsilon", 1e-5));
  out["model.dropout"] = HfConfig::text(oneDropout(hf, {"resid_pdrop", "embd_pdrop", "attn_pdrop"}, 0.1));
  out["model.init_std"] = HfConfig::text(hf.get<double>("initializer_range", 0.02));
  std::string act = hf.get<std::string>("activation_function", "gelu_new");
  STRATA_USER_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh",
                    "the HF gpt2 config.json's 'activation_function' is {}: Strata's GPT uses the tanh GELU "
                    "(gelu_new, gelu_pytorch_tanh)",
                    act);
  hf.expect("scale_attn_weights", true, true, "Strata's GPT scales the attention scores by 1/sqrt(head dim)");
  hf.expect("scale_attn_by_inverse_layer_idx", false, false,
            "Strata's GPT does not scale the scores by 1/(layer + 1)");
  hf.expect("add_cross_attention", false, false, "Strata's GPT has no cross-attention");
  hf.expect("tie_word_embeddings", true, true, "Strata's GPT ties its head to wte");
}

void readBert(const HfConfig& hf, std::map<std::string, std::string>& out) {
  out["model.arch"] = "bert";
  out["model.num_layers"] = HfConfig::text(hf.required<int64_t>("num_hidden_layers"));
  out["model.hidden_size"] = HfConfig::text(hf.required<int64_t>("hidden_size"));
  out["model.num_attention_heads"] = HfConfig::text(hf.required<int64_t>("num_attention_heads"));
  out["model.ffn_hidden_size"] = HfConfig::text(hf.required<int64_t>("intermediate_size"));
  out["model.vocab_size"] = HfConfig::text(hf.required<int64_t>("vocab_size"));
  int64_t positions = hf.get<int64_t>("max_position_embeddings", 512);
  out["model.max_position_embeddings"] = HfConfig::text(positions);
  out["model.seq_length"] = HfConfig::text(positions);
  out["model.num_tokentypes"] = HfConfig::text(hf.get<int64_t>("type_vocab_size", 2));
  out["model.layer_norm_eps"] = HfConfig::text(hf.get<double>("layer_norm_eps", 1e-12));
  out["model.dropout"] =
      HfConfig::text(oneDropout(hf, {"hidden_dropout_prob", "attention_probs_dropout_prob"}, 0.1));
  out["model.init_std"] = HfConfig::text(hf.get<double>("initializer_range", 0.02));
  STRATA_USER_CHECK(
      !hf.isNull("pad_token_id"),
      "the HF bert config.json's 'pad_token_id' is null: Strata's BERT always has a [PAD] whose "
      "embedding row takes no gradient from lookups; set pad_token_id to the vocabulary's [PAD]");
  out["model.pad_token_id"] = HfConfig::text(hf.get<int64_t>("pad_token_id", 0));
  std::string act = hf.get<std::string>("hidden_act", "gelu");
  STRATA_USER_CHECK(act == "gelu" || act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "relu",
                    "the HF bert config.json's 'hidden_act' is {}: Strata's BERT has gelu, gelu_new (or "
                    "gelu_pytorch_tanh) and relu",
                    act);
  out["model.activation"] = act == "gelu" ? "gelu" : act == "relu" ? "relu" : "gelu_tanh";
  hf.expect<std::string>("position_embedding_type", "absolute", "absolute",
                         "Strata's BERT has absolute position embeddings");
  hf.expect("is_decoder", false, false, "Strata's BERT is an encoder (no causal mask)");
  hf.expect("add_cross_attention", false, false, "Strata's BERT has no cross-attention");
  hf.expect("tie_word_embeddings", true, true, "Strata's BERT ties its MLM decoder to the word embeddings");
  out["model.bert_binary_head"] = hf.listsArchitecture("BertForPreTraining") ? "true" : "false";
}

void readSwitch(const HfConfig& hf, std::map<std::string, std::string>& out) {
  // Top-1 experts in every sparse_step-th block; HF's expert_capacity (per sequence) has no Strata form,
  // which sets a capacity factor per batch (model.moe_capacity_factor keeps its default).
  out["model.moe_num_experts"] = HfConfig::text(hf.required<int64_t>("num_experts"));
  out["model.moe_top_k"] = "1";
  int64_t layers = hf.get<int64_t>("num_layers", 12);
  int64_t decoderLayers = hf.get<int64_t>("num_decoder_layers", layers);
  int64_t sparseEncoder = hf.get<int64_t>("num_sparse_encoder_layers", 0),
          sparseDecoder = hf.get<int64_t>("num_sparse_decoder_layers", 0);
  STRATA_USER_CHECK(sparseEncoder > 0 && sparseDecoder > 0,
                    "HF switch_transformers config without sparse layers in both stacks "
                    "(num_sparse_encoder_layers {}, num_sparse_decoder_layers {})",
                    sparseEncoder, sparseDecoder);
  int64_t step = layers / sparseEncoder;
  STRATA_USER_CHECK(decoderLayers / sparseDecoder == step,
                    "HF switch_transformers config with different sparse steps in the encoder ({}) and the "
                    "decoder ({}): Strata's model.moe_every is one for both",
                    step, decoderLayers / sparseDecoder);
  out["model.moe_every"] = std::to_string(step);
  out["model.moe_z_loss_coef"] = HfConfig::text(hf.get<double>("router_z_loss_coef", 0.001));
  out["model.moe_aux_loss_coef"] = HfConfig::text(hf.get<double>("router_aux_loss_coef", 0.001));
  hf.expect("router_bias", false, false, "Strata's router has no bias");
  hf.expect<std::string>("dense_act_fn", "relu", "relu", "Strata's experts are ReLU");
}

// T5's head: tied to `shared` or a table of its own, and the decoder output scaled by d_model^-0.5 or not.
// transformers 4.x reads both from tie_word_embeddings (tied and scaled, or untied and unscaled). 5.x writes
// tie_word_embeddings true for every T5 and the scaling as scale_decoder_outputs; it keeps a checkpoint's
// lm_head.weight apart from shared.weight when the two differ (a 4.x v1.1 checkpoint saved again).
void readT5Head(const HfConfig& hf, const std::map<std::string, Tensor>* weights,
                std::map<std::string, std::string>& out) {
  bool tied = hf.get<bool>("tie_word_embeddings", true);
  bool scaled = tied;
  bool written5 = hf.type() == "t5" && hf.has("scale_decoder_outputs");
  if (written5) scaled = hf.get<bool>("scale_decoder_outputs", true);
  if (tied && weights != nullptr) {
    auto head = weights->find("lm_head.weight"), shared = weights->find("shared.weight");
    bool distinct =
        head != weights->end() && (shared == weights->end() || !sameValues(head->second, shared->second));
    STRATA_USER_CHECK(
        !distinct || written5,
        "the HF {} config.json's 'tie_word_embeddings' is true but the weights hold an "
        "lm_head.weight that differs from shared.weight: transformers 4.x ties the two (dropping "
        "lm_head.weight) and 5.x keeps them apart, so the checkpoint is two different models. "
        "Set tie_word_embeddings to false for a head of its own, or delete lm_head.weight for "
        "the tied one",
        hf.type());
    tied = !distinct;
  }
  out["model.untie_embeddings_and_output_weights"] = tied ? "false" : "true";
  out["model.scale_decoder_outputs"] = scaled ? "true" : "false";
}

void readT5(const HfConfig& hf, const std::map<std::string, Tensor>* weights,
            std::map<std::string, std::string>& out) {
  out["model.arch"] = "t5";
  out["model.bias"] = "false";
  int64_t layers = hf.required<int64_t>("num_layers");
  out["model.num_layers"] = HfConfig::text(layers);
  out["model.decoder_num_layers"] = HfConfig::text(hf.get<int64_t>("num_decoder_layers", layers));
  out["model.hidden_size"] = HfConfig::text(hf.required<int64_t>("d_model"));
  out["model.num_attention_heads"] = HfConfig::text(hf.required<int64_t>("num_heads"));
  out["model.kv_channels"] = HfConfig::text(hf.required<int64_t>("d_kv"));
  out["model.ffn_hidden_size"] = HfConfig::text(hf.required<int64_t>("d_ff"));
  out["model.vocab_size"] = HfConfig::text(hf.required<int64_t>("vocab_size"));
  out["model.relative_attention_num_buckets"] =
      HfConfig::text(hf.get<int64_t>("relative_attention_num_buckets", 32));
  out["model.relative_attention_max_distance"] =
      HfConfig::text(hf.get<int64_t>("relative_attention_max_distance", 128));
  out["model.layer_norm_eps"] = HfConfig::text(hf.get<double>("layer_norm_epsilon", 1e-6));
  out["model.dropout"] = HfConfig::text(hf.get<double>("dropout_rate", 0.1));
  // T5 has no position table; old configs' n_positions is only a length to run at.
  if (hf.has("n_positions")) out["model.seq_length"] = HfConfig::text(hf.get<int64_t>("n_positions", 512));
  if (hf.type() == "switch_transformers") readSwitch(hf, out);
  std::string ff = hf.get<std::string>("feed_forward_proj", "relu");
  STRATA_USER_CHECK(ff == "relu" || ff == "gated-gelu",
                    "the HF {} config.json's 'feed_forward_proj' is {}: Strata's T5 has relu (v1.0) and "
                    "gated-gelu (v1.1)",
                    hf.type(), ff);
  bool gated = ff == "gated-gelu";
  out["model.activation"] = gated ? "gated_gelu" : "relu";
  // transformers derives these from feed_forward_proj, but 4.x lets the saved values override it.
  if (hf.type() == "t5") {
    hf.expect<std::string>("dense_act_fn", gated ? "gelu_new" : "relu", gated ? "gelu_new" : "relu",
                           "it contradicts feed_forward_proj " + ff);
    hf.expect("is_gated_act", gated, gated, "it contradicts feed_forward_proj " + ff);
  }
  readT5Head(hf, weights, out);
  // Strata's span corruption starts the decoder with [PAD], as HF's _shift_right with these equal.
  int64_t pad = hf.get<int64_t>("pad_token_id", 0);
  STRATA_USER_CHECK(hf.get<int64_t>("decoder_start_token_id", pad) == pad,
                    "the HF {} config.json's 'decoder_start_token_id' ({}) is not its 'pad_token_id' ({}): "
                    "Strata's span corruption starts the decoder with [PAD]",
                    hf.type(), hf.get<int64_t>("decoder_start_token_id", pad), pad);
}

}  // namespace

std::map<std::string, std::string> modelConfigFromHf(const std::string& text,
                                                     const std::map<std::string, Tensor>* weights) {
  HfConfig hf(text);
  std::map<std::string, std::string> out;
  if (hf.type() == "gpt2") {
    readGpt2(hf, out);
  } else if (hf.type() == "bert") {
    readBert(hf, out);
  } else if (hf.type() == "t5" || hf.type() == "switch_transformers") {
    readT5(hf, weights, out);
  } else {
    STRATA_USER_FAIL("HF model_type '{}' is not in Strata's zoo (gpt2, bert, t5, switch_transformers)",
                     hf.type());
  }
  return out;
}

}  // namespace strata::models
