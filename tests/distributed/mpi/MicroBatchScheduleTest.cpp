// The step engine under micro-batch schedules other than the sequential one (train/MicroBatchSchedule.h),
// on N CPU ranks: a schedule that runs every micro-batch's forward before the first backward, as a
// pipeline schedule holds micro-batches in flight. With the backwards in micro-batch order the gradients
// accumulate in the same order, so the step is the sequential one bit for bit; in reverse order the last
// backward run is micro-batch 0's, and the engine must reduce the gradients after it (the sums then differ
// only by their order). Checks use CHECK, so no rank leaves early and strands the others.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "CatchShim.h"
#include "strata/data/Data.h"
#include "strata/distributed/ParallelContext.h"
#include "strata/train/StepEngine.h"
#include "strata/train/Trainer.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

// Every forward first, then the backwards in micro-batch order or reversed.
class ForwardsFirstSchedule final : public train::MicroBatchSchedule {
 public:
  explicit ForwardsFirstSchedule(bool reverse) : reverse_(reverse) {}
  void run(int64_t microBatches, const train::MicroBatchWork& work) const override {
    std::vector<Tensor> losses;
    for (int64_t m = 0; m < microBatches; ++m) losses.push_back(work.forward(m));
    for (int64_t k = 0; k < microBatches; ++k) {
      int64_t m = reverse_ ? microBatches - 1 - k : k;
      work.backward(m, losses[size_t(m)]);
    }
  }

 private:
  bool reverse_;
};

struct ScheduledRun {
  std::vector<double> losses, gradNorms;
  std::vector<std::vector<float>> parameters;  // this rank's pieces of the model after the steps
};

// A corpus for the config (the steps read random tokens), one file per process.
fs::path corpusFor(int rank) {
  fs::path corpus = fs::temp_directory_path() / ("strata-schedule-corpus-" + std::to_string(::getppid()) +
                                                 "-" + std::to_string(rank) + ".txt");
  std::ofstream text(corpus);
  for (int i = 0; i < 50; ++i) text << "to be or not to be " << i % 7 << "\n";
  return corpus;
}

// Three steps of two micro-batches on every rank at ZeRO stage `stage`, under `schedule` (null: the
// engine's own, sequential).
ScheduledRun scheduledRun(dist::ParallelContext& ctx, int stage,
                          std::unique_ptr<train::MicroBatchSchedule> schedule) {
  config::Config config =
      config::parseConfig("", "schedule-test",
                          {"data.path=" + corpusFor(ctx.rank()).string(), "model.num_layers=2",
                           "model.hidden_size=32", "model.num_attention_heads=2", "model.seq_length=32",
                           "model.vocab_size=256", "model.dropout=0", "zero_optimization.chunk_size_mb=0.02",
                           "precision.dtype=fp32", "zero_optimization.stage=" + std::to_string(stage)});
  auto objective = data::makeObjective(config, Device::cpu());
  train::ZeroStepEngine engine(*objective, config, Device::cpu(), DType::F32, &ctx.world());
  if (schedule) engine.setSchedule(std::move(schedule));
  auto data = data::TokenDataset::random(256, 1 << 14, 7, 0.0);
  int64_t index = 100 * ctx.rank();  // each rank its own batches
  auto next = [&] {
    auto [ids, targets] = data.batch(data::Split::Train, index, 2, 32, 1, Device::cpu());
    return data::TokenBatch{ids, targets, index++};
  };
  ScheduledRun run;
  for (int step = 0; step < 3; ++step) {
    train::StepOutcome outcome = engine.step(next, 2, 1e-3);
    run.losses.push_back(outcome.loss);
    run.gradNorms.push_back(outcome.gradNorm);
  }
  for (const train::SaveTensor& piece : engine.checkpointModel())
    run.parameters.push_back(piece.value().toVector<float>());
  return run;
}

double worstRelative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-30));
  return worst;
}

}  // namespace

TEST_CASE(
    "the step engine steps alike under a schedule that holds micro-batches between forward and backward",
    "[dist][zero][schedule]") {
  dist::ParallelContext ctx(dist::ParallelOptions{.timeoutSeconds = 60});
  for (int stage : {0, 1, 2, 3}) {
    INFO("stage " << stage << " on rank " << ctx.rank() << " of " << ctx.worldSize());
    ScheduledRun sequential = scheduledRun(ctx, stage, nullptr);
    ScheduledRun inOrder = scheduledRun(ctx, stage, std::make_unique<ForwardsFirstSchedule>(false));
    ScheduledRun reversed = scheduledRun(ctx, stage, std::make_unique<ForwardsFirstSchedule>(true));
    CHECK(sequential.losses.size() == 3);
    CHECK(std::isfinite(sequential.losses.back()));
    CHECK(inOrder.losses == sequential.losses);
    CHECK(inOrder.gradNorms == sequential.gradNorms);
    CHECK(inOrder.parameters == sequential.parameters);
    // Reversed: each rank's sum of the two micro-batches in the other order (the tied embedding takes
    // several terms), then the same reductions.
    CHECK(worstRelative(reversed.losses, sequential.losses) < 1e-6);
    CHECK(worstRelative(reversed.gradNorms, sequential.gradNorms) < 1e-5);
  }
}
