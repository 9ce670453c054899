// ZeRO stages 0 to 3, expert parallelism and tensor parallelism ([tensor], a CTest entry of its own) training
// a small GPT on N CPU ranks (mpirun -np 2 and -np 4 through CTest), against the same run on one rank. Every
// rank runs every training run (they are collectives); rank 0 reads the metrics and checks. Checks use CHECK,
// not REQUIRE, so no rank leaves early and strands the others. STRATA_DIST_TEST_DEVICE=cuda runs the same
// tests on the GPU (ranks that share one GPU communicate through MPI with host staging: NOTE [GPU
// collectives] in distributed/ParallelContext.h), in fp32 so that the tolerances against one rank hold;
// STRATA_DIST_TEST_SETS adds config overrides (comma-separated key=value) to every run.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "CatchShim.h"
#include "models/Zoo.h"
#include "strata/data/CausalLmObjective.h"
#include "strata/distributed/ParallelContext.h"
#include "strata/interop/HfImport.h"
#include "strata/ops/Ops.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/StepEngine.h"
#include "strata/train/Trainer.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

// The device the tests train on: the CPU, or the GPU under STRATA_DIST_TEST_DEVICE=cuda.
bool onGpu() {
  const char* d = std::getenv("STRATA_DIST_TEST_DEVICE");
  return d != nullptr && std::string(d) == "cuda";
}

// STRATA_DIST_TEST_SETS: more overrides for every run.
std::vector<std::string> extraSets() {
  std::vector<std::string> out;
  const char* text = std::getenv("STRATA_DIST_TEST_SETS");
  std::string all = text ? text : "";
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find(',', start);
    if (end == std::string::npos) end = all.size();
    if (end > start) out.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

struct Run {
  std::vector<double> losses, valLosses, gradNorms;
  std::vector<double> modelStateGb, stateHostGb, stateNvmeGb;
  std::string checkpoint;
  std::string sample;
  int64_t reducedBytes = 0, reducedBytesPowerSgd = 0;
  // This rank's parameters at the end (every rank's own: under a pipeline, its stage's).
  std::map<std::string, std::vector<float>> parameters;
  std::map<std::string, Shape> shapes;
};

// A corpus every process (world rank) writes identically to a place of its own, once, whole (by rename): a
// resume compares the other ranks' copies with the one its checkpoint names.
fs::path corpusFor(int rank) {
  fs::path dir = fs::temp_directory_path() /
                 ("strata-zero-corpus-" + std::to_string(::getppid()) + "-" + std::to_string(rank));
  fs::create_directories(dir);
  fs::path corpus = dir / "corpus.txt";
  if (fs::exists(corpus)) return corpus;
  {
    std::ofstream text(dir / "corpus.txt.tmp");
    for (int i = 0; i < 400; ++i) text << "to be or not to be, that is the question " << i % 7 << "\n";
  }
  fs::rename(dir / "corpus.txt.tmp", corpus);
  return corpus;
}

// The output directory of the run `name` (the same on every rank).
fs::path runDir(const std::string& name) {
  return fs::temp_directory_path() / ("strata-zero-" + std::to_string(::getppid()) + "-" + name);
}

// The config of trainRun's run `name`.
config::Config runConfig(const std::string& name, int stage, const std::vector<std::string>& extra) {
  fs::path out = runDir(name);
  // A global batch of 8 sequences fills 2 and 4 ranks; 8 ranks (mpirun -np 8) take 16, two per rank.
  const int worldSize = dist::launchInfoFromEnvironment().worldSize;
  const std::string globalBatch = std::to_string(worldSize > 4 ? 2 * worldSize : 8);
  std::vector<std::string> sets = {
      "data.path=" + corpusFor(dist::launchInfoFromEnvironment().rank).string(),
      "train.out_dir=" + out.string(), onGpu() ? "train.device=cuda" : "train.device=cpu", "train.threads=1",
      "model.num_layers=2", "model.hidden_size=32", "model.num_attention_heads=2", "model.seq_length=32",
      "model.dropout=0", "train.micro_batch_size=2", "train.global_batch_size=" + globalBatch,
      "train.train_iters=20", "train.log_interval=1", "train.eval_interval=10", "train.eval_iters=6",
      "train.sample_length=8", "lr_schedule.warmup_iters=2", "optimizer.lr=3e-3",
      // Small chunks, so each has several parameters and several split across shard boundaries.
      "zero_optimization.chunk_size_mb=0.02", "model.vocab_size=256",
      "zero_optimization.stage=" + std::to_string(stage)};
  if (onGpu()) sets.push_back("precision.dtype=fp32");
  for (auto& e : extraSets()) sets.push_back(e);
  for (auto& e : extra) sets.push_back(e);
  return config::parseConfig("", "zero-test", sets);
}

// 20 steps (or `iters`) of a 2-layer GPT at a global batch of 8 sequences, one record per step, on the ranks
// of `parallel`. Only rank 0's metrics exist; the other ranks return no losses.
// With `eager`, the model is built whole with its values here and handed to the trainer, which lays it out
// from them and broadcasts rank 0's; otherwise the trainer builds it with deferred parameters. With
// `mainReadsFirst`, rank 0 alone reads the model before the run (which makes its values there).
Run trainRun(const std::shared_ptr<dist::ParallelContext>& parallel, const std::string& name, int stage,
             std::vector<std::string> extra = {}, bool eager = false, bool mainReadsFirst = false) {
  fs::path out = runDir(name);
  if (parallel->isMain()) fs::remove_all(out);
  if (parallel->worldSize() > 1) parallel->world().communicator().barrier();
  config::Config config = runConfig(name, stage, extra);
  std::unique_ptr<train::Trainer> built;
  if (eager) {
    Device device = onGpu() ? parallel->device() : Device::cpu();
    built = std::make_unique<train::Trainer>(
        config, models::buildModel(config::modelSpecFrom(config, device)), parallel);
  } else {
    built = std::make_unique<train::Trainer>(config, parallel);
  }
  train::Trainer& trainer = *built;
  if (mainReadsFirst && parallel->isMain()) REQUIRE(trainer.model().numParameters() > 0);
  train::TrainResult result = trainer.run();
  Run run;
  run.checkpoint = result.checkpoint;
  run.sample = result.sample;
  run.reducedBytes = result.reducedBytes;
  run.reducedBytesPowerSgd = result.reducedBytesPowerSgd;
  // (Stage 3 keeps only shards between steps, and parameters homed off the device are not resident.)
  auto homed = [&](const char* home) {
    return std::find(extra.begin(), extra.end(), std::string("store.parameter_home=") + home) != extra.end();
  };
  bool resident = stage < 3 && !homed("host") && !homed("nvme");
  for (auto& [pname, p] :
       resident ? trainer.model().namedParameters() : std::vector<std::pair<std::string, Tensor>>{}) {
    run.parameters[pname] = ops::to(p, Device::cpu(), DType::F32).toVector<float>();
    run.shapes[pname] = p.shape();
  }
  if (!parallel->isMain()) return run;
  std::ifstream in(out / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) run.valLosses.push_back(j["val_loss"].get<double>());
    if (!j.contains("loss")) continue;
    run.losses.push_back(j["loss"].get<double>());
    run.gradNorms.push_back(j["grad_norm"].get<double>());
    run.modelStateGb.push_back(j["mem_model_state_gb"].get<double>());
    run.stateHostGb.push_back(j["mem_state_host_gb"].get<double>());
    run.stateNvmeGb.push_back(j["mem_state_nvme_gb"].get<double>());
  }
  return run;
}

// The error a run of `name` ends with on this rank: its message, "reported by rank 0" where rank 0 reports
// it for every rank, or "no error".
std::string refusalOf(const std::shared_ptr<dist::ParallelContext>& parallel, const std::string& name,
                      int stage, const std::vector<std::string>& extra) {
  try {
    trainRun(parallel, name, stage, extra);
  } catch (const train::ReportedByRankZero&) {
    return "reported by rank 0";
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

dist::ParallelOptions options() {
  return dist::ParallelOptions{.timeoutSeconds = 60,
                               .deviceType = onGpu() ? DeviceType::CUDA : DeviceType::CPU};
}

std::shared_ptr<dist::ParallelContext> world() {
  return std::make_shared<dist::ParallelContext>(options());
}

// One rank alone, in this process: no collectives.
std::shared_ptr<dist::ParallelContext> alone() {
  dist::LaunchInfo one;
  return std::make_shared<dist::ParallelContext>(one, options());
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

double worstRelative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-30));
  return worst;
}

}  // namespace

