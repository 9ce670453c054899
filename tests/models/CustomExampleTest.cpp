// The custom example's model trains through the stock trainer without touching Strata's sources.
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "TestUtil.h"
#include "models/custom_example/BigramMlp.h"
#include "nn/HookTrace.h"
#include "strata/train/Trainer.h"
#include "train/TinyRun.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

// The example's model as a user who names nothing and counts no FLOPs writes it: the defaults.
class UncountedBigramMlp : public example::BigramMlp {
 public:
  using example::BigramMlp::BigramMlp;
  std::string name() const override { return nn::CausalLM::name(); }
  std::optional<double> flopsPerToken() const override { return nn::CausalLM::flopsPerToken(); }
};

// Trains `model` on a small corpus on the CPU for `iters` iterations into `out`, and returns what the trainer
// logged.
std::string trainLogged(std::shared_ptr<nn::CausalLM> model, const fs::path& out, int iters,
                        train::TrainResult& r) {
  fs::path corpus = fs::temp_directory_path() / "strata-custom-corpus.txt";
  {
    std::ofstream text(corpus);
    for (int i = 0; i < 300; ++i) text << "abcabcabd abcabcabd\n";
  }
  fs::remove_all(out);
  config::Config c = config::parseConfig(
      "", "test",
      {"data.path=" + corpus.string(), "train.out_dir=" + out.string(), "train.device=cpu",
       "model.hidden_size=16", "model.seq_length=16", "train.micro_batch_size=8",
       "train.train_iters=" + std::to_string(iters), "train.log_interval=10",
       "train.eval_interval=" + std::to_string(iters), "train.eval_iters=2", "train.sample_length=0",
       "lr_schedule.warmup_iters=5", "optimizer.lr=0.01"});
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.push_back(sink);
  try {
    train::Trainer trainer(c, std::move(model));
    r = trainer.run();
  } catch (...) {
    sinks.erase(std::find(sinks.begin(), sinks.end(), sink));
    throw;
  }
  sinks.erase(std::find(sinks.begin(), sinks.end(), sink));
  return log.str();
}

}  // namespace

TEST_CASE("a user-written model trains with the stock trainer", "[models][custom]") {
  fs::path out = fs::temp_directory_path() / "strata-custom-out";
  auto model = std::make_shared<example::BigramMlp>(256, 16, 16, Device::cpu());
  REQUIRE(model->namedParameters().size() == 5);
  train::TrainResult r;
  std::string log = trainLogged(model, out, 60, r);
  // The text is nearly deterministic given two tokens of context: the loss must fall far below ln(256).
  REQUIRE(r.trainLoss < 1.5);
  REQUIRE(r.valLoss < 1.5);
  // Logged under its own name, with TFLOP/s from its own count: 6 x its two GEMMs' weights per token.
  INFO(log);
  REQUIRE(log.find("training bigram-mlp (") != std::string::npos);
  REQUIRE(log.find("gpt") == std::string::npos);
  REQUIRE(model->flopsPerToken() == 6.0 * (32 * 64 + 64 * 256));
  REQUIRE(log.find(" TFLOP/s | MFU 0.0%") != std::string::npos);
  int trainRecords = 0;
  for (const auto& rec : test::metricsRecords(out)) {
    if (!rec.contains("tokens_per_s")) continue;
    ++trainRecords;
    REQUIRE(rec["tflops"].get<double>() * 1e12 ==
            Approx(rec["tokens_per_s"].get<double>() * *model->flopsPerToken()).epsilon(1e-9));
    REQUIRE(rec["mfu"].get<double>() == 0);  // the CPU has no peak to compare with
  }
  REQUIRE(trainRecords == 6);
}

TEST_CASE("a user-written model that counts no FLOPs is logged as custom, with TFLOP/s unknown",
          "[models][custom]") {
  fs::path out = fs::temp_directory_path() / "strata-custom-uncounted";
  auto model = std::make_shared<UncountedBigramMlp>(256, 16, 16, Device::cpu());
  REQUIRE(!model->flopsPerToken().has_value());
  train::TrainResult r;
  std::string log = trainLogged(model, out, 20, r);
  INFO(log);
  REQUIRE(log.find("training custom (") != std::string::npos);
  REQUIRE(log.find("TFLOP/s unknown") != std::string::npos);
  REQUIRE(log.find("MFU") == std::string::npos);
  REQUIRE(log.find("gpt") == std::string::npos);
  int trainRecords = 0;
  for (const auto& rec : test::metricsRecords(out)) {
    if (!rec.contains("tokens_per_s")) continue;
    ++trainRecords;
    REQUIRE(!rec.contains("tflops"));
    REQUIRE(!rec.contains("mfu"));
  }
  REQUIRE(trainRecords == 2);
}

TEST_CASE("a user-written model's hooks fire around every parameter use", "[models][custom][hooks]") {
  std::vector<float> losses[2];
  for (bool zero : {false, true}) {
    INFO((zero ? "simulated ZeRO-3" : "plain"));
    auto model = std::make_shared<example::BigramMlp>(32, 8, 16, Device::cpu());
    // A parameter the model never uses: it must still hear once per backward pass.
    model->registerParameter("spare", ops::zeros({3}));
    test::HookTrace trace(*model, zero);
    for (int micro = 0; micro < 2; ++micro) {
      size_t from = trace.events.size();
      Tensor ids = Tensor::fromVector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8 + micro}, {2, 4});
      Tensor loss = model->loss(ids, ids, DType::F32) * 0.5;
      trace.recordGraph(loss);
      trace.checkForward(from);
      backward(loss);
      losses[zero].push_back(loss.item());
    }
    std::set<std::string> all(trace.modules.begin(), trace.modules.end());
    REQUIRE(all == std::set<std::string>{"", "embed", "hidden", "out"});
    REQUIRE(trace.modulesWith(test::HookTrace::Kind::FwdPre, 0) == all);
    REQUIRE(trace.modulesWith(test::HookTrace::Kind::BwdPre, 0) == all);
    REQUIRE(trace.checkBackward(0).size() == 2);
    REQUIRE(trace.forwardUses.count("spare") == 0);
    REQUIRE(trace.forwardUses.count("embed.weight") == 1);
    for (auto& p : trace.params) REQUIRE(test::HookTrace::released(p) == zero);
  }
  // Under the simulated ZeRO-3 no parameter was read while released (it would have turned the loss into NaN).
  REQUIRE(losses[1] == losses[0]);
}
