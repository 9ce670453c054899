#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "TestUtil.h"
#include "TinyRun.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Run.h"
#include "strata/train/Trainer.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

fs::path fresh(const std::string& name) {
  fs::path p = fs::temp_directory_path() / name;
  fs::remove_all(p);
  return p;
}

std::vector<std::string> stepDirectories(const fs::path& saveDir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(saveDir))
    if (entry.is_directory()) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string latestOf(const fs::path& saveDir) {
  std::string name;
  std::getline(std::ifstream(saveDir / "latest"), name);
  return name;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE(
    "a run's id is in its checkpoints, metrics and event files, and a fresh run never touches another's",
    "[train][run]") {
  fs::path a = fresh("strata-run-a"), b = fresh("strata-run-b");
  fs::path shared = a / "ckpt";
  train::Trainer first(
      test::tinyConfig(a, {"checkpoint.save=" + shared.string(), "checkpoint.save_interval=3",
                           "train.train_iters=6", "train.eval_interval=0"}));
  first.run();
  std::string id = first.runId();
  REQUIRE(id.size() == 24);  // 20260101-120000-1a2b3c4d
  REQUIRE(train::readCheckpointState(shared.string()).runId == id);
  for (const auto& record : test::metricsRecords(a)) REQUIRE(record["run_id"] == id);
  int events = 0;
  for (const auto& entry : fs::directory_iterator(a))
    if (entry.path().filename().string().rfind("events.out.tfevents", 0) == 0) {
      ++events;
      REQUIRE(train::eventFileRunId(entry.path().filename().string()) == id);
    }
  REQUIRE(events == 1);

  // Another fresh run whose checkpoints would go to the same directory stops before any work, naming the
  // run and its files, and offering both ways on; nothing of the first run changes.
  std::string e = test::errorOf([&] {
    train::Trainer t(test::tinyConfig(
        b, {"checkpoint.save=" + shared.string(), "train.train_iters=2", "checkpoint.keep_last=1"}));
  });
  REQUIRE(contains(e, "hold another run's files"));
  REQUIRE(contains(e, "run " + id));
  REQUIRE(contains(e, "checkpoints step-3, step-6"));
  REQUIRE(contains(e, "--resume"));
  REQUIRE(contains(e, "--overwrite"));
  REQUIRE(stepDirectories(shared) == std::vector<std::string>{"step-3", "step-6"});
  REQUIRE(latestOf(shared) == "step-6");
  REQUIRE(!fs::exists(b / "metrics.jsonl"));
  // The same for its out_dir alone (the first run's metrics and events), without a save directory.
  e = test::errorOf([&] { train::Trainer t(test::tinyConfig(a, {"train.train_iters=2"})); });
  REQUIRE(contains(e, "train.out_dir " + a.string()));
  REQUIRE(contains(e, "metrics.jsonl, 1 TensorBoard event file"));

  // Starting over removes the first run's files, and only those.
  { std::ofstream(shared / "notes.txt") << "a user's file\n"; }
  config::Config over = test::tinyConfig(
      b, {"checkpoint.save=" + shared.string(), "train.train_iters=2", "checkpoint.keep_last=1"});
  over.checkpoint.overwrite = true;
  train::Trainer second(over);
  second.run();
  REQUIRE(second.runId() != id);
  REQUIRE(stepDirectories(shared) == std::vector<std::string>{"step-2"});
  REQUIRE(fs::exists(shared / "notes.txt"));
  REQUIRE(train::readCheckpointState(shared.string()).runId == second.runId());
  REQUIRE(fs::exists(a / "metrics.jsonl"));  // another directory: not this run's to remove
}

TEST_CASE("a resume takes the run's settings from its checkpoint and refuses given ones that differ",
          "[train][run][checkpoint]") {
  fs::path out = fresh("strata-run-resume");
  fs::path ckpt = out / "ckpt";
  train::Trainer first(test::tinyConfig(
      out, {"checkpoint.save=" + ckpt.string(), "train.train_iters=12", "train.exit_interval=4",
            "lr_schedule.warmup_iters=3", "zero_optimization.chunk_size_mb=0.01"}));
  REQUIRE(first.run().steps == 4);

  // A bare config resumes the run as it was: its model, batch, schedule, out_dir and exit interval. Where
  // its state lives is this command's (the default chunks here): that changes no number.
  config::Config bare = config::parseConfig(
      "", "bare",
      {"data.path=" + test::tinyCorpus().string(), "train.device=cpu", "checkpoint.load=" + ckpt.string()});
  train::Trainer resumed(bare);
  REQUIRE(resumed.runId() == first.runId());
  REQUIRE(resumed.start().step == 4);
  REQUIRE(resumed.config().model.numLayers == 2);
  REQUIRE(resumed.config().train.globalBatchSize == 8);
  REQUIRE(resumed.config().optimizer.lr == 0.003);
  REQUIRE(resumed.config().lrSchedule.warmupIters == 3);
  REQUIRE(resumed.config().train.outDir == out.string());
  REQUIRE(resumed.config().zero.chunkSizeMb == 64);
  train::TrainResult r = resumed.run();
  REQUIRE(r.steps == 8);  // the run's exit interval
  REQUIRE(r.checkpoint == (ckpt / "step-8").string());
  auto records = test::metricsRecords(out);
  REQUIRE(records.back()["step"] == 8);
  REQUIRE(records.back()["run_id"] == first.runId());

  // Given settings that may not change are refused, every one listed, and nothing is touched.
  auto changed = [&](std::vector<std::string> extra) {
    extra.push_back("checkpoint.load=" + ckpt.string());
    return test::tinyConfig(out, extra);
  };
  std::string e = test::errorOf([&] {
    train::Trainer t(changed({"train.train_iters=12", "train.exit_interval=4", "lr_schedule.warmup_iters=3",
                              "optimizer.lr=0.01", "train.micro_batch_size=8", "train.seed=7"}));
  });
  REQUIRE(contains(e, "settings that differ from the run's"));
  REQUIRE(contains(e, "optimizer.lr: 0.003 in the checkpoint, 0.01 now"));
  REQUIRE(contains(e, "train.micro_batch_size: 4 in the checkpoint, 8 now"));
  REQUIRE(contains(e, "train.seed: 1234 in the checkpoint, 7 now"));
  REQUIRE(contains(e, "checkpoint.allow_changes=true"));
  REQUIRE(test::metricsRecords(out).size() == records.size());
  // tinyConfig leaves warmup at 2 and the exit interval unset: the warm-up is refused too, the interval
  // (not given) stays the run's.
  e = test::errorOf([&] { train::Trainer t(changed({"train.train_iters=12"})); });
  REQUIRE(contains(e, "lr_schedule.warmup_iters: 3 in the checkpoint, 2 now"));
  // Settings that may change do, with a note.
  train::Trainer longer(
      changed({"train.train_iters=16", "lr_schedule.warmup_iters=3", "train.log_interval=2"}));
  REQUIRE(longer.config().train.trainIters == 16);
  REQUIRE(longer.config().train.exitInterval == 4);
  REQUIRE(longer.start().notes.size() == 2);
  REQUIRE(contains(longer.start().notes[0], "train.log_interval: 1 in the checkpoint, 2 now"));
  // And any, with checkpoint.allow_changes.
  train::Trainer anyway(
      changed({"lr_schedule.warmup_iters=3", "optimizer.lr=0.01", "checkpoint.allow_changes=true"}));
  REQUIRE(anyway.config().optimizer.lr == 0.01);
  // The model's shape never changes, allow_changes or not.
  e = test::errorOf([&] {
    train::Trainer t(
        changed({"lr_schedule.warmup_iters=3", "model.num_layers=1", "checkpoint.allow_changes=true"}));
  });
  REQUIRE(contains(e, "model.num_layers: 2 in the checkpoint, 1 in this config"));
}

TEST_CASE("checkpoint.resume continues from latest or starts the run; a complete run trains nothing",
          "[train][run][checkpoint]") {
  fs::path out = fresh("strata-run-auto");
  fs::path ckpt = out / "ckpt";
  auto job = [&](std::vector<std::string> extra = {}) {
    extra.insert(extra.end(), {"checkpoint.save=" + ckpt.string(), "train.train_iters=6",
                               "train.exit_interval=3", "checkpoint.resume=true"});
    return test::tinyConfig(out, extra);
  };
  // The job script's first run starts the run; each rerun continues it (`load: latest` is the same).
  train::Trainer first(job());
  REQUIRE(first.start().checkpoint.empty());
  REQUIRE(contains(first.start().notes.at(0), "no checkpoint in " + ckpt.string() + " yet"));
  REQUIRE(first.run().steps == 3);
  train::Trainer second(job({"checkpoint.load=latest"}));
  REQUIRE(second.start().checkpoint == (ckpt / "step-3").string());
  REQUIRE(second.runId() == first.runId());
  REQUIRE(second.run().steps == 6);
  // Past train_iters there is nothing to do: no step, no metrics record, no sample.
  size_t before = test::metricsRecords(out).size();
  train::Trainer done(job({"train.sample_length=50"}));
  train::TrainResult r = done.run();
  REQUIRE(r.alreadyComplete);
  REQUIRE(r.steps == 6);
  REQUIRE(r.sample.empty());
  REQUIRE(test::metricsRecords(out).size() == before);
  // A resume with nowhere to look is refused.
  std::string e = test::errorOf([&] { train::Trainer t(test::tinyConfig(out, {"checkpoint.resume=true"})); });
  REQUIRE(contains(e, "saves none"));

  // An attempt that wrote metrics but crashed before its first checkpoint (here: a run that saves none)
  // cannot be resumed; a rerun with --resume starts the run over it.
  fs::path crashed = fresh("strata-run-crashed");
  train::Trainer(test::tinyConfig(crashed, {"train.train_iters=2"})).run();
  train::Trainer rerun(test::tinyConfig(crashed, {"train.train_iters=2", "checkpoint.resume=true",
                                                  "checkpoint.save=" + (crashed / "ckpt").string()}));
  rerun.run();
  for (const auto& record : test::metricsRecords(crashed)) REQUIRE(record["run_id"] == rerun.runId());
}