TEST_CASE("ZeRO stages 0 to 3 on N ranks train like one rank", "[dist][zero]") {
  auto ctx = world();
  int ranks = ctx->worldSize();
  // The reference: every rank trains the whole global batch alone (rank 0's is the one compared).
  Run reference = trainRun(alone(), "one-rank-" + std::to_string(ctx->rank()), 0);
  std::map<int, Run> stages;
  for (int stage : {0, 1, 2, 3}) stages[stage] = trainRun(ctx, "stage" + std::to_string(stage), stage);
  // Stage 3 gathers into the chunk arena by default; into the caching allocator's blocks without it.
  Run blocks = trainRun(ctx, "stage3-no-arena", 3, {"store.arena=false"});
  if (!ctx->isMain()) return;
  INFO(ranks << " ranks");
  CHECK(reference.losses.size() == 20);
  CHECK(blocks.losses == stages[3].losses);
  CHECK(blocks.valLosses == stages[3].valLosses);
  for (int stage : {0, 1, 2, 3}) {
    INFO("stage " << stage);
    CHECK(stages[stage].losses.size() == 20);
    // The stages differ only in where state lives: the same sums in the same order, bit for bit.
    CHECK(stages[stage].losses == stages[0].losses);
    // Evaluation splits its batches over the ranks and sums them in one all-reduce.
    CHECK(stages[stage].valLosses.size() == 2);
    CHECK(stages[stage].valLosses == stages[0].valLosses);
    CHECK(worstRelative(stages[stage].valLosses, reference.valLosses) < 1e-5);
    // Against one rank the micro-batches' gradients are summed in another order (per rank, then across
    // ranks), so the curves agree to rounding, not bitwise.
    CHECK(worstRelative(stages[stage].losses, reference.losses) < 1e-5);
  }
  // Model state per rank: stages 1 and 2 keep 1/N of the moments (fp32 on the CPU: the parameters, 4 bytes,
  // stay whole; m and v, 8 bytes, are sharded); stage 3 keeps 1/N of everything (up to the chunks' padding).
  double whole = stages[0].modelStateGb.back(), params = whole / 3.0;
  for (int stage : {1, 2}) {
    double expected = params + 2.0 * params / double(ranks);
    CHECK(stages[stage].modelStateGb.back() == Approx(expected).epsilon(0.02));
  }
  CHECK(stages[3].modelStateGb.back() == Approx(whole / double(ranks)).epsilon(0.02));
}

TEST_CASE(
    "a model the trainer builds, laid out in shards, trains bit for bit like the same model built whole and "
    "handed to it",
    "[dist][zero][deferred]") {
  // NOTE [Deferred parameters] in nn/DeferredInit.h and NOTE [Sharded layout] in zero/ChunkManager.h: at
  // stages 1 to 3 each rank makes only its shards of the masters (and at stage 3 of the parameters), with no
  // start-up broadcast; the eager model is laid out whole and broadcast.
  auto ctx = world();
  for (int stage : {0, 1, 2, 3}) {
    std::vector<std::string> sets = {"train.recompute=none"};
    Run deferred = trainRun(ctx, "deferred" + std::to_string(stage), stage, sets);
    Run eager = trainRun(ctx, "eager" + std::to_string(stage), stage, sets, /*eager=*/true);
    // Rank 0 alone reads its model first, so only its values exist: the ranks agree to lay out whole.
    Run mixed = trainRun(ctx, "mixed" + std::to_string(stage), stage, sets, false, /*mainReadsFirst=*/true);
    CHECK(mixed.parameters == eager.parameters);
    INFO("stage " << stage << " on rank " << ctx->rank());
    CHECK(deferred.parameters == eager.parameters);  // every rank's, where resident (stages 0 and 1)
    CHECK(deferred.parameters.empty() == (stage == 3));
    if (!ctx->isMain()) continue;
    CHECK(deferred.losses.size() == 20);
    CHECK(deferred.losses == eager.losses);
    CHECK(deferred.valLosses == eager.valLosses);
    CHECK(deferred.gradNorms == eager.gradNorms);
    CHECK(mixed.losses == eager.losses);
  }
}

TEST_CASE("ZeRO stages 2 and 3 resume exactly from their checkpoints, at this world size and at one rank",
          "[dist][zero][checkpoint]") {
  auto ctx = world();
  std::string tag = std::to_string(ctx->rank());
  for (int stage : {2, 3}) {
    std::string name = "resume-stage" + std::to_string(stage);
    // Straight through 20 steps, saving at 10.
    Run straight = trainRun(ctx, name + "-straight", stage, {"checkpoint.save_interval=10"});
    fs::path saved = fs::path(straight.checkpoint).parent_path() / "step-10";
    // 10 more steps from the step-10 checkpoint, on N ranks, then on one rank.
    Run resumed = trainRun(ctx, name + "-again", stage, {"checkpoint.load=" + saved.string()});
    Run single = trainRun(alone(), name + "-single-" + tag, 0, {"checkpoint.load=" + saved.string()});
    if (!ctx->isMain()) continue;
    INFO("stage " << stage);
    // Each rank wrote its own pieces of the state, nothing gathered: about 1/N of it each.
    uint64_t total = 0, largest = 0;
    for (int r = 0; r < ctx->worldSize(); ++r)
      for (const char* kind : {"model", "optimizer"}) {
        fs::path file = saved / (std::string(kind) + "-rank" + std::to_string(r) + ".safetensors");
        REQUIRE(fs::exists(file));
        total += fs::file_size(file);
        largest = std::max<uint64_t>(largest, fs::file_size(file));
      }
    // The state is 3 fp32 values per element (parameter, m, v); an optimizer file holds 2 of them for 1/N.
    CHECK(double(largest) < 1.1 * double(total) * 2.0 / (3.0 * ctx->worldSize()));
    CHECK(straight.losses.size() == 20);
    CHECK(resumed.losses.size() == 10);
    std::vector<double> tail(straight.losses.begin() + 10, straight.losses.end());
    CHECK(resumed.losses == tail);
    CHECK(worstRelative(single.losses, tail) < 1e-5);
  }
}

TEST_CASE("optimizer state on the host and SSD tiers trains like state on the device, at stages 1 and 3",
          "[dist][zero][store]") {
  auto ctx = world();
  for (int stage : {1, 3}) {
    std::string name = "offload-stage" + std::to_string(stage);
    Run device = trainRun(ctx, name + "-device", stage);
    Run host = trainRun(ctx, name + "-host", stage, {"zero_optimization.offload_optimizer.device=cpu"});
    // All three tiers: each rank's SSD file under its own directory.
    fs::path nvme = fs::temp_directory_path() /
                    ("strata-zero-nvme-" + std::to_string(::getppid()) + "-" + std::to_string(ctx->rank()));
    Run tiers =
        trainRun(ctx, name + "-tiers", stage,
                 // The parameters and a little state on the device (stage 3 shards the parameters).
                 {"store.gpu_budget_gb=" + std::to_string(stage == 3 ? 0.00016 / ctx->worldSize() : 0.00015),
                  "store.host_budget_gb=0.00006", "zero_optimization.nvme_path=" + nvme.string()});
    CHECK(fs::is_empty(nvme));
    if (!ctx->isMain()) continue;
    INFO("stage " << stage);
    REQUIRE(device.losses.size() == 20);
    CHECK(host.losses == device.losses);
    CHECK(host.valLosses == device.valLosses);
    CHECK(tiers.losses == device.losses);
    CHECK(tiers.valLosses == device.valLosses);
    CHECK(tiers.stateNvmeGb.back() > 0);
    CHECK(tiers.stateHostGb.back() > 0);
    // The host holds no more than its budget on any rank (the metric is the largest rank's).
    for (double gb : tiers.stateHostGb) CHECK(gb <= 0.00006);
  }
}

TEST_CASE(
    "AdamW's m and v in bf16 on N ranks: sharded state in the tiers trains like on the device, and "
    "resumes exactly here and resharded at one rank",
    "[dist][zero][store][checkpoint]") {
  // NOTE [AdamW moments dtype] in optim/AdamW.h: optimizer.moments_dtype bf16 at stage 3, each rank's shard
  // of m and v in bf16 on the device, in host memory and on the SSD; the checkpoint's fp32 pieces reload at
  // this world size and resharded onto one rank.
  auto ctx = world();
  std::string tag = std::to_string(ctx->rank());
  std::string bf16 = "optimizer.moments_dtype=bf16";
  Run device = trainRun(ctx, "bf16-moments-device", 3, {bf16, "checkpoint.save_interval=10"});
  fs::path saved = fs::path(device.checkpoint).parent_path() / "step-10";
  fs::path nvme = fs::temp_directory_path() / ("strata-zero-bf16-moments-" + std::to_string(::getppid()) +
                                               "-" + std::to_string(ctx->rank()));
  Run tiers = trainRun(ctx, "bf16-moments-tiers", 3,
                       {bf16, "store.gpu_budget_gb=" + std::to_string(0.00016 / ctx->worldSize()),
                        "store.host_budget_gb=0.00004", "zero_optimization.nvme_path=" + nvme.string()});
  Run resumed = trainRun(ctx, "bf16-moments-again", 3, {bf16, "checkpoint.load=" + saved.string()});
  Run single =
      trainRun(alone(), "bf16-moments-single-" + tag, 0, {bf16, "checkpoint.load=" + saved.string()});
  CHECK(fs::is_empty(nvme));
  if (!ctx->isMain()) return;
  REQUIRE(device.losses.size() == 20);
  CHECK(tiers.losses == device.losses);
  CHECK(tiers.valLosses == device.valLosses);
  CHECK(tiers.stateNvmeGb.back() > 0);
  CHECK(tiers.stateHostGb.back() > 0);
  std::vector<double> tail(device.losses.begin() + 10, device.losses.end());
  CHECK(resumed.losses == tail);
  INFO("one rank from the N ranks' checkpoint: worst relative loss difference "
       << worstRelative(single.losses, tail));
  CHECK(worstRelative(single.losses, tail) < 1e-5);
}

