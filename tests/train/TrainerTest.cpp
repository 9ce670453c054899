#include <omp.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "TestUtil.h"
#include "TinyRun.h"
#include "strata/core/Allocator.h"
#include "strata/core/Stream.h"
#include "strata/optim/Adafactor.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Metrics.h"
#include "strata/train/StepEngine.h"
#include "strata/train/Trainer.h"
#include "strata/zero/GradientReducer.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

config::Config tinyConfig(const fs::path& outDir, std::vector<std::string> extra = {}) {
  return test::tinyConfig(outDir, std::move(extra));
}

// The two runs' metrics hold the same steps with the same losses, number for number.
void requireSameCurves(const std::vector<nlohmann::json>& a, const std::vector<nlohmann::json>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("record " << i);
    REQUIRE(a[i]["step"] == b[i]["step"]);
    if (a[i].contains("loss")) REQUIRE(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());
    if (a[i].contains("val_loss")) REQUIRE(a[i]["val_loss"].get<double>() == b[i]["val_loss"].get<double>());
  }
}

std::vector<nlohmann::json> records(const fs::path& outDir) {
  return test::metricsRecords(outDir);
}

}  // namespace

TEST_CASE("training lowers the loss and writes metrics and TensorBoard events", "[train][trainer]") {
  fs::path out = fs::temp_directory_path() / "strata-trainer-basic";
  fs::remove_all(out);
  train::Trainer trainer(tinyConfig(out, {"train.train_iters=40", "train.eval_interval=40"}));
  train::TrainResult r = trainer.run();
  REQUIRE(r.steps == 40);
  auto recs = records(out);
  REQUIRE(recs.size() == 41);  // 40 train records and one eval
  double first = recs.front()["loss"].get<double>();
  REQUIRE(first == Approx(std::log(256.0)).margin(0.5));
  REQUIRE(r.trainLoss < first - 1.0);
  REQUIRE(recs.back().contains("val_loss"));
  REQUIRE(recs[5].contains("tokens_per_s"));
  REQUIRE(recs[5]["elapsed_s"].get<double>() > 0);
  REQUIRE(fs::file_size(out / "loss.svg") > 1000);
  REQUIRE(recs[5]["grad_norm"].get<double>() > 0);
  bool events = false;
  for (auto& e : fs::directory_iterator(out))
    events = events || e.path().filename().string().rfind("events.out.tfevents", 0) == 0;
  REQUIRE(events);
  std::string text = trainer.sample("the ", 20, 0.8, 10, 3);
  REQUIRE(text.size() == 20);
}

TEST_CASE("resume continues the loss curve exactly", "[train][trainer][checkpoint]") {
  fs::path straight = fs::temp_directory_path() / "strata-resume-straight";
  fs::path split = fs::temp_directory_path() / "strata-resume-split";
  fs::remove_all(straight);
  fs::remove_all(split);
  train::Trainer(tinyConfig(straight)).run();
  fs::path ckpt = split / "ckpt";
  train::Trainer(tinyConfig(split, {"train.exit_interval=10", "checkpoint.save=" + ckpt.string()})).run();
  REQUIRE(fs::exists(ckpt / "latest"));
  REQUIRE(fs::exists(ckpt / "step-10" / "manifest.json"));
  REQUIRE(fs::exists(ckpt / "step-10" / "model-rank0.safetensors"));
  auto shards = train::loadModelShards(ckpt.string());
  REQUIRE(shards.count("wte.weight") == 1);
  REQUIRE(shards.count("h.1.mlp.proj.bias") == 1);
  train::Trainer(tinyConfig(split, {"checkpoint.load=" + ckpt.string()})).run();
  requireSameCurves(records(straight), records(split));
  // Another chunk size reads the same state by parameter name (NOTE [Sharded chunk checkpoints]): the
  // curve still continues exactly, since the numbers never depend on the layout.
  fs::path rechunked = fs::temp_directory_path() / "strata-resume-rechunked";
  fs::remove_all(rechunked);
  train::Trainer(tinyConfig(rechunked, {"checkpoint.load=" + (ckpt / "step-10").string(),
                                        "zero_optimization.chunk_size_mb=0.01"}))
      .run();
  auto whole = records(straight), tail = records(rechunked);
  REQUIRE(tail.size() < whole.size());
  requireSameCurves(std::vector<nlohmann::json>(whole.end() - std::ptrdiff_t(tail.size()), whole.end()),
                    tail);
}

namespace {

// FP8 training (the LM head included) against bf16 on `device`: the loss falls alike over 30 steps, and a run
// stopped every 10 steps and resumed gives the uninterrupted run's losses bit for bit (the scales,
// histories and history position come back with the optimizer state; a history of 4 steps wraps around in
// between).
void requireFp8TrainsAndResumes(const std::string& device) {
  fs::path base = test::freshDir("strata-fp8-" + device);
  std::vector<std::string> common{"train.train_iters=30", "precision.fp8_amax_history=4",
                                  "train.device=" + device};
  std::vector<std::string> fp8 = common;
  fp8.push_back("precision.fp8=true");
  fp8.push_back("precision.fp8_lm_head=true");  // the tied head too (a vocabulary of 256)
  train::Trainer(tinyConfig(base / "bf16", common)).run();
  train::Trainer(tinyConfig(base / "straight", fp8)).run();
  auto lossesOf = [](const std::vector<nlohmann::json>& recs) {
    std::vector<double> out;
    for (const auto& r : recs)
      if (r.contains("loss")) out.push_back(r["loss"].get<double>());
    return out;
  };
  std::vector<double> a = lossesOf(records(base / "bf16")), b = lossesOf(records(base / "straight"));
  REQUIRE(a.size() == 30);
  REQUIRE(b.size() == 30);
  auto tail = [](const std::vector<double>& v) { return (v[27] + v[28] + v[29]) / 3; };
  INFO("bf16 " << a.front() << " -> " << tail(a) << ", fp8 " << b.front() << " -> " << tail(b));
  REQUIRE(tail(b) < 0.7 * b.front());
  REQUIRE(std::abs(tail(b) - tail(a)) < 0.05 * tail(a));
  REQUIRE(a != b);  // the products did run in FP8
  fs::path split = base / "split", ckpt = split / "ckpt";
  std::vector<std::string> first = fp8;
  first.push_back("train.exit_interval=10");
  first.push_back("checkpoint.save=" + ckpt.string());
  train::Trainer(tinyConfig(split, first)).run();
  REQUIRE(train::ChunkCheckpointReader((ckpt / "step-10").string()).hasKind("fp8"));
  std::vector<std::string> resumed = fp8;
  resumed.push_back("checkpoint.load=" + ckpt.string());
  train::Trainer(tinyConfig(split, resumed)).run();  // to step 20 (the run's exit interval)
  train::Trainer(tinyConfig(split, resumed)).run();
  requireSameCurves(records(base / "straight"), records(split));
}

}  // namespace

TEST_CASE("fp8 training (the CPU's emulation) lowers the loss as bf16 does and resumes bit for bit",
          "[train][trainer][fp8]") {
  requireFp8TrainsAndResumes("cpu");
}

TEST_CASE("[cuda] fp8 training lowers the loss as bf16 does and resumes bit for bit",
          "[cuda][train][trainer][fp8]") {
  STRATA_REQUIRE_CUDA();
  requireFp8TrainsAndResumes("cuda");
}

TEST_CASE("fp16 training skips overflowing steps and lowers the loss scale", "[train][trainer][fp16]") {
  fs::path out = fs::temp_directory_path() / "strata-trainer-fp16";
  fs::remove_all(out);
  // 1e8 overflows fp16 gradients at first: steps are skipped until the scale comes down into range.
  train::Trainer trainer(
      tinyConfig(out, {"precision.dtype=fp16", "precision.initial_loss_scale=1e8", "train.train_iters=40",
                       "train.eval_interval=40", "model.dropout=0"}));
  REQUIRE(trainer.computeDType() == DType::F16);
  train::TrainResult r = trainer.run();
  auto recs = records(out);
  double firstScale = recs.front()["loss_scale"].get<double>();
  double lastScale = recs[39]["loss_scale"].get<double>();
  REQUIRE(firstScale < 1e8);  // halved on the first, overflowing step
  // Kept halving until the fp16 gradients fit. How many halvings that takes depends on which gradients are
  // fp16: activation gradients are, while parameter gradients (Linear, LayerNorm, embeddings) are formed in
  // fp32 straight from fp16 operands, so only a bound is asserted (5 halvings after the first here).
  REQUIRE(lastScale <= firstScale / 16);
  REQUIRE(recs[39]["grad_norm"].get<double>() > 0);  // finite again: steps are being applied
  REQUIRE(r.trainLoss < recs.front()["loss"].get<double>() - 0.5);
}

TEST_CASE("fp16 training holds fp16 parameters in chunks, each its saved fp32 master rounded",
          "[train][trainer][fp16][chunks]") {
  // fp16 runs as fp16 on the CPU, so the 16-bit parameters and the fp32 masters are exercised here.
  fs::path out = test::freshDir("strata-trainer-fp16-chunks");
  train::Trainer trainer(
      tinyConfig(out, {"precision.dtype=fp16", "train.train_iters=6", "train.eval_interval=6",
                       "checkpoint.save=" + (out / "ckpt").string()}));
  train::TrainResult r = trainer.run();
  REQUIRE(std::isfinite(r.trainLoss));
  auto masters = train::loadModelShards(r.checkpoint);
  for (auto& [name, p] : trainer.model().namedParameters()) {
    INFO(name);
    REQUIRE(p.dtype() == DType::F16);
    REQUIRE(autograd::gradDType(p) == DType::F32);
    REQUIRE(masters.at(name).dtype() == DType::F32);
    REQUIRE(p.toVector<double>() == masters.at(name).to(DType::F16).toVector<double>());
  }
  // The key of the old per-tensor copies is refused with what replaced it.
  std::string error = test::errorOf([&] { tinyConfig(out, {"precision.weight_copies=true"}); });
  REQUIRE(error.find("precision.weight_copies is gone") != std::string::npos);
}

TEST_CASE("safetensors round-trips tensors and metadata", "[train][checkpoint]") {
  fs::path p = fs::temp_directory_path() / "strata-roundtrip.safetensors";
  Tensor a = ops::arange(0, 6).view({2, 3});
  Tensor b = Tensor::fromVector<float>({1.5f, -2.25f}, {2}).to(DType::BF16);
  Tensor c = Tensor::fromVector<int64_t>({7, 8, 9}, {3});
  train::writeSafetensors(p.string(), {{"a", a}, {"b", b}, {"c", c}}, {{"format", "pt"}});
  std::map<std::string, std::string> meta;
  auto loaded = train::readSafetensors(p.string(), Device::cpu(), &meta);
  REQUIRE(meta.at("format") == "pt");
  REQUIRE(loaded.at("a").shape() == Shape{2, 3});
  REQUIRE(loaded.at("a").toVector<float>() == a.toVector<float>());
  REQUIRE(loaded.at("b").dtype() == DType::BF16);
  REQUIRE(loaded.at("b").toVector<float>() == std::vector<float>{1.5f, -2.25f});
  REQUIRE(loaded.at("c").toVector<int64_t>() == std::vector<int64_t>{7, 8, 9});
  // The header is 8-byte aligned JSON after a little-endian length, as the format requires.
  std::ifstream in(p, std::ios::binary);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  REQUIRE((len + 8) % 8 == 0);
  REQUIRE_THROWS_AS(train::resolveCheckpoint("/nonexistent/ckpt"), Error);
}

TEST_CASE("data.format random trains without a data file (strata bench's source)", "[train][trainer]") {
  fs::path out = fs::temp_directory_path() / "strata-trainer-random";
  fs::remove_all(out);
  train::Trainer trainer(
      tinyConfig(out, {"data.format=random", "data.path=/nonexistent/corpus.bin", "train.train_iters=6",
                       "train.log_interval=3", "train.eval_interval=0"}));
  train::TrainResult r = trainer.run();
  REQUIRE(r.steps == 6);
  // Uniform ids over 256: the loss stays near log(256), and the last interval's speed is reported.
  REQUIRE(r.trainLoss == Approx(std::log(256.0)).margin(0.5));
  REQUIRE(r.last.step == 6);
  REQUIRE(r.last.tokensPerSec > 0);
  REQUIRE(r.last.msPerIter > 0);
}

TEST_CASE("a diverging bf16/fp32 run skips non-finite steps, stops with an error and saves none of them",
          "[train][trainer][nonfinite]") {
  fs::path out = fs::temp_directory_path() / "strata-trainer-diverge";
  fs::remove_all(out);
  fs::path ckpt = out / "ckpt";
  // Decoupled weight decay of lr * wd = 100 multiplies the weight matrices by -99 per step: they overflow
  // fp32 after a dozen or so steps and the loss goes non-finite.
  train::Trainer trainer(
      tinyConfig(out, {"optimizer.lr=10", "optimizer.weight_decay=10", "optimizer.min_lr=0",
                       "lr_schedule.style=constant", "lr_schedule.warmup_iters=0", "train.train_iters=60",
                       "train.max_nonfinite_steps=3", "checkpoint.save=" + ckpt.string(),
                       "checkpoint.save_interval=1", "checkpoint.keep_last=0", "model.dropout=0"}));
  try {
    trainer.run();
    FAIL("expected the run to stop");
  } catch (const train::DivergedError& e) {
    std::string what = e.what();
    REQUIRE(what.find("3 steps in a row") != std::string::npos);
    REQUIRE(what.find("No checkpoint was written from that state") != std::string::npos);
  }
  auto recs = records(out);
  int64_t skipped = 0;
  for (auto& r : recs)
    if (r.contains("skipped_steps")) skipped += r["skipped_steps"].get<int64_t>();
  // The third bad step throws before it is logged; the two before it were logged as skipped.
  REQUIRE(skipped == 2);
  // Every checkpoint on disk loads (checksums, no NaN) and none is from a skipped step.
  int64_t lastStep = recs.back()["step"].get<int64_t>();
  for (auto& entry : fs::directory_iterator(ckpt)) {
    if (!entry.is_directory()) continue;
    INFO(entry.path());
    auto shards = train::loadModelShards(entry.path().string());
    REQUIRE(std::stoll(entry.path().filename().string().substr(5)) <= lastStep - 2);
  }
}

