// YAML config loading: one schema table, one walk over the document, one validation pass.
#include "strata/config/Config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>

#include "strata/core/Error.h"
#include "strata/optim/Adafactor.h"

namespace strata::config {
namespace {

enum class Kind { Int, Float, String, Bool, FloatList };

struct Field {
  std::string key;
  Kind kind;
  std::function<void(Config&, const YAML::Node&)> assign;
  std::vector<std::string> choices;  // for strings
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  std::function<std::string(const Config&)> show;  // the effective value as YAML text
};

std::string numberText(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

const char* kindName(Kind k) {
  switch (k) {
    case Kind::Int:
      return "an integer";
    case Kind::Float:
      return "a number";
    case Kind::String:
      return "a string";
    case Kind::Bool:
      return "true or false";
    case Kind::FloatList:
      return "a list of numbers";
  }
  return "?";
}

// `ref` maps a Config to the member the key sets; the same accessor reads the effective value back.
template <class Ref>
Field intField(std::string key, Ref ref, double min = 0, double max = 1e18) {
  return Field{std::move(key),
               Kind::Int,
               [ref](Config& c, const YAML::Node& n) { ref(c) = n.as<int64_t>(); },
               {},
               min,
               max,
               [ref](const Config& c) { return std::to_string(ref(const_cast<Config&>(c))); }};
}
template <class Ref>
Field floatField(std::string key, Ref ref, double min = 0, double max = 1e18) {
  return Field{std::move(key),
               Kind::Float,
               [ref](Config& c, const YAML::Node& n) { ref(c) = n.as<double>(); },
               {},
               min,
               max,
               [ref](const Config& c) { return numberText(ref(const_cast<Config&>(c))); }};
}
template <class Ref>
Field stringField(std::string key, Ref ref, std::vector<std::string> choices = {}) {
  return Field{std::move(key),
               Kind::String,
               [ref](Config& c, const YAML::Node& n) { ref(c) = n.as<std::string>(); },
               std::move(choices),
               -std::numeric_limits<double>::infinity(),
               std::numeric_limits<double>::infinity(),
               [ref](const Config& c) { return ref(const_cast<Config&>(c)); }};
}
template <class Ref>
Field boolField(std::string key, Ref ref) {
  return Field{
      std::move(key),
      Kind::Bool,
      [ref](Config& c, const YAML::Node& n) { ref(c) = n.as<bool>(); },
      {},
      -std::numeric_limits<double>::infinity(),
      std::numeric_limits<double>::infinity(),
      [ref](const Config& c) { return std::string(ref(const_cast<Config&>(c)) ? "true" : "false"); }};
}

const std::vector<Field>& schema() {
  static const std::vector<Field> fields = [] {
    std::vector<Field> f;
    // model
    f.push_back(
        stringField("model.arch", [](Config & c) -> auto& { return c.model.arch; }, {"gpt", "bert", "t5"}));
    f.push_back(intField(
        "model.num_layers", [](Config & c) -> auto& { return c.model.numLayers; }, 1));
    f.push_back(intField(
        "model.hidden_size", [](Config & c) -> auto& { return c.model.hiddenSize; }, 1));
    f.push_back(intField(
        "model.num_attention_heads", [](Config & c) -> auto& { return c.model.numAttentionHeads; }, 1));
    f.push_back(intField(
        "model.ffn_hidden_size", [](Config & c) -> auto& { return c.model.ffnHiddenSize; }, 0));
    f.push_back(intField(
        "model.seq_length", [](Config & c) -> auto& { return c.model.seqLength; }, 1));
    f.push_back(intField(
        "model.vocab_size", [](Config & c) -> auto& { return c.model.vocabSize; }, 1));
    f.push_back(floatField(
        "model.dropout", [](Config & c) -> auto& { return c.model.dropout; }, 0, 0.999));
    f.push_back(floatField(
        "model.layer_norm_eps", [](Config & c) -> auto& { return c.model.layerNormEps; }, 0, 1));
    f.push_back(boolField(
        "model.bias", [](Config & c) -> auto& { return c.model.bias; }));
    f.push_back(floatField(
        "model.init_std", [](Config & c) -> auto& { return c.model.initStd; }, 0, 10));
    f.push_back(intField(
        "model.kv_channels", [](Config & c) -> auto& { return c.model.kvChannels; }, 0));
    f.push_back(intField(
        "model.decoder_num_layers", [](Config & c) -> auto& { return c.model.decoderNumLayers; }, 0));
    f.push_back(intField(
        "model.decoder_seq_length", [](Config & c) -> auto& { return c.model.decoderSeqLength; }, 0));
    f.push_back(intField(
        "model.num_tokentypes", [](Config & c) -> auto& { return c.model.numTokentypes; }, 1));
    f.push_back(intField(
        "model.relative_attention_num_buckets",
        [](Config & c) -> auto& { return c.model.relativeAttentionNumBuckets; }, 4));
    f.push_back(intField(
        "model.relative_attention_max_distance",
        [](Config & c) -> auto& { return c.model.relativeAttentionMaxDistance; }, 1));
    f.push_back(stringField("model.activation", [](Config & c) -> auto& { return c.model.activation; },
                            {"default", "gelu", "gelu_tanh", "relu", "gated_gelu"}));
    f.push_back(boolField(
        "model.untie_embeddings_and_output_weights",
        [](Config & c) -> auto& { return c.model.untieEmbeddingsAndOutputWeights; }));
    f.push_back(boolField(
        "model.bert_binary_head", [](Config & c) -> auto& { return c.model.bertBinaryHead; }));
    f.push_back(boolField(
        "model.fp32_residual", [](Config & c) -> auto& { return c.model.fp32Residual; }));
    f.push_back(intField(
        "model.moe_num_experts", [](Config & c) -> auto& { return c.model.moeNumExperts; }, 0, 4096));
    f.push_back(intField(
        "model.moe_top_k", [](Config & c) -> auto& { return c.model.moeTopK; }, 1, 2));
    f.push_back(intField(
        "model.moe_every", [](Config & c) -> auto& { return c.model.moeEvery; }, 1, 1024));
    f.push_back(floatField(
        "model.moe_capacity_factor", [](Config & c) -> auto& { return c.model.moeCapacityFactor; }, 0.01,
        1e6));
    f.push_back(floatField(
        "model.moe_eval_capacity_factor", [](Config & c) -> auto& { return c.model.moeEvalCapacityFactor; },
        0.01, 1e6));
    f.push_back(floatField(
        "model.moe_aux_loss_coef", [](Config & c) -> auto& { return c.model.moeAuxLossCoef; }, 0, 1e6));
    f.push_back(floatField(
        "model.moe_z_loss_coef", [](Config & c) -> auto& { return c.model.moeZLossCoef; }, 0, 1e6));
    f.push_back(intField(
        "model.moe_expert_parallel_size", [](Config & c) -> auto& { return c.model.moeExpertParallelSize; },
        1, 4096));
    // model: what HF checkpoints carry besides the shapes
    f.push_back(intField(
        "model.max_position_embeddings", [](Config & c) -> auto& { return c.model.maxPositionEmbeddings; },
        0));
    f.push_back(intField(
        "model.pad_token_id", [](Config & c) -> auto& { return c.model.padTokenId; }, -1));
    f.push_back(stringField("model.scale_decoder_outputs",
                            [](Config & c) -> auto& { return c.model.scaleDecoderOutputs; },
                            {"default", "true", "false"}));
    // data
    f.push_back(stringField(
        "data.path", [](Config & c) -> auto& { return c.data.path; }));
    f.push_back(stringField("data.format", [](Config & c) -> auto& { return c.data.format; },
                            {"text", "nanogpt", "megatron", "random"}));
    f.push_back(stringField("data.tokenizer", [](Config & c) -> auto& { return c.data.tokenizer; },
                            {"byte", "gpt2", "sentencepiece"}));
    f.push_back(stringField(
        "data.vocab_file", [](Config & c) -> auto& { return c.data.vocabFile; }));
    f.push_back(stringField(
        "data.merges_file", [](Config & c) -> auto& { return c.data.mergesFile; }));
    f.push_back(floatField(
        "data.val_fraction", [](Config & c) -> auto& { return c.data.valFraction; }, 0, 0.9));
    // train
    f.push_back(stringField(
        "train.device", [](Config & c) -> auto& { return c.train.device; }));
    f.push_back(intField(
        "train.micro_batch_size", [](Config & c) -> auto& { return c.train.microBatchSize; }, 1));
    f.push_back(intField(
        "train.global_batch_size", [](Config & c) -> auto& { return c.train.globalBatchSize; }, 0));
    f.push_back(intField(
        "train.train_iters", [](Config & c) -> auto& { return c.train.trainIters; }, 1));
    f.push_back(intField(
        "train.exit_interval", [](Config & c) -> auto& { return c.train.exitInterval; }, 0));
    f.push_back(Field{"train.seed",
                      Kind::Int,
                      [](Config& c, const YAML::Node& n) { c.train.seed = n.as<uint64_t>(); },
                      {},
                      0,
                      1.8e19,
                      [](const Config& c) { return std::to_string(c.train.seed); }});
    f.push_back(stringField(
        "train.out_dir", [](Config & c) -> auto& { return c.train.outDir; }));
    f.push_back(intField(
        "train.log_interval", [](Config & c) -> auto& { return c.train.logInterval; }, 1));
    f.push_back(intField(
        "train.eval_interval", [](Config & c) -> auto& { return c.train.evalInterval; }, 0));
    f.push_back(intField(
        "train.eval_iters", [](Config & c) -> auto& { return c.train.evalIters; }, 1));
    f.push_back(intField(
        "train.sample_length", [](Config & c) -> auto& { return c.train.sampleLength; }, 0));
    f.push_back(intField(
        "train.threads", [](Config & c) -> auto& { return c.train.threads; }, 0, 4096));
    f.push_back(stringField("train.recompute", [](Config & c) -> auto& { return c.train.recompute; },
                            {"none", "selective", "full"}));
    f.push_back(intField(
        "train.max_nonfinite_steps", [](Config & c) -> auto& { return c.train.maxNonfiniteSteps; }, 1));
    f.push_back(stringField(
        "train.sample_prompt", [](Config & c) -> auto& { return c.train.samplePrompt; }));
    // optimizer
    f.push_back(stringField("optimizer.type", [](Config & c) -> auto& { return c.optimizer.type; },
                            {"adamw", "adafactor"}));
    f.push_back(floatField(
        "optimizer.lr", [](Config & c) -> auto& { return c.optimizer.lr; }, 0, 10));
    f.push_back(floatField(
        "optimizer.min_lr", [](Config & c) -> auto& { return c.optimizer.minLr; }, 0, 10));
    f.push_back(floatField(
        "optimizer.weight_decay", [](Config & c) -> auto& { return c.optimizer.weightDecay; }, 0, 10));
    f.push_back(Field{"optimizer.betas",
                      Kind::FloatList,
                      [](Config& c, const YAML::Node& n) { c.optimizer.betas = n.as<std::vector<double>>(); },
                      {},
                      0,
                      0.999999,
                      [](const Config& c) {
                        std::string text;
                        for (double b : c.optimizer.betas) text += (text.empty() ? "" : ", ") + numberText(b);
                        return "[" + text + "]";
                      }});
    f.push_back(floatField(
        "optimizer.eps", [](Config & c) -> auto& { return c.optimizer.eps; }, 0, 1));
    f.push_back(floatField(
        "optimizer.clip_grad", [](Config & c) -> auto& { return c.optimizer.clipGrad; }, 0));
    f.push_back(boolField(
        "optimizer.pipeline", [](Config & c) -> auto& { return c.optimizer.pipeline; }));
    f.push_back(floatField(
        "optimizer.pipeline_piece_mb", [](Config & c) -> auto& { return c.optimizer.pipelinePieceMb; },
        0.0001, 4096));
    // Adafactor (optimizer.type adafactor; optim/Adafactor.h)
    f.push_back(boolField(
        "optimizer.adafactor_relative_step",
        [](Config & c) -> auto& { return c.optimizer.adafactor.relativeStep; }));
    f.push_back(boolField(
        "optimizer.adafactor_warmup_init",
        [](Config & c) -> auto& { return c.optimizer.adafactor.warmupInit; }));
    f.push_back(boolField(
        "optimizer.adafactor_scale_parameter",
        [](Config & c) -> auto& { return c.optimizer.adafactor.scaleParameter; }));
    f.push_back(floatField(
        "optimizer.adafactor_beta1", [](Config & c) -> auto& { return c.optimizer.adafactor.beta1; }, -1,
        0.999999));
    f.push_back(boolField(
        "optimizer.adafactor_bf16_momentum",
        [](Config & c) -> auto& { return c.optimizer.adafactor.bf16Momentum; }));
    f.push_back(floatField(
        "optimizer.adafactor_decay_rate", [](Config & c) -> auto& { return c.optimizer.adafactor.decayRate; },
        -10, -1e-6));
    f.push_back(floatField(
        "optimizer.adafactor_eps1", [](Config & c) -> auto& { return c.optimizer.adafactor.eps1; }, 1e-45,
        1));
    f.push_back(floatField(
        "optimizer.adafactor_eps2", [](Config & c) -> auto& { return c.optimizer.adafactor.eps2; }, 0, 1));
    f.push_back(floatField(
        "optimizer.adafactor_clip_threshold",
        [](Config & c) -> auto& { return c.optimizer.adafactor.clipThreshold; }, 0, 1e6));
    // lr schedule
    f.push_back(stringField("lr_schedule.style", [](Config & c) -> auto& { return c.lrSchedule.style; },
                            {"constant", "linear", "cosine"}));
    f.push_back(intField(
        "lr_schedule.warmup_iters", [](Config & c) -> auto& { return c.lrSchedule.warmupIters; }, 0));
    f.push_back(intField(
        "lr_schedule.decay_iters", [](Config & c) -> auto& { return c.lrSchedule.decayIters; }, 0));
    // precision
    f.push_back(stringField("precision.dtype", [](Config & c) -> auto& { return c.precision.dtype; },
                            {"bf16", "fp16", "fp32"}));
    f.push_back(floatField(
        "precision.initial_loss_scale", [](Config & c) -> auto& { return c.precision.initialLossScale; }, 1,
        1e30));
    f.push_back(intField(
        "precision.loss_scale_window", [](Config & c) -> auto& { return c.precision.lossScaleWindow; }, 1));
    f.push_back(floatField(
        "precision.min_loss_scale", [](Config & c) -> auto& { return c.precision.minLossScale; }, 1e-30,
        1e30));
    f.push_back(stringField("precision.grad_accum_dtype",
                            [](Config & c) -> auto& { return c.precision.gradAccumDType; },
                            {"fp32", "bf16", "fp16"}));
    // zero_optimization (DeepSpeed names)
    f.push_back(intField(
        "zero_optimization.stage", [](Config & c) -> auto& { return c.zero.stage; }, 0, 3));
    f.push_back(floatField(
        "zero_optimization.chunk_size_mb", [](Config & c) -> auto& { return c.zero.chunkSizeMb; }, 1e-3,
        65536));
    f.push_back(intField(
        "zero_optimization.prefetch_depth", [](Config & c) -> auto& { return c.zero.prefetchDepth; }, 0, 64));
    f.push_back(stringField("zero_optimization.offload_param.device",
                            [](Config & c) -> auto& { return c.zero.offloadParamDevice; },
                            {"none", "cpu", "nvme"}));
    f.push_back(stringField("zero_optimization.offload_optimizer.device",
                            [](Config & c) -> auto& { return c.zero.offloadOptimizerDevice; },
                            {"none", "cpu", "nvme"}));
    f.push_back(stringField(
        "zero_optimization.nvme_path", [](Config & c) -> auto& { return c.zero.nvmePath; }));
    f.push_back(boolField(
        "zero_optimization.pin_memory", [](Config & c) -> auto& { return c.zero.pinMemory; }));
    f.push_back(intField(
        "zero_optimization.buffer_count", [](Config & c) -> auto& { return c.zero.bufferCount; }, 1, 64));
    f.push_back(intField(
        "zero_optimization.aio.block_size", [](Config & c) -> auto& { return c.zero.aioBlockSize; }, 4096));
    f.push_back(intField(
        "zero_optimization.aio.queue_depth", [](Config & c) -> auto& { return c.zero.aioQueueDepth; }, 1,
        4096));
    // store budgets: a number of GiB or "auto"
    f.push_back(stringField(
        "store.gpu_budget_gb", [](Config & c) -> auto& { return c.store.gpuBudgetGb; }));
    f.push_back(stringField(
        "store.host_budget_gb", [](Config & c) -> auto& { return c.store.hostBudgetGb; }));
    f.push_back(stringField(
        "store.nvme_budget_gb", [](Config & c) -> auto& { return c.store.nvmeBudgetGb; }));
    f.push_back(stringField("store.nvme_state_dtype",
                            [](Config & c) -> auto& { return c.store.nvmeStateDType; },
                            {"fp32", "bf16", "fp16"}));
    f.push_back(boolField(
        "store.arena", [](Config & c) -> auto& { return c.store.arena; }));
    f.push_back(boolField(
        "store.delayed_update", [](Config & c) -> auto& { return c.store.delayedUpdate; }));
    // dist
    f.push_back(floatField(
        "dist.timeout_s", [](Config & c) -> auto& { return c.dist.timeoutS; }, 0.1, 1e7));
    f.push_back(stringField("dist.gpu_collectives", [](Config & c) -> auto& { return c.dist.gpuCollectives; },
                            {"auto", "nccl", "staged"}));
    // checkpoint
    f.push_back(stringField(
        "checkpoint.save", [](Config & c) -> auto& { return c.checkpoint.save; }));
    f.push_back(stringField(
        "checkpoint.load", [](Config & c) -> auto& { return c.checkpoint.load; }));
    f.push_back(intField(
        "checkpoint.save_interval", [](Config & c) -> auto& { return c.checkpoint.saveInterval; }, 0));
    f.push_back(intField(
        "checkpoint.keep_last", [](Config & c) -> auto& { return c.checkpoint.keepLast; }, 0));
    f.push_back(boolField(
        "checkpoint.load_model_only", [](Config & c) -> auto& { return c.checkpoint.loadModelOnly; }));
    // runs across restarts (train/Run.h)
    f.push_back(boolField(
        "checkpoint.resume", [](Config & c) -> auto& { return c.checkpoint.resume; }));
    f.push_back(boolField(
        "checkpoint.allow_changes", [](Config & c) -> auto& { return c.checkpoint.allowChanges; }));
    return f;
  }();
  return fields;
}

std::string nearestKey(const std::string& key) {
  std::string best;
  size_t bestDist = std::numeric_limits<size_t>::max();
  for (const auto& f : schema()) {
    size_t d = editDistance(key, f.key);
    // Also compare the last component alone, so "model.hiden_size" and "hiden_size" both find hidden_size.
    std::string leaf = f.key.substr(f.key.rfind('.') + 1);
    d = std::min(
        d, editDistance(key.substr(key.rfind('.') + 1), leaf) + (key.find('.') == std::string::npos ? 0 : 2));
    if (d < bestDist) {
      bestDist = d;
      best = f.key;
    }
  }
  return best;
}

const Field* findField(const std::string& key) {
  for (const auto& f : schema())
    if (f.key == key) return &f;
  return nullptr;
}

bool isPrefix(const std::string& key) {
  for (const auto& f : schema())
    if (f.key.rfind(key + ".", 0) == 0) return true;
  return false;
}

struct Loader {
  Config config;
  std::string origin;
  std::map<std::string, std::string> where;  // key -> "file:line"

  std::string at(const YAML::Mark& m) const {
    return m.line >= 0 ? origin + ":" + std::to_string(m.line + 1) : origin;
  }

  [[noreturn]] void unknown(const std::string& key, const std::string& place) {
    // Keys that existed once, with what replaced them.
    if (key == "precision.weight_copies")
      STRATA_USER_FAIL(
          "{}: precision.weight_copies is gone: parameters are now the compute-dtype weights themselves "
          "(16-bit views into chunks, their fp32 masters kept by the optimizer), so there is no copy to "
          "keep; delete the key",
          place);
    STRATA_USER_FAIL("{}: unknown config key '{}'; did you mean '{}'?", place, key, nearestKey(key));
  }

  void assign(const Field& f, const YAML::Node& node, const std::string& place) {
    bool scalar = node.IsScalar();
    bool ok = f.kind == Kind::FloatList ? node.IsSequence() : scalar;
    if (ok) {
      try {
        f.assign(config, node);
      } catch (const YAML::Exception&) {
        ok = false;
      }
    }
    std::string text = scalar ? node.Scalar() : YAML::Dump(node);
    STRATA_USER_CHECK(ok, "{}: '{}' must be {}, got '{}'", place, f.key, kindName(f.kind), text);
    if (!f.choices.empty()) {
      std::string v = node.as<std::string>();
      bool valid = std::find(f.choices.begin(), f.choices.end(), v) != f.choices.end();
      std::string list;
      for (const auto& c : f.choices) list += (list.empty() ? "" : ", ") + c;
      STRATA_USER_CHECK(valid, "{}: '{}' must be one of {}, got '{}'", place, f.key, list, v);
    }
    if (f.kind == Kind::Int || f.kind == Kind::Float) {
      double v = node.as<double>();
      STRATA_USER_CHECK(v >= f.min && v <= f.max, "{}: '{}' = {} is out of range [{}, {}]", place, f.key,
                        text, f.min, f.max);
    }
    if (f.kind == Kind::FloatList) {
      for (double v : node.as<std::vector<double>>())
        STRATA_USER_CHECK(v >= f.min && v <= f.max, "{}: '{}' has {} outside [{}, {}]", place, f.key, v,
                          f.min, f.max);
    }
    where[f.key] = place;
    YAML::Emitter emitter;
    emitter.SetSeqFormat(YAML::Flow);
    emitter << node;
    config.values[f.key] = emitter.c_str();
  }

  void walk(const YAML::Node& node, const std::string& prefix) {
    STRATA_USER_CHECK(node.IsMap(), "{}: expected a mapping of keys{}", at(node.Mark()),
                      prefix.empty() ? std::string() : " under '" + prefix + "'");
    std::map<std::string, std::string> seen;  // key -> where it was first set in this mapping
    for (auto it = node.begin(); it != node.end(); ++it) {
      std::string key = prefix.empty() ? it->first.Scalar() : prefix + "." + it->first.Scalar();
      std::string place = at(it->first.Mark());
      // YAML forbids a repeated key; yaml-cpp keeps one silently, so a typo'd duplicate would hide a value.
      auto [first, fresh] = seen.emplace(key, place);
      STRATA_USER_CHECK(fresh, "{}: config key '{}' appears twice (first at {})", place, key, first->second);
      if (const Field* f = findField(key)) {
        assign(*f, it->second, place);
      } else if (isPrefix(key) && it->second.IsMap()) {
        walk(it->second, key);
      } else if (isPrefix(key) && it->second.IsNull()) {
        continue;  // an empty section
      } else if (isPrefix(key)) {
        STRATA_USER_FAIL("{}: '{}' must be a section: expected a mapping of keys under it", place, key);
      } else {
        unknown(key, place);
      }
    }
  }

  void override(const std::string& spec) {
    auto eq = spec.find('=');
    STRATA_USER_CHECK(eq != std::string::npos && eq > 0, "--set '{}': expected key=value", spec);
    std::string key = spec.substr(0, eq), value = spec.substr(eq + 1);
    const Field* f = findField(key);
    if (!f) unknown(key, "--set " + spec);
    YAML::Node node;
    try {
      node = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      STRATA_USER_FAIL("--set {}: cannot parse value: {}", spec, e.what());
    }
    if (value.empty()) node = YAML::Node(std::string());
    assign(*f, node, "--set " + spec);
  }

  // A key's effective text as effectiveValues wrote it: strings are taken as they are (no YAML parsing), the
  // others parsed as YAML.
  void setEffective(const std::string& key, const std::string& text) {
    const Field* f = findField(key);
    if (!f) {
      config.warnings.push_back(detail::format(
          "{}: the recorded setting '{}' is not a config key of this version; it is left out", origin, key));
      return;
    }
    YAML::Node node;
    if (f->kind == Kind::String) {
      node = YAML::Node(text);
    } else {
      try {
        node = YAML::Load(text);
      } catch (const YAML::Exception& e) {
        STRATA_USER_FAIL("{}: the recorded value '{}' of '{}' cannot be parsed: {}", origin, text, key,
                         e.what());
      }
    }
    assign(*f, node, origin);
  }

  std::string place(const std::string& key) const {
    auto it = where.find(key);
    return it != where.end() ? it->second : origin + " (default)";
  }

  bool requireData = true;

  void validate() {
    Config& c = config;
    // T5's heads have a width of their own (model.kv_channels) and need not divide the model's.
    STRATA_USER_CHECK(c.model.arch == "t5" || c.model.hiddenSize % c.model.numAttentionHeads == 0,
                      "{}: 'model.hidden_size' ({}) must be divisible by 'model.num_attention_heads' ({})",
                      place("model.hidden_size"), c.model.hiddenSize, c.model.numAttentionHeads);
    c.train.globalBatchSizeSet = c.train.globalBatchSize != 0;
    if (c.train.globalBatchSize == 0) c.train.globalBatchSize = c.train.microBatchSize;
    STRATA_USER_CHECK(
        c.train.globalBatchSize % c.train.microBatchSize == 0,
        "{}: 'train.global_batch_size' ({}) must be a multiple of 'train.micro_batch_size' ({})",
        place("train.global_batch_size"), c.train.globalBatchSize, c.train.microBatchSize);
    STRATA_USER_CHECK(c.optimizer.betas.size() == 2, "{}: 'optimizer.betas' needs two values, got {}",
                      place("optimizer.betas"), c.optimizer.betas.size());
    STRATA_USER_CHECK(c.optimizer.minLr <= c.optimizer.lr,
                      "{}: 'optimizer.min_lr' ({}) exceeds 'optimizer.lr' ({})", place("optimizer.min_lr"),
                      c.optimizer.minLr, c.optimizer.lr);
    if (c.optimizer.type != "adafactor")
      for (const auto& [key, value] : c.values)
        if (key.rfind("optimizer.adafactor_", 0) == 0)
          c.warnings.push_back(detail::format("{}: '{}' is ignored: 'optimizer.type' is {}, not adafactor",
                                              place(key), key, c.optimizer.type));
    STRATA_USER_CHECK(
        c.optimizer.type != "adafactor" || c.zero.offloadOptimizerDevice != "nvme",
        "{}: Adafactor's state has no SSD form: 'zero_optimization.offload_optimizer.device' is "
        "none or cpu with 'optimizer.type' adafactor",
        place("zero_optimization.offload_optimizer.device"));
    STRATA_USER_CHECK(
        c.precision.gradAccumDType == "fp32" || c.precision.gradAccumDType == c.precision.dtype,
        "{}: 'precision.grad_accum_dtype' is fp32 or the compute dtype ('precision.dtype' {}), not {}",
        place("precision.grad_accum_dtype"), c.precision.dtype, c.precision.gradAccumDType);
    if (c.lrSchedule.warmupIters > c.train.trainIters)
      c.warnings.push_back(detail::format(
          "{}: 'lr_schedule.warmup_iters' ({}) exceeds 'train.train_iters' ({}): the learning rate never "
          "reaches 'optimizer.lr'",
          place("lr_schedule.warmup_iters"), c.lrSchedule.warmupIters, c.train.trainIters));
    // Random tokens (benches, and models described without data: `strata embed`) never meet the tokenizer.
    if (c.data.tokenizer == "byte" && c.data.format != "random")
      STRATA_USER_CHECK(c.model.vocabSize >= 256,
                        "{}: 'model.vocab_size' ({}) is too small for the byte tokenizer (256)",
                        place("model.vocab_size"), c.model.vocabSize);
    if (c.data.tokenizer == "gpt2")
      STRATA_USER_CHECK(!c.data.vocabFile.empty() && !c.data.mergesFile.empty(),
                        "{}: the gpt2 tokenizer needs 'data.vocab_file' and 'data.merges_file'",
                        place("data.tokenizer"));
    if (c.data.tokenizer == "sentencepiece")
      STRATA_USER_CHECK(!c.data.vocabFile.empty(),
                        "{}: the sentencepiece tokenizer needs 'data.vocab_file' (a .model file)",
                        place("data.tokenizer"));
    for (const char* key : {"store.gpu_budget_gb", "store.host_budget_gb", "store.nvme_budget_gb"}) {
      auto it = c.values.find(key);
      if (it == c.values.end() || it->second == "auto") continue;
      char* end = nullptr;
      double v = std::strtod(it->second.c_str(), &end);
      STRATA_USER_CHECK(end && *end == '\0' && v >= 0, "{}: '{}' must be a number of GiB or 'auto', got '{}'",
                        place(key), key, it->second);
    }
    if (c.zero.offloadParamDevice == "nvme" || c.zero.offloadOptimizerDevice == "nvme")
      STRATA_USER_CHECK(!c.zero.nvmePath.empty(),
                        "{}: offloading to nvme needs 'zero_optimization.nvme_path'",
                        place("zero_optimization.offload_optimizer.device"));
    // A relative data path is relative to the config file, else to the current directory.
    namespace fs = std::filesystem;
    if (!c.data.path.empty() && fs::path(c.data.path).is_relative() && !c.sourcePath.empty()) {
      fs::path alt = fs::path(c.sourcePath).parent_path() / c.data.path;
      if (fs::exists(alt)) c.data.path = alt.lexically_normal().string();
    }
    // data.format: random draws uniform token ids (benchmarks, smoke tests) and reads no file.
    if (requireData && c.data.format != "random")
      STRATA_USER_CHECK(fs::exists(c.data.path), "{}: 'data.path' {} does not exist", place("data.path"),
                        c.data.path);
  }
};

Config parseWith(const YAML::Node& root, const std::string& origin, const std::string& sourcePath,
                 const std::vector<std::string>& overrides, bool requireData) {
  Loader loader;
  loader.requireData = requireData;
  loader.origin = origin;
  loader.config.sourcePath = sourcePath;
  if (root.IsDefined() && !root.IsNull()) loader.walk(root, "");
  for (const auto& o : overrides) loader.override(o);
  loader.validate();
  return loader.config;
}

}  // namespace

Config configFromValues(const std::map<std::string, std::string>& values, const std::string& origin,
                        bool requireData) {
  Loader loader;
  loader.origin = origin;
  loader.requireData = requireData;
  // Only what differs from the defaults counts as set (Config::values), as in a config file.
  std::map<std::string, std::string> defaults = effectiveValues(Config{});
  for (const auto& [key, text] : values) {
    auto it = defaults.find(key);
    if (it == defaults.end() || it->second != text) loader.setEffective(key, text);
  }
  loader.validate();
  return loader.config;
}

Config parseConfig(const std::string& yaml, const std::string& origin,
                   const std::vector<std::string>& overrides, bool requireData) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::ParserException& e) {
    STRATA_USER_FAIL("{}:{}: YAML syntax error: {}", origin, e.mark.line + 1, e.msg);
  }
  return parseWith(root, origin, "", overrides, requireData);
}