TEST_CASE("parameters homed in host memory or on the SSD on N ranks train like parameters on the device",
          "[dist][zero][store][homes]") {
  // NOTE [Parameter homes] in zero/ParameterGatherer.h: at stage 0 every rank homes whole chunks and copies
  // them into slots; at stage 3 each rank homes its shard, copies it into its block of the slot and
  // all-gathers the slot in place. The host homes resume; the SSD's are read ahead through staging. Their
  // gradients go to host memory as they complete (store.gradient_home: auto; NOTE [Gradient homes] in
  // zero/GradientReducer.h): at stage 0 each rank's all-reduced chunk, at stage 3 its reduce-scattered
  // shard; and so do those of parameters on the device with their optimizer state in host memory.
  auto ctx = world();
  for (int stage : {0, 3}) {
    std::string name = "homes-stage" + std::to_string(stage);
    std::vector<std::string> homed = {"store.parameter_home=host", "zero_optimization.chunk_size_mb=0.02"};
    Run device = trainRun(ctx, name + "-device", stage, {"zero_optimization.chunk_size_mb=0.02"});
    std::vector<std::string> saving = homed;
    saving.push_back("checkpoint.save_interval=10");
    Run host = trainRun(ctx, name + "-host", stage, saving);
    fs::path saved = fs::path(host.checkpoint).parent_path() / "step-10";
    std::vector<std::string> resuming = homed;
    resuming.push_back("checkpoint.load=" + saved.string());
    Run resumed = trainRun(ctx, name + "-again", stage, resuming);
    // Every chunk's parameters (each rank's shard at stage 3) on the SSD, in each rank's own file.
    fs::path nvme = fs::temp_directory_path() /
                    ("strata-homes-nvme-" + std::to_string(::getppid()) + "-" + std::to_string(ctx->rank()));
    Run ssd = trainRun(ctx, name + "-ssd", stage,
                       {"store.parameter_home=nvme", "zero_optimization.chunk_size_mb=0.02",
                        "zero_optimization.nvme_path=" + nvme.string()});
    Run grads = trainRun(ctx, name + "-grads", stage,
                         {"store.gradient_home=host", "zero_optimization.offload_optimizer.device=cpu",
                          "zero_optimization.chunk_size_mb=0.02"});
    if (!ctx->isMain()) continue;
    INFO("stage " << stage);
    REQUIRE(device.losses.size() == 20);
    CHECK(host.losses == device.losses);
    CHECK(host.valLosses == device.valLosses);
    CHECK(host.stateHostGb.back() > 0);
    CHECK(ssd.losses == device.losses);
    CHECK(ssd.valLosses == device.valLosses);
    CHECK(ssd.stateNvmeGb.back() > 0);
    CHECK(grads.losses == device.losses);
    CHECK(grads.valLosses == device.valLosses);
    CHECK(grads.gradNorms == device.gradNorms);
    if (stage == 0) CHECK(grads.parameters == device.parameters);
    REQUIRE(resumed.losses.size() == 10);
    CHECK(resumed.losses == std::vector<double>(device.losses.begin() + 10, device.losses.end()));
  }
}

TEST_CASE(
    "Adafactor at ZeRO stages 0 to 3 on N ranks, its state on the device, the host or the SSD, trains and "
    "resumes",
    "[dist][zero][adafactor]") {
  auto ctx = world();
  std::vector<std::string> adafactor = {"optimizer.type=adafactor", "optimizer.lr=0.01",
                                        "optimizer.adafactor_beta1=0.9",
                                        "optimizer.adafactor_bf16_momentum=true"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), adafactor.begin(), adafactor.end());
    return extra;
  };
  Run reference = trainRun(alone(), "adafactor-one-rank-" + std::to_string(ctx->rank()), 0, adafactor);
  std::map<int, Run> stages;
  for (int stage : {0, 1, 2, 3})
    stages[stage] = trainRun(ctx, "adafactor-stage" + std::to_string(stage), stage,
                             with({"checkpoint.save_interval=10"}));
  Run host1 =
      trainRun(ctx, "adafactor-stage1-host", 1, with({"zero_optimization.offload_optimizer.device=cpu"}));
  Run host3 =
      trainRun(ctx, "adafactor-stage3-host", 3, with({"zero_optimization.offload_optimizer.device=cpu"}));
  fs::path saved = fs::path(stages[3].checkpoint).parent_path() / "step-10";
  Run resumed = trainRun(ctx, "adafactor-stage3-again", 3, with({"checkpoint.load=" + saved.string()}));
  // Stage 0: every rank holds each chunk's whole state, rank 0 saves it and every rank reads it.
  fs::path saved0 = fs::path(stages[0].checkpoint).parent_path() / "step-10";
  Run resumed0 = trainRun(ctx, "adafactor-stage0-again", 0, with({"checkpoint.load=" + saved0.string()}));
  // The state on the SSD (NOTE [Adafactor SSD chunks] in optim/Adafactor.h), each rank's file under its own
  // directory: every chunk's at stages 0 and 1, and at stage 3 spread over the three tiers, resumed from the
  // checkpoint the device-resident run saved.
  fs::path nvme = fs::temp_directory_path() / ("strata-zero-adafactor-nvme-" + std::to_string(::getppid()) +
                                               "-" + std::to_string(ctx->rank()));
  std::vector<std::string> onSsd = {"zero_optimization.offload_optimizer.device=nvme",
                                    "zero_optimization.nvme_path=" + nvme.string(),
                                    "store.nvme_state_dtype=fp32"};
  Run ssd0 = trainRun(ctx, "adafactor-stage0-ssd", 0, with(onSsd));
  Run ssd1 = trainRun(ctx, "adafactor-stage1-ssd", 1, with(onSsd));
  std::vector<std::string> tiers = {
      "store.gpu_budget_gb=" + std::to_string(0.00016 / ctx->worldSize()), "store.host_budget_gb=0.00006",
      "zero_optimization.nvme_path=" + nvme.string(), "store.nvme_state_dtype=fp32"};
  Run tiers3 = trainRun(ctx, "adafactor-stage3-tiers", 3, with(tiers));
  tiers.push_back("checkpoint.load=" + saved.string());
  Run tiersResumed = trainRun(ctx, "adafactor-stage3-tiers-again", 3, with(tiers));
  // Parameters homed off every rank's device (NOTE [Parameter homes] in zero/ParameterGatherer.h): in host
  // memory at stages 0 and 3 (each rank's whole chunks, or its shards), the stage-3 run resumed; and on the
  // SSD, in each rank's own file. The same update, its new values written into the homes.
  std::vector<std::string> hostHomes = {"store.parameter_home=host"};
  Run homes0 = trainRun(ctx, "adafactor-stage0-homes", 0, with(hostHomes));
  hostHomes.push_back("checkpoint.save_interval=10");
  Run homes3 = trainRun(ctx, "adafactor-stage3-homes", 3, with(hostHomes));
  hostHomes.back() = "checkpoint.load=" + (fs::path(homes3.checkpoint).parent_path() / "step-10").string();
  Run homesResumed = trainRun(ctx, "adafactor-stage3-homes-again", 3, with(hostHomes));
  std::vector<std::string> ssdHomes = {"store.parameter_home=nvme",
                                       "zero_optimization.nvme_path=" + nvme.string(),
                                       "store.nvme_state_dtype=fp32"};
  Run ssdHomes0 = trainRun(ctx, "adafactor-stage0-ssd-homes", 0, with(ssdHomes));
  Run ssdHomes3 = trainRun(ctx, "adafactor-stage3-ssd-homes", 3, with(ssdHomes));
  CHECK(fs::is_empty(nvme));
  if (!ctx->isMain()) return;
  INFO(ctx->worldSize() << " ranks");
  REQUIRE(stages[0].losses.size() == 20);
  // Stage 0 keeps whole chunks on every rank: one rank's numbers, up to the order of the gradients' sum
  // (measured 1.1e-5 relative at 4 ranks: Adafactor's normalised update carries the rounding further than
  // AdamW's does in the test above).
  CHECK(worstRelative(stages[0].losses, reference.losses) < 1e-4);
  // Stages 1 to 3 cut the chunks at the same shard boundaries, so each rank updates the same pieces
  // (a parameter split across ranks keeps a full second moment per piece): the same bits at every stage.
  CHECK(stages[2].losses == stages[1].losses);
  CHECK(stages[3].losses == stages[1].losses);
  // Host-resident state is the same update.
  CHECK(host1.losses == stages[1].losses);
  CHECK(host3.losses == stages[3].losses);
  CHECK(stages[1].losses.back() < stages[1].losses.front() - 1.0);
  // The sharded "adafactor_v" pieces reload at the world size they were saved with.
  std::vector<double> tail(stages[3].losses.begin() + 10, stages[3].losses.end());
  CHECK(resumed.losses == tail);
  std::vector<double> tail0(stages[0].losses.begin() + 10, stages[0].losses.end());
  CHECK(resumed0.losses == tail0);
  // SSD-resident state is the same update too, and takes the checkpoint's sharded state.
  CHECK(ssd0.losses == stages[0].losses);
  CHECK(ssd1.losses == stages[1].losses);
  CHECK(ssd1.stateHostGb.back() == 0);
  CHECK(ssd1.stateNvmeGb.back() > 0);
  CHECK(tiers3.losses == stages[3].losses);
  CHECK(tiers3.stateHostGb.back() > 0);
  CHECK(tiers3.stateNvmeGb.back() > 0);
  CHECK(tiersResumed.losses == tail);
  CHECK(homes0.losses == stages[0].losses);
  CHECK(homes3.losses == stages[3].losses);
  CHECK(homes3.stateHostGb.back() > 0);
  CHECK(homesResumed.losses == tail);
  CHECK(ssdHomes0.losses == stages[0].losses);
  CHECK(ssdHomes3.losses == stages[3].losses);
  CHECK(ssdHomes3.stateNvmeGb.back() > 0);
}