TEST_CASE("startup checks stop before any work", "[train][trainer][startup]") {
  fs::path base = fs::temp_directory_path() / "strata-trainer-startup";
  fs::remove_all(base);
  fs::create_directories(base);
  { std::ofstream(base / "a-file") << "x"; }
  // out_dir is a file, or lies under one.
  using test::errorOf;
  std::string e = errorOf([&] { train::Trainer t(tinyConfig(base / "a-file")); });
  REQUIRE(e.find("'train.out_dir'") != std::string::npos);
  REQUIRE(e.find("is a file") != std::string::npos);
  e = errorOf([&] { train::Trainer t(tinyConfig(base / "a-file" / "run")); });
  REQUIRE(e.find("'train.out_dir'") != std::string::npos);
  // An unwritable save path is found before training, not after it.
  e = errorOf([&] {
    train::Trainer t(tinyConfig(base / "ok", {"checkpoint.save=" + (base / "a-file" / "ckpt").string()}));
  });
  REQUIRE(e.find("'checkpoint.save'") != std::string::npos);
  REQUIRE(!fs::exists(base / "ok" / "metrics.jsonl"));
  // A validation split smaller than one window, with evaluations on.
  e = errorOf([&] { train::Trainer t(tinyConfig(base / "ok", {"data.val_fraction=0.001"})); });
  REQUIRE(e.find("validation split") != std::string::npos);
  REQUIRE(e.find("data.val_fraction") != std::string::npos);
  // ... is fine without evaluations.
  train::Trainer fine(tinyConfig(base / "ok", {"data.val_fraction=0.001", "train.eval_interval=0"}));
  REQUIRE(fs::is_directory(base / "ok"));
}

TEST_CASE("SIGINT and SIGTERM finish the step, save, and the run resumes exactly",
          "[train][trainer][signal]") {
  fs::path straight = fs::temp_directory_path() / "strata-signal-straight";
  fs::path split = fs::temp_directory_path() / "strata-signal-split";
  fs::remove_all(straight);
  fs::remove_all(split);
  train::Trainer(tinyConfig(straight)).run();
  fs::path ckpt = split / "ckpt";
  struct sigaction before {};
  sigaction(SIGINT, nullptr, &before);
  for (int sig : {SIGINT, SIGTERM}) {
    fs::remove_all(split);
    train::Trainer trainer(tinyConfig(split, {"checkpoint.save=" + ckpt.string()}));
    trainer.onIteration([sig](int64_t step) {
      if (step == 7) std::raise(sig);
    });
    train::TrainResult r = trainer.run();
    REQUIRE(r.interruptSignal == sig);
    REQUIRE(r.steps == 7);
    REQUIRE(r.checkpoint == (ckpt / "step-7").string());
    REQUIRE(train::resolveCheckpoint(ckpt.string()) == (ckpt / "step-7").string());
    REQUIRE(fs::exists(split / "loss.svg"));
  }
  // The handlers from before run() are back.
  struct sigaction now {};
  sigaction(SIGINT, nullptr, &now);
  REQUIRE(now.sa_handler == before.sa_handler);
  train::Trainer(tinyConfig(split, {"checkpoint.load=" + ckpt.string()})).run();
  requireSameCurves(records(straight), records(split));
}

TEST_CASE("keep_last prunes old checkpoints and a new run removes failed saves' leftovers",
          "[train][trainer][checkpoint]") {
  fs::path out = fs::temp_directory_path() / "strata-trainer-keep";
  fs::remove_all(out);
  fs::path ckpt = out / "ckpt";
  fs::create_directories(ckpt / "step-3.tmp");
  train::Trainer trainer(tinyConfig(out, {"checkpoint.save=" + ckpt.string(), "checkpoint.save_interval=2",
                                          "checkpoint.keep_last=2", "train.train_iters=10"}));
  REQUIRE(!fs::exists(ckpt / "step-3.tmp"));  // removed at startup
  trainer.run();
  std::vector<std::string> dirs;
  for (auto& entry : fs::directory_iterator(ckpt))
    if (entry.is_directory()) dirs.push_back(entry.path().filename().string());
  std::sort(dirs.begin(), dirs.end());
  REQUIRE(dirs == std::vector<std::string>{"step-10", "step-8"});
}

TEST_CASE("metrics: a failed write is an error, and a resume never logs a step twice", "[train][metrics]") {
  fs::path out = fs::temp_directory_path() / "strata-metrics-full";
  fs::remove_all(out);
  fs::create_directories(out);
  fs::create_symlink("/dev/full", out / "metrics.jsonl");
  try {
    train::Trainer(tinyConfig(out, {"train.train_iters=3"})).run();
    FAIL("expected a write error");
  } catch (const Error& e) {
    REQUIRE(std::string(e.what()).find("metrics.jsonl") != std::string::npos);
  }
  // Train 20 steps with a checkpoint at 10, then resume from 10 in the same out_dir.
  fs::path run = fs::temp_directory_path() / "strata-metrics-resume";
  fs::remove_all(run);
  fs::path ckpt = run / "ckpt";
  train::Trainer(tinyConfig(run, {"checkpoint.save=" + ckpt.string(), "checkpoint.save_interval=10"})).run();
  auto first = records(run);
  train::Trainer(tinyConfig(run, {"checkpoint.load=" + (ckpt / "step-10").string()})).run();
  auto second = records(run);
  REQUIRE(second.size() == first.size());
  std::set<std::pair<int64_t, bool>> seen;
  for (auto& r : second) {
    REQUIRE(r.contains("elapsed_s") == r.contains("loss"));
    REQUIRE(seen.insert({r["step"].get<int64_t>(), r.contains("val_loss")}).second);
  }
  // A fresh run in that directory is another run (NOTE [Run lineage]): it stops before touching the file,
  // and starting over replaces the file.
  std::string e = test::errorOf([&] { train::Trainer(tinyConfig(run, {"train.train_iters=4"})); });
  REQUIRE(e.find("hold another run's files") != std::string::npos);
  REQUIRE(records(run).size() == first.size());
  config::Config over = tinyConfig(run, {"train.train_iters=4", "train.eval_interval=0"});
  over.checkpoint.overwrite = true;
  train::Trainer(over).run();
  REQUIRE(records(run).size() == 4);
}

TEST_CASE("resuming into a different model is refused with the differing keys",
          "[train][trainer][checkpoint]") {
  fs::path out = fs::temp_directory_path() / "strata-trainer-shape";
  fs::remove_all(out);
  fs::path ckpt = out / "ckpt";
  train::Trainer(tinyConfig(out, {"train.train_iters=2", "checkpoint.save=" + ckpt.string()})).run();
  auto errorOf = [&](std::vector<std::string> extra) -> std::string {
    extra.push_back("checkpoint.load=" + ckpt.string());
    try {
      train::Trainer t(tinyConfig(out, extra));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  std::string e = errorOf({"model.num_layers=1"});
  REQUIRE(e.find("model.num_layers: 2 in the checkpoint, 1 now") != std::string::npos);
  e = errorOf({"model.bias=false", "model.num_attention_heads=4"});
  REQUIRE(e.find("model.bias") != std::string::npos);
  REQUIRE(e.find("model.num_attention_heads") != std::string::npos);
  REQUIRE(errorOf({"model.num_layers=1", "checkpoint.load_model_only=true"}).find("model.num_layers") !=
          std::string::npos);
  // Defaults spelt out are the same model: gpt's default activation is gelu_tanh (`convert --from-hf` writes
  // the activation HF's config.json names).
  REQUIRE(errorOf({"model.activation=gelu_tanh"}).empty());
  // Fine-tuning: the weights with another optimizer setup start a fresh run.
  fs::path elsewhere = fs::temp_directory_path() / "strata-trainer-shape-tune";
  fs::remove_all(elsewhere);
  REQUIRE(test::errorOf([&] {
            train::Trainer t(
                tinyConfig(elsewhere, {"checkpoint.load=" + ckpt.string(), "checkpoint.load_model_only=true",
                                       "optimizer.lr=0.0001"}));
          }).empty());
  fs::path tune = fs::temp_directory_path() / "strata-trainer-finetune";
  fs::remove_all(tune);
  train::Trainer tuned(
      tinyConfig(tune, {"checkpoint.load=" + ckpt.string(), "checkpoint.load_model_only=true",
                        "optimizer.lr=0.0001", "train.train_iters=3"}));
  train::TrainResult r = tuned.run();
  REQUIRE(r.steps == 3);
  REQUIRE(records(tune).front()["step"].get<int64_t>() == 1);
}

TEST_CASE("train.threads sets the OpenMP threads; the default is the physical cores", "[train][trainer]") {
  fs::path out = fs::temp_directory_path() / "strata-trainer-threads";
  fs::remove_all(out);
  train::Trainer one(tinyConfig(out, {"train.threads=1"}));
  REQUIRE(omp_get_max_threads() == 1);
  const char* env = std::getenv("OMP_NUM_THREADS");
  std::string saved = env ? env : "";
  unsetenv("OMP_NUM_THREADS");
  train::Trainer automatic(tinyConfig(out));
  REQUIRE(omp_get_max_threads() == physicalCpuCores());
  REQUIRE(physicalCpuCores() >= 1);
  REQUIRE(physicalCpuCores() <= int(std::thread::hardware_concurrency()));
  if (env) setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  // The CPUs by physical core (what the CPU AdamW workers pin to): each usable CPU once, one per core first.
  int cores = 0;
  std::vector<int> cpus = cpusByPhysicalCore(&cores);
  REQUIRE(cores == physicalCpuCores());
  REQUIRE(int(cpus.size()) >= cores);
  REQUIRE(std::set<int>(cpus.begin(), cpus.end()).size() == cpus.size());
}

TEST_CASE("durations print as s, m and h", "[train][metrics]") {
  REQUIRE(train::formatDuration(42.2) == "42s");
  REQUIRE(train::formatDuration(187) == "3m07s");
  REQUIRE(train::formatDuration(7500) == "2h05m");
  REQUIRE(train::formatDuration(NAN) == "?");
}

TEST_CASE("an fp16 run resumed mid-way matches the uninterrupted run, loss scale included",
          "[train][trainer][fp16][checkpoint]") {
  // A window of 3 good steps doubles the scale every third step, so the resumed run must restore both the
  // scale and the count of good steps since it last changed to stay in step.
  std::vector<std::string> fp16 = {"precision.dtype=fp16", "precision.initial_loss_scale=1024",
                                   "precision.loss_scale_window=3", "model.dropout=0"};
  fs::path straight = fs::temp_directory_path() / "strata-fp16-straight";
  fs::path split = fs::temp_directory_path() / "strata-fp16-split";
  fs::remove_all(straight);
  fs::remove_all(split);
  train::Trainer(tinyConfig(straight, fp16)).run();
  auto resumed = fp16;
  resumed.push_back("checkpoint.save=" + (split / "ckpt").string());
  resumed.push_back("train.exit_interval=10");
  train::Trainer(tinyConfig(split, resumed)).run();
  REQUIRE(train::readCheckpointState((split / "ckpt").string()).lossScaleGoodSteps == 10 % 3);
  resumed.pop_back();
  resumed.push_back("checkpoint.load=" + (split / "ckpt").string());
  train::Trainer(tinyConfig(split, resumed)).run();
  auto a = records(straight);
  REQUIRE(a.back().contains("val_loss"));
  REQUIRE(a[19]["loss_scale"].get<double>() > 1024);  // the scale did move
  requireSameCurves(a, records(split));
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].contains("loss_scale"))
      REQUIRE(a[i]["loss_scale"].get<double>() == records(split)[i]["loss_scale"].get<double>());
}

TEST_CASE("the step engine applies finite steps and leaves non-finite ones untouched",
          "[train][stepengine]") {
  fs::path out = fs::temp_directory_path() / "strata-step-engine";
  fs::remove_all(out);
  config::Config config = tinyConfig(out, {"model.dropout=0"});
  auto model = models::buildModel(config::modelSpecFrom(config, Device::cpu()));
  data::CausalLmObjective objective(model, nullptr);
  train::ZeroStepEngine engine(objective, config, Device::cpu(), DType::F32);
  auto data = data::TokenDataset::random(256, 4096, 3, 0.0);
  int64_t index = 0;
  auto next = [&] {
    auto [ids, targets] = data.batch(data::Split::Train, index, 4, 32, 1, Device::cpu());
    return data::TokenBatch{ids, targets, index++};
  };
  train::StepOutcome ok = engine.step(next, 2, 1e-3);
  REQUIRE(ok.applied);
  REQUIRE(ok.finite);
  REQUIRE(ok.loss == Approx(std::log(256.0)).margin(0.5));
  REQUIRE(engine.state().optimizerSteps == 1);
  REQUIRE(index == 2);
  // Poison one weight: the loss goes NaN, the step is skipped and nothing moves.
  Tensor w = model->namedParameters()[0].second;
  std::vector<float> before = w.toVector<float>();
  auto moment = engine.checkpointOptimizer()[0].value().toVector<float>();
  Tensor poisoned = w.clone();
  float* p = poisoned.data<float>();
  p[0] = NAN;
  ops::copy(w, poisoned);
  train::StepOutcome bad = engine.step(next, 1, 1e-3);
  REQUIRE(!bad.finite);
  REQUIRE(!bad.applied);
  REQUIRE(engine.state().optimizerSteps == 1);
  REQUIRE(engine.checkpointOptimizer()[0].value().toVector<float>() == moment);
  std::vector<float> after = w.toVector<float>();
  REQUIRE(std::isnan(after[0]));
  REQUIRE(std::equal(after.begin() + 1, after.end(), before.begin() + 1));
  for (auto& prm : model->parameters()) REQUIRE(!prm.grad().defined());  // zeroed either way
}