Config loadConfig(const std::string& path, const std::vector<std::string>& overrides, bool requireData) {
  namespace fs = std::filesystem;
  STRATA_USER_CHECK(fs::exists(path), "config file {} does not exist", path);
  STRATA_USER_CHECK(!fs::is_directory(path), "config file {} is a directory, not a YAML file", path);
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::ParserException& e) {
    STRATA_USER_FAIL("{}:{}: YAML syntax error: {}", path, e.mark.line + 1, e.msg);
  } catch (const YAML::Exception& e) {
    STRATA_USER_FAIL("config file {} cannot be read: {}", path, e.what());
  }
  // An empty file would silently train the built-in defaults, which is never what was meant.
  STRATA_USER_CHECK(root.IsDefined() && !root.IsNull(), "config file {} is empty", path);
  return parseWith(root, path, path, overrides, requireData);
}

size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::vector<std::string> configKeys() {
  std::vector<std::string> keys;
  for (const auto& f : schema()) keys.push_back(f.key);
  return keys;
}

std::map<std::string, std::string> effectiveValues(const Config& config, const std::string& prefix) {
  std::map<std::string, std::string> out;
  for (const auto& f : schema())
    if (f.key.rfind(prefix, 0) == 0) out[f.key] = f.show(config);
  return out;
}

bool sameConfigValue(const std::string& a, const std::string& b) {
  if (a == b) return true;
  char *endA = nullptr, *endB = nullptr;
  double x = std::strtod(a.c_str(), &endA), y = std::strtod(b.c_str(), &endB);
  return !a.empty() && !b.empty() && *endA == '\0' && *endB == '\0' && x == y;
}

optim::AdafactorConfig adafactorConfigFrom(const Config& c) {
  const AdafactorOptions& a = c.optimizer.adafactor;
  optim::AdafactorConfig out;
  out.relativeStep = a.relativeStep;
  out.lr = a.relativeStep ? 0.0 : c.optimizer.lr;
  out.beta1 = a.beta1;
  out.firstMomentBf16 = a.bf16Momentum;
  out.decayRate = a.decayRate;
  out.eps1 = a.eps1;
  out.eps2 = a.eps2;
  out.clipThreshold = a.clipThreshold;
  out.weightDecay = c.optimizer.weightDecay;
  out.scaleParameter = a.scaleParameter;
  out.warmupInit = a.warmupInit;
  return out;
}

}  // namespace strata::config
