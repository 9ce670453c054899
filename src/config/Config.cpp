// YAML config loading: one walk over the document against the key table (ConfigKeys.h), one validation pass.
#include "strata/config/Config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <variant>

#include "strata/config/ConfigKeys.h"
#include "strata/core/Error.h"
#include "strata/optim/Adafactor.h"

namespace strata::config {
namespace {

// A key's value from a YAML node: false when the node is not of the member's type.
template <class T>
bool readNode(const YAML::Node& node, T& out) {
  if (!node.IsScalar()) return false;
  try {
    out = node.as<T>();
  } catch (const YAML::Exception&) {
    return false;
  }
  return true;
}

bool readNode(const YAML::Node& node, std::vector<double>& out) {
  if (!node.IsSequence()) return false;
  try {
    out = node.as<std::vector<double>>();
  } catch (const YAML::Exception&) {
    return false;
  }
  return true;
}

bool isNumber(const ConfigMember& m) {
  return std::holds_alternative<int64_t*>(m) || std::holds_alternative<uint64_t*>(m) ||
         std::holds_alternative<double*>(m);
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
    if (isConfigSection(key))
      STRATA_USER_FAIL(
          "{}: '{}' is a section, not a key: set one of its keys ('{}.KEY'; strata config --list)", place,
          key, key);
    std::string nearest = nearestConfigKey(key);
    if (nearest.empty())
      STRATA_USER_FAIL("{}: unknown config key '{}' (strata config --list shows every key)", place, key);
    STRATA_USER_FAIL("{}: unknown config key '{}'; did you mean '{}'?", place, key, nearest);
  }

  void assign(const ConfigKey& k, const YAML::Node& node, const std::string& place) {
    ConfigMember member = k.member(config);
    bool ok = std::visit([&](auto* m) { return readNode(node, *m); }, member);
    std::string text = node.IsScalar() ? node.Scalar() : YAML::Dump(node);
    STRATA_USER_CHECK(ok, "{}: '{}' must be {}, got '{}'", place, k.name, configTypeName(k), text);
    if (!k.choices.empty()) {
      const std::string& v = *std::get<std::string*>(member);
      bool valid = std::find(k.choices.begin(), k.choices.end(), v) != k.choices.end();
      std::string list;
      for (const auto& c : k.choices) list += (list.empty() ? "" : ", ") + c;
      STRATA_USER_CHECK(valid, "{}: '{}' must be one of {}, got '{}'", place, k.name, list, v);
    }
    if (isNumber(member)) {
      double v = node.as<double>();
      STRATA_USER_CHECK(v >= k.min && v <= k.max, "{}: '{}' = {} is out of range [{}, {}]", place, k.name,
                        text, k.min, k.max);
    }
    if (auto* list = std::get_if<std::vector<double>*>(&member)) {
      for (double v : **list)
        STRATA_USER_CHECK(v >= k.min && v <= k.max, "{}: '{}' has {} outside [{}, {}]", place, k.name, v,
                          k.min, k.max);
    }
    where[k.name] = place;
    YAML::Emitter emitter;
    emitter.SetSeqFormat(YAML::Flow);
    emitter << node;
    config.values[k.name] = emitter.c_str();
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
      if (const ConfigKey* k = findConfigKey(key)) {
        assign(*k, it->second, place);
      } else if (key == "parallel" && it->second.IsScalar()) {
        setParallel(it->second.Scalar(), place);
      } else if (isConfigSection(key) && it->second.IsMap()) {
        walk(it->second, key);
      } else if (isConfigSection(key) && it->second.IsNull()) {
        continue;  // an empty section
      } else if (isConfigSection(key)) {
        STRATA_USER_FAIL("{}: '{}' must be a section: expected a mapping of keys under it", place, key);
      } else {
        unknown(key, place);
      }
    }
  }

  // `parallel: auto`, the one scalar a section takes (NOTE [Parallel auto] in plan/Plan.h).
  void setParallel(const std::string& value, const std::string& place) {
    STRATA_USER_CHECK(value == "auto",
                      "{}: 'parallel' is a section of keys (parallel.tensor, ...) or the word auto (the plan "
                      "chooses the layout), not '{}'",
                      place, value);
    config.parallel.automatic = true;
    where["parallel"] = place;
  }