TEST_CASE("bert and t5 at ZeRO stages 0 and 3 on N ranks train like one rank", "[dist][zero][zoo]") {
  auto ctx = world();
  // Two-layer encoders of the zoo's shapes, 6 steps: their corruptions (masks, spans, NSP pairs) are drawn
  // from each window's global batch index, so every world size corrupts the same windows alike.
  std::map<std::string, std::vector<std::string>> archs = {
      {"bert",
       {"model.arch=bert", "model.vocab_size=260", "model.bert_binary_head=true",
        "model.layer_norm_eps=1e-12", "train.sample_length=0"}},
      {"t5",
       {"model.arch=t5", "model.vocab_size=384", "model.bias=false", "model.kv_channels=16",
        "model.ffn_hidden_size=48", "model.decoder_num_layers=1", "model.decoder_seq_length=16",
        "model.activation=gated_gelu", "model.untie_embeddings_and_output_weights=true",
        "train.sample_length=6"}}};
  for (auto& [arch, sets] : archs) {
    sets.push_back("train.train_iters=6");
    Run reference = trainRun(alone(), arch + "-one-rank-" + std::to_string(ctx->rank()), 0, sets);
    Run stage0 = trainRun(ctx, arch + "-stage0", 0, sets);
    Run stage3 = trainRun(ctx, arch + "-stage3", 3, sets);
    if (!ctx->isMain()) continue;
    INFO(arch << " on " << ctx->worldSize() << " ranks");
    CHECK(reference.losses.size() == 6);
    CHECK(stage0.losses.size() == 6);
    CHECK(stage3.losses == stage0.losses);
    CHECK(stage3.valLosses == stage0.valLosses);
    CHECK(stage0.valLosses.size() == 1);
    // As for GPT: against one rank only the order of the gradients' sums differs.
    CHECK(worstRelative(stage0.losses, reference.losses) < 1e-5);
    CHECK(worstRelative(stage0.valLosses, reference.valLosses) < 1e-5);
    CHECK(stage0.losses.back() < stage0.losses.front());
    // Every rank decodes the same tokens (T5's greedy decoding at stage 3 is a chain of collectives).
    CHECK(stage3.sample == stage0.sample);
  }
}

TEST_CASE("expert parallelism on N ranks trains like one rank, at ZeRO stages 0 and 3", "[dist][zero][moe]") {
  auto ctx = world();
  int ranks = ctx->worldSize();
  // A GPT-MoE with 4 experts, top-2, at a capacity no token overflows (2 x 64 tokens x 2 / 4 = 64 slots per
  // expert for 64 tokens): the routing is then the same whether the experts sit on one rank or several.
  // Each rank routes its own micro-batches, which are the one-rank run's micro-batches.
  std::vector<std::string> moe = {"model.moe_num_experts=4", "model.moe_top_k=2", "model.moe_every=1",
                                  "model.moe_capacity_factor=2", "model.moe_eval_capacity_factor=2"};
  auto with = [&](std::vector<std::string> sets, std::vector<std::string> more) {
    sets.insert(sets.end(), more.begin(), more.end());
    return sets;
  };
  Run reference = trainRun(alone(), "moe-one-rank-" + std::to_string(ctx->rank()), 0, moe);
  Run dense = trainRun(ctx, "moe-data-parallel", 0, moe);
  std::string ep = "model.moe_expert_parallel_size=" + std::to_string(ranks);
  Run stage0 = trainRun(ctx, "moe-ep-stage0", 0, with(moe, {ep}));
  Run stage3 = trainRun(ctx, "moe-ep-stage3", 3, with(moe, {ep}));
  // Four ranks: two expert-parallel groups of two, whose experts ZeRO shards over the two ranks that hold
  // them.
  Run hybrid;
  if (ranks == 4)
    hybrid = trainRun(ctx, "moe-ep2-stage2", 2, with(moe, {"model.moe_expert_parallel_size=2"}));
  if (!ctx->isMain()) return;
  INFO(ranks << " ranks");
  CHECK(reference.losses.size() == 20);
  CHECK(stage0.losses.size() == 20);
  // The same sums in the same order at every stage.
  CHECK(stage3.losses == stage0.losses);
  CHECK(stage3.valLosses == stage0.valLosses);
  CHECK(stage3.sample == stage0.sample);
  // Against one rank, the experts' rows arrive from several ranks and their gradients are summed in another
  // order: equal to rounding.
  CHECK(worstRelative(stage0.losses, reference.losses) < 1e-5);
  CHECK(worstRelative(stage0.valLosses, reference.valLosses) < 1e-5);
  CHECK(worstRelative(stage0.losses, dense.losses) < 1e-5);
  CHECK(stage0.losses.back() < stage0.losses.front() - 0.5);
  if (ranks == 4) {
    CHECK(hybrid.losses.size() == 20);
    CHECK(worstRelative(hybrid.losses, reference.losses) < 1e-5);
  }
  // Each rank holds 1/N of the experts: less model state than plain data parallelism at stage 0.
  CHECK(stage0.modelStateGb.back() < 0.8 * dense.modelStateGb.back());
}

TEST_CASE("expert-parallel checkpoints resume exactly, and load at another expert-parallel size",
          "[dist][zero][moe][checkpoint]") {
  auto ctx = world();
  int ranks = ctx->worldSize();
  std::string tag = std::to_string(ctx->rank());
  std::vector<std::string> moe = {"model.moe_num_experts=4",
                                  "model.moe_top_k=2",
                                  "model.moe_every=1",
                                  "model.moe_capacity_factor=2",
                                  "model.moe_eval_capacity_factor=2",
                                  "model.moe_expert_parallel_size=" + std::to_string(ranks)};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> sets = moe;
    sets.insert(sets.end(), more.begin(), more.end());
    return sets;
  };
  Run straight = trainRun(ctx, "moe-resume-straight", 3, with({"checkpoint.save_interval=10"}));
  fs::path saved = fs::path(straight.checkpoint).parent_path() / "step-10";
  Run resumed = trainRun(ctx, "moe-resume-again", 3, with({"checkpoint.load=" + saved.string()}));
  // Every expert's state, from every rank's pieces, into one rank that holds all experts.
  std::vector<std::string> whole(moe.begin(), moe.end() - 1);  // no expert parallelism
  whole.push_back("checkpoint.load=" + saved.string());
  Run single = trainRun(alone(), "moe-resume-single-" + tag, 0, whole);
  if (!ctx->isMain()) return;
  CHECK(straight.losses.size() == 20);
  CHECK(resumed.losses.size() == 10);
  std::vector<double> tail(straight.losses.begin() + 10, straight.losses.end());
  CHECK(resumed.losses == tail);
  CHECK(single.losses.size() == 10);
  CHECK(worstRelative(single.losses, tail) < 1e-5);
}

TEST_CASE("the start-up broadcast gives every rank rank 0's weights, whatever each rank built",
          "[dist][zero]") {
  auto ctx = world();
  Device device = onGpu() ? ctx->device() : Device::cpu();
  std::vector<std::string> dtypes = {"fp32"};
  if (onGpu()) dtypes.push_back("bf16");  // 16-bit chunks: the fp32 masters are broadcast, then copied in
  for (const std::string& dtype : dtypes)
    for (int stage : {0, 2}) {
      auto config = [&](int seed) {
        std::vector<std::string> sets = {
            "data.path=" + corpusFor(dist::launchInfoFromEnvironment().rank).string(),
            "model.num_layers=2",
            "model.hidden_size=32",
            "model.num_attention_heads=2",
            "model.seq_length=32",
            "model.vocab_size=256",
            "zero_optimization.chunk_size_mb=0.02",
            "precision.dtype=" + dtype,
            "zero_optimization.stage=" + std::to_string(stage),
            "train.seed=" + std::to_string(seed)};
        for (auto& e : extraSets()) sets.push_back(e);
        return config::parseConfig("", "broadcast-test", sets);
      };
      // Each rank builds the model from a seed of its own.
      config::Config mine = config(100 + ctx->rank());
      auto objective = data::makeObjective(mine, device);
      DType compute = config::computeDTypeFor(mine, device);
      train::ZeroStepEngine engine(*objective, mine, device, compute, &ctx->world());
      // What rank 0 built, built again here.
      config::Config first = config(100);
      auto reference = data::makeObjective(first, device);
      std::map<std::string, Tensor> expected;
      for (auto& [name, p] : reference->model().namedParameters()) expected[name] = p;
      size_t compared = 0, different = 0;
      for (auto& [name, p] : objective->model().namedParameters()) {
        std::vector<double> got = ops::to(p, Device::cpu(), DType::F64).toVector<double>();
        std::vector<double> want =
            ops::to(ops::to(expected.at(name), device, compute), Device::cpu(), DType::F64)
                .toVector<double>();
        ++compared;
        different += got != want;
      }
      INFO(dtype << " at stage " << stage << " on rank " << ctx->rank());
      CHECK(compared == expected.size());
      CHECK(different == 0);
    }
}