TEST_CASE("optimizer state offloaded to the host trains bit for bit like state on the device, and resumes",
          "[train][trainer][store]") {
  // On the CPU both tiers are host memory, but the host tier's path is the one a GPU run takes: the
  // gradients are copied out of the chunks, the CPU kernel updates separate masters and moments, and the
  // new values are copied back into the parameters.
  fs::path base = test::freshDir("strata-store-offload");
  train::Trainer(tinyConfig(base / "device", {"model.dropout=0"})).run();
  train::Trainer(tinyConfig(base / "host",
                            {"model.dropout=0", "zero_optimization.offload_optimizer.device=cpu",
                             "checkpoint.save=" + (base / "ckpt").string(), "checkpoint.save_interval=10"}))
      .run();
  // A device budget that keeps part of the state on the device and sends the rest to the host.
  train::Trainer(tinyConfig(base / "split", {"model.dropout=0", "store.gpu_budget_gb=0.0002",
                                             "zero_optimization.chunk_size_mb=0.02"}))
      .run();
  auto device = records(base / "device");
  requireSameCurves(device, records(base / "host"));
  requireSameCurves(device, records(base / "split"));
  // Every piece of state is counted once: the tiers add up to the model state.
  for (const char* run : {"host", "split"}) {
    nlohmann::json last;
    for (const auto& r : records(base / run))
      if (r.contains("loss")) last = r;
    INFO(run);
    double tiers = last["mem_state_device_gb"].get<double>() + last["mem_state_host_gb"].get<double>() +
                   last["mem_state_nvme_gb"].get<double>();
    REQUIRE(tiers == Approx(last["mem_model_state_gb"].get<double>()).margin(1e-6));
  }
  // The placement itself, read from an engine: with offload every chunk's optimizer state is on the host.
  config::Config config = tinyConfig(base / "engine", {"zero_optimization.offload_optimizer.device=cpu",
                                                       "zero_optimization.chunk_size_mb=0.02"});
  auto model = models::buildModel(config::modelSpecFrom(config, Device::cpu()));
  data::CausalLmObjective objective(model, nullptr);
  train::ZeroStepEngine engine(objective, config, Device::cpu(), DType::F32);
  const zero::StorePlacement& placement = engine.placement();
  REQUIRE(placement.chunksOn(zero::Tier::Host) == engine.chunks().numChunks());
  REQUIRE(placement.bytes[int(zero::Tier::Host)] > 0);
  REQUIRE(placement.total() == engine.modelStateBytes());
  // Resuming the offloaded run from step 10 (into state on the device) continues the curve exactly.
  train::Trainer(tinyConfig(base / "resumed",
                            {"model.dropout=0", "checkpoint.load=" + (base / "ckpt" / "step-10").string()}))
      .run();
  auto tail = records(base / "resumed");
  requireSameCurves(std::vector<nlohmann::json>(device.end() - std::ptrdiff_t(tail.size()), device.end()),
                    tail);
}

TEST_CASE("parameters homed in host memory train bit for bit like parameters on the device, and resume",
          "[train][trainer][store][homes]") {
  // NOTE [Parameter homes] in zero/ParameterGatherer.h. On the CPU the home is a host buffer of its own and
  // each use copies it into a slot of the chunk arena, as a GPU run copies it over PCIe; the update writes
  // the new parameters into the home. Two micro-batches a step and evaluations exercise the releases.
  fs::path base = test::freshDir("strata-parameter-homes");
  std::vector<std::string> common = {"model.dropout=0", "zero_optimization.chunk_size_mb=0.02"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), common.begin(), common.end());
    return extra;
  };
  train::Trainer(tinyConfig(base / "device", with({}))).run();
  train::Trainer(tinyConfig(base / "host0",
                            with({"store.parameter_home=host", "checkpoint.save=" + (base / "ckpt").string(),
                                  "checkpoint.save_interval=10"})))
      .run();
  train::Trainer(
      tinyConfig(base / "host3", with({"store.parameter_home=host", "zero_optimization.stage=3",
                                       "optimizer.pipeline=true", "optimizer.pipeline_piece_mb=0.001"})))
      .run();
  // auto within a device budget smaller than the parameters: the first chunks' on the device, the rest homed
  // in host memory.
  train::Trainer(tinyConfig(base / "split", with({"store.gpu_budget_gb=0.0001"}))).run();
  auto device = records(base / "device");
  for (const char* run : {"host0", "host3", "split"}) {
    INFO(run);
    auto homed = records(base / run);
    requireSameCurves(device, homed);
    nlohmann::json last;
    for (const auto& r : homed)
      if (r.contains("loss")) last = r;
    REQUIRE(last["mem_state_host_gb"].get<double>() > 0);
    REQUIRE(last["mem_state_device_gb"].get<double>() + last["mem_state_host_gb"].get<double>() +
                last["mem_state_nvme_gb"].get<double>() ==
            Approx(last["mem_model_state_gb"].get<double>()).margin(1e-6));
  }
  for (const auto& r : records(base / "host0"))
    if (r.contains("loss")) {
      REQUIRE(r["mem_state_device_gb"].get<double>() == 0);
      // Every chunk is gathered into the arena's slots, a few at a time.
      REQUIRE(r["gathered_peak"].get<int64_t>() > 0);
      REQUIRE(r["arena_slots"].get<int64_t>() > 0);
    }
  // The engine: the homed chunks are not resident between uses and are gathered into the arena's slots,
  // a few at a time; at stage 0 the chunks homed on the device stay resident.
  for (const char* home : {"host", "auto"}) {
    INFO(home);
    config::Config config = tinyConfig(
        base / "engine", with({std::string("store.parameter_home=") + home, "store.gpu_budget_gb=0.0001"}));
    auto model = models::buildModel(config::modelSpecFrom(config, Device::cpu()));
    data::CausalLmObjective objective(model, nullptr);
    train::ZeroStepEngine engine(objective, config, Device::cpu(), DType::F32);
    const zero::StorePlacement& placement = engine.placement();
    INFO(placement.table());
    size_t n = engine.chunks().numChunks(), homed = placement.parameterChunksOn(zero::Tier::Host);
    REQUIRE(homed > 0);
    REQUIRE((homed == n) == (std::string(home) == "host"));
    for (size_t c = 0; c < n; ++c)
      REQUIRE(engine.chunks().storage(c)->resident() == (placement.parameterHome(c) == zero::Tier::Device));
    REQUIRE(engine.arenas().size() >= 1);
    auto data = data::TokenDataset::random(256, 4096, 3, 0.0);
    int64_t index = 0;
    auto next = [&] {
      auto [ids, targets] = data.batch(data::Split::Train, index, 4, 32, 1, Device::cpu());
      return data::TokenBatch{ids, targets, index++};
    };
    train::StepOutcome outcome = engine.step(next, 2, 1e-3);
    REQUIRE(outcome.applied);
    REQUIRE(engine.peakGatheredChunks() > 0);
    REQUIRE(engine.peakGatheredChunks() <= homed);
    for (size_t c = 0; c < n; ++c)
      REQUIRE(engine.chunks().storage(c)->resident() == (placement.parameterHome(c) == zero::Tier::Device));
  }
  // Resuming the stage-0 homed run from step 10 into homes at stage 3 continues the curve exactly.
  train::Trainer(
      tinyConfig(base / "resumed", with({"checkpoint.load=" + (base / "ckpt" / "step-10").string(),
                                         "store.parameter_home=host", "zero_optimization.stage=3"})))
      .run();
  auto tail = records(base / "resumed");
  REQUIRE(tail.size() < device.size());
  requireSameCurves(std::vector<nlohmann::json>(device.end() - std::ptrdiff_t(tail.size()), device.end()),
                    tail);
  // Stages 1 and 2 refuse homes off the device at start-up, naming the keys.
  std::string e = test::errorOf([&] {
    train::Trainer(
        tinyConfig(base / "stage1", with({"store.parameter_home=host", "zero_optimization.stage=1"})))
        .run();
  });
  REQUIRE(e.find("store.parameter_home") != std::string::npos);
  REQUIRE(e.find("zero_optimization.stage") != std::string::npos);
}

TEST_CASE("gradients homed in host memory train bit for bit like gradients on the device, and resume",
          "[train][trainer][store][homes]") {
  // NOTE [Gradient homes] in zero/GradientReducer.h. On the CPU the home is a host buffer of its own: each
  // chunk's gradients are copied there once complete in the step's last backward and its buffer released,
  // as a GPU run copies them over PCIe; the norm's terms are taken before the copy and the update reads the
  // home. Two micro-batches a step: the first accumulates in the buffers, which leave in the second.
  fs::path base = test::freshDir("strata-gradient-homes");
  std::vector<std::string> common = {"model.dropout=0", "zero_optimization.chunk_size_mb=0.02",
                                     "zero_optimization.offload_optimizer.device=cpu"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), common.begin(), common.end());
    return extra;
  };
  train::Trainer(tinyConfig(base / "device", with({"store.gradient_home=device"}))).run();
  train::Trainer(tinyConfig(base / "host0",
                            with({"store.gradient_home=host", "checkpoint.save=" + (base / "ckpt").string(),
                                  "checkpoint.save_interval=10"})))
      .run();
  train::Trainer(
      tinyConfig(base / "host3", with({"store.gradient_home=host", "zero_optimization.stage=3",
                                       "optimizer.pipeline=true", "optimizer.pipeline_piece_mb=0.001"})))
      .run();
  // auto with the parameters homed in host memory too, and the plain update.
  train::Trainer(tinyConfig(base / "auto3", with({"store.parameter_home=host", "zero_optimization.stage=3",
                                                  "optimizer.pipeline=false"})))
      .run();
  auto device = records(base / "device");
  for (const char* run : {"host0", "host3", "auto3"}) {
    INFO(run);
    requireSameCurves(device, records(base / run));
  }
  // Resuming the stage-0 run from step 10 at stage 3 continues the curve exactly.
  train::Trainer(
      tinyConfig(base / "resumed", with({"checkpoint.load=" + (base / "ckpt" / "step-10").string(),
                                         "store.gradient_home=host", "zero_optimization.stage=3"})))
      .run();
  auto tail = records(base / "resumed");
  REQUIRE(tail.size() < device.size());
  requireSameCurves(std::vector<nlohmann::json>(device.end() - std::ptrdiff_t(tail.size()), device.end()),
                    tail);

  // The engine: at the end of backward no chunk whose state is off the device holds a gradient buffer; its
  // gradients are in host memory. After the first of two micro-batches every buffer is still there.
  struct Watch final : train::MicroBatchSchedule {
    const train::ZeroStepEngine* engine = nullptr;
    mutable std::vector<bool> afterFirst, atEnd, onHost;
    void run(int64_t microBatches, const train::MicroBatchWork& work) const override {
      for (int64_t m = 0; m < microBatches; ++m) {
        work.backward(m, work.forward(m));
        std::vector<bool>& seen = m + 1 == microBatches ? atEnd : afterFirst;
        seen.clear();
        for (size_t c = 0; c < engine->chunks().numChunks(); ++c)
          seen.push_back(engine->chunks().gradients(c).defined());
      }
      onHost.clear();
      for (size_t c = 0; c < engine->chunks().numChunks(); ++c)
        onHost.push_back(engine->gradientReducer().onHost(c));
    }
  };
  for (int stage : {0, 3})
    for (const char* home : {"host", "device"}) {
      INFO("stage " << stage << ", store.gradient_home " << home);
      config::Config config =
          tinyConfig(base / "engine", with({std::string("store.gradient_home=") + home,
                                            "zero_optimization.stage=" + std::to_string(stage)}));
      auto model = models::buildModel(config::modelSpecFrom(config, Device::cpu()));
      data::CausalLmObjective objective(model, nullptr);
      train::ZeroStepEngine engine(objective, config, Device::cpu(), DType::F32);
      auto watch = std::make_unique<Watch>();
      Watch* seen = watch.get();
      watch->engine = &engine;
      engine.setSchedule(std::move(watch));
      auto data = data::TokenDataset::random(256, 4096, 3, 0.0);
      int64_t index = 0;
      auto next = [&] {
        auto [ids, targets] = data.batch(data::Split::Train, index, 4, 32, 1, Device::cpu());
        return data::TokenBatch{ids, targets, index++};
      };
      REQUIRE(engine.step(next, 2, 1e-3).applied);
      size_t n = engine.chunks().numChunks();
      REQUIRE(engine.placement().chunksOn(zero::Tier::Device) == 0);
      bool homed = std::string(home) == "host";
      REQUIRE((engine.gradientReducer().hostGradientBytes() > 0) == homed);
      for (size_t c = 0; c < n; ++c) {
        INFO("chunk " << c);
        REQUIRE(seen->afterFirst[c]);
        REQUIRE(seen->onHost[c] == homed);
        // Stage 3 on one rank keeps the chunk's buffer as its shard of the gradients.
        REQUIRE(seen->atEnd[c] == !homed);
      }
    }
  // Stages 1 and 2 refuse gradients homed in host memory, naming the keys.
  std::string e = test::errorOf([&] {
    train::Trainer(
        tinyConfig(base / "stage1", with({"store.gradient_home=host", "zero_optimization.stage=1"})))
        .run();
  });
  REQUIRE(e.find("store.gradient_home") != std::string::npos);
  REQUIRE(e.find("zero_optimization.stage") != std::string::npos);
}

