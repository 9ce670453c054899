#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <variant>

#include "TestUtil.h"
#include "strata/config/Config.h"
#include "strata/config/ConfigKeys.h"
#include "strata/optim/Adafactor.h"
#include "strata/plan/PlacementInputs.h"

using namespace strata;
using strata::config::parseConfig;

namespace {
std::string errorOf(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parseConfig(yaml, "test.yaml", overrides, false);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A YAML text as a config file holds it: nested mappings from dotted names, strings double-quoted.
struct YamlTree {
  std::string value;
  std::map<std::string, YamlTree> children;
};

void emitYaml(const YamlTree& tree, const std::string& indent, std::string& out) {
  for (const auto& [name, child] : tree.children) {
    if (child.children.empty()) {
      out += indent + name + ": " + child.value + "\n";
    } else {
      out += indent + name + ":\n";
      emitYaml(child, indent + "  ", out);
    }
  }
}

std::string doubleQuoted(const std::string& s) {
  std::string out = "\"";
  for (char ch : s)
    out += ch == '\n' ? std::string("\\n") : ch == '"' ? std::string("\\\"") : std::string(1, ch);
  return out + "\"";
}
}  // namespace

TEST_CASE("config fills structs and applies overrides", "[train][config]") {
  auto c = parseConfig("model:\n  num_layers: 6\n  hidden_size: 256\noptimizer:\n  betas: [0.8, 0.9]\n",
                       "t.yaml", {"train.train_iters=177", "model.dropout=0.1"}, false);
  REQUIRE(c.model.numLayers == 6);
  REQUIRE(c.model.hiddenSize == 256);
  REQUIRE(c.train.trainIters == 177);
  REQUIRE(c.model.dropout == 0.1);
  REQUIRE(c.optimizer.betas == std::vector<double>{0.8, 0.9});
  REQUIRE(c.train.globalBatchSize == c.train.microBatchSize);  // default: no accumulation
  REQUIRE(c.values.at("train.train_iters") == "177");
}

TEST_CASE("unknown keys name the file, the line and the nearest key", "[train][config]") {
  std::string e = errorOf("model:\n  num_layers: 2\n  hiden_size: 64\n");
  REQUIRE(e.find("test.yaml:3") != std::string::npos);
  REQUIRE(e.find("model.hiden_size") != std::string::npos);
  REQUIRE(e.find("did you mean 'model.hidden_size'") != std::string::npos);
  std::string o = errorOf("", {"train.trian_iters=5"});
  REQUIRE(o.find("--set") != std::string::npos);
  REQUIRE(o.find("train.train_iters") != std::string::npos);
}

TEST_CASE("wrong types, choices and ranges stop with the key", "[train][config]") {
  REQUIRE(errorOf("model:\n  num_layers: many\n").find("'model.num_layers' must be an integer") !=
          std::string::npos);
  REQUIRE(errorOf("model:\n  num_layers: 0\n").find("out of range") != std::string::npos);
  REQUIRE(errorOf("data:\n  format: csv\n").find("must be one of text, nanogpt, megatron") !=
          std::string::npos);
  REQUIRE(errorOf("model:\n  hidden_size: 100\n  num_attention_heads: 3\n").find("divisible") !=
          std::string::npos);
  REQUIRE(errorOf("train:\n  micro_batch_size: 4\n  global_batch_size: 6\n").find("multiple") !=
          std::string::npos);
  REQUIRE(errorOf("store:\n  gpu_budget_gb: lots\n").find("store.gpu_budget_gb") != std::string::npos);
  REQUIRE(errorOf("model: [1, 2]\n").find("expected a mapping") != std::string::npos);
  REQUIRE(errorOf("model:\n  num_layers: [1\n").find("test.yaml") != std::string::npos);
}

TEST_CASE("a missing data file is named by its path", "[train][config]") {
  try {
    parseConfig("data:\n  path: /nonexistent/corpus.txt\n", "t.yaml", {}, true);
    FAIL("expected an error");
  } catch (const Error& e) {
    REQUIRE(std::string(e.what()).find("/nonexistent/corpus.txt") != std::string::npos);
    REQUIRE(std::string(e.what()).find("t.yaml:2") != std::string::npos);
  }
}

TEST_CASE("a duplicate key is an error naming both places", "[train][config]") {
  std::string e = errorOf("model:\n  num_layers: 2\n  hidden_size: 64\n  num_layers: 3\n");
  REQUIRE(e.find("test.yaml:4") != std::string::npos);
  REQUIRE(e.find("'model.num_layers' appears twice") != std::string::npos);
  REQUIRE(e.find("test.yaml:2") != std::string::npos);
  // Twice at the top level too.
  REQUIRE(errorOf("train:\n  seed: 1\ntrain:\n  seed: 2\n").find("'train' appears twice") !=
          std::string::npos);
}

TEST_CASE("an empty config file or a directory is refused, naming it", "[train][config]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "strata-config-files";
  fs::remove_all(dir);
  fs::create_directories(dir);
  { std::ofstream(dir / "empty.yaml") << "# nothing here\n"; }
  for (const fs::path& p : {dir / "empty.yaml", dir}) {
    try {
      config::loadConfig(p.string(), {}, false);
      FAIL("expected an error for " << p);
    } catch (const Error& e) {
      std::string what = e.what();
      REQUIRE(what.find(p.string()) != std::string::npos);
      REQUIRE(what.find(p == dir ? "is a directory" : "is empty") != std::string::npos);
    }
  }
}

TEST_CASE("a warm-up longer than the run is a warning, not an error", "[train][config]") {
  auto c = parseConfig("", "t.yaml", {"train.train_iters=20"}, false);  // default warm-up: 100
  REQUIRE(c.train.trainIters == 20);
  REQUIRE(c.warnings.size() == 1);
  REQUIRE(c.warnings[0].find("lr_schedule.warmup_iters") != std::string::npos);
  REQUIRE(parseConfig("", "t.yaml", {"train.train_iters=200"}, false).warnings.empty());
}

TEST_CASE("config errors are user errors: no source location in the message", "[train][config]") {
  try {
    parseConfig("model:\n  hiden_size: 64\n", "t.yaml", {}, false);
    FAIL("expected an error");
  } catch (const Error& e) {
    REQUIRE(e.userFacing());
    REQUIRE(std::string(e.what()).find("[src/") == std::string::npos);
    REQUIRE(std::string(e.what()).find("check failed") == std::string::npos);
    REQUIRE(e.location().find("Config.cpp") != std::string::npos);  // kept for STRATA_DEBUG=1
  }
  // An internal error keeps its location in the message.
  try {
    Tensor::fromVector<float>({1, 2}, {2}).view({3});
    FAIL("expected an error");
  } catch (const Error& e) {
    REQUIRE(!e.userFacing());
    REQUIRE(std::string(e.what()).find("[src/") != std::string::npos);
  }
}

TEST_CASE("effective values cover defaults and compare numbers as numbers", "[train][config]") {
  auto c = parseConfig("model:\n  num_layers: 3\n", "t.yaml", {}, false);
  auto model = config::effectiveValues(c, "model.");
  REQUIRE(model.at("model.num_layers") == "3");
  REQUIRE(model.at("model.hidden_size") == "128");  // a default
  REQUIRE(model.at("model.bias") == "true");
  REQUIRE(model.count("train.seed") == 0);
  REQUIRE(config::sameConfigValue("0.02", model.at("model.init_std")));
  REQUIRE(config::sameConfigValue("1e-05", "0.00001"));
  REQUIRE(!config::sameConfigValue("2", "3"));
  REQUIRE(!config::sameConfigValue("gpt", "bert"));
  // The default config saves a final checkpoint, so `strata generate` works right after tools/train.sh.
  auto nano = config::loadConfig(STRATA_SOURCE_DIR "/configs/gpt-nano.yaml", {}, false);
  REQUIRE(!nano.checkpoint.save.empty());
  REQUIRE(nano.checkpoint.keepLast == 3);
}

TEST_CASE("optimizer.type adafactor and its keys", "[train][config][adafactor]") {
  auto c = parseConfig(
      "optimizer:\n  type: adafactor\n  lr: 0.002\n  weight_decay: 0.01\n  adafactor_beta1: 0.9\n"
      "  adafactor_bf16_momentum: true\n  adafactor_clip_threshold: 0.5\n  adafactor_decay_rate: -0.7\n",
      "t.yaml", {}, false);
  REQUIRE(c.optimizer.type == "adafactor");
  optim::AdafactorConfig a = config::adafactorConfigFrom(c);
  REQUIRE(a.lr == 0.002);
  REQUIRE(!a.usesRelativeStep());
  REQUIRE(a.beta1 == 0.9);
  REQUIRE(a.firstMomentBf16);
  REQUIRE(a.clipThreshold == 0.5);
  REQUIRE(a.decayRate == -0.7);
  REQUIRE(a.weightDecay == 0.01);
  REQUIRE(!a.scaleParameter);
  auto r =
      parseConfig("optimizer:\n  type: adafactor\n  adafactor_relative_step: true\n", "t.yaml", {}, false);
  REQUIRE(config::adafactorConfigFrom(r).usesRelativeStep());
  REQUIRE(config::adafactorConfigFrom(r).lr == 0);
  // Out of range, and a key meant for adafactor under adamw (a warning).
  REQUIRE(errorOf("optimizer:\n  adafactor_decay_rate: 0.5\n").find("out of range") != std::string::npos);
  auto w = parseConfig("optimizer:\n  adafactor_beta1: 0.9\n", "t.yaml", {}, false);
  REQUIRE(w.warnings.size() == 1);
  REQUIRE(w.warnings[0].find("ignored") != std::string::npos);
  // 16-bit gradient buffers: the compute dtype's, for Adafactor and AdamW alike.
  auto g = parseConfig("optimizer:\n  type: adafactor\nprecision:\n  dtype: bf16\n  grad_accum_dtype: bf16\n",
                       "t.yaml", {}, false);
  REQUIRE(g.precision.gradAccumDType == "bf16");
  REQUIRE(parseConfig("precision:\n  dtype: bf16\n  grad_accum_dtype: bf16\n", "t.yaml", {}, false)
              .precision.gradAccumDType == "bf16");
  // Adafactor's state goes to the SSD as AdamW's does.
  REQUIRE(parseConfig("optimizer:\n  type: adafactor\nzero_optimization:\n  nvme_path: /tmp/ssd\n  "
                      "offload_optimizer:\n    device: nvme\n",
                      "t.yaml", {}, false)
              .zero.offloadOptimizerDevice == "nvme");
  REQUIRE(errorOf("optimizer:\n  type: adafactor\nprecision:\n  dtype: fp16\n  grad_accum_dtype: bf16\n")
              .find("the compute dtype") != std::string::npos);
}

TEST_CASE("optimizer.moments_dtype: AdamW's only, and the SSD keeps bf16 moments as they are",
          "[train][config]") {
  // NOTE [AdamW moments dtype] in optim/AdamW.h.
  REQUIRE(parseConfig("", "t.yaml", {}, false).optimizer.momentsDType == "fp32");
  auto c = parseConfig("optimizer:\n  moments_dtype: bf16\n", "t.yaml", {}, false);
  REQUIRE(c.optimizer.momentsDType == "bf16");
  REQUIRE(plan::momentsDType(c) == DType::BF16);
  REQUIRE(plan::nvmeStateDType(c) == DType::BF16);  // store.nvme_state_dtype fp32 (the default) or bf16
  auto bf16Ssd = parseConfig("optimizer:\n  moments_dtype: bf16\nstore:\n  nvme_state_dtype: bf16\n",
                             "t.yaml", {}, false);
  REQUIRE(plan::nvmeStateDType(bf16Ssd) == DType::BF16);
  REQUIRE(plan::momentsDType(parseConfig("", "t.yaml", {}, false)) == DType::F32);
  REQUIRE(errorOf("optimizer:\n  moments_dtype: fp16\n").find("optimizer.moments_dtype") !=
          std::string::npos);
  // Adafactor: refused, naming its own key.
  std::string e = errorOf("optimizer:\n  type: adafactor\n  moments_dtype: bf16\n");
  REQUIRE(e.find("optimizer.moments_dtype") != std::string::npos);
  REQUIRE(e.find("optimizer.adafactor_bf16_momentum: true") != std::string::npos);
  REQUIRE(parseConfig("optimizer:\n  type: adafactor\n  moments_dtype: fp32\n", "t.yaml", {}, false)
              .optimizer.type == "adafactor");
  // fp16 on the SSD would round bf16 moments again.
  e = errorOf("optimizer:\n  moments_dtype: bf16\nstore:\n  nvme_state_dtype: fp16\n");
  REQUIRE(e.find("store.nvme_state_dtype") != std::string::npos);
  REQUIRE(e.find("set store.nvme_state_dtype to bf16") != std::string::npos);
}

TEST_CASE("precision.fp8 takes bf16 only and reads its recipe's keys", "[config][fp8]") {
  auto c = parseConfig(
      "precision:\n  fp8: true\n  fp8_amax_history: 16\n  fp8_margin: 2\n  fp8_amax_compute: "
      "most_recent\n",
      "t.yaml", {}, false);
  REQUIRE(c.precision.fp8);
  REQUIRE(c.precision.fp8AmaxHistory == 16);
  REQUIRE(c.precision.fp8Margin == 2);
  REQUIRE(c.precision.fp8AmaxCompute == "most_recent");
  REQUIRE(!parseConfig("", "t.yaml", {}, false).precision.fp8);
  std::string e = errorOf("precision:\n  dtype: fp32\n  fp8: true\n");
  REQUIRE(e.find("precision.fp8") != std::string::npos);
  REQUIRE(e.find("precision.dtype") != std::string::npos);
  REQUIRE(errorOf("precision:\n  fp8_amax_compute: mean\n").find("precision.fp8_amax_compute") !=
          std::string::npos);
}

TEST_CASE("the model keys HF checkpoints carry: max_position_embeddings, pad_token_id, scale_decoder_outputs",
          "[train][config][hf]") {
  auto c =
      parseConfig("model:\n  arch: t5\n  bias: false\n  scale_decoder_outputs: false\n", "t.yaml", {}, false);
  REQUIRE(c.model.scaleDecoderOutputs == "false");
  REQUIRE(c.model.maxPositionEmbeddings == 0);  // seq_length's table
  REQUIRE(c.model.padTokenId == -1);            // vocab_size - 4
  auto effective = config::effectiveValues(c, "model.");
  REQUIRE(effective.at("model.scale_decoder_outputs") == "false");
  REQUIRE(effective.at("model.max_position_embeddings") == "0");
  REQUIRE(effective.at("model.pad_token_id") == "-1");
  auto b = parseConfig("", "t.yaml", {"model.max_position_embeddings=512", "model.pad_token_id=0"}, false);
  REQUIRE(b.model.maxPositionEmbeddings == 512);
  REQUIRE(b.model.padTokenId == 0);
  REQUIRE(
      errorOf("model:\n  scale_decoder_outputs: sometimes\n").find("must be one of default, true, false") !=
      std::string::npos);
  REQUIRE(errorOf("model:\n  pad_token_id: -2\n").find("out of range") != std::string::npos);
  REQUIRE(errorOf("model:\n  max_position_embeddings: -1\n").find("out of range") != std::string::npos);
}

TEST_CASE("a config rebuilt from its effective values is the same config (what a resume starts from)",
          "[train][config][resume]") {
  auto c = parseConfig("model:\n  num_layers: 3\noptimizer:\n  betas: [0.8, 0.9]\n", "t.yaml",
                       {"data.path=/tmp/a dir/x.txt", "train.global_batch_size=32", "store.gpu_budget_gb=1.5",
                        "optimizer.lr=0.1"},
                       false);
  c.train.samplePrompt = "ROMEO:\n  a 'quoted' line";  // text YAML would read as a mapping
  std::map<std::string, std::string> effective = config::effectiveValues(c);
  config::Config back = config::configFromValues(effective, "manifest.json", false);
  REQUIRE(config::effectiveValues(back) == effective);
  REQUIRE(back.train.samplePrompt == "ROMEO:\n  a 'quoted' line");
  REQUIRE(back.data.path == "/tmp/a dir/x.txt");
  REQUIRE(back.optimizer.lr == 0.1);
  REQUIRE(back.train.globalBatchSize == 32);
  REQUIRE(back.train.globalBatchSizeSet);
  // Only what differs from the defaults counts as set, so no warning about keys nobody gave.
  REQUIRE(back.values.count("optimizer.adafactor_beta1") == 0);
  REQUIRE(back.values.count("model.num_layers") == 1);
  REQUIRE(back.warnings.empty());
  // A key this version no longer has is left out with a warning, not an error.
  effective["model.retired_key"] = "1";
  REQUIRE(config::configFromValues(effective, "manifest.json", false).warnings.size() == 1);
}

TEST_CASE("the key table: unique names under known sections, one-line docs, defaults within the rules",
          "[train][config][keys]") {
  std::set<std::string> names, sections;
  for (const auto& section : config::configSections()) sections.insert(section.name);
  config::Config defaults;
  for (const auto& k : config::configKeyTable()) {
    INFO(k.name);
    REQUIRE(names.insert(k.name).second);
    REQUIRE(sections.count(k.name.substr(0, k.name.find('.'))) == 1);
    REQUIRE(!k.doc.empty());
    REQUIRE(k.doc.find('\n') == std::string::npos);
    config::ConfigMember member = k.member(defaults);
    if (!k.choices.empty()) {
      REQUIRE(std::holds_alternative<std::string*>(member));
      REQUIRE(std::count(k.choices.begin(), k.choices.end(), *std::get<std::string*>(member)) == 1);
    }
    if (auto* i = std::get_if<int64_t*>(&member)) REQUIRE((double(**i) >= k.min && double(**i) <= k.max));
    if (auto* d = std::get_if<double*>(&member)) REQUIRE((**d >= k.min && **d <= k.max));
  }
  REQUIRE(config::configKeys().size() == config::configKeyTable().size());
}

TEST_CASE("each key of the table sets a member of its own, which it reads back", "[train][config][keys]") {
  const config::Config defaults;
  auto before = config::effectiveValues(defaults);
  for (const auto& k : config::configKeyTable()) {
    INFO(k.name);
    config::Config c;
    std::visit(
        [](auto* member) {
          using T = std::remove_pointer_t<decltype(member)>;
          if constexpr (std::is_same_v<T, bool>)
            *member = !*member;
          else if constexpr (std::is_same_v<T, std::string>)
            *member += "x";
          else if constexpr (std::is_same_v<T, std::vector<double>>)
            member->push_back(0.5);
          else
            *member = *member * 2 + 3;
        },
        k.member(c));
    auto after = config::effectiveValues(c);
    REQUIRE(after.size() == before.size());
    for (const auto& [name, text] : after) REQUIRE((text == before.at(name)) == (name != k.name));
  }
}

TEST_CASE("a YAML file holding every key of the table at its default parses to the defaults",
          "[train][config][keys]") {
  const config::Config defaults;
  YamlTree root;
  for (const auto& k : config::configKeyTable()) {
    YamlTree* node = &root;
    for (size_t begin = 0, dot; begin <= k.name.size(); begin = dot + 1) {
      dot = std::min(k.name.find('.', begin), k.name.size());
      node = &node->children[k.name.substr(begin, dot - begin)];
    }
    std::string text = config::configValueText(k, defaults);
    config::ConfigMember member = k.member(const_cast<config::Config&>(defaults));
    node->value = std::holds_alternative<std::string*>(member) ? doubleQuoted(text) : text;
  }
  std::string yaml;
  emitYaml(root, "", yaml);
  config::Config parsed = parseConfig(yaml, "every-key.yaml", {}, false);
  // Every key was read (Config::values holds what a file set), and each took its default.
  REQUIRE(parsed.values.size() == config::configKeyTable().size());
  for (const auto& k : config::configKeyTable()) REQUIRE(parsed.values.count(k.name) == 1);
  REQUIRE(config::effectiveValues(parsed) ==
          config::effectiveValues(parseConfig("", "empty.yaml", {}, false)));
  REQUIRE(parsed.train.samplePrompt == "\n");
  // And the parser reads no key the table lacks: one more key is refused.
  REQUIRE(errorOf(yaml + "extra_section:\n  key: 1\n").find("unknown config key 'extra_section'") !=
          std::string::npos);
}

TEST_CASE("the config reference lists every key with its type, default and meaning",
          "[train][config][keys]") {
  std::string doc = config::configReference();
  for (const auto& k : config::configKeyTable()) {
    INFO(k.name);
    size_t at = doc.find("| `" + k.name + "` |");
    REQUIRE(at != std::string::npos);
    REQUIRE(doc.find("| `" + k.name + "` |", at + 1) == std::string::npos);
  }
  for (const auto& section : config::configSections())
    REQUIRE(doc.find("\n## " + section.name + "\n") != std::string::npos);
  REQUIRE(doc.find("| `model.num_layers` | integer ≥ 1 | `4` | transformer blocks") != std::string::npos);
  REQUIRE(doc.find("| `model.arch` | `gpt`, `bert`, `t5` | `gpt` |") != std::string::npos);
  // Defaults another key decides say so; numbers print as written, strings as YAML reads them back.
  REQUIRE(doc.find("| `model.max_position_embeddings` | integer ≥ 0 | `0` (= seq_length) |") !=
          std::string::npos);
  REQUIRE(doc.find("| `optimizer.betas` | list of numbers, each in [0, 0.999999] | `[0.9, 0.95]` |") !=
          std::string::npos);
  REQUIRE(doc.find("| `train.sample_prompt` | string | `\"\\n\"` |") != std::string::npos);
  REQUIRE(doc.find("| `store.gpu_budget_gb` | GiB, or `auto` | `auto` |") != std::string::npos);
}

TEST_CASE("an unknown key suggests the nearest: a typo, or the right key under another section",
          "[train][config][keys]") {
  using config::nearestConfigKey;
  REQUIRE(nearestConfigKey("train.micro_batch") == "train.micro_batch_size");
  REQUIRE(nearestConfigKey("model.n_layers") == "model.num_layers");
  REQUIRE(nearestConfigKey("model.num_layer") == "model.num_layers");
  REQUIRE(nearestConfigKey("model.micro_batch_size") == "train.micro_batch_size");
  REQUIRE(nearestConfigKey("train.lr") == "optimizer.lr");
  REQUIRE(nearestConfigKey("seq_length") == "model.seq_length");
  REQUIRE(nearestConfigKey("trian") == "train");
  REQUIRE(nearestConfigKey("zero_optimization.offload_optimizer.devise") ==
          "zero_optimization.offload_optimizer.device");
  REQUIRE(nearestConfigKey("foo.bar").empty());
  REQUIRE(nearestConfigKey("completely_unrelated").empty());
  // In a file (with its line) and in --set alike.
  std::string file = errorOf("train:\n  train_iters: 5\n  micro_batch: 4\n");
  REQUIRE(file.find("test.yaml:3: unknown config key 'train.micro_batch'; did you mean "
                    "'train.micro_batch_size'?") != std::string::npos);
  REQUIRE(errorOf("model:\n  micro_batch_size: 4\n").find("did you mean 'train.micro_batch_size'?") !=
          std::string::npos);
  REQUIRE(errorOf("trian:\n  seed: 1\n").find("did you mean 'train'?") != std::string::npos);
  std::string set = errorOf("", {"model.n_layers=3"});
  REQUIRE(set.find("--set model.n_layers=3: unknown config key 'model.n_layers'; did you mean "
                   "'model.num_layers'?") != std::string::npos);
  std::string far = errorOf("", {"foo.bar=1"});
  REQUIRE(far.find("unknown config key 'foo.bar' (strata config --list") != std::string::npos);
  REQUIRE(far.find("did you mean") == std::string::npos);
  REQUIRE(errorOf("", {"model=3"}).find("'model' is a section, not a key") != std::string::npos);
}

TEST_CASE("parallel: auto stands in for the section; other scalars and parallel.tensor beside it are errors",
          "[train][config]") {
  // NOTE [Parallel auto] in plan/Plan.h.
  CHECK(parseConfig("parallel: auto\n", "t.yaml", {}, false).parallel.automatic);
  CHECK(parseConfig("model:\n  num_layers: 2\n", "t.yaml", {"parallel=auto"}, false).parallel.automatic);
  CHECK(!parseConfig("parallel:\n  tensor: 2\n", "t.yaml", {}, false).parallel.automatic);
  std::string other = errorOf("parallel: fast\n");
  CHECK(other.find("test.yaml:1") != std::string::npos);
  CHECK(other.find("or the word auto") != std::string::npos);
  std::string both = errorOf("parallel: auto\n", {"parallel.tensor=2"});
  CHECK(both.find("'parallel: auto' chooses parallel.tensor") != std::string::npos);
}
