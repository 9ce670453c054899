#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "strata/config/Config.h"
#include "strata/optim/Adafactor.h"

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
  REQUIRE(
      errorOf("optimizer:\n  type: adafactor\nzero_optimization:\n  offload_optimizer:\n    device: nvme\n")
          .find("no SSD form") != std::string::npos);
  REQUIRE(errorOf("optimizer:\n  type: adafactor\nprecision:\n  dtype: fp16\n  grad_accum_dtype: bf16\n")
              .find("the compute dtype") != std::string::npos);
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