TEST_CASE(
    "the delayed SSD update at ZeRO stages 1 to 3 on N ranks: a checkpoint changes nothing, a resume "
    "continues exactly",
    "[dist][zero][store][delayed]") {
  // NOTE [Delayed update checkpoints] in train/CheckpointPieces.h: every chunk's state on the SSD (each
  // rank's file under its own directory), updated one step late. The run that saves at steps 5 and 10, each
  // time with that step's update pending, is the straight run step for step, and the run resumed from step 10
  // continues it bit for bit. The same checkpoint loads on one rank, where only the gradients' sums differ.
  auto ctx = world();
  std::string tag = std::to_string(ctx->rank());
  fs::path nvme =
      fs::temp_directory_path() / ("strata-zero-delayed-nvme-" + std::to_string(::getppid()) + "-" + tag);
  std::vector<std::string> delayed = {"zero_optimization.offload_optimizer.device=nvme",
                                      "zero_optimization.nvme_path=" + nvme.string(),
                                      "store.delayed_update=true", "train.sample_length=0"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> sets = delayed;
    sets.insert(sets.end(), more.begin(), more.end());
    return sets;
  };
  for (int stage : {1, 2, 3}) {
    std::string name = "delayed-stage" + std::to_string(stage);
    Run straight = trainRun(ctx, name + "-straight", stage, delayed);
    Run saving = trainRun(ctx, name + "-saving", stage,
                          with({"train.exit_interval=10", "checkpoint.save_interval=5"}));
    fs::path saved = fs::path(saving.checkpoint).parent_path() / "step-10";
    Run resumed = trainRun(ctx, name + "-again", stage, with({"checkpoint.load=" + saved.string()}));
    Run single =
        trainRun(alone(), name + "-single-" + tag, stage, with({"checkpoint.load=" + saved.string()}));
    if (!ctx->isMain()) continue;
    INFO("stage " << stage << " on " << ctx->worldSize() << " ranks");
    CHECK(straight.losses.size() == 20);
    CHECK(straight.stateNvmeGb.back() > 0);
    std::vector<double> head(straight.losses.begin(), straight.losses.begin() + 10);
    CHECK(saving.losses == head);
    CHECK(saving.valLosses ==
          std::vector<double>(straight.valLosses.begin(), straight.valLosses.begin() + 1));
    std::vector<double> tail(straight.losses.begin() + 10, straight.losses.end());
    CHECK(resumed.losses == tail);
    CHECK(resumed.valLosses == std::vector<double>(straight.valLosses.begin() + 1, straight.valLosses.end()));
    CHECK(single.losses.size() == 10);
    CHECK(worstRelative(single.losses, tail) < 1e-4);
  }
}

TEST_CASE(
    "the memory tracer moves state with a delayed SSD update pending and changes no number, at ZeRO "
    "stages 1 and 2 on N ranks",
    "[dist][zero][store][delayed][tracer]") {
  // NOTE [Delayed SSD update] in optim/AdamW.h: the run starts traced (a "device" of 1.9x the model state
  // per rank), its optimizer state in host memory and on the SSD, the SSD's updated one step late. After the
  // first step, with that step's update pending, the tracer brings every SSD chunk's state onto the device,
  // where nothing is delayed: each rank writes its moved shards' pending parameters and the ranks gather the
  // chunks again. From then on the run is the one with all state in memory, number for number.
  auto ctx = world();
  if (onGpu()) {
    // The stand-in device (STRATA_DEVICE_MEMORY_GB, 1.9x the state) is sized by the CPU allocator's peak; the
    // GPU's (2 MiB blocks, cuBLAS workspaces) leaves the tracer room for only some chunks, and those left on
    // the SSD stay one update late: another run, not a failure. The delayed update's resume is checked on the
    // GPU by the case above.
    WARN("the delayed-update tracer case is sized for the CPU: skipped on the GPU");
    return;
  }
  std::string tag = std::to_string(ctx->rank());
  fs::path nvme =
      fs::temp_directory_path() / ("strata-zero-tracer-nvme-" + std::to_string(::getppid()) + "-" + tag);
  std::vector<std::string> shape = {"model.hidden_size=128", "model.seq_length=16", "train.train_iters=6",
                                    "train.eval_interval=0", "train.sample_length=0"};
  for (int stage : {1, 2}) {
    std::string name = "delayed-tracer-stage" + std::to_string(stage);
    Run memory = trainRun(ctx, name + "-memory", stage, shape);
    // The model state per rank, from rank 0's metrics (every rank reads them).
    ctx->world().communicator().barrier();
    double state = 0;
    {
      std::ifstream in(runDir(name + "-memory") / "metrics.jsonl");
      std::string line;
      while (std::getline(in, line)) state = nlohmann::json::parse(line)["mem_model_state_gb"].get<double>();
    }
    REQUIRE(state > 0);
    std::vector<std::string> traced = shape;
    traced.insert(traced.end(),
                  {"store.host_budget_gb=" + std::to_string(0.3 * state), "store.nvme_state_dtype=fp32",
                   "zero_optimization.nvme_path=" + nvme.string(), "store.delayed_update=true"});
    const char* previous = std::getenv("STRATA_DEVICE_MEMORY_GB");
    std::string saved = previous ? previous : "";
    setenv("STRATA_DEVICE_MEMORY_GB", std::to_string(1.9 * state).c_str(), 1);
    Run moved;
    uint64_t startNvme = 0, startDevice = 0;
    try {
      {
        // The placement the first step runs with.
        config::Config config = runConfig(name + "-engine", stage, traced);
        auto model = models::buildModel(config::modelSpecFrom(config, Device::cpu()));
        data::CausalLmObjective objective(model, nullptr);
        train::ZeroStepEngine engine(objective, config, Device::cpu(), DType::F32, &ctx->world());
        startNvme = engine.placement().bytes[int(zero::Tier::Nvme)];
        startDevice = engine.placement().chunksOn(zero::Tier::Device);
      }
      moved = trainRun(ctx, name + "-traced", stage, traced);
    } catch (...) {
      saved.empty() ? unsetenv("STRATA_DEVICE_MEMORY_GB")
                    : setenv("STRATA_DEVICE_MEMORY_GB", saved.c_str(), 1);
      throw;
    }
    saved.empty() ? unsetenv("STRATA_DEVICE_MEMORY_GB") : setenv("STRATA_DEVICE_MEMORY_GB", saved.c_str(), 1);
    INFO("stage " << stage << " on " << ctx->worldSize() << " ranks, rank " << ctx->rank());
    CHECK(startNvme > 0);
    CHECK(startDevice == 0);
    if (!ctx->isMain()) continue;
    CHECK(memory.losses.size() == 6);
    CHECK(moved.losses == memory.losses);
    CHECK(moved.stateNvmeGb.back() == 0);  // every SSD chunk came back (the largest rank's figure)
  }
}

TEST_CASE("tensor parallelism (parallel.tensor 2) on N ranks trains like one rank at ZeRO stages 0 to 3",
          "[dist][tensor]") {
  auto ctx = world();
  int ranks = ctx->worldSize();
  // N = 2: one tensor-parallel pair; N = 4: two data-parallel ranks, each a tensor-parallel pair. The global
  // batch is 8 sequences either way, and the norm is clipped (optimizer.clip_grad 1 by default), so the
  // slices' squares must meet across the pair.
  Run reference = trainRun(alone(), "tp-one-rank-" + std::to_string(ctx->rank()), 0);
  Run stage0 = trainRun(ctx, "tp2-stage0", 0, {"parallel.tensor=2"});
  Run stage2 = trainRun(ctx, "tp2-stage2", 2, {"parallel.tensor=2"});
  // Stage 3 gathers each rank's slices over the data-parallel group, module by module.
  Run stage3 = trainRun(ctx, "tp2-stage3", 3, {"parallel.tensor=2"});
  // Sequence parallelism: the norms and the residual stream on half of each sequence.
  Run sequence = trainRun(ctx, "tp2-sp-stage3", 3, {"parallel.tensor=2", "parallel.sequence_parallel=true"});
  if (!ctx->isMain()) return;
  INFO(ranks << " ranks");
  CHECK(reference.losses.size() == 20);
  for (const Run* run : {&stage0, &stage2, &stage3, &sequence}) {
    CHECK(run->losses.size() == 20);
    CHECK(worstRelative(run->losses, reference.losses) < 1e-5);
    CHECK(worstRelative(run->gradNorms, reference.gradNorms) < 1e-5);
    CHECK(run->valLosses.size() == 2);
    CHECK(worstRelative(run->valLosses, reference.valLosses) < 1e-5);
    // Generation gathers the vocabulary-parallel logits: the same greedy-free sample as one rank.
    CHECK(run->sample == reference.sample);
  }
  CHECK(stage0.losses.back() < stage0.losses.front() - 0.5);
  // The same sums at both stages (ZeRO over the data-parallel group only).
  CHECK(stage2.losses == stage0.losses);
  CHECK(stage3.losses == stage0.losses);
  // Each rank holds about half of the model: the attention, MLP and embedding slices.
  CHECK(stage0.modelStateGb.back() < 0.7 * reference.modelStateGb.back());
}