TEST_CASE("parameters homed on the SSD train bit for bit like parameters on the device, and resume",
          "[train][trainer][store][homes][nvme]") {
  // NOTE [Parameter homes] in zero/ParameterGatherer.h: a chunk homed on the SSD is read from its extent
  // (ahead of its gather) into staging and copied into a slot; the update writes the new values into the
  // extent. Two micro-batches a step and evaluations exercise the releases and the reads ahead.
  fs::path base = test::freshDir("strata-parameter-homes-ssd");
  std::string nvme = "zero_optimization.nvme_path=" + (base / "nvme").string();
  std::vector<std::string> common = {"model.dropout=0", "zero_optimization.chunk_size_mb=0.02"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), common.begin(), common.end());
    return extra;
  };
  // auto past small device and host budgets: the first chunk's parameters on the device, the next in host
  // memory, the rest on the SSD.
  std::vector<std::string> tiers = {"store.gpu_budget_gb=0.00004", "store.host_budget_gb=0.00002", nvme};
  auto withTiers = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), tiers.begin(), tiers.end());
    return with(extra);
  };
  train::Trainer(tinyConfig(base / "device", with({}))).run();
  train::Trainer(tinyConfig(base / "ssd0", withTiers({"checkpoint.save=" + (base / "ckpt").string(),
                                                      "checkpoint.save_interval=10"})))
      .run();
  train::Trainer(tinyConfig(base / "ssd3", withTiers({"zero_optimization.stage=3", "optimizer.pipeline=true",
                                                      "optimizer.pipeline_piece_mb=0.001"})))
      .run();
  train::Trainer(
      tinyConfig(base / "nvme3", with({"store.parameter_home=nvme", "zero_optimization.stage=3", nvme})))
      .run();
  auto device = records(base / "device");
  for (const char* run : {"ssd0", "ssd3", "nvme3"}) {
    INFO(run);
    auto homed = records(base / run);
    requireSameCurves(device, homed);
    nlohmann::json last;
    for (const auto& r : homed)
      if (r.contains("loss")) last = r;
    REQUIRE(last["mem_state_nvme_gb"].get<double>() > 0);
    REQUIRE(last["mem_state_device_gb"].get<double>() + last["mem_state_host_gb"].get<double>() +
                last["mem_state_nvme_gb"].get<double>() ==
            Approx(last["mem_model_state_gb"].get<double>()).margin(1e-6));
  }
  // The placement: the parameters over three tiers, the SSD's in the tier's file beside their state.
  {
    config::Config config = tinyConfig(base / "engine", withTiers({}));
    auto model = models::buildModel(config::modelSpecFrom(config, Device::cpu()));
    data::CausalLmObjective objective(model, nullptr);
    train::ZeroStepEngine engine(objective, config, Device::cpu(), DType::F32);
    const zero::StorePlacement& placement = engine.placement();
    INFO(placement.table());
    REQUIRE(placement.parameterChunksOn(zero::Tier::Device) > 0);
    REQUIRE(placement.parameterChunksOn(zero::Tier::Host) > 0);
    REQUIRE(placement.parameterChunksOn(zero::Tier::Nvme) > 0);
    REQUIRE(placement.bytes[int(zero::Tier::Nvme)] > placement.parameterNvmeBytes);
    size_t n = engine.chunks().numChunks();
    for (size_t c = 0; c < n; ++c)
      REQUIRE(engine.chunks().storage(c)->resident() == (placement.parameterHome(c) == zero::Tier::Device));
  }
  // Resuming the stage-0 run from step 10 at stage 3 (each rank's shard homed where the placement puts it)
  // continues the curve exactly.
  train::Trainer(
      tinyConfig(base / "resumed", withTiers({"checkpoint.load=" + (base / "ckpt" / "step-10").string(),
                                              "zero_optimization.stage=3"})))
      .run();
  auto tail = records(base / "resumed");
  REQUIRE(tail.size() < device.size());
  requireSameCurves(std::vector<nlohmann::json>(device.end() - std::ptrdiff_t(tail.size()), device.end()),
                    tail);
  // nvme without an SSD path is refused, naming the key that gives one.
  std::string e = test::errorOf(
      [&] { train::Trainer(tinyConfig(base / "nopath", with({"store.parameter_home=nvme"}))).run(); });
  REQUIRE(e.find("zero_optimization.nvme_path") != std::string::npos);
}

TEST_CASE("the memory tracer starts off the device and brings the SSD's state back first, bit for bit",
          "[train][trainer][store][nvme][tracer]") {
  fs::path base = test::freshDir("strata-store-tracer");
  std::vector<std::string> common = {"model.dropout=0",          "zero_optimization.chunk_size_mb=0.02",
                                     "model.hidden_size=128",    "model.seq_length=16",
                                     "train.micro_batch_size=2", "train.global_batch_size=2",
                                     "train.train_iters=6",      "train.eval_interval=0"};
  train::Trainer(tinyConfig(base / "memory", common)).run();
  auto memory = records(base / "memory");
  // A "device" of 1.9x the model state: the state with its gradient buffers (20 of its 12 bytes per
  // parameter) would crowd it, so the run starts traced, its optimizer state on the host (1 MiB) and the SSD.
  double state = memory.back()["mem_model_state_gb"].get<double>();
  std::string saved = std::getenv("STRATA_DEVICE_MEMORY_GB") ? std::getenv("STRATA_DEVICE_MEMORY_GB") : "";
  setenv("STRATA_DEVICE_MEMORY_GB", std::to_string(1.9 * state).c_str(), 1);
  std::vector<std::string> traced = common;
  traced.insert(traced.end(), {"store.host_budget_gb=0.001", "store.nvme_state_dtype=fp32",
                               "zero_optimization.nvme_path=" + (base / "nvme").string()});
  zero::StorePlacement start;
  auto restore = [&] {
    saved.empty() ? unsetenv("STRATA_DEVICE_MEMORY_GB") : setenv("STRATA_DEVICE_MEMORY_GB", saved.c_str(), 1);
  };
  try {
    {
      // The placement the first step runs with: the parameters alone on the device, the host (its budget)
      // and the SSD hold the optimizer state.
      config::Config config = tinyConfig(base / "engine", traced);
      auto model = models::buildModel(config::modelSpecFrom(config, Device::cpu()));
      data::CausalLmObjective objective(model, nullptr);
      train::ZeroStepEngine engine(objective, config, Device::cpu(), DType::F32);
      start = engine.placement();
    }
    train::Trainer(tinyConfig(base / "traced", traced)).run();
  } catch (...) {
    restore();
    throw;
  }
  restore();
  INFO(start.table());
  REQUIRE(start.chunksOn(zero::Tier::Device) == 0);
  REQUIRE(start.bytes[int(zero::Tier::Host)] > 0);
  REQUIRE(start.bytes[int(zero::Tier::Nvme)] > 0);
  // The traced run is the in-memory run, number for number, though its state moved after the first step.
  auto tracedRecords = records(base / "traced");
  requireSameCurves(memory, tracedRecords);
  const nlohmann::json& last = tracedRecords.back();
  double device = last["mem_state_device_gb"].get<double>(), host = last["mem_state_host_gb"].get<double>(),
         nvme = last["mem_state_nvme_gb"].get<double>();
  INFO("after the first step: device " << device << " host " << host << " nvme " << nvme);
  constexpr double kGiB = double(1ull << 30);
  REQUIRE(device * kGiB > double(start.bytes[int(zero::Tier::Device)]));
  // The SSD's chunks come back first (chunksToPromote): the host keeps its state while the SSD has some.
  if (nvme > 0) REQUIRE(host * kGiB == Approx(double(start.bytes[int(zero::Tier::Host)])));
  REQUIRE(device + host + nvme == Approx(last["mem_model_state_gb"].get<double>()).margin(1e-6));
}

TEST_CASE("state across the device, host and SSD tiers trains bit for bit like state in memory, and resumes",
          "[train][trainer][store][nvme]") {
  fs::path base = test::freshDir("strata-store-tiers");
  std::vector<std::string> common = {"model.dropout=0", "zero_optimization.chunk_size_mb=0.02"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), common.begin(), common.end());
    return extra;
  };
  train::Trainer(tinyConfig(base / "memory", with({}))).run();
  // Budgets tight enough to put a chunk's state on the device, a few in host memory and the rest on the SSD.
  std::vector<std::string> tiers = {"store.gpu_budget_gb=0.0002", "store.host_budget_gb=0.0002",
                                    "zero_optimization.nvme_path=" + (base / "nvme").string(),
                                    "store.nvme_state_dtype=fp32"};
  std::vector<std::string> saving = tiers;
  saving.push_back("checkpoint.save=" + (base / "ckpt").string());
  saving.push_back("checkpoint.save_interval=10");
  train::Trainer(tinyConfig(base / "tiers", with(saving))).run();
  auto memory = records(base / "memory");
  requireSameCurves(memory, records(base / "tiers"));
  nlohmann::json last;
  for (const auto& r : records(base / "tiers"))
    if (r.contains("loss")) last = r;
  REQUIRE(last["mem_state_nvme_gb"].get<double>() > 0);
  REQUIRE(last["mem_state_host_gb"].get<double>() > 0);
  REQUIRE(last["offload_ms"].get<double>() > 0);  // the time the device waited for the off-device update
  // Its phases: each measured, none more than the whole.
  double phases = 0;
  for (const char* phase : {"grads_out", "cpu", "params_in", "ssd_wait"}) {
    std::string key = std::string("offload_") + phase + "_ms";
    INFO(key);
    REQUIRE(last.contains(key));
    REQUIRE(last[key].get<double>() >= 0);
    phases += last[key].get<double>();
  }
  REQUIRE(last["offload_cpu_ms"].get<double>() > 0);
  REQUIRE(phases <= last["offload_ms"].get<double>() * 1.001);
  REQUIRE(records(base / "memory").back().value("offload_ms", 0.0) == 0.0);
  REQUIRE(last["mem_state_device_gb"].get<double>() > 0);
  REQUIRE(last["mem_state_device_gb"].get<double>() + last["mem_state_host_gb"].get<double>() +
              last["mem_state_nvme_gb"].get<double>() ==
          Approx(last["mem_model_state_gb"].get<double>()).margin(1e-6));
  REQUIRE(fs::is_empty(base / "nvme"));  // the SSD tier's file goes with the run
  // A checkpoint saved from the SSD tier resumes exactly, into the tiers again.
  std::vector<std::string> resume = tiers;
  resume.push_back("checkpoint.load=" + (base / "ckpt" / "step-10").string());
  train::Trainer(tinyConfig(base / "resumed", with(resume))).run();
  auto tail = records(base / "resumed");
  requireSameCurves(std::vector<nlohmann::json>(memory.end() - std::ptrdiff_t(tail.size()), memory.end()),
                    tail);
  // m and v in bf16 on the SSD: the curve departs a little from fp32 state (measured: see BENCHMARKS.md).
  std::vector<std::string> half = tiers;
  half.back() = "store.nvme_state_dtype=bf16";
  train::Trainer(tinyConfig(base / "half", with(half))).run();
  auto h = records(base / "half");
  double worst = 0;
  for (size_t i = 0; i < h.size(); ++i)
    if (h[i].contains("loss"))
      worst = std::max(worst, std::abs(h[i]["loss"].get<double>() - memory[i]["loss"].get<double>()));
  INFO("largest loss difference with bf16 m and v on the SSD: " << worst);
  REQUIRE(worst < 0.05);
  // An SSD budget too small for what the other tiers cannot hold is refused with the figures.
  std::vector<std::string> tooSmall = tiers;
  tooSmall.push_back("store.nvme_budget_gb=0.00001");
  std::string e = test::errorOf([&] { train::Trainer(tinyConfig(base / "small", with(tooSmall))).run(); });
  REQUIRE(e.find("store.nvme_budget_gb") != std::string::npos);
}