  void override(const std::string& spec) {
    auto eq = spec.find('=');
    STRATA_USER_CHECK(eq != std::string::npos && eq > 0, "--set '{}': expected key=value", spec);
    std::string key = spec.substr(0, eq), value = spec.substr(eq + 1);
    if (key == "parallel") return setParallel(value, "--set " + spec);
    const ConfigKey* k = findConfigKey(key);
    if (!k) unknown(key, "--set " + spec);
    YAML::Node node;
    try {
      node = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      STRATA_USER_FAIL("--set {}: cannot parse value: {}", spec, e.what());
    }
    if (value.empty()) node = YAML::Node(std::string());
    assign(*k, node, "--set " + spec);
  }

  // A key's effective text as effectiveValues wrote it: strings are taken as they are (no YAML parsing), the
  // others parsed as YAML.
  void setEffective(const std::string& key, const std::string& text) {
    const ConfigKey* k = findConfigKey(key);
    if (!k) {
      config.warnings.push_back(detail::format(
          "{}: the recorded setting '{}' is not a config key of this version; it is left out", origin, key));
      return;
    }
    YAML::Node node;
    if (std::holds_alternative<std::string*>(k->member(config))) {
      node = YAML::Node(text);
    } else {
      try {
        node = YAML::Load(text);
      } catch (const YAML::Exception& e) {
        STRATA_USER_FAIL("{}: the recorded value '{}' of '{}' cannot be parsed: {}", origin, text, key,
                         e.what());
      }
    }
    assign(*k, node, origin);
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
    STRATA_USER_CHECK(!c.parallel.automatic || !c.values.count("parallel.tensor"),
                      "{}: 'parallel: auto' chooses parallel.tensor, which {} sets too: drop one",
                      place("parallel"), place("parallel.tensor"));
    STRATA_USER_CHECK(c.optimizer.betas.size() == 2, "{}: 'optimizer.betas' needs two values, got {}",
                      place("optimizer.betas"), c.optimizer.betas.size());
    STRATA_USER_CHECK(c.optimizer.minLr <= c.optimizer.lr,
                      "{}: 'optimizer.min_lr' ({}) exceeds 'optimizer.lr' ({})", place("optimizer.min_lr"),
                      c.optimizer.minLr, c.optimizer.lr);
    STRATA_USER_CHECK(c.optimizer.momentsDType == "fp32" || c.optimizer.type != "adafactor",
                      "{}: 'optimizer.moments_dtype: {}' is AdamW's (optimizer.type is adafactor): set "
                      "optimizer.adafactor_bf16_momentum: true for Adafactor's first moment in bf16 (with "
                      "optimizer.adafactor_beta1 set; its factored second moment stays fp32), and drop "
                      "optimizer.moments_dtype",
                      place("optimizer.moments_dtype"), c.optimizer.momentsDType);
    // With bf16 moments the SSD tier stores them in bf16 too (NOTE [AdamW moments dtype] in optim/AdamW.h):
    // fp32 and bf16 both mean that; fp16 would round them a second time, differently.
    STRATA_USER_CHECK(c.optimizer.momentsDType != "bf16" || c.store.nvmeStateDType != "fp16",
                      "{}: 'store.nvme_state_dtype: fp16' with 'optimizer.moments_dtype: bf16': the SSD tier "
                      "keeps bf16 moments as they are; set store.nvme_state_dtype to bf16 (or leave it "
                      "fp32), or optimizer.moments_dtype: fp32",
                      place("store.nvme_state_dtype"));
    if (c.optimizer.type != "adafactor")
      for (const auto& [key, value] : c.values)
        if (key.rfind("optimizer.adafactor_", 0) == 0)
          c.warnings.push_back(detail::format("{}: '{}' is ignored: 'optimizer.type' is {}, not adafactor",
                                              place(key), key, c.optimizer.type));
    STRATA_USER_CHECK(
        c.precision.gradAccumDType == "fp32" || c.precision.gradAccumDType == c.precision.dtype,
        "{}: 'precision.grad_accum_dtype' is fp32 or the compute dtype ('precision.dtype' {}), not {}",
        place("precision.grad_accum_dtype"), c.precision.dtype, c.precision.gradAccumDType);
    STRATA_USER_CHECK(!c.precision.fp8 || c.precision.dtype == "bf16",
                      "{}: 'precision.fp8' needs 'precision.dtype' bf16, not {} (FP8 GEMMs write bf16): set "
                      "precision.dtype: bf16 or precision.fp8: false",
                      place("precision.fp8"), c.precision.dtype);
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
  for (const auto& k : configKeyTable()) keys.push_back(k.name);
  return keys;
}

std::map<std::string, std::string> effectiveValues(const Config& config, const std::string& prefix) {
  std::map<std::string, std::string> out;
  for (const auto& k : configKeyTable())
    if (k.name.rfind(prefix, 0) == 0) out[k.name] = configValueText(k, config);
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