TEST_CASE("tensor-parallel checkpoints resume exactly at their layout and refuse another",
          "[dist][tensor][checkpoint]") {
  auto ctx = world();
  std::string tag = std::to_string(ctx->rank());
  Run straight = trainRun(ctx, "tp-resume-straight", 1, {"parallel.tensor=2", "checkpoint.save_interval=10"});
  fs::path saved = fs::path(straight.checkpoint).parent_path() / "step-10";
  Run resumed =
      trainRun(ctx, "tp-resume-again", 1, {"parallel.tensor=2", "checkpoint.load=" + saved.string()});
  // At stage 3 each rank's pieces are its shard of its slices.
  Run straight3 =
      trainRun(ctx, "tp-resume-straight3", 3, {"parallel.tensor=2", "checkpoint.save_interval=10"});
  fs::path saved3 = fs::path(straight3.checkpoint).parent_path() / "step-10";
  Run resumed3 =
      trainRun(ctx, "tp-resume-again3", 3, {"parallel.tensor=2", "checkpoint.load=" + saved3.string()});
  // Adafactor's factored state reloads into its own layout, checked against the data-parallel ranks that
  // shard it (the world over parallel.tensor).
  std::vector<std::string> adafactor{"parallel.tensor=2", "optimizer.type=adafactor", "optimizer.lr=0.01"};
  std::vector<std::string> adafactorSave = adafactor;
  adafactorSave.push_back("checkpoint.save_interval=10");
  Run straightA = trainRun(ctx, "tp-resume-adafactor", 1, adafactorSave);
  std::vector<std::string> adafactorLoad = adafactor;
  adafactorLoad.push_back("checkpoint.load=" +
                          (fs::path(straightA.checkpoint).parent_path() / "step-10").string());
  Run resumedA = trainRun(ctx, "tp-resume-adafactor-again", 1, adafactorLoad);
  // One rank alone cannot take the slices. A resume takes parallel.tensor 2 from the checkpoint, which one
  // rank cannot split; the weights alone at parallel.tensor 1 are refused naming the checkpoint's layout.
  auto refusal = [&](const std::string& name, const std::vector<std::string>& sets) {
    try {
      trainRun(alone(), name + "-" + tag, 0, sets);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string resume = refusal("tp-resume-single", {"checkpoint.load=" + saved.string()});
  std::string weights =
      refusal("tp-weights-single", {"checkpoint.load=" + saved.string(), "checkpoint.load_model_only=true"});
  if (!ctx->isMain()) return;
  CHECK(straight.losses.size() == 20);
  CHECK(resumed.losses.size() == 10);
  std::vector<double> tail(straight.losses.begin() + 10, straight.losses.end());
  CHECK(resumed.losses == tail);
  CHECK(resumed3.losses.size() == 10);
  CHECK(resumed3.losses == std::vector<double>(straight3.losses.begin() + 10, straight3.losses.end()));
  CHECK(resumedA.losses.size() == 10);
  CHECK(resumedA.losses == std::vector<double>(straightA.losses.begin() + 10, straightA.losses.end()));
  // strata generate and convert read whole parameters: the slices joined, each rank's slice of them where it
  // belongs, the whole parameters once, every one in the one-rank model's shape.
  std::map<std::string, Tensor> whole = train::loadModelShards(saved.string());
  train::ChunkCheckpointReader reader(saved.string());
  auto saved1 = [&](const std::string& name) {
    const auto& p = reader.parameters().at("tp1/" + name);
    Tensor t = Tensor::empty(p.shape, p.dtype, Device::cpu());
    reader.readParameter("tp1/" + name, t.data());
    return t.toVector<float>();
  };
  CHECK(whole.at("h.0.attn.qkv.weight").shape() == Shape{32, 96});
  CHECK(whole.at("wte.weight").shape() == Shape{256, 32});
  CHECK(whole.at("h.1.mlp.proj.weight").shape() == Shape{128, 32});
  CHECK(whole.count("tp0/wte.weight") == 0);
  CHECK(nn::columnSlice(whole.at("h.0.attn.qkv.weight"), 3, 2, 1).toVector<float>() ==
        saved1("h.0.attn.qkv.weight"));
  CHECK(whole.at("wte.weight").narrow(0, 128, 128).contiguous().toVector<float>() == saved1("wte.weight"));
  CHECK(whole.at("h.1.mlp.proj.weight").narrow(0, 64, 64).contiguous().toVector<float>() ==
        saved1("h.1.mlp.proj.weight"));
  CHECK(whole.at("h.1.ln_2.weight").toVector<float>() == saved1("h.1.ln_2.weight"));
  // One rank with the joined weights of the last checkpoint samples what the tensor-parallel run sampled.
  std::string last = straight.checkpoint;
  config::Config c = interop::checkpointConfig(last);
  std::shared_ptr<data::Objective> objective = data::makeObjective(c, Device::cpu());
  std::map<std::string, Tensor> lastWeights = train::loadModelShards(last);
  for (auto& [name, p] : objective->model().namedParameters()) ops::copy(p, lastWeights.at(name));
  std::optional<data::Generation> g = objective->generate(
      c.train.samplePrompt, data::GenerateOptions{c.train.sampleLength, -1, 40, c.train.seed}, DType::F32);
  REQUIRE(g.has_value());
  CHECK(!straight.sample.empty());
  CHECK(g->text == straight.sample);
  INFO(resume << "\n" << weights);
  CHECK(contains(resume, "parallel.tensor (2) must divide the number of ranks (1)"));
  CHECK(contains(weights,
                 "was saved with parallel.tensor: 2 on " + std::to_string(ctx->worldSize()) + " ranks"));
  CHECK(contains(weights, "this run has parallel.tensor: 1 on 1 rank"));
}

TEST_CASE(
    "bert and t5 at parallel.tensor 2 train like one rank, resume exactly from their slices, and join into "
    "the one-rank model's tensors",
    "[dist][tensor][zoo][checkpoint]") {
  auto ctx = world();
  std::string tag = std::to_string(ctx->rank());
  // The zoo test's shapes, 20 steps at a global batch of 8, saved at step 10: on 2 ranks one tensor-parallel
  // pair, on 4 two data-parallel pairs.
  std::map<std::string, std::vector<std::string>> archs = {
      {"bert",
       {"model.arch=bert", "model.vocab_size=260", "model.bert_binary_head=true",
        "model.layer_norm_eps=1e-12", "train.sample_length=0", "checkpoint.save_interval=10"}},
      {"t5",
       {"model.arch=t5", "model.vocab_size=384", "model.bias=false", "model.kv_channels=16",
        "model.ffn_hidden_size=48", "model.decoder_num_layers=1", "model.decoder_seq_length=16",
        "model.activation=gated_gelu", "model.untie_embeddings_and_output_weights=true",
        "train.sample_length=6", "checkpoint.save_interval=10"}}};
  for (auto& [arch, sets] : archs) {
    Run reference = trainRun(alone(), arch + "-tp-one-rank-" + tag, 1, sets);
    std::vector<std::string> split = sets;
    split.push_back("parallel.tensor=2");
    Run straight = trainRun(ctx, arch + "-tp2", 1, split);
    fs::path saved = fs::path(straight.checkpoint).parent_path() / "step-10";
    std::vector<std::string> again = split;
    again.push_back("checkpoint.load=" + saved.string());
    Run resumed = trainRun(ctx, arch + "-tp2-again", 1, again);
    if (!ctx->isMain()) continue;
    INFO(arch << " on " << ctx->worldSize() << " ranks");
    REQUIRE(reference.losses.size() == 20);
    REQUIRE(straight.losses.size() == 20);
    CHECK(worstRelative(straight.losses, reference.losses) < 1e-5);
    CHECK(worstRelative(straight.gradNorms, reference.gradNorms) < 1e-5);
    CHECK(straight.valLosses.size() == 2);
    CHECK(worstRelative(straight.valLosses, reference.valLosses) < 1e-5);
    CHECK(straight.losses.back() < straight.losses.front());
    // T5's greedy decoding reads the gathered logits.
    CHECK(straight.sample == reference.sample);
    REQUIRE(resumed.losses.size() == 10);
    CHECK(resumed.losses == std::vector<double>(straight.losses.begin() + 10, straight.losses.end()));
    // What strata convert and generate read: the slices joined into the one-rank model's tensors, every one
    // of the one-rank checkpoint's names and shapes, its values to the rounding of 10 steps.
    std::map<std::string, Tensor> whole = train::loadModelShards(saved.string());
    std::map<std::string, Tensor> one =
        train::loadModelShards((fs::path(reference.checkpoint).parent_path() / "step-10").string());
    CHECK(whole.size() == one.size());
    for (auto& [name, t] : one) {
      INFO(name);
      REQUIRE(whole.count(name) == 1);
      REQUIRE(whole.at(name).shape() == t.shape());
      std::vector<float> a = whole.at(name).toVector<float>(), b = t.toVector<float>();
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::abs(a[i] - b[i])));
      CHECK(worst < 1e-4);
    }
  }
}

TEST_CASE("GPT-MoE at parallel.tensor 2, and with expert parallelism beside it, trains like one rank",
          "[dist][tensor][moe]") {
  // NOTE [Experts under tensor parallelism] in nn/MoE.h. The expert test's GPT-MoE (4 experts, top-2, a
  // capacity no token overflows). 2 ranks: T2; 4 ranks: D2 x T2, and D2 x T2 with the experts split over the
  // two data-parallel ranks of each tensor rank (model.moe_expert_parallel_size 2).
  auto ctx = world();
  int ranks = ctx->worldSize();
  std::vector<std::string> moe = {"model.moe_num_experts=4", "model.moe_top_k=2", "model.moe_every=1",
                                  "model.moe_capacity_factor=2", "model.moe_eval_capacity_factor=2"};
  auto with = [&](std::vector<std::string> sets, std::vector<std::string> more) {
    sets.insert(sets.end(), more.begin(), more.end());
    return sets;
  };
  Run reference = trainRun(alone(), "moe-tp-one-rank-" + std::to_string(ctx->rank()), 0, moe);
  Run tensor = trainRun(ctx, "moe-tp2", 0, with(moe, {"parallel.tensor=2"}));
  Run tensor3 = trainRun(ctx, "moe-tp2-stage3", 3, with(moe, {"parallel.tensor=2"}));
  Run experts;
  if (ranks == 4)
    experts =
        trainRun(ctx, "moe-ep2-tp2", 2, with(moe, {"parallel.tensor=2", "model.moe_expert_parallel_size=2"}));
  if (!ctx->isMain()) return;
  INFO(ranks << " ranks");
  REQUIRE(reference.losses.size() == 20);
  std::vector<const Run*> runs{&tensor, &tensor3};
  if (ranks == 4) runs.push_back(&experts);
  for (const Run* run : runs) {
    REQUIRE(run->losses.size() == 20);
    CHECK(worstRelative(run->losses, reference.losses) < 1e-5);
    CHECK(worstRelative(run->gradNorms, reference.gradNorms) < 1e-5);
    CHECK(worstRelative(run->valLosses, reference.valLosses) < 1e-5);
    CHECK(run->sample == reference.sample);
  }
  CHECK(tensor3.losses == tensor.losses);
  CHECK(tensor.losses.back() < tensor.losses.front() - 0.5);
}