TEST_CASE(
    "AdamW with m and v in bf16 trains close to fp32 moments, bit for bit alike in every tier, and resumes "
    "bit for bit",
    "[train][trainer][store][nvme]") {
  // NOTE [AdamW moments dtype] in optim/AdamW.h: optimizer.moments_dtype bf16 on the device, in host memory
  // and on the SSD (stored as they are, though store.nvme_state_dtype says fp32).
  fs::path base = test::freshDir("strata-bf16-moments");
  std::vector<std::string> common = {"model.dropout=0", "zero_optimization.chunk_size_mb=0.02"};
  auto with = [&](std::vector<std::string> extra, bool bf16 = true) {
    extra.insert(extra.begin(), common.begin(), common.end());
    if (bf16) extra.push_back("optimizer.moments_dtype=bf16");
    return extra;
  };
  std::string saveEvery10 = "checkpoint.save_interval=10";
  train::Trainer(tinyConfig(base / "fp32",
                            with({"checkpoint.save=" + (base / "fp32-ckpt").string(), saveEvery10}, false)))
      .run();
  train::Trainer(
      tinyConfig(base / "memory", with({"checkpoint.save=" + (base / "ckpt").string(), saveEvery10})))
      .run();
  std::vector<std::string> tiers = {"store.gpu_budget_gb=0.0002", "store.host_budget_gb=0.0002",
                                    "zero_optimization.nvme_path=" + (base / "nvme").string(),
                                    "store.nvme_state_dtype=fp32"};
  std::vector<std::string> saving = tiers;
  saving.push_back("checkpoint.save=" + (base / "tiers-ckpt").string());
  saving.push_back(saveEvery10);
  train::Trainer(tinyConfig(base / "tiers", with(saving))).run();
  auto fp32 = records(base / "fp32"), memory = records(base / "memory");
  // Every tier updates with the same kernel from the same bits.
  requireSameCurves(memory, records(base / "tiers"));
  nlohmann::json last;
  for (const auto& r : records(base / "tiers"))
    if (r.contains("loss")) last = r;
  for (const char* tier : {"mem_state_device_gb", "mem_state_host_gb", "mem_state_nvme_gb"}) {
    INFO(tier);
    REQUIRE(last[tier].get<double>() > 0);
  }
  // Rounding m and v each step moves the curve a little from fp32 moments'.
  double worst = 0;
  for (size_t i = 0; i < fp32.size(); ++i)
    if (fp32[i].contains("loss"))
      worst = std::max(worst, std::abs(fp32[i]["loss"].get<double>() - memory[i]["loss"].get<double>()));
  double first = 0, lastLoss = 0;
  for (const auto& r : memory)
    if (r.contains("loss")) (first == 0 ? first : lastLoss) = r["loss"].get<double>();
  INFO("largest loss difference from fp32 moments: " << worst << "; loss " << first << " -> " << lastLoss);
  REQUIRE(worst > 0);
  REQUIRE(worst < 0.05);
  REQUIRE(lastLoss < first - 1.5);
  {
    // The engine's accounting: 4 + 2 + 2 bytes per element in every tier, as the placement weighed it.
    config::Config config = tinyConfig(base / "engine", with(tiers));
    auto model = models::buildModel(config::modelSpecFrom(config, Device::cpu()));
    data::CausalLmObjective objective(model, nullptr);
    train::ZeroStepEngine engine(objective, config, Device::cpu(), DType::F32);
    const zero::StorePlacement& placement = engine.placement();
    INFO(placement.table());
    REQUIRE(placement.chunksOn(zero::Tier::Nvme) > 0);
    REQUIRE(placement.chunksOn(zero::Tier::Host) > 0);
    REQUIRE(placement.total() == engine.modelStateBytes());
    uint64_t elems = 0;
    for (const auto& r : engine.optimizer().ranges()) elems += uint64_t(r.size());
    // Beside the parameters; an fp32 chunk on the device is its own master: at most 8 bytes an element.
    uint64_t optimizerBytes = engine.modelStateBytes() - placement.parameterBytes -
                              placement.parameterHostBytes - placement.parameterNvmeBytes;
    REQUIRE(optimizerBytes <= elems * (4 + 2 + 2));
    REQUIRE(optimizerBytes > elems * (2 + 2));
    uint64_t ssdElems = 0;
    for (size_t c = 0; c < placement.optimizerTier.size(); ++c)
      if (placement.optimizerTier[c] == zero::Tier::Nvme)
        ssdElems += uint64_t(engine.optimizer().ranges()[c].size());
    REQUIRE(placement.bytes[int(zero::Tier::Nvme)] == ssdElems * (4 + 2 + 2));
  }
  // Resumes continue the curve bit for bit: in memory from memory, into the tiers from the tiers, and across
  // (the checkpoint holds fp32 pieces either way).
  for (auto [from, into] :
       {std::pair{"ckpt", "memory"}, std::pair{"tiers-ckpt", "tiers"}, std::pair{"tiers-ckpt", "memory"}}) {
    INFO(from << " into " << into);
    std::vector<std::string> resume = std::string(into) == "tiers" ? tiers : std::vector<std::string>{};
    resume.push_back("checkpoint.load=" + (base / from / "step-10").string());
    fs::path out = base / (std::string("resumed-") + from + "-" + into);
    train::Trainer(tinyConfig(out, with(resume))).run();
    auto tail = records(out);
    REQUIRE(!tail.empty());
    requireSameCurves(std::vector<nlohmann::json>(memory.end() - std::ptrdiff_t(tail.size()), memory.end()),
                      tail);
  }
  // The moments' dtype is the run's (it changes the step's numbers): a resume that changes it is refused,
  // naming it, unless checkpoint.allow_changes says so. Then a bf16-moments checkpoint loads into an
  // fp32-moments run (widened exactly), and an fp32 one into a bf16-moments run (rounded): the first step's
  // loss is the saving run's (the same weights), and the curve goes on close to it.
  std::string refused = test::errorOf([&] {
    train::Trainer(
        tinyConfig(base / "refused", with({"checkpoint.load=" + (base / "fp32-ckpt" / "step-10").string()})))
        .run();
  });
  REQUIRE(refused.find("optimizer.moments_dtype: fp32 in the checkpoint, bf16 now") != std::string::npos);
  for (bool toFp32 : {true, false}) {
    INFO((toFp32 ? "bf16 moments into fp32 ones" : "fp32 moments into bf16 ones"));
    fs::path out = base / (toFp32 ? "into-fp32" : "into-bf16");
    fs::path from = base / (toFp32 ? "ckpt" : "fp32-ckpt") / "step-10";
    std::vector<std::string> sets = {"checkpoint.load=" + from.string(), "checkpoint.allow_changes=true"};
    if (toFp32) sets.push_back("optimizer.moments_dtype=fp32");
    train::Trainer(tinyConfig(out, with(sets, !toFp32))).run();
    auto into = records(out);
    const auto& saver = toFp32 ? memory : fp32;
    REQUIRE(!into.empty());
    std::vector<nlohmann::json> saverTail(saver.end() - std::ptrdiff_t(into.size()), saver.end());
    bool first = true, departs = false;
    for (size_t i = 0; i < into.size(); ++i) {
      if (!into[i].contains("loss")) continue;
      double a = into[i]["loss"].get<double>(), b = saverTail[i]["loss"].get<double>();
      if (first)
        REQUIRE(a == b);
      else
        REQUIRE(std::abs(a - b) < 0.05);
      departs = departs || a != b;
      first = false;
    }
    REQUIRE(departs);  // the new dtype ran: the curve is not the saving run's
  }
}

namespace {

// Trains the tiny model twice with state across the device, host and SSD tiers, with the sequential update
// and the pipelined one (pieces small enough to cut parameters in two), and compares the curves and the
// weights and moments saved after 20 steps: bit for bit when `exact`, else within a relative 1e-3 (on the
// GPU, where the embedding's backward sums with atomics and no two runs agree to the bit; the kernels' own
// agreement is the "[cuda] fused multi-tensor AdamW gives the cpu kernel's bits" test). Returns the
// pipelined run's last step record.
nlohmann::json pipelineMatchesSequential(const fs::path& base, std::vector<std::string> extra, bool exact) {
  std::vector<std::string> tiers = {"model.dropout=0",
                                    "zero_optimization.chunk_size_mb=0.02",
                                    "store.gpu_budget_gb=0.0002",
                                    "store.host_budget_gb=0.0002",
                                    "zero_optimization.nvme_path=" + (base / "nvme").string(),
                                    "store.nvme_state_dtype=fp32",
                                    "checkpoint.save_interval=20"};
  tiers.insert(tiers.end(), extra.begin(), extra.end());
  auto run = [&](const std::string& name, std::vector<std::string> options) {
    options.insert(options.end(), tiers.begin(), tiers.end());
    options.push_back("checkpoint.save=" + (base / name / "ckpt").string());
    train::Trainer(tinyConfig(base / name, options)).run();
    return records(base / name);
  };
  auto sequential = run("sequential", {"optimizer.pipeline=false"});
  auto pipelined = run("pipelined", {"optimizer.pipeline=true", "optimizer.pipeline_piece_mb=0.001"});
  if (exact) {
    requireSameCurves(sequential, pipelined);
  } else {
    REQUIRE(sequential.size() == pipelined.size());
    for (size_t i = 0; i < sequential.size(); ++i)
      if (sequential[i].contains("loss"))
        REQUIRE(pipelined[i]["loss"].get<double>() ==
                Approx(sequential[i]["loss"].get<double>()).epsilon(1e-3));
  }
  for (const char* file : {"model-rank0.safetensors", "optimizer-rank0.safetensors"}) {
    INFO(file);
    auto read = [&](const std::string& name) {
      std::ifstream in(base / name / "ckpt" / "step-20" / file, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    std::string a = read("sequential"), b = read("pipelined");
    REQUIRE(a.size() > 8);
    REQUIRE(a.size() == b.size());
    // The header (its length in the first 8 bytes) is the same text; then fp32 values.
    uint64_t header = 0;
    std::memcpy(&header, a.data(), 8);
    REQUIRE(a.compare(0, 8 + header, b, 0, 8 + header) == 0);
    size_t differing = 0, far = 0;
    for (size_t i = 8 + header; i + 4 <= a.size(); i += 4) {
      float x, y;
      std::memcpy(&x, a.data() + i, 4);
      std::memcpy(&y, b.data() + i, 4);
      if (std::memcmp(&x, &y, 4) == 0) continue;
      ++differing;
      if (!(std::abs(x - y) <= 1e-3 * std::abs(x) + 1e-6)) ++far;
    }
    INFO(differing << " values differ, " << far << " beyond the tolerance, of "
                   << (a.size() - 8 - header) / 4);
    REQUIRE(far == 0);
    if (exact) REQUIRE(differing == 0);
  }
  nlohmann::json last;
  for (const auto& r : pipelined)
    if (r.contains("loss")) last = r;
  REQUIRE(last["mem_state_nvme_gb"].get<double>() > 0);
  REQUIRE(last["mem_state_host_gb"].get<double>() > 0);
  REQUIRE(last["offload_cpu_ms"].get<double>() > 0);
  return last;
}

}  // namespace

TEST_CASE("the pipelined update equals the sequential one bit for bit, with state across the tiers",
          "[train][trainer][store][nvme][pipeline]") {
  nlohmann::json last = pipelineMatchesSequential(test::freshDir("strata-pipeline"), {}, true);
  REQUIRE(last["offload_gpu_share"].get<double>() == 0);  // no GPU: the CPU lane takes every piece
  // m and v in bf16 (optimizer.moments_dtype), in host memory and on the SSD.
  pipelineMatchesSequential(test::freshDir("strata-pipeline-bf16-moments"), {"optimizer.moments_dtype=bf16"},
                            true);
}

TEST_CASE("[cuda] the pipelined update shares the host state with the GPU and keeps the sequential bits",
          "[cuda][train][trainer][store][pipeline]") {
  STRATA_REQUIRE_CUDA();
  // bf16 only: in fp32 the runs' run-to-run noise (above) grows past any useful tolerance in 20 steps.
  for (const char* dtype : {"bf16"}) {
    INFO(dtype);
    nlohmann::json last =
        pipelineMatchesSequential(test::freshDir(std::string("strata-pipeline-cuda-") + dtype),
                                  {"train.device=cuda", std::string("precision.dtype=") + dtype}, false);
    REQUIRE(last["offload_gpu_share"].get<double>() > 0);
    REQUIRE(last["offload_gpu_share"].get<double>() < 1);
  }
  // The fewest staging slots the CPU lane runs with (zero_optimization.buffer_count).
  pipelineMatchesSequential(test::freshDir("strata-pipeline-cuda-2"),
                            {"train.device=cuda", "precision.dtype=bf16", "zero_optimization.buffer_count=2"},
                            false);
  // m and v in bf16 (optimizer.moments_dtype): the GPU lane streams them through its scratch at 2 bytes.
  // The state takes 8 bytes an element instead of 12, so smaller budgets keep chunks on all three tiers.
  nlohmann::json bf16Moments =
      pipelineMatchesSequential(test::freshDir("strata-pipeline-cuda-bf16-moments"),
                                {"train.device=cuda", "precision.dtype=bf16", "optimizer.moments_dtype=bf16",
                                 "store.gpu_budget_gb=0.0001", "store.host_budget_gb=0.0001"},
                                false);
  REQUIRE(bf16Moments["offload_gpu_share"].get<double>() > 0);
}

TEST_CASE("store.delayed_update trains with the SSD chunks one step behind, close to the undelayed curve",
          "[train][trainer][store][nvme][delayed]") {
  fs::path base = test::freshDir("strata-delayed");
  std::vector<std::string> tiers = {"model.dropout=0", "zero_optimization.chunk_size_mb=0.02",
                                    "store.gpu_budget_gb=0.0002", "store.host_budget_gb=0.0002",
                                    "zero_optimization.nvme_path=" + (base / "nvme").string()};
  auto run = [&](const std::string& name, bool delayedUpdate) {
    std::vector<std::string> options = tiers;
    options.push_back(std::string("store.delayed_update=") + (delayedUpdate ? "true" : "false"));
    options.push_back("checkpoint.save=" + (base / name / "ckpt").string());
    options.push_back("checkpoint.save_interval=20");
    train::Trainer(tinyConfig(base / name, options)).run();
    return records(base / name);
  };
  auto plain = run("plain", false);
  auto delayed = run("delayed", true);
  REQUIRE(plain.size() == delayed.size());
  // Step 1 is the same (nothing is stale yet); later steps depart a little.
  double worst = 0, firstLoss = 0, lastLoss = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    if (!plain[i].contains("loss")) continue;
    double d = delayed[i]["loss"].get<double>();
    if (firstLoss == 0) {
      firstLoss = d;
      REQUIRE(d == plain[i]["loss"].get<double>());
    }
    lastLoss = d;
    worst = std::max(worst, std::abs(d - plain[i]["loss"].get<double>()));
  }
  INFO("largest loss difference with the delayed SSD update: " << worst);
  REQUIRE(worst > 0);  // it is a different optimizer
  // Measured 2026-12-01 on the CPU: the delayed curve trails the plain one by about a step (5 of the 9
  // chunks' state on the SSD): largest train-loss gap 0.113, loss 3.981 vs 4.084 at step 20, val 3.971
  // vs 4.075.
  REQUIRE(worst < 0.2);
  REQUIRE(lastLoss < firstLoss - 0.5);
  REQUIRE(fs::exists(base / "delayed" / "ckpt" / "step-20" / "optimizer-rank0.safetensors"));
}

TEST_CASE(
    "with the delayed SSD update a checkpoint changes nothing and a resume continues the run exactly, "
    "at ZeRO stages 1 to 3",
    "[train][trainer][store][nvme][delayed][checkpoint]") {
  // NOTE [Delayed update checkpoints]: every chunk's state on the SSD, updated one step late. The run that
  // saves at steps 5 and 10, each time with that step's update pending, is the straight run step for step;
  // the run resumed from step 10 continues it bit for bit, and so does one resumed at another chunk size
  // (every chunk still on the SSD: the same parameters lag).
  fs::path base = test::freshDir("strata-delayed-resume");
  for (int stage : {1, 2, 3}) {
    INFO("stage " << stage);
    fs::path dir = base / ("stage" + std::to_string(stage));
    auto with = [&](std::vector<std::string> extra) {
      std::vector<std::string> sets = {"zero_optimization.stage=" + std::to_string(stage),
                                       "zero_optimization.offload_optimizer.device=nvme",
                                       "zero_optimization.nvme_path=" + (dir / "nvme").string(),
                                       "store.delayed_update=true", "zero_optimization.chunk_size_mb=0.02",
                                       // One thread: the worker's update and the step's OpenMP team share
                                       // the CI machine's two cores.
                                       "train.threads=1"};
      sets.insert(sets.end(), extra.begin(), extra.end());
      return sets;
    };
    // (It saves nothing, so its engine goes with the last step's update still running.)
    train::Trainer(tinyConfig(dir / "straight", with({}))).run();
    fs::path ckpt = dir / "ckpt";
    train::Trainer(tinyConfig(dir / "saving", with({"train.exit_interval=10", "checkpoint.save_interval=5",
                                                    "checkpoint.save=" + ckpt.string()})))
        .run();
    std::string step10 = (ckpt / "step-10").string();
    train::Trainer(tinyConfig(dir / "resumed", with({"checkpoint.load=" + step10}))).run();
    auto straight = records(dir / "straight");
    auto saving = records(dir / "saving");
    auto resumed = records(dir / "resumed");
    REQUIRE(straight.size() == 22);  // 20 steps and 2 evaluations
    REQUIRE(saving.size() == 11);
    requireSameCurves(std::vector<nlohmann::json>(straight.begin(), straight.begin() + 11), saving);
    REQUIRE(resumed.size() == 11);
    std::vector<nlohmann::json> tail(straight.end() - 11, straight.end());
    requireSameCurves(tail, resumed);
    // The parameters that lag their masters are in the checkpoint beside them.
    REQUIRE(train::ChunkCheckpointReader(step10).hasKind("delayed_param"));
    if (stage != 2) continue;
    train::Trainer(tinyConfig(dir / "rechunked",
                              with({"checkpoint.load=" + step10, "zero_optimization.chunk_size_mb=0.01"})))
        .run();
    requireSameCurves(tail, records(dir / "rechunked"));
  }
}

namespace {
// Adafactor through the trainer (optim/Adafactor.h): an explicit lr, a bf16 first moment (so the
// checkpoint's exp_avg is widened and narrowed again), small chunks.
// `other` follows `reference` within `tolerance` at every logged loss, and its loss falls by more than
// `fall`.
void requireCloseCurves(const std::vector<nlohmann::json>& reference,
                        const std::vector<nlohmann::json>& other, const std::string& run, double tolerance,
                        double fall) {
  REQUIRE(other.size() == reference.size());
  double worst = 0, first = 0, last = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    if (!reference[i].contains("loss")) continue;
    double a = reference[i]["loss"].get<double>(), b = other[i]["loss"].get<double>();
    worst = std::max(worst, std::abs(a - b));
    (first == 0 ? first : last) = b;
  }
  INFO(run << ": worst loss gap " << worst << ", loss " << first << " -> " << last);
  REQUIRE(worst < tolerance);
  REQUIRE(last < first - fall);
}

std::vector<std::string> adafactorSets(std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.dropout=0",
                                   "optimizer.type=adafactor",
                                   "optimizer.lr=0.01",
                                   "optimizer.weight_decay=0.01",
                                   "optimizer.adafactor_beta1=0.9",
                                   "optimizer.adafactor_bf16_momentum=true",
                                   "zero_optimization.chunk_size_mb=0.02"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return sets;
}
}  // namespace

