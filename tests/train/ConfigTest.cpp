#include "TestUtil.h"
#include "strata/train/Config.h"

using namespace strata;
using strata::train::parseConfig;

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