TEST_CASE("parallel.tensor is refused where it does not fit and the error names the key", "[dist][tensor]") {
  auto ctx = world();
  auto refusal = [&](const std::string& name, int stage, const std::vector<std::string>& sets) {
    return refusalOf(ctx, name, stage, sets);
  };
  std::string notDividing = refusal("tp-3", 0, {"parallel.tensor=3"});
  std::string heads = refusal("tp-heads", 0, {"parallel.tensor=2", "model.num_attention_heads=1"});
  std::string sequence = refusal("sp-alone", 0, {"parallel.sequence_parallel=true"});
  // Sequence parallelism splits gpt's dense blocks only.
  std::string bertSequence = refusal("sp-bert", 0,
                                     {"parallel.tensor=2", "parallel.sequence_parallel=true",
                                      "model.arch=bert", "model.vocab_size=260", "train.sample_length=0"});
  std::string moeSequence = refusal(
      "sp-moe", 0, {"parallel.tensor=2", "parallel.sequence_parallel=true", "model.moe_num_experts=2"});
  // Expert parallelism splits the data-parallel ranks of a tensor rank.
  std::string experts =
      refusal("tp-ep-too-wide", 0,
              {"parallel.tensor=2", "model.moe_num_experts=" + std::to_string(std::max(4, ctx->worldSize())),
               "model.moe_expert_parallel_size=" + std::to_string(ctx->worldSize())});
  if (!ctx->isMain()) {
    CHECK(notDividing == "reported by rank 0");
    return;
  }
  INFO(notDividing << "\n"
                   << heads << "\n"
                   << sequence << "\n"
                   << bertSequence << "\n"
                   << moeSequence << "\n"
                   << experts);
  CHECK(contains(notDividing, "parallel.tensor (3) must divide the number of ranks"));
  CHECK(contains(heads, "parallel.tensor (2) must divide model.num_attention_heads (1)"));
  CHECK(contains(sequence, "parallel.sequence_parallel splits the sequence over a tensor-parallel group"));
  CHECK(contains(bertSequence,
                 "parallel.sequence_parallel splits the sequence of gpt's dense blocks only, not model.arch "
                 "'bert'; set it to false"));
  CHECK(
      contains(moeSequence, "only, not mixture-of-experts layers (model.moe_num_experts); set it to false"));
  CHECK(contains(experts, "model.moe_expert_parallel_size (" + std::to_string(ctx->worldSize()) +
                              ") must divide the number of data-parallel ranks (" +
                              std::to_string(ctx->worldSize() / 2) + ")"));
}

TEST_CASE("PowerSGD at rank 2 trains close to the exact reduction at ZeRO stages 0 and 1, sending less",
          "[dist][powersgd]") {
  auto ctx = world();
  std::vector<std::string> plainSets = {"train.train_iters=30", "train.eval_interval=30"};
  std::vector<std::string> sets = plainSets;
  sets.insert(sets.end(), {"dist.powersgd_rank=2", "dist.powersgd_start_iter=5"});
  Run plain = trainRun(ctx, "powersgd-plain", 0, plainSets);
  Run stage0 = trainRun(ctx, "powersgd-stage0", 0, sets);
  Run stage1 = trainRun(ctx, "powersgd-stage1", 1, sets);
  if (!ctx->isMain()) return;
  REQUIRE(plain.losses.size() == 30);
  REQUIRE(stage0.losses.size() == 30);
  REQUIRE(stage1.losses.size() == 30);
  std::printf("PowerSGD rank 2 on %d ranks: %lld bytes a step instead of %lld (%.1fx less)\n",
              ctx->worldSize(), (long long)stage0.reducedBytesPowerSgd, (long long)stage0.reducedBytes,
              double(stage0.reducedBytes) / double(stage0.reducedBytesPowerSgd));
  CHECK(plain.reducedBytesPowerSgd == plain.reducedBytes);
  CHECK(stage0.reducedBytes == plain.reducedBytes);
  CHECK(3 * stage0.reducedBytesPowerSgd < stage0.reducedBytes);
  for (const Run* run : {&stage0, &stage1}) {
    INFO("plain " << Catch::Detail::stringify(plain.losses) << "\nPowerSGD "
                  << Catch::Detail::stringify(run->losses));
    // The first 5 steps (and the loss after them) are the exact reduction's, bit for bit at stage 0; then
    // the losses stay close to the exact reduction's and fall as far.
    std::vector<double> head(run->losses.begin(), run->losses.begin() + 6);
    std::vector<double> plainHead(plain.losses.begin(), plain.losses.begin() + 6);
    if (run == &stage0) CHECK(head == plainHead);
    CHECK(run->losses[6] != plain.losses[6]);
    CHECK(worstRelative(run->losses, plain.losses) < 0.02);
    double first = run->losses.front();
    double last = (run->losses[27] + run->losses[28] + run->losses[29]) / 3;
    double plainLast = (plain.losses[27] + plain.losses[28] + plain.losses[29]) / 3;
    CHECK(last < 0.8 * first);
    CHECK(last < plainLast * 1.03);
  }
}

TEST_CASE(
    "PowerSGD resumes exactly from its checkpoints, and is refused at ZeRO stages 2 and 3 and by a "
    "checkpoint without its state",
    "[dist][powersgd]") {
  auto ctx = world();
  auto refusal = [&](const std::string& name, int stage, const std::vector<std::string>& sets) {
    return refusalOf(ctx, name, stage, sets);
  };
  std::string stage2 = refusal("powersgd-stage2", 2, {"dist.powersgd_rank=2"});
  std::string stage3 = refusal("powersgd-stage3", 3, {"dist.powersgd_rank=2"});
  // Saved at step 10, PowerSGD running since step 5 (its Q matrices and error feedback in the checkpoint),
  // and before it starts at step 15: both resumes continue exactly.
  std::vector<Run> straight, resumed;
  std::vector<fs::path> saved;
  for (const char* start : {"5", "15"}) {
    std::vector<std::string> sets = {"dist.powersgd_rank=2",
                                     std::string("dist.powersgd_start_iter=") + start};
    std::vector<std::string> saving = sets;
    saving.push_back("checkpoint.save_interval=10");
    straight.push_back(trainRun(ctx, std::string("powersgd-resume-straight-") + start, 1, saving));
    saved.push_back(fs::path(straight.back().checkpoint).parent_path() / "step-10");
    std::vector<std::string> again = sets;
    again.push_back("checkpoint.load=" + saved.back().string());
    resumed.push_back(trainRun(ctx, std::string("powersgd-resume-again-") + start, 1, again));
  }
  // PowerSGD from step 5 resumed from the checkpoint saved before it ran: its state is missing. And state of
  // another rank r does not fit.
  std::string missing = refusal("powersgd-resume-missing", 1,
                                {"dist.powersgd_rank=2", "dist.powersgd_start_iter=5",
                                 "checkpoint.allow_changes=true", "checkpoint.load=" + saved[1].string()});
  std::string otherRank = refusal("powersgd-resume-other-rank", 1,
                                  {"dist.powersgd_rank=3", "dist.powersgd_start_iter=5",
                                   "checkpoint.allow_changes=true", "checkpoint.load=" + saved[0].string()});
  if (!ctx->isMain()) return;
  INFO(stage2 << "\n" << stage3 << "\n" << missing << "\n" << otherRank);
  CHECK(contains(stage2, "dist.powersgd_rank: 2 needs ZeRO stage 0 or 1 (zero_optimization.stage is 2"));
  CHECK(contains(stage3, "dist.powersgd_rank: 2 needs ZeRO stage 0 or 1 (zero_optimization.stage is 3"));
  CHECK(contains(missing, "resuming at optimizer step 10 with dist.powersgd_rank"));
  CHECK(contains(missing, "from a checkpoint without PowerSGD's state"));
  CHECK(
      contains(otherRank, "holds PowerSGD state (Q matrices and error feedback) that does not fit this run"));
  for (size_t i = 0; i < 2; ++i) {
    REQUIRE(straight[i].losses.size() == 20);
    std::vector<double> tail(straight[i].losses.begin() + 10, straight[i].losses.end());
    CHECK(resumed[i].losses == tail);
  }
}

namespace {

// The largest difference between this rank's parameters in `run` and the same ones of `reference` (the
// parameters of the same name and shape: a pipeline stage's, the whole ones under tensor parallelism), and
// how many were compared.
std::pair<double, int> parameterGap(const Run& run, const Run& reference) {
  double worst = 0;
  int compared = 0;
  for (const auto& [name, values] : run.parameters) {
    auto it = reference.parameters.find(name);
    if (it == reference.parameters.end() || run.shapes.at(name) != reference.shapes.at(name)) continue;
    ++compared;
    for (size_t i = 0; i < values.size(); ++i)
      worst = std::max(worst, double(std::abs(values[i] - it->second[i])));
  }
  return {worst, compared};
}

}  // namespace