TEST_CASE("Adafactor trains through the step engine: device and host state give the same bits, and resume",
          "[train][trainer][adafactor][store]") {
  fs::path base = test::freshDir("strata-adafactor-train");
  train::Trainer(tinyConfig(base / "device", adafactorSets({}))).run();
  // Every chunk's state on the host (NOTE [Adafactor host chunks]), saving at step 10; and a device budget
  // that keeps some chunks' state on the device and sends the rest to the host.
  train::Trainer(tinyConfig(base / "host", adafactorSets({"zero_optimization.offload_optimizer.device=cpu",
                                                          "checkpoint.save=" + (base / "ckpt").string(),
                                                          "checkpoint.save_interval=10"})))
      .run();
  train::Trainer(tinyConfig(base / "split", adafactorSets({"store.gpu_budget_gb=0.0002"}))).run();
  auto device = records(base / "device");
  requireSameCurves(device, records(base / "host"));
  requireSameCurves(device, records(base / "split"));
  double first = 0, last = 0;
  for (const auto& r : device)
    if (r.contains("loss")) (first == 0 ? first : last) = r["loss"].get<double>();
  INFO("loss " << first << " -> " << last);
  // Measured: 5.57 -> 2.65 in 20 steps.
  REQUIRE(last < first - 1.5);
  for (const char* run : {"host", "split"}) {
    nlohmann::json lastRecord;
    for (const auto& r : records(base / run))
      if (r.contains("loss")) lastRecord = r;
    INFO(run);
    REQUIRE(lastRecord["mem_state_host_gb"].get<double>() > 0);
    double tiers = lastRecord["mem_state_device_gb"].get<double>() +
                   lastRecord["mem_state_host_gb"].get<double>() +
                   lastRecord["mem_state_nvme_gb"].get<double>();
    REQUIRE(tiers == Approx(lastRecord["mem_model_state_gb"].get<double>()).margin(1e-6));
  }
  {
    // The split placement really splits, and the optimizer counts its own state (no SSD for Adafactor).
    config::Config config = tinyConfig(base / "engine", adafactorSets({"store.gpu_budget_gb=0.0002"}));
    auto model = models::buildModel(config::modelSpecFrom(config, Device::cpu()));
    data::CausalLmObjective objective(model, nullptr);
    train::ZeroStepEngine engine(objective, config, Device::cpu(), DType::F32);
    const zero::StorePlacement& placement = engine.placement();
    INFO(placement.table());
    REQUIRE(placement.chunksOn(zero::Tier::Host) > 0);
    REQUIRE(placement.chunksOn(zero::Tier::Device) > 0);
    REQUIRE(placement.total() == engine.modelStateBytes());
    // Adafactor's state is a fraction of AdamW's 8 bytes per element beside the master.
    uint64_t elems = 0;
    for (const auto& r : engine.optimizer().ranges()) elems += uint64_t(r.size());
    REQUIRE(engine.modelStateBytes() < elems * (4 + 4 + 4));
  }
  // The checkpoint holds Adafactor's fields; resuming from step 10 into state on the device continues the
  // curve exactly.
  REQUIRE(fs::exists(base / "ckpt" / "step-10" / "optimizer-rank0.safetensors"));
  train::Trainer(tinyConfig(base / "resumed",
                            adafactorSets({"checkpoint.load=" + (base / "ckpt" / "step-10").string()})))
      .run();
  auto tail = records(base / "resumed");
  REQUIRE(!tail.empty());
  requireSameCurves(std::vector<nlohmann::json>(device.end() - std::ptrdiff_t(tail.size()), device.end()),
                    tail);
  // An AdamW run cannot take Adafactor's state (nor the reverse): the error says how to start fresh.
  std::string error;
  try {
    train::Trainer(tinyConfig(base / "adamw", {"model.dropout=0", "zero_optimization.chunk_size_mb=0.02",
                                               "checkpoint.load=" + (base / "ckpt" / "step-10").string()}))
        .run();
  } catch (const Error& e) {
    error = e.what();
  }
  INFO(error);
  REQUIRE(error.find("load_model_only") != std::string::npos);
}

TEST_CASE(
    "Adafactor with its state across the device, host and SSD tiers trains bit for bit like state in "
    "memory, resumes, and refuses a corrupted checkpoint of it",
    "[train][trainer][adafactor][store][nvme]") {
  // NOTE [Adafactor SSD chunks] in optim/Adafactor.h: fp32 state on the SSD (the bf16 first moment moves
  // as it is) is the in-memory update's bits.
  fs::path base = test::freshDir("strata-adafactor-ssd");
  std::string nvme = "zero_optimization.nvme_path=" + (base / "nvme").string();
  train::Trainer(tinyConfig(base / "memory", adafactorSets({}))).run();
  // Budgets tight enough to put some chunks' state on the device, some in host memory, the rest on the SSD.
  std::vector<std::string> tiers = {"store.gpu_budget_gb=0.0002", "store.host_budget_gb=0.0001", nvme,
                                    "store.nvme_state_dtype=fp32"};
  std::vector<std::string> saving = tiers;
  saving.push_back("checkpoint.save=" + (base / "ckpt").string());
  saving.push_back("checkpoint.save_interval=10");
  train::Trainer(tinyConfig(base / "tiers", adafactorSets(saving))).run();
  auto memory = records(base / "memory");
  requireSameCurves(memory, records(base / "tiers"));
  nlohmann::json last;
  for (const auto& r : records(base / "tiers"))
    if (r.contains("loss")) last = r;
  for (const char* tier : {"mem_state_device_gb", "mem_state_host_gb", "mem_state_nvme_gb"}) {
    INFO(tier);
    REQUIRE(last[tier].get<double>() > 0);
  }
  REQUIRE(last["mem_state_device_gb"].get<double>() + last["mem_state_host_gb"].get<double>() +
              last["mem_state_nvme_gb"].get<double>() ==
          Approx(last["mem_model_state_gb"].get<double>()).margin(1e-6));
  // The time the device waited for the update off it, and the part of it spent waiting for the SSD.
  REQUIRE(last["offload_ms"].get<double>() > 0);
  REQUIRE(last["offload_ssd_wait_ms"].get<double>() >= 0);
  REQUIRE(last["offload_ssd_wait_ms"].get<double>() <= last["offload_ms"].get<double>());
  REQUIRE(fs::is_empty(base / "nvme"));  // the SSD tier's file goes with the run
  {
    // The engine counts the SSD's bytes as the tier holds them: the master, the bf16 first moment and the
    // factored second moment.
    config::Config config = tinyConfig(base / "engine", adafactorSets(tiers));
    auto model = models::buildModel(config::modelSpecFrom(config, Device::cpu()));
    data::CausalLmObjective objective(model, nullptr);
    train::ZeroStepEngine engine(objective, config, Device::cpu(), DType::F32);
    const zero::StorePlacement& placement = engine.placement();
    INFO(placement.table());
    REQUIRE(placement.chunksOn(zero::Tier::Nvme) > 0);
    REQUIRE(placement.total() == engine.modelStateBytes());
    uint64_t ssdElems = 0;
    for (size_t c = 0; c < placement.optimizerTier.size(); ++c)
      if (placement.optimizerTier[c] == zero::Tier::Nvme)
        ssdElems += uint64_t(engine.optimizer().ranges()[c].size());
    REQUIRE(placement.bytes[int(zero::Tier::Nvme)] > ssdElems * (4 + 2));
    REQUIRE(placement.bytes[int(zero::Tier::Nvme)] < ssdElems * (4 + 2 + 1));
  }
  // Every chunk's state on the SSD, with an fp32 first moment: the in-memory run with one, exactly.
  std::vector<std::string> fp32Moment = {"optimizer.adafactor_bf16_momentum=false"};
  train::Trainer(tinyConfig(base / "memory32", adafactorSets(fp32Moment))).run();
  std::vector<std::string> allSsd = {"optimizer.adafactor_bf16_momentum=false",
                                     "zero_optimization.offload_optimizer.device=nvme", nvme,
                                     "store.nvme_state_dtype=fp32"};
  train::Trainer(tinyConfig(base / "ssd32", adafactorSets(allSsd))).run();
  auto memory32 = records(base / "memory32");
  requireSameCurves(memory32, records(base / "ssd32"));
  for (const auto& r : records(base / "ssd32"))
    if (r.contains("loss")) REQUIRE(r["mem_state_host_gb"].get<double>() == 0.0);
  // A checkpoint saved from the SSD tier resumes exactly, into the tiers again and into memory.
  fs::path saved = base / "ckpt" / "step-10";
  for (bool intoTiers : {true, false}) {
    INFO((intoTiers ? "into the tiers" : "into memory"));
    std::vector<std::string> resume = intoTiers ? tiers : std::vector<std::string>{};
    resume.push_back("checkpoint.load=" + saved.string());
    fs::path out = base / (intoTiers ? "resumed-tiers" : "resumed-memory");
    train::Trainer(tinyConfig(out, adafactorSets(resume))).run();
    auto tail = records(out);
    REQUIRE(!tail.empty());
    requireSameCurves(std::vector<nlohmann::json>(memory.end() - std::ptrdiff_t(tail.size()), memory.end()),
                      tail);
  }
  // The first moment in bf16 on the SSD from fp32 in memory: the curve departs a little.
  std::vector<std::string> half = allSsd;
  half.back() = "store.nvme_state_dtype=bf16";
  train::Trainer(tinyConfig(base / "half", adafactorSets(half))).run();
  auto h = records(base / "half");
  double worst = 0;
  for (size_t i = 0; i < h.size(); ++i)
    if (h[i].contains("loss"))
      worst = std::max(worst, std::abs(h[i]["loss"].get<double>() - memory32[i]["loss"].get<double>()));
  INFO("largest loss difference with a bf16 first moment on the SSD: " << worst);
  REQUIRE(worst > 0);
  REQUIRE(worst < 0.05);
  // The checkpoint's optimizer file, saved from the SSD, damaged on disk: its checksum names it before a
  // byte of it is used.
  fs::path damaged = base / "damaged" / "step-10";
  fs::create_directories(damaged.parent_path());
  fs::copy(saved, damaged, fs::copy_options::recursive);
  fs::path optimizerFile = damaged / "optimizer-rank0.safetensors";
  {
    std::fstream f(optimizerFile, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(fs::file_size(optimizerFile) - 5));
    f.put('\x5a');
  }
  std::vector<std::string> fromDamaged = tiers;
  fromDamaged.push_back("checkpoint.load=" + damaged.string());
  std::string e = test::errorOf(
      [&] { train::Trainer(tinyConfig(base / "from-damaged", adafactorSets(fromDamaged))).run(); });
  INFO(e);
  REQUIRE(e.find("optimizer-rank0.safetensors is corrupted") != std::string::npos);
}

