// The custom example's model trains through the stock trainer without touching Strata's sources.
#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "models/custom_example/BigramMlp.h"
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
  train::Config c = train::parseConfig(
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