TEST_CASE("pipeline parallelism trains like one rank: 1F1B, interleaved, with data and tensor parallelism",
          "[dist][pipeline]") {
  auto ctx = world();
  int ranks = ctx->worldSize();
  std::string tag = std::to_string(ctx->rank());
  // Four blocks, so that four stages, or two stages of two virtual stages, each get one.
  std::vector<std::string> four{"model.num_layers=4"};
  auto with = [&](std::vector<std::string> sets) {
    sets.push_back("model.num_layers=4");
    return sets;
  };
  Run reference = trainRun(alone(), "pp-one-rank-" + tag, 0, four);
  std::map<std::string, Run> runs;
  runs["P2 stage 0"] = trainRun(ctx, "pp2-stage0", 0, with({"parallel.pipeline=2"}));
  runs["P2 V2 stage 1"] =
      trainRun(ctx, "pp2-v2-stage1", 1, with({"parallel.pipeline=2", "parallel.virtual_stages=2"}));
  // The store's tiers compose: each stage's optimizer state on its device, host and SSD. (The memory plan
  // weighs the whole model's parameters against the device budget; on 4 ranks each rank keeps half of its
  // stage's state; on 8, at stage 0, all of it, as on 2.)
  fs::path nvme = fs::temp_directory_path() /
                  ("strata-pp-nvme-" + std::to_string(::getppid()) + "-" + std::to_string(ctx->rank()));
  runs["P2 on three tiers"] = trainRun(
      ctx, "pp2-tiers", ranks == 8 ? 0 : 1,
      with({"parallel.pipeline=2", std::string("store.gpu_budget_gb=") + (ranks == 4 ? "0.00025" : "0.0003"),
            "store.host_budget_gb=0.00006", "zero_optimization.nvme_path=" + nvme.string()}));
  if (ctx->isMain()) {
    CHECK(runs["P2 on three tiers"].stateNvmeGb.back() > 0);
    CHECK(runs["P2 on three tiers"].stateHostGb.back() > 0);
  }
  if (ranks == 4) {
    runs["P4 stage 2"] = trainRun(ctx, "pp4-stage2", 2, with({"parallel.pipeline=4"}));
    runs["D2 x P2 stage 2"] = trainRun(ctx, "pp2-dp2-stage2", 2, with({"parallel.pipeline=2"}));
    runs["T2 x P2 stage 1"] =
        trainRun(ctx, "pp2-tp2-stage1", 1, with({"parallel.pipeline=2", "parallel.tensor=2"}));
  }
  if (ranks == 8) {  // the three axes at once (mpirun -np 8)
    runs["D2 x T2 x P2 stage 1"] =
        trainRun(ctx, "pp2-tp2-dp2-stage1", 1, with({"parallel.pipeline=2", "parallel.tensor=2"}));
    runs["D2 x T2 x P2 V2 stage 2"] =
        trainRun(ctx, "pp2-v2-tp2-dp2-stage2", 2,
                 with({"parallel.pipeline=2", "parallel.virtual_stages=2", "parallel.tensor=2",
                       "parallel.sequence_parallel=true"}));
  }
  for (const auto& [layout, run] : runs) {
    INFO(layout << " on " << ranks << " ranks, rank " << ctx->rank());
    // Every rank holds part of the model and ends with the one-rank model's numbers for it (the last
    // stage's copy of the tied embedding too).
    auto [gap, compared] = parameterGap(run, reference);
    CHECK(compared > 0);
    CHECK(run.parameters.size() < reference.parameters.size());
    CHECK(gap < 1e-5);
    if (!ctx->isMain()) continue;
    // Rank 0 (the first stage) writes the last stage's loss.
    CHECK(run.losses.size() == 20);
    CHECK(worstRelative(run.losses, reference.losses) < 1e-5);
    CHECK(worstRelative(run.gradNorms, reference.gradNorms) < 1e-5);
    CHECK(run.valLosses.size() == 2);
    CHECK(worstRelative(run.valLosses, reference.valLosses) < 1e-5);
  }
  if (ctx->isMain()) CHECK(reference.losses.back() < reference.losses.front() - 0.5);
}

TEST_CASE("PowerSGD under a pipeline compresses each stage's data-parallel reduction, close to the exact one",
          "[dist][pipeline]") {
  auto ctx = world();
  // Data 2 x pipeline 2: the compressed reduction runs over each stage's two data-parallel ranks.
  if (ctx->worldSize() != 4) return;
  std::vector<std::string> plainSets = {"model.num_layers=4", "parallel.pipeline=2", "train.train_iters=30",
                                        "train.eval_interval=30"};
  std::vector<std::string> sets = plainSets;
  sets.insert(sets.end(), {"dist.powersgd_rank=2", "dist.powersgd_start_iter=5"});
  Run plain = trainRun(ctx, "pp-powersgd-plain", 0, plainSets);
  Run compressed = trainRun(ctx, "pp-powersgd", 0, sets);
  if (!ctx->isMain()) return;
  REQUIRE(plain.losses.size() == 30);
  REQUIRE(compressed.losses.size() == 30);
  INFO("plain " << Catch::Detail::stringify(plain.losses) << "\nPowerSGD "
                << Catch::Detail::stringify(compressed.losses));
  CHECK(3 * compressed.reducedBytesPowerSgd < compressed.reducedBytes);
  // The first 5 steps are the exact reduction's, bit for bit; then close to it, falling as far.
  CHECK(std::vector<double>(compressed.losses.begin(), compressed.losses.begin() + 6) ==
        std::vector<double>(plain.losses.begin(), plain.losses.begin() + 6));
  CHECK(compressed.losses[6] != plain.losses[6]);
  CHECK(worstRelative(compressed.losses, plain.losses) < 0.02);
  double last = (compressed.losses[27] + compressed.losses[28] + compressed.losses[29]) / 3;
  double plainLast = (plain.losses[27] + plain.losses[28] + plain.losses[29]) / 3;
  CHECK(last < 0.8 * compressed.losses.front());
  CHECK(last < plainLast * 1.03);
}

TEST_CASE("parallel.pipeline is refused where it does not fit, naming what to set", "[dist][pipeline]") {
  // Fewer micro-batches than stages, or a number that does not divide by them under virtual stages, cannot be
  // configured here: the memory plan asks the global batch to divide by micro_batch_size x all the ranks,
  // which makes the micro-batches a multiple of parallel.pipeline.
  auto ctx = world();
  auto refusal = [&](const std::string& name, int stage, std::vector<std::string> sets) {
    sets.push_back("model.num_layers=4");
    return refusalOf(ctx, name, stage, sets);
  };
  std::string notDividing = refusal("pp-3", 0, {"parallel.pipeline=3"});
  std::string stage3 = refusal("pp-stage3", 3, {"parallel.pipeline=2"});
  std::string virtualAlone = refusal("pp-v-alone", 0, {"parallel.virtual_stages=2"});
  std::string blocks = refusal("pp-blocks", 0, {"parallel.pipeline=2", "parallel.virtual_stages=4"});
  std::string bert = refusal("pp-bert", 0, {"parallel.pipeline=2", "model.arch=bert"});
  if (!ctx->isMain()) {
    CHECK(notDividing == "reported by rank 0");
    return;
  }
  INFO(notDividing << "\n" << stage3 << "\n" << virtualAlone << "\n" << blocks << "\n" << bert);
  CHECK(contains(notDividing, "parallel.pipeline (3) x parallel.tensor (1) must divide the number of ranks"));
  CHECK(contains(stage3, "set zero_optimization.stage to 0, 1 or 2"));
  CHECK(contains(virtualAlone, "set parallel.pipeline > 1 with it"));
  CHECK(contains(blocks, "lower parallel.pipeline or parallel.virtual_stages"));
  CHECK(contains(bert, "parallel.pipeline (2) splits gpt only"));
}

TEST_CASE("pipeline checkpoints resume exactly at their layout, join into one model, and refuse another",
          "[dist][pipeline][checkpoint]") {
  auto ctx = world();
  std::string tag = std::to_string(ctx->rank());
  // Two stages of two virtual stages (with two data-parallel ranks on 4 ranks), ZeRO stage 1.
  std::vector<std::string> layout{"model.num_layers=4", "parallel.pipeline=2", "parallel.virtual_stages=2"};
  std::vector<std::string> saving = layout;
  saving.push_back("checkpoint.save_interval=10");
  Run straight = trainRun(ctx, "pp-resume-straight", 1, saving);
  fs::path saved = fs::path(straight.checkpoint).parent_path() / "step-10";
  std::vector<std::string> loading = layout;
  loading.push_back("checkpoint.load=" + saved.string());
  Run resumed = trainRun(ctx, "pp-resume-again", 1, loading);
  // One rank alone takes neither the run (it keeps parallel.pipeline 2) nor its weights at another layout.
  auto refusal = [&](const std::string& name, const std::vector<std::string>& sets) {
    try {
      trainRun(alone(), name + "-" + tag, 0, sets);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string resume =
      refusal("pp-resume-single", {"model.num_layers=4", "checkpoint.load=" + saved.string()});
  std::string weights =
      refusal("pp-weights-single",
              {"model.num_layers=4", "checkpoint.load=" + saved.string(), "checkpoint.load_model_only=true"});
  // strata convert's reader joins the stages: one whole model, each parameter once, with every rank's final
  // values of its stage.
  std::map<std::string, Tensor> whole = train::loadModelShards(straight.checkpoint);
  for (const char* name :
       {"wte.weight", "wpe.weight", "h.0.attn.qkv.weight", "h.3.mlp.proj.weight", "ln_f.bias"})
    CHECK(whole.count(name) == 1);
  CHECK(whole.size() == 2 + 4 * 12 + 2);  // the two tables, 12 tensors a block, the final norm
  for (const auto& [name, values] : straight.parameters) {
    INFO(name);
    REQUIRE(whole.count(name) == 1);
    CHECK(whole.at(name).toVector<float>() == values);
  }
  INFO(resume << "\n" << weights);
  CHECK(contains(resume, "parallel.pipeline (2) x parallel.tensor (1) must divide the number of ranks (1)"));
  CHECK(contains(weights, "was saved with parallel.pipeline: 2 and parallel.virtual_stages: 2"));
  CHECK(contains(weights, "this run has parallel.pipeline: 1"));
  if (!ctx->isMain()) return;
  CHECK(straight.losses.size() == 20);
  CHECK(resumed.losses.size() == 10);
  CHECK(resumed.losses == std::vector<double>(straight.losses.begin() + 10, straight.losses.end()));
}