TEST_CASE(
    "Adafactor with parameters homed in host memory and on the SSD trains bit for bit like parameters on the "
    "device, at stages 0 and 3, and resumes",
    "[train][trainer][adafactor][store][homes][nvme]") {
  // NOTE [Parameter homes] in zero/ParameterGatherer.h and NOTE [Adafactor host chunks] in optim/Adafactor.h:
  // a homed chunk's state is off the device too; its update rounds the new values into the home (the host
  // buffer, or the SSD's staging, then its extent). fp32 state on the SSD (the bf16 first moment moves as it
  // is) keeps the in-memory bits.
  fs::path base = test::freshDir("strata-adafactor-homes");
  std::string nvme = "zero_optimization.nvme_path=" + (base / "nvme").string();
  // auto past small device and host budgets: the first chunk's parameters on the device, the next in host
  // memory, the rest on the SSD.
  std::vector<std::string> tiers = {"store.gpu_budget_gb=0.00004", "store.host_budget_gb=0.00002", nvme,
                                    "store.nvme_state_dtype=fp32"};
  auto withTiers = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), tiers.begin(), tiers.end());
    return adafactorSets(extra);
  };
  train::Trainer(tinyConfig(base / "device", adafactorSets({}))).run();
  train::Trainer(tinyConfig(base / "host0", adafactorSets({"store.parameter_home=host",
                                                           "checkpoint.save=" + (base / "ckpt").string(),
                                                           "checkpoint.save_interval=10"})))
      .run();
  train::Trainer(
      tinyConfig(base / "host3", adafactorSets({"store.parameter_home=host", "zero_optimization.stage=3"})))
      .run();
  train::Trainer(tinyConfig(base / "ssd0", withTiers({"checkpoint.save=" + (base / "ckpt-ssd").string(),
                                                      "checkpoint.save_interval=10"})))
      .run();
  train::Trainer(tinyConfig(base / "ssd3", withTiers({"zero_optimization.stage=3"}))).run();
  train::Trainer(
      tinyConfig(base / "nvme3", adafactorSets({"store.parameter_home=nvme", "zero_optimization.stage=3",
                                                nvme, "store.nvme_state_dtype=fp32"})))
      .run();
  auto device = records(base / "device");
  for (const char* run : {"host0", "host3", "ssd0", "ssd3", "nvme3"}) {
    INFO(run);
    auto homed = records(base / run);
    requireSameCurves(device, homed);
    nlohmann::json last;
    for (const auto& r : homed)
      if (r.contains("loss")) last = r;
    bool ssd = std::string(run).find("host") == std::string::npos;
    REQUIRE(last[ssd ? "mem_state_nvme_gb" : "mem_state_host_gb"].get<double>() > 0);
    if (!ssd) REQUIRE(last["mem_state_device_gb"].get<double>() == 0);
    REQUIRE(last["mem_state_device_gb"].get<double>() + last["mem_state_host_gb"].get<double>() +
                last["mem_state_nvme_gb"].get<double>() ==
            Approx(last["mem_model_state_gb"].get<double>()).margin(1e-6));
  }
  REQUIRE(fs::is_empty(base / "nvme"));  // the SSD tier's file goes with the run
  // The placement: the parameters over three tiers, each homed chunk's Adafactor state off the device.
  for (int stage : {0, 3}) {
    INFO("stage " << stage);
    config::Config config =
        tinyConfig(base / "engine", withTiers({"zero_optimization.stage=" + std::to_string(stage)}));
    auto model = models::buildModel(config::modelSpecFrom(config, Device::cpu()));
    data::CausalLmObjective objective(model, nullptr);
    train::ZeroStepEngine engine(objective, config, Device::cpu(), DType::F32);
    const zero::StorePlacement& placement = engine.placement();
    INFO(placement.table());
    REQUIRE(dynamic_cast<const optim::Adafactor*>(&engine.optimizer()) != nullptr);
    REQUIRE(placement.parameterChunksOn(zero::Tier::Device) > 0);
    REQUIRE(placement.parameterChunksOn(zero::Tier::Host) > 0);
    REQUIRE(placement.parameterChunksOn(zero::Tier::Nvme) > 0);
    REQUIRE(placement.total() == engine.modelStateBytes());
    for (size_t c = 0; c < engine.chunks().numChunks(); ++c) {
      if (placement.parameterHome(c) == zero::Tier::Device) continue;
      REQUIRE(placement.optimizerTier[c] != zero::Tier::Device);
      REQUIRE(!engine.chunks().storage(c)->resident());
    }
  }
  // Resuming from step 10 continues the curve exactly: the host-homed stage-0 run at stage 3, the stage-0
  // run over the three tiers at stage 3, and the latter's checkpoint with parameters and state on the device.
  struct Resume {
    const char* out;
    fs::path from;
    std::vector<std::string> sets;
  };
  for (const Resume& r :
       {Resume{"resumed-host3", base / "ckpt" / "step-10",
               adafactorSets({"store.parameter_home=host", "zero_optimization.stage=3"})},
        Resume{"resumed-tiers", base / "ckpt-ssd" / "step-10", withTiers({"zero_optimization.stage=3"})},
        Resume{"resumed-device", base / "ckpt-ssd" / "step-10", adafactorSets({})}}) {
    INFO(r.out);
    std::vector<std::string> sets = r.sets;
    sets.push_back("checkpoint.load=" + r.from.string());
    train::Trainer(tinyConfig(base / r.out, sets)).run();
    auto tail = records(base / r.out);
    REQUIRE(!tail.empty());
    REQUIRE(tail.size() < device.size());
    requireSameCurves(std::vector<nlohmann::json>(device.end() - std::ptrdiff_t(tail.size()), device.end()),
                      tail);
  }
}

TEST_CASE(
    "Adafactor with gradients homed in host memory trains bit for bit like gradients on the device, and "
    "resumes",
    "[train][trainer][adafactor][store][homes]") {
  // NOTE [Gradient homes] in zero/GradientReducer.h and NOTE [Adafactor host chunks] in optim/Adafactor.h:
  // each chunk's gradients go to a host buffer of its own once complete in the step's last backward, and
  // the update takes them back in with the chunk's state. Two micro-batches a step (the tiny config's).
  fs::path base = test::freshDir("strata-adafactor-gradient-homes");
  std::string nvme = "zero_optimization.nvme_path=" + (base / "nvme").string();
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), "zero_optimization.offload_optimizer.device=cpu");
    return adafactorSets(extra);
  };
  train::Trainer(tinyConfig(base / "device", with({"store.gradient_home=device"}))).run();
  train::Trainer(tinyConfig(base / "host0",
                            with({"store.gradient_home=host", "checkpoint.save=" + (base / "ckpt").string(),
                                  "checkpoint.save_interval=10"})))
      .run();
  train::Trainer(tinyConfig(base / "host3", with({"store.gradient_home=host", "zero_optimization.stage=3"})))
      .run();
  // auto with the parameters homed in host memory too.
  train::Trainer(tinyConfig(base / "auto3", with({"store.parameter_home=host", "zero_optimization.stage=3"})))
      .run();
  // The state and the parameters on the SSD, the gradients in host memory.
  train::Trainer(
      tinyConfig(base / "ssd3", adafactorSets({"zero_optimization.offload_optimizer.device=nvme", nvme,
                                               "store.nvme_state_dtype=fp32", "store.parameter_home=nvme",
                                               "store.gradient_home=host", "zero_optimization.stage=3"})))
      .run();
  auto device = records(base / "device");
  for (const char* run : {"host0", "host3", "auto3", "ssd3"}) {
    INFO(run);
    requireSameCurves(device, records(base / run));
  }
  // Resuming the stage-0 run from step 10 at stage 3 continues the curve exactly.
  train::Trainer(
      tinyConfig(base / "resumed", with({"checkpoint.load=" + (base / "ckpt" / "step-10").string(),
                                         "store.gradient_home=host", "zero_optimization.stage=3"})))
      .run();
  auto tail = records(base / "resumed");
  REQUIRE(!tail.empty());
  REQUIRE(tail.size() < device.size());
  requireSameCurves(std::vector<nlohmann::json>(device.end() - std::ptrdiff_t(tail.size()), device.end()),
                    tail);
  // The engine: the gradients went to host buffers (kept across steps) with host, and stayed with device.
  for (int stage : {0, 3})
    for (const char* home : {"host", "device"}) {
      INFO("stage " << stage << ", store.gradient_home " << home);
      config::Config config =
          tinyConfig(base / "engine", with({std::string("store.gradient_home=") + home,
                                            "zero_optimization.stage=" + std::to_string(stage)}));
      auto model = models::buildModel(config::modelSpecFrom(config, Device::cpu()));
      data::CausalLmObjective objective(model, nullptr);
      train::ZeroStepEngine engine(objective, config, Device::cpu(), DType::F32);
      REQUIRE(dynamic_cast<const optim::Adafactor*>(&engine.optimizer()) != nullptr);
      auto data = data::TokenDataset::random(256, 4096, 3, 0.0);
      int64_t index = 0;
      auto next = [&] {
        auto [ids, targets] = data.batch(data::Split::Train, index, 4, 32, 1, Device::cpu());
        return data::TokenBatch{ids, targets, index++};
      };
      REQUIRE(engine.step(next, 2, 1e-3).applied);
      REQUIRE(engine.placement().chunksOn(zero::Tier::Device) == 0);
      REQUIRE((engine.gradientReducer().hostGradientBytes() > 0) == (std::string(home) == "host"));
    }
}

TEST_CASE("[cuda] Adafactor with host or SSD state and bf16 gradient buffers trains like state on the GPU",
          "[cuda][train][trainer][adafactor][store]") {
  STRATA_REQUIRE_CUDA();
  fs::path base = test::freshDir("strata-adafactor-cuda");
  std::vector<std::string> cuda = {"train.device=cuda", "precision.dtype=bf16"};
  train::Trainer(tinyConfig(base / "device", adafactorSets(cuda))).run();
  std::vector<std::string> host = cuda;
  host.push_back("zero_optimization.offload_optimizer.device=cpu");
  train::Trainer(tinyConfig(base / "host", adafactorSets(host))).run();
  std::vector<std::string> bf16 = host;
  bf16.push_back("precision.grad_accum_dtype=bf16");
  train::Trainer(tinyConfig(base / "bf16grads", adafactorSets(bf16))).run();
  // Every chunk's state on the SSD (NOTE [Adafactor SSD chunks]): read into page-locked buffers, streamed
  // through the GPU's scratch like host state.
  std::vector<std::string> ssd = cuda;
  ssd.insert(ssd.end(),
             {"zero_optimization.offload_optimizer.device=nvme",
              "zero_optimization.nvme_path=" + (base / "nvme").string(), "store.nvme_state_dtype=fp32"});
  train::Trainer(tinyConfig(base / "ssd", adafactorSets(ssd))).run();
  // Gradients homed in host memory, copied back in with the state; parameters homed in page-locked host
  // memory at stage 3 (their gradients homed too: store.gradient_home auto) and on the SSD at stage 0, their
  // new values copied from the device's scratch into the homes.
  std::vector<std::string> gradientHomes = host;
  gradientHomes.push_back("store.gradient_home=host");
  train::Trainer(tinyConfig(base / "gradient-homes", adafactorSets(gradientHomes))).run();
  std::vector<std::string> hostHomes = cuda;
  hostHomes.insert(hostHomes.end(), {"store.parameter_home=host", "zero_optimization.stage=3"});
  train::Trainer(tinyConfig(base / "host-homes", adafactorSets(hostHomes))).run();
  std::vector<std::string> ssdHomes = cuda;
  ssdHomes.insert(ssdHomes.end(),
                  {"store.parameter_home=nvme", "zero_optimization.nvme_path=" + (base / "nvme").string(),
                   "store.nvme_state_dtype=fp32"});
  train::Trainer(tinyConfig(base / "ssd-homes", adafactorSets(ssdHomes))).run();
  auto device = records(base / "device");
  // The host and SSD runs are the device run's kernel on the same inputs (bf16 GEMMs' run-to-run noise
  // aside); bf16 gradient buffers round each gradient once more.
  for (const char* run : {"host", "bf16grads", "ssd", "gradient-homes", "host-homes", "ssd-homes"})
    requireCloseCurves(device, records(base / run), run, 0.1, 1.5);
  nlohmann::json last;
  for (const auto& r : records(base / "ssd"))
    if (r.contains("loss")) last = r;
  REQUIRE(last["mem_state_nvme_gb"].get<double>() > 0);
  REQUIRE(last["mem_state_host_gb"].get<double>() == 0);
  REQUIRE(fs::is_empty(base / "nvme"));
}

TEST_CASE("[cuda] AdamW with bf16 gradient buffers trains like fp32 ones, on the device and from host state",
          "[cuda][train][trainer][adamw][store]") {
  STRATA_REQUIRE_CUDA();
  // Two micro-batches per step, so the bf16 buffers accumulate. The host runs update through both lanes of
  // the pipelined update (gradients cross to the CPU lane's staging at 2 bytes each) and sequentially.
  fs::path base = test::freshDir("strata-adamw-bf16grads-cuda");
  std::vector<std::string> cuda = {"train.device=cuda", "precision.dtype=bf16", "model.dropout=0",
                                   "zero_optimization.chunk_size_mb=0.02", "optimizer.lr=0.01"};
  train::Trainer(tinyConfig(base / "fp32grads", cuda)).run();
  std::vector<std::string> bf16 = cuda;
  bf16.push_back("precision.grad_accum_dtype=bf16");
  train::Trainer(tinyConfig(base / "device", bf16)).run();
  std::vector<std::string> host = bf16;
  host.push_back("zero_optimization.offload_optimizer.device=cpu");
  train::Trainer(tinyConfig(base / "host", host)).run();
  host.push_back("optimizer.pipeline=false");
  train::Trainer(tinyConfig(base / "sequential", host)).run();
  // bf16 buffers round each gradient, and each sum of two micro-batches, once more than fp32 ones.
  auto reference = records(base / "fp32grads");
  for (const char* run : {"device", "host", "sequential"})
    requireCloseCurves(reference, records(base / run), run, 0.1, 1.5);
}

