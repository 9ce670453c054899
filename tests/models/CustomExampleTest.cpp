// The custom example's model trains through the stock trainer without touching Strata's sources.
#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "models/custom_example/BigramMlp.h"
#include "nn/HookTrace.h"
#include "strata/train/Trainer.h"

using namespace strata;
namespace fs = std::filesystem;

TEST_CASE("a user-written model trains with the stock trainer", "[models][custom]") {
  fs::path corpus = fs::temp_directory_path() / "strata-custom-corpus.txt";
  {
    std::ofstream out(corpus);
    for (int i = 0; i < 300; ++i) out << "abcabcabd abcabcabd\n";
  }
  fs::path out = fs::temp_directory_path() / "strata-custom-out";
  fs::remove_all(out);
  config::Config c = config::parseConfig(
      "", "test",
      {"data.path=" + corpus.string(), "train.out_dir=" + out.string(), "train.device=cpu",
       "model.hidden_size=16", "model.seq_length=16", "train.micro_batch_size=8", "train.train_iters=60",
       "train.log_interval=10", "train.eval_interval=60", "train.eval_iters=2", "train.sample_length=0",
       "lr_schedule.warmup_iters=5", "optimizer.lr=0.01"});
  auto model = std::make_shared<example::BigramMlp>(256, 16, 16, Device::cpu());
  REQUIRE(model->namedParameters().size() == 5);
  train::Trainer trainer(c, model);
  train::TrainResult r = trainer.run();
  // The text is nearly deterministic given two tokens of context: the loss must fall far below ln(256).
  REQUIRE(r.trainLoss < 1.5);
  REQUIRE(r.valLoss < 1.5);
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