TEST_CASE(
    "[cuda] gradients homed in host memory leave the GPU as they complete and train like gradients on it",
    "[cuda][train][trainer][store][homes]") {
  STRATA_REQUIRE_CUDA();
  // NOTE [Gradient homes] in zero/GradientReducer.h. bf16, two micro-batches a step, the optimizer state on
  // the host: the norm's partial sums and the copies to page-locked memory run on the comm stream.
  fs::path base = test::freshDir("strata-gradient-homes-cuda");
  std::vector<std::string> cuda = {"train.device=cuda",
                                   "precision.dtype=bf16",
                                   "model.dropout=0",
                                   "optimizer.lr=0.01",
                                   "zero_optimization.chunk_size_mb=0.02",
                                   "zero_optimization.offload_optimizer.device=cpu"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), cuda.begin(), cuda.end());
    return extra;
  };
  for (std::string stage : {"0", "3"}) {
    std::string staged = "zero_optimization.stage=" + stage;
    train::Trainer(tinyConfig(base / ("device" + stage), with({staged, "store.gradient_home=device"}))).run();
    train::Trainer(tinyConfig(base / ("host" + stage), with({staged, "store.gradient_home=host"}))).run();
    // The GPU's sums differ from run to run in their last bits (atomics): close, not equal.
    requireCloseCurves(records(base / ("device" + stage)), records(base / ("host" + stage)), "stage " + stage,
                       0.05, 1.0);
  }
  // The engine: at the end of the step's last backward the GPU holds no gradient buffer of a homed chunk.
  struct AtEnd final : train::MicroBatchSchedule {
    mutable uint64_t allocated = 0;
    void run(int64_t microBatches, const train::MicroBatchWork& work) const override {
      for (int64_t m = 0; m < microBatches; ++m) work.backward(m, work.forward(m));
      synchronizeDevice(Device::cuda(0));
      allocated = deviceAllocator(Device::cuda(0)).stats().allocatedBytes;
    }
  };
  std::map<std::string, uint64_t> allocated;
  uint64_t gradientBytes = 0;
  for (const char* home : {"device", "host"}) {
    config::Config config = tinyConfig(base / "engine", with({std::string("store.gradient_home=") + home}));
    auto model = models::buildModel(config::modelSpecFrom(config, Device::cuda(0)));
    data::CausalLmObjective objective(model, nullptr);
    train::ZeroStepEngine engine(objective, config, Device::cuda(0), DType::BF16);
    auto atEnd = std::make_unique<AtEnd>();
    AtEnd* seen = atEnd.get();
    engine.setSchedule(std::move(atEnd));
    auto data = data::TokenDataset::random(256, 4096, 3, 0.0);
    int64_t index = 0;
    auto next = [&] {
      auto [ids, targets] = data.batch(data::Split::Train, index, 4, 32, 1, Device::cuda(0));
      return data::TokenBatch{ids, targets, index++};
    };
    for (int step = 0; step < 2; ++step) REQUIRE(engine.step(next, 2, 1e-3).applied);
    allocated[home] = seen->allocated;
    gradientBytes = 0;
    for (size_t c = 0; c < engine.chunks().numChunks(); ++c)
      gradientBytes += uint64_t(engine.chunks().paddedElems(c)) * dtypeSize(engine.chunks().gradientDType());
    REQUIRE((engine.gradientReducer().hostGradientBytes() == gradientBytes) == (std::string(home) == "host"));
  }
  INFO("allocated at the end of backward: " << allocated["device"] << " with the gradients on the GPU, "
                                            << allocated["host"] << " homed; gradient buffers "
                                            << gradientBytes);
  REQUIRE(allocated["host"] + gradientBytes / 2 < allocated["device"]);
}

TEST_CASE(
    "[cuda] parameters homed in host memory or on the SSD are gathered over PCIe and train like "
    "parameters on the GPU",
    "[cuda][train][trainer][store][homes]") {
  STRATA_REQUIRE_CUDA();
  // NOTE [Parameter homes] in zero/ParameterGatherer.h. bf16, two micro-batches a step: each homed chunk is
  // copied from page-locked host memory (or read from its SSD extent into staging) into a slot of the
  // chunk arena on the prefetch stream, and the CPU's update writes the new values into the home. The
  // reference keeps the parameters on the GPU and the optimizer state on the host, so both runs update on
  // the CPU; the GPU's gradient sums differ from run to run in their last bits (atomics): close, not equal.
  fs::path base = test::freshDir("strata-parameter-homes-cuda");
  std::vector<std::string> cuda = {"train.device=cuda", "precision.dtype=bf16", "model.dropout=0",
                                   "optimizer.lr=0.01", "zero_optimization.chunk_size_mb=0.02"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), cuda.begin(), cuda.end());
    return extra;
  };
  std::string nvme = "zero_optimization.nvme_path=" + (base / "nvme").string();
  train::Trainer(tinyConfig(base / "device", with({"zero_optimization.offload_optimizer.device=cpu"}))).run();
  train::Trainer(tinyConfig(base / "host0", with({"store.parameter_home=host"}))).run();
  train::Trainer(tinyConfig(base / "host3", with({"store.parameter_home=host", "zero_optimization.stage=3",
                                                  "optimizer.pipeline=true"})))
      .run();
  train::Trainer(
      tinyConfig(base / "ssd3", with({"store.parameter_home=nvme", "zero_optimization.stage=3", nvme})))
      .run();
  auto device = records(base / "device");
  for (const char* run : {"host0", "host3", "ssd3"}) {
    auto homed = records(base / run);
    requireCloseCurves(device, homed, run, 0.05, 1.0);
    INFO(run);
    for (const auto& r : homed)
      if (r.contains("loss")) {
        REQUIRE(r["mem_state_device_gb"].get<double>() == 0);
        REQUIRE(r["gathered_peak"].get<int64_t>() > 0);
        REQUIRE(r["arena_slots"].get<int64_t>() > 0);
      }
  }
  nlohmann::json last;
  for (const auto& r : records(base / "ssd3"))
    if (r.contains("loss")) last = r;
  REQUIRE(last["mem_state_nvme_gb"].get<double>() > 0);
}

TEST_CASE(
    "[cuda] AdamW with m and v in bf16 trains like fp32 moments on the GPU, from host state and the SSD",
    "[cuda][train][trainer][adamw][store]") {
  STRATA_REQUIRE_CUDA();
  // NOTE [AdamW moments dtype] in optim/AdamW.h: the device's kernel, the pipelined update's two lanes (the
  // GPU lane streams bf16 m and v through its scratch) and the SSD tier, each with m and v in bf16.
  fs::path base = test::freshDir("strata-adamw-bf16-moments-cuda");
  std::vector<std::string> cuda = {"train.device=cuda", "precision.dtype=bf16", "model.dropout=0",
                                   "zero_optimization.chunk_size_mb=0.02", "optimizer.lr=0.01"};
  train::Trainer(tinyConfig(base / "fp32", cuda)).run();
  std::vector<std::string> bf16 = cuda;
  bf16.push_back("optimizer.moments_dtype=bf16");
  train::Trainer(tinyConfig(base / "device", bf16)).run();
  std::vector<std::string> host = bf16;
  host.push_back("zero_optimization.offload_optimizer.device=cpu");
  train::Trainer(tinyConfig(base / "host", host)).run();
  std::vector<std::string> ssd = bf16;
  ssd.insert(ssd.end(), {"zero_optimization.offload_optimizer.device=nvme",
                         "zero_optimization.nvme_path=" + (base / "nvme").string()});
  train::Trainer(tinyConfig(base / "ssd", ssd)).run();
  auto reference = records(base / "fp32");
  for (const char* run : {"device", "host", "ssd"})
    // bf16 compute at lr 0.01: the curves part by up to 0.11 (H200) from rounding alone, as any two
    // orders of the same sums do.
    requireCloseCurves(reference, records(base / run), run, 0.2, 1.5);
  nlohmann::json last;
  for (const auto& r : records(base / "host"))
    if (r.contains("loss")) last = r;
  REQUIRE(last["offload_gpu_share"].get<double>() > 0);
  for (const auto& r : records(base / "ssd"))
    if (r.contains("loss")) last = r;
  REQUIRE(last["mem_state_nvme_gb"].get<double>() > 0);
}

TEST_CASE("train.recompute selective and full train a GPT with the losses of none, at ZeRO stages 0 and 3",
          "[train][trainer][recompute]") {
  // Dropout on (tinyConfig's 0.1): the recomputation replays the generator, so its masks are the same.
  for (const char* stage : {"0", "3"}) {
    std::map<std::string, std::vector<nlohmann::json>> runs;
    for (std::string mode : {"none", "selective", "full"}) {
      fs::path out = test::freshDir(std::string("strata-recompute-") + stage + "-" + mode);
      train::Trainer(tinyConfig(out, {std::string("zero_optimization.stage=") + stage,
                                      "zero_optimization.chunk_size_mb=0.02", "train.train_iters=6",
                                      "train.eval_interval=3", "train.recompute=" + mode}))
          .run();
      runs[mode] = records(out);
    }
    INFO("stage " << stage);
    requireSameCurves(runs["none"], runs["selective"]);
    requireSameCurves(runs["none"], runs["full"]);
  }
}

TEST_CASE("a GPT with MoE blocks trains through the trainer, alike at ZeRO stages 0 and 3 and with recompute",
          "[train][trainer][moe]") {
  std::vector<std::string> moe = {"model.dropout=0",
                                  "model.moe_num_experts=4",
                                  "model.moe_top_k=2",
                                  "model.moe_capacity_factor=1.0",
                                  "train.train_iters=12",
                                  "train.eval_interval=6",
                                  "zero_optimization.chunk_size_mb=0.02"};
  std::map<std::string, std::vector<nlohmann::json>> runs;
  for (std::string variant : {"stage0", "stage3", "stage3-full"}) {
    std::vector<std::string> sets = moe;
    sets.push_back(variant == "stage0" ? "zero_optimization.stage=0" : "zero_optimization.stage=3");
    if (variant == "stage3-full") sets.push_back("train.recompute=full");
    fs::path out = test::freshDir("strata-moe-" + variant);
    train::Trainer(tinyConfig(out, sets)).run();
    runs[variant] = records(out);
  }
  requireSameCurves(runs["stage0"], runs["stage3"]);
  requireSameCurves(runs["stage0"], runs["stage3-full"]);
  double first = 0, last = 0;
  for (const auto& r : runs["stage0"])
    if (r.contains("loss")) (first == 0 ? first : last) = r["loss"].get<double>();
  INFO("loss " << first << " -> " << last);
  REQUIRE(last < first - 1.0);
  // The routing metrics: per MoE layer (block 1 of 2) its tokens per expert, dropped share and losses.
  const nlohmann::json& record = runs["stage0"].front();
  REQUIRE(record.contains("moe"));
  const nlohmann::json& layer = record["moe"]["h.1.mlp"];
  REQUIRE(layer["tokens_per_expert"].size() == 4);
  int64_t kept = 0;
  for (const auto& n : layer["tokens_per_expert"]) kept += n.get<int64_t>();
  double dropped = layer["dropped"].get<double>();
  // 4 sequences x 32 tokens x top-2 choices, each kept or dropped (capacity factor 1).
  REQUIRE(double(kept) == Approx(4 * 32 * 2 * (1.0 - dropped)));
  REQUIRE(layer["aux_loss"].get<double>() > 0);
  REQUIRE(record["moe_z_loss"].get<double>() > 0);
}

TEST_CASE("model.moe_expert_parallel_size is checked against the experts and the ranks before any work",
          "[train][trainer][moe]") {
  fs::path out = test::freshDir("strata-moe-ep-errors");
  auto message = [&](std::vector<std::string> sets) {
    return test::errorOf([&] { train::Trainer trainer(tinyConfig(out, sets)); });
  };
  REQUIRE(message({"model.moe_expert_parallel_size=2"}).find("no mixture-of-experts layers") !=
          std::string::npos);
  REQUIRE(message({"model.moe_num_experts=3", "model.moe_expert_parallel_size=2"})
              .find("must be a multiple of model.moe_expert_parallel_size") != std::string::npos);
  // One rank cannot split its experts over two.
  REQUIRE(message({"model.moe_num_experts=4", "model.moe_expert_parallel_size=2"})
              .find("must divide the number of ranks (1)") != std::string::npos);
}

TEST_CASE(
    "out of memory in a step says what for, what the device holds and what to change, and keeps the "
    "checkpoints",
    "[train][oom]") {
  // NOTE [Out of memory]: STRATA_TEST_OOM_AT_STEP fails step 3's first forward as a full device would.
  std::filesystem::path out = test::freshDir("strata-trainer-oom");
  setenv("STRATA_TEST_OOM_AT_STEP", "3", 1);
  std::string message;
  try {
    train::Trainer(test::tinyConfig(out, {"train.train_iters=6", "checkpoint.save_interval=1",
                                          "checkpoint.save=" + (out / "ckpt").string()}))
        .run();
  } catch (const OutOfMemory& e) {
    message = e.message();
  }
  unsetenv("STRATA_TEST_OOM_AT_STEP");
  CHECK(message.find("out of memory: ") == 0);
  CHECK(message.find("for the activations of a micro-batch's forward") != std::string::npos);
  CHECK(message.find("at iteration 3, with model state") != std::string::npos);
  CHECK(message.find("lower train.micro_batch_size, set train.recompute") != std::string::npos);
  CHECK(std::filesystem::exists(out / "ckpt" / "step-2"));
  CHECK(!std::filesystem::exists(out / "ckpt" / "step-3"));
}
