#include "strata/train/Trainer.h"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "models/Zoo.h"
#include "models/gpt/Gpt.h"
#include "strata/autograd/Engine.h"
#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"
#include "strata/core/Allocator.h"
#include "strata/core/Philox.h"
#include "strata/core/Profiler.h"
#include "strata/core/Stream.h"
#include "strata/distributed/Launch.h"
#include "strata/nn/DeferredInit.h"
#include "strata/nn/MoE.h"
#include "strata/nn/TransformerBlock.h"
#include "strata/ops/Ops.h"
#include "strata/optim/LrSchedule.h"
#include "strata/plan/Plan.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Interrupts.h"
#include "strata/train/LossPlot.h"
#include "strata/train/Metrics.h"
#include "strata/train/PipelineSchedule.h"
#include "strata/train/Run.h"
#include "strata/train/StepEngine.h"
#include "strata/zero/GradientReducer.h"

namespace strata::train {

namespace fs = std::filesystem;

namespace {

// Dense bf16 peak for MFU, by device name; 0 when unknown (MFU is then reported as 0).
double peakFlops(Device d, DType compute) {
  if (d.isCpu()) return 0;
  std::string name = deviceName(d);
  bool hopper = name.find("H100") != std::string::npos || name.find("H200") != std::string::npos;
  if (!hopper) return 0;
  return compute == DType::F32 ? 67e12 : 989e12;
}

double gib(size_t bytes) {
  return double(bytes) / double(1u << 30);
}

// Creates `dir` (and its parents) and proves it writable by creating and removing a file in it, so a bad
// out_dir or save path stops the run before any work instead of after it.
void ensureWritableDirectory(const std::string& dir, const std::string& key) {
  std::error_code ec;
  STRATA_USER_CHECK(!fs::exists(dir, ec) || fs::is_directory(dir, ec), "'{}' {} is a file, not a directory",
                    key, dir);
  fs::create_directories(dir, ec);
  STRATA_USER_CHECK(!ec, "'{}' {} cannot be created: {}", key, dir, ec.message());
  fs::path probe = fs::path(dir) / (".strata-write-test-" + std::to_string(getpid()));
  FILE* f = std::fopen(probe.c_str(), "w");
  int err = errno;
  STRATA_USER_CHECK(f != nullptr, "'{}' {} is not writable: {}", key, dir, std::strerror(err));
  std::fclose(f);
  fs::remove(probe, ec);
}

// Keys of the model section that change a tensor's shape or what the model computes: a checkpoint differing
// in one of them can never be loaded. The others (dropout, layer_norm_eps, the training lengths seq_length
// and decoder_seq_length) only warn, and init_std does not matter after the first step.
bool isShapeKey(const std::string& key) {
  for (const char* k :
       {"model.arch", "model.num_layers", "model.hidden_size", "model.num_attention_heads",
        "model.ffn_hidden_size", "model.max_position_embeddings", "model.vocab_size", "model.bias",
        "model.kv_channels", "model.decoder_num_layers", "model.num_tokentypes",
        "model.relative_attention_num_buckets", "model.activation",
        "model.untie_embeddings_and_output_weights", "model.scale_decoder_outputs", "model.bert_binary_head"})
    if (key == k) return true;
  return false;
}

// Refuses a checkpoint whose model section differs from this config in a shape key, listing every
// difference; warns about the others.
void checkModelSection(const std::string& checkpoint, std::map<std::string, std::string> saved,
                       const config::Config& config) {
  std::map<std::string, std::string> current = config::effectiveValues(config, "model.");
  // Checkpoints from before the manifest recorded the model section: compare the keys their config set.
  if (saved.empty())
    for (const auto& [key, value] : readCheckpointState(checkpoint).config)
      if (key.rfind("model.", 0) == 0) saved[key] = value;
  spellOutModelDefaults(saved);
  spellOutModelDefaults(current);
  std::vector<std::string> shape, other;
  for (const auto& [key, value] : saved) {
    auto it = current.find(key);
    if (it == current.end() || config::sameConfigValue(it->second, value) || key == "model.init_std")
      continue;
    std::string line = detail::format("{}: {} in the checkpoint, {} in this config", key, value, it->second);
    if (key == "model.max_position_embeddings")
      line += " (0 means model.seq_length; set it to the checkpoint's to train at another length)";
    (isShapeKey(key) ? shape : other).push_back(line);
  }
  std::string list;
  for (const auto& line : shape) list += "\n  " + line;
  STRATA_USER_CHECK(shape.empty(),
                    "checkpoint {} holds a different model than this config:{}\nUse the checkpoint's model "
                    "settings (its manifest.json lists them), or start without checkpoint.load.",
                    checkpoint, list);
  for (const auto& line : other) spdlog::warn("resuming {} with a changed setting: {}", checkpoint, line);
}

// NOTE [Pipeline checkpoints] in train/CheckpointPieces.h: the stages' parameters load only at the pipeline
// layout that saved them.
void checkPipelineLayout(const CheckpointState& saved, const std::string& checkpoint, int64_t pipeline,
                         int64_t virtualStages) {
  auto valueOf = [&](const char* key) {
    auto it = saved.effective.find(key);
    return it == saved.effective.end() ? int64_t(1) : std::stoll(it->second);
  };
  int64_t savedPipeline = valueOf("parallel.pipeline"), savedVirtual = valueOf("parallel.virtual_stages");
  STRATA_USER_CHECK(
      savedPipeline == pipeline && (pipeline == 1 || savedVirtual == virtualStages),
      "checkpoint {} was saved with parallel.pipeline: {} and parallel.virtual_stages: {}; this run has "
      "parallel.pipeline: {} and parallel.virtual_stages: {}. Resume it at its layout (parallel.pipeline: "
      "{}, "
      "parallel.virtual_stages: {}), or join its stages into one model file with `strata convert` and start "
      "from that",
      checkpoint, savedPipeline, savedVirtual, pipeline, virtualStages, savedPipeline, savedVirtual);
}

// NOTE [Tensor-parallel checkpoints] in train/CheckpointPieces.h: the slices load only at the layout that
// saved them.
void checkTensorLayout(const CheckpointState& saved, const std::string& checkpoint, int64_t tensor,
                       int world) {
  auto it = saved.effective.find("parallel.tensor");
  int64_t savedTensor = it == saved.effective.end() ? 1 : std::stoll(it->second);
  STRATA_USER_CHECK(
      savedTensor == tensor,
      "checkpoint {} was saved with parallel.tensor: {} on {} rank{} ({} data-parallel x {} "
      "tensor-parallel); "
      "this run has parallel.tensor: {} on {} rank{}. Its layers are split {} way{} and load only at that "
      "split: resume with parallel.tensor: {} (mpirun -np a multiple of it)",
      checkpoint, savedTensor, saved.worldSize, saved.worldSize == 1 ? "" : "s",
      std::max<int64_t>(1, saved.worldSize / savedTensor), savedTensor, tensor, world, world == 1 ? "" : "s",
      savedTensor, savedTensor == 1 ? "" : "s", savedTensor);
}

}  // namespace

std::string expertGroupName(int64_t size, int64_t tensor) {
  return "expert_parallel_" + std::to_string(size) + (tensor > 1 ? "_tp" + std::to_string(tensor) : "");
}

std::string expertDataGroupName(int64_t size, int64_t tensor) {
  return "expert_data_parallel_" + std::to_string(size) + (tensor > 1 ? "_tp" + std::to_string(tensor) : "");
}

std::string tensorGroupName(int64_t size) {
  return "tensor_parallel_" + std::to_string(size);
}

std::string dataGroupName(int64_t tensorSize, int64_t pipelineSize) {
  std::string name = "data_parallel_" + std::to_string(tensorSize);
  return pipelineSize > 1 ? name + "_pp" + std::to_string(pipelineSize) : name;
}

std::string pipelineGroupName(int64_t size) {
  return "pipeline_parallel_" + std::to_string(size);
}

std::string embeddingGroupName(int64_t size) {
  return "embedding_pp" + std::to_string(size);
}

Trainer::Trainer(config::Config config, std::shared_ptr<dist::ParallelContext> parallel)
    : parallel_(std::move(parallel)), buildsModel_(true) {
  begin(config);
  agreeOnSetup([&] { plan(config); });
  agreeOnSetup([&] {
    connect();
    tokenizer_ = data::makeTokenizer(config_);
    models::ModelSpec spec = config::modelSpecFrom(config_, device_);
    spec.expertParallel = expertParallel();
    spec.tensorParallel = tensorParallel();
    spec.pipeline = pipelineParallel();
    if (spec.pipeline.active() && parallel_->isMain()) {
      // NOTE [Pipeline stages] in nn/Pipeline.h: the split, once.
      models::GptConfig g = models::gptConfig(spec);
      std::string chunks;
      for (const nn::BlockRange& r : g.pipelineSplit())
        chunks += r.end - r.begin == 1 ? fmt::format(" [{}]", r.begin)
                                       : fmt::format(" [{}-{}]", r.begin, r.end - 1);
      spdlog::info(
          "pipeline: {} stages x {} virtual, blocks by model chunk:{} (balanced by FLOPs: the embeddings "
          "cost {:.2f} of a block on the first chunk, the LM head and loss {:.2f} on the last)",
          spec.pipeline.size, spec.pipeline.virtualStages, chunks,
          g.embeddingFlopsPerToken() / g.blockFlopsPerToken(),
          g.headFlopsPerToken() / g.blockFlopsPerToken());
    }
    // Built without the parameters' values: the engine makes each where it lays it out (NOTE [Deferred
    // parameters] in nn/DeferredInit.h).
    std::shared_ptr<nn::Module> module;
    {
      nn::DeferParameters defer;
      module = models::buildModule(spec);
    }
    mayBeDeferred_ = true;
    objective_ = data::makeObjective(config_.model.arch, std::move(module), tokenizer_, config_.train.seed);
    setup();
  });
}

Trainer::Trainer(config::Config config, std::shared_ptr<nn::CausalLM> model,
                 std::shared_ptr<dist::ParallelContext> parallel)
    : parallel_(std::move(parallel)) {
  begin(config);
  agreeOnSetup([&] { plan(config); });
  agreeOnSetup([&] {
    connect();
    refuseTensorParallel("a model given to the trainer");
    STRATA_CHECK(model != nullptr, "Trainer: no model given");
    mayBeDeferred_ = true;  // built with deferred parameters, perhaps
    tokenizer_ = data::makeTokenizer(config_);
    objective_ = std::make_shared<data::CausalLmObjective>(std::move(model), tokenizer_);
    setup();
  });
}

Trainer::Trainer(config::Config config, std::shared_ptr<data::Objective> objective,
                 std::shared_ptr<dist::ParallelContext> parallel)
    : objective_(std::move(objective)), parallel_(std::move(parallel)) {
  begin(config);
  agreeOnSetup([&] { plan(config); });
  agreeOnSetup([&] {
    connect();
    refuseTensorParallel("an objective given to the trainer");
    STRATA_CHECK(objective_ != nullptr, "Trainer: no objective given");
    mayBeDeferred_ = true;
    tokenizer_ = data::makeTokenizer(config_);
    setup();
  });
}

void Trainer::begin(const config::Config& config) {
  // The device and the collective timeout are this launch's, never a checkpoint's (NOTE [Resume is a
  // property of the run] in train/Run.h), so the ranks connect before they plan. Every rank checks the
  // device alike; only rank 0 reports it.
  int rank = parallel_ ? parallel_->rank() : dist::launchInfoFromEnvironment().rank;
  try {
    device_ = config::resolveDevice(config.train.device);
  } catch (const Error& e) {
    if (rank != 0) throw ReportedByRankZero(e.message());
    throw;
  }
  config_ = config;
  if (!parallel_) {
    dist::ParallelOptions options;
    options.timeoutSeconds = config.dist.timeoutS;
    options.deviceType = device_.type;
    options.gpuCollectives = dist::parseGpuCollectives(config_.dist.gpuCollectives);
    parallel_ = std::make_shared<dist::ParallelContext>(options);
  }
  // Several ranks on GPUs: each rank's GPU is its local rank's (modulo the GPUs present); the context made it
  // the process's (NOTE [Process device] in core/Device.h).
  if (device_.isCuda() && parallel_->device().isCuda()) device_ = parallel_->device();
  if (device_.isCuda() && processDeviceIndex() < 0) setProcessDevice(device_);
  // Rank 0 speaks for the job; the others only warn.
  if (!parallel_->isMain()) spdlog::set_level(spdlog::level::warn);
}

void Trainer::plan(const config::Config& config) {
  start_ = planRunStart(config);
  config_ = start_.config;
  if (!buildsModel_) {
    // A model given to the trainer: the config does not describe it, so there is no plan to weigh.
    if (config_.train.recompute == "auto") config_.train.recompute = "none";
    return;
  }
  // NOTE [Recompute auto] in plan/Plan.h: the plan `strata plan` prints, of this machine, this launch's
  // ranks and this rank's share of the device.
  plan::PlanOptions options;
  options.ranks = parallel_->worldSize();
  options.ranksPerNode = parallel_->topology().ranksOnHost;
  plan::MachineChoice machine = plan::chooseMachine("here", "", config_.zero.nvmePath);
  options.calibration = machine.calibration;
  options.calibrationSource = machine.source;
  config::Config planned = config_;
  planned.train.device = device_.isCuda() ? "cuda" : "cpu";
  if (const char* gb = std::getenv("STRATA_DEVICE_MEMORY_GB")) {
    options.calibration->deviceMemoryBytes = zero::parseBudgetGb(gb, 0, "STRATA_DEVICE_MEMORY_GB");
  } else if (device_.isCuda()) {
    options.calibration->deviceMemoryBytes =
        dist::perRankShare(deviceMemoryBytes(device_), parallel_->topology().ranksOnDevice);
  }
  if (config_.parallel.automatic) {
    // NOTE [Parallel auto] in plan/Plan.h: the fastest layout that fits and that the trainer runs, at the
    // global batch the layouts were weighed at.
    plan::LayoutChoice choice = plan::chooseLayout(planned, options);
    // Every rank takes rank 0's choice: the free memory and disk each rank reads of the machine may differ.
    std::vector<int64_t> picked{0, 1, 1, 1, 0};
    if (choice.chosen >= 0) {
      const plan::LayoutPlan& l = choice.layouts[size_t(choice.chosen)];
      picked = {1, l.tensor, l.pipeline, l.virtualStages, l.plan.globalBatch};
    }
    Tensor agreed = Tensor::fromVector(picked, {int64_t(picked.size())});
    parallel_->world().communicator().broadcast(agreed, 0);
    picked = agreed.toVector<int64_t>();
    STRATA_USER_CHECK(picked[0] == 1, "{}: {}",
                      config_.sourcePath.empty() ? "the config" : config_.sourcePath,
                      parallel_->isMain() ? choice.why : "parallel: auto: rank 0 found no layout that fits");
    for (config::Config* c : {&config_, &planned}) {
      c->parallel.tensor = picked[1];
      c->parallel.pipeline = picked[2];
      c->parallel.virtualStages = picked[3];
      c->parallel.automatic = false;
      c->train.globalBatchSize = picked[4];
      c->train.globalBatchSizeSet = true;
    }
    if (parallel_->isMain()) spdlog::info("{}", choice.why);
  }
  plan::ModelStatePlan p = plan::planModelState(planned, options);
  if (!p.fits)
    STRATA_USER_FAIL(
        "{}", plan::refusalMessage(config_.sourcePath.empty() ? "the config" : config_.sourcePath, planned, p,
                                   options));
  if (p.recomputeAuto) {
    config_.train.recompute = p.recompute;
    if (parallel_->isMain()) spdlog::info("{}", p.recomputeWhy);
  }
  if (device_.isCuda()) plannedDeviceBudget_ = p.budgets.device;
  // The allocator's share of the plan's non-model memory: the CUDA context and libraries are outside it.
  if (device_.isCuda())
    plannedWorkingBytes_ =
        p.devicePeakBytes - p.placement.bytes[int(zero::Tier::Device)] -
        std::min(p.devicePeakBytes - p.placement.bytes[int(zero::Tier::Device)], plan::kDeviceWorkspaceBytes);
}

void Trainer::agreeOnSetup(const std::function<void()>& work) {
  bool main = parallel_->isMain();
  std::exception_ptr failure;
  std::string message;
  try {
    work();
  } catch (const std::exception& e) {
    failure = std::current_exception();
    const auto* error = dynamic_cast<const Error*>(&e);
    message = error ? error->message() : e.what();
  }
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  nlohmann::json report{{"ok", failure == nullptr},
                        {"error", message},
                        {"run_id", runId_},
                        {"pid", long(getpid())},
                        {"host", std::string(host)}};
  std::vector<std::string> reports = dist::allGatherText(parallel_->world().communicator(), report.dump());
  std::string firstError;
  int firstRank = -1;
  rankProcesses_.clear();
  for (size_t r = 0; r < reports.size(); ++r) {
    nlohmann::json j = nlohmann::json::parse(reports[r]);
    rankProcesses_.push_back(RankProcess{int(r), j["pid"].get<long>(), j["host"].get<std::string>()});
    if (!j["ok"].get<bool>() && firstRank < 0) {
      firstRank = int(r);
      firstError = j["error"].get<std::string>();
    }
  }
  if (firstRank < 0) {
    runId_ = nlohmann::json::parse(reports[0])["run_id"].get<std::string>();
    return;
  }
  // Rank 0 reports its own failure as it is, or another rank's with its number; the others stay quiet.
  if (main && failure) std::rethrow_exception(failure);
  if (main) STRATA_USER_FAIL("rank {}: {}", firstRank, firstError);
  throw ReportedByRankZero(firstError);
}

void Trainer::connect() {
  int64_t world = parallel_->worldSize(), micro = config_.train.microBatchSize;
  int64_t tensor = config_.parallel.tensor;
  STRATA_USER_CHECK(!config_.parallel.sequenceParallel || tensor > 1,
                    "{}: parallel.sequence_parallel splits the sequence over a tensor-parallel group: set "
                    "parallel.tensor > 1 with it, or leave it false",
                    config_.sourcePath);
  if (tensor > 1) {
    STRATA_USER_CHECK(
        world % tensor == 0,
        "{}: parallel.tensor ({}) must divide the number of ranks ({}); launch with mpirun -np a "
        "multiple of it",
        config_.sourcePath, tensor, world);
    // NOTE [Sequence parallelism] in nn/TensorParallel.h: gpt's dense blocks only.
    STRATA_USER_CHECK(
        !config_.parallel.sequenceParallel ||
            (config_.model.arch == "gpt" && config_.model.moeNumExperts == 0),
        "{}: parallel.sequence_parallel splits the sequence of gpt's dense blocks only, not {}; "
        "set it to false (parallel.tensor ({}) splits the heads, widths and vocabulary without "
        "it)",
        config_.sourcePath,
        config_.model.arch != "gpt" ? "model.arch '" + config_.model.arch + "'"
                                    : std::string("mixture-of-experts layers (model.moe_num_experts)"),
        tensor);
    if (!parallel_->hasGroup(tensorGroupName(tensor))) {
      // Adjacent ranks split the layers (rank = d x tensor + t, within a pipeline stage).
      int rank = parallel_->rank();
      parallel_->split(tensorGroupName(tensor), parallel_->world(), int(rank / tensor), rank);
    }
  }
  int64_t pipeline = config_.parallel.pipeline, virtualStages = config_.parallel.virtualStages;
  STRATA_USER_CHECK(virtualStages == 1 || pipeline > 1,
                    "{}: parallel.virtual_stages ({}) interleaves the model chunks of pipeline stages: set "
                    "parallel.pipeline > 1 with it, or leave it 1",
                    config_.sourcePath, virtualStages);
  if (pipeline > 1) {
    STRATA_USER_CHECK(
        world % (tensor * pipeline) == 0,
        "{}: parallel.pipeline ({}) x parallel.tensor ({}) must divide the number of ranks ({}); "
        "launch with mpirun -np a multiple of {}",
        config_.sourcePath, pipeline, tensor, world, tensor * pipeline);
    STRATA_USER_CHECK(config_.model.arch == "gpt",
                      "{}: parallel.pipeline ({}) splits gpt only, not model.arch '{}'; train it with "
                      "parallel.pipeline: 1",
                      config_.sourcePath, pipeline, config_.model.arch);
    STRATA_USER_CHECK(
        config_.model.moeNumExperts == 0,
        "{}: parallel.pipeline ({}) with mixture-of-experts layers (model.moe_num_experts) is not "
        "supported; train MoE models with parallel.pipeline: 1",
        config_.sourcePath, pipeline);
    STRATA_USER_CHECK(config_.zero.stage <= 2,
                      "{}: parallel.pipeline ({}) with zero_optimization.stage 3 is not supported (stage 3 "
                      "gathers parameters module by module, which the pipeline schedule does not drive): set "
                      "zero_optimization.stage to 0, 1 or 2",
                      config_.sourcePath, pipeline);
  }
  // Megatron's order: tensor innermost, then data, then the pipeline's stages (rank = p x data x tensor + d x
  // tensor + t).
  int64_t perStage = world / std::max<int64_t>(1, pipeline);
  if ((tensor > 1 || pipeline > 1) && !parallel_->hasGroup(dataGroupName(tensor, pipeline)) &&
      world % (tensor * pipeline) == 0) {
    // Ranks `tensor` apart within a stage hold the same slices and split the data.
    int rank = parallel_->rank();
    parallel_->split(dataGroupName(tensor, pipeline), parallel_->world(),
                     int((rank / perStage) * tensor + rank % tensor), rank);
  }
  if (pipeline > 1 && !parallel_->hasGroup(pipelineGroupName(pipeline))) {
    int rank = parallel_->rank(), stage = int(rank / perStage);
    parallel_->split(pipelineGroupName(pipeline), parallel_->world(), int(rank % perStage), rank);
    bool tied = stage == 0 || stage == pipeline - 1;
    parallel_->split(embeddingGroupName(pipeline), parallel_->world(),
                     tied ? int(rank % perStage) : int(world + rank), rank);
  }
  // The ranks that split the batch: all of them, or the data-parallel ones under tensor and pipeline
  // parallelism.
  int64_t ranks = world / (tensor * pipeline);
  std::string rankText = tensor > 1 || pipeline > 1 ? "data-parallel ranks" : "ranks";
  // Unset, the global batch is one micro-batch per rank.
  if (!config_.train.globalBatchSizeSet) config_.train.globalBatchSize = micro * ranks;
  STRATA_USER_CHECK(
      config_.train.globalBatchSize % (micro * ranks) == 0,
      "{}: train.global_batch_size ({}) must be micro_batch_size ({}) x accumulation steps x {} "
      "({}); {} is not a multiple of {} x {} = {}",
      config_.sourcePath, config_.train.globalBatchSize, micro, rankText, ranks,
      config_.train.globalBatchSize, micro, ranks, micro * ranks);
  if (pipeline > 1) {
    // NOTE [Pipeline schedules] in train/PipelineSchedule.h: the step's micro-batches fill the pipeline.
    int64_t microBatches = config_.train.globalBatchSize / (micro * ranks);
    STRATA_USER_CHECK(microBatches >= pipeline,
                      "{}: parallel.pipeline ({}) needs at least as many micro-batches per step, and "
                      "train.global_batch_size ({}) / (micro_batch_size ({}) x {} data-parallel ranks) gives "
                      "{}: set train.global_batch_size to {} or more (or a smaller train.micro_batch_size)",
                      config_.sourcePath, pipeline, config_.train.globalBatchSize, micro, ranks, microBatches,
                      micro * ranks * pipeline);
    STRATA_USER_CHECK(
        virtualStages == 1 || microBatches % pipeline == 0,
        "{}: parallel.virtual_stages ({}) needs the micro-batches per step ({}: "
        "train.global_batch_size / (micro_batch_size x {} data-parallel ranks)) to be a multiple "
        "of parallel.pipeline ({}): set train.global_batch_size to a multiple of {}",
        config_.sourcePath, virtualStages, microBatches, ranks, pipeline, micro * ranks * pipeline);
  }
  int64_t ep = config_.model.moeExpertParallelSize;
  if (ep > 1) {
    STRATA_USER_CHECK(
        config_.model.moeNumExperts > 0,
        "{}: model.moe_expert_parallel_size is {}, but the model has no mixture-of-experts layers "
        "(model.moe_num_experts)",
        config_.sourcePath, ep);
    STRATA_USER_CHECK(
        config_.model.moeNumExperts % ep == 0,
        "{}: model.moe_num_experts ({}) must be a multiple of model.moe_expert_parallel_size ({})",
        config_.sourcePath, config_.model.moeNumExperts, ep);
    STRATA_USER_CHECK(ranks % ep == 0,
                      "{}: model.moe_expert_parallel_size ({}) must divide the number of {} ({}); launch "
                      "with mpirun -np a multiple of {}",
                      config_.sourcePath, ep, rankText, ranks, ep * tensor);
    if (!parallel_->hasGroup(expertGroupName(ep, tensor))) {
      // Among the data-parallel ranks d of one tensor rank t (rank = d x tensor + t), consecutive ones split
      // the experts, and ranks ep apart hold the same ones (NOTE [Experts under tensor parallelism] in
      // nn/MoE.h).
      int rank = parallel_->rank(), d = rank / int(tensor), t = rank % int(tensor);
      parallel_->split(expertGroupName(ep, tensor), parallel_->world(), (d / int(ep)) * int(tensor) + t,
                       rank);
      parallel_->split(expertDataGroupName(ep, tensor), parallel_->world(), (d % int(ep)) * int(tensor) + t,
                       rank);
    }
  }
}

void Trainer::refuseTensorParallel(const std::string& what) const {
  STRATA_USER_CHECK(config_.parallel.pipeline == 1,
                    "{}: parallel.pipeline ({}) splits the zoo's gpt built from the config, not {}; train it "
                    "with parallel.pipeline: 1",
                    config_.sourcePath, config_.parallel.pipeline, what);
  STRATA_USER_CHECK(config_.parallel.tensor == 1,
                    "{}: parallel.tensor ({}) splits the zoo's models (gpt, bert, t5) built from the "
                    "config, not {}; train it with parallel.tensor: 1",
                    config_.sourcePath, config_.parallel.tensor, what);
}

nn::TensorParallel Trainer::tensorParallel() const {
  nn::TensorParallel out;
  if (config_.parallel.tensor <= 1) return out;
  dist::ProcessGroup* group = &parallel_->group(tensorGroupName(config_.parallel.tensor));
  out.size = group->size();
  out.rank = group->rank();
  // NOTE [Collective ordering and completion] in distributed/Communicator.h: each collective waits for the
  // compute stream's work, and the compute stream for it.
  auto ordered = [](const Tensor& t, bool gather, const std::function<void()>& collective) {
    Device device = t.device();
    const Stream& lane = dist::collectiveStream(device, gather);
    streamWaits(lane, currentStream(device), device);
    collective();
    streamWaits(currentStream(device), lane, device);
  };
  out.allReduceSum = [group, ordered](const Tensor& t) {
    ordered(t, false, [&] { group->communicator().allReduce(t); });
  };
  out.allReduceMax = [group, ordered](const Tensor& t) {
    ordered(t, false, [&] { group->communicator().allReduce(t, dist::ReduceOp::Max); });
  };
  out.allGather = [group, ordered](const Tensor& dst, const Tensor& src) {
    ordered(src, true, [&] { group->communicator().allGather(dst, src); });
  };
  out.reduceScatter = [group, ordered](const Tensor& dst, const Tensor& src) {
    ordered(src, false, [&] { group->communicator().reduceScatter(dst, src); });
  };
  out.sequenceParallel = config_.parallel.sequenceParallel;
  return out;
}

dist::ProcessGroup* Trainer::dataGroup() const {
  int64_t tensor = config_.parallel.tensor, pipeline = config_.parallel.pipeline;
  dist::ProcessGroup* group =
      tensor > 1 || pipeline > 1 ? &parallel_->group(dataGroupName(tensor, pipeline)) : &parallel_->world();
  return group->communicator().communicates() ? group : nullptr;
}

nn::PipelineParallel Trainer::pipelineParallel() const {
  nn::PipelineParallel out;
  if (config_.parallel.pipeline <= 1) return out;
  dist::ProcessGroup* group = pipelineGroup();
  out.size = group->size();
  out.rank = group->rank();
  out.virtualStages = int(config_.parallel.virtualStages);
  return out;
}

dist::ProcessGroup* Trainer::pipelineGroup() const {
  if (config_.parallel.pipeline <= 1) return nullptr;
  return &parallel_->group(pipelineGroupName(config_.parallel.pipeline));
}

dist::ProcessGroup* Trainer::embeddingGroup() const {
  if (config_.parallel.pipeline <= 1) return nullptr;
  dist::ProcessGroup* group = &parallel_->group(embeddingGroupName(config_.parallel.pipeline));
  return group->size() > 1 ? group : nullptr;
}

Tensor Trainer::pipelineLoss(const data::TokenBatch& batch) {
  auto* stages = dynamic_cast<nn::PipelineStageModel*>(&objective_->model());
  STRATA_CHECK(stages != nullptr, "Trainer: parallel.pipeline for a model that is not split into stages");
  DType compute = modelDType();
  PipelineWork work;
  work.device = device_;
  work.dtype = compute;
  work.activationShape = stages->stageActivationShape(batch.ids.shape());
  work.forward = [&](int64_t local, int64_t, const Tensor& input) {
    return stages->stageForward(local, input, batch.ids, batch.targets, compute);
  };
  return PipelineSchedule(pipelineGroup()->communicator(), stages->pipeline()).forwardOnly(work);
}

nn::ExpertParallel Trainer::expertParallel() const {
  nn::ExpertParallel out;
  if (config_.model.moeExpertParallelSize <= 1) return out;
  dist::ProcessGroup* group = &parallel_->group(
      expertGroupName(config_.model.moeExpertParallelSize, std::max<int64_t>(1, config_.parallel.tensor)));
  out.size = group->size();
  out.rank = group->rank();
  out.allToAll = [group](const Tensor& dst, const Tensor& src) {
    // NOTE [Collective ordering and completion] in distributed/Communicator.h.
    Device device = src.device();
    const Stream& comm = deviceStreams(device).comm;
    streamWaits(comm, currentStream(device), device);
    group->communicator().allToAll(dst, src);
    streamWaits(currentStream(device), comm, device);
  };
  return out;
}

void Trainer::setup() {
  for (const auto& warning : config_.warnings) spdlog::warn("{}", warning);
  for (const auto& note : start_.notes) spdlog::info("{}", note);
  nn::applyRecompute(objective_->model(), nn::parseRecompute(config_.train.recompute));
  // CPU threads: train.threads, else OMP_NUM_THREADS when the user set it, else this rank's share of the
  // physical cores (NOTE [Per-node shares] in distributed/Launch.h).
  if (config_.train.threads > 0)
    omp_set_num_threads(int(config_.train.threads));
  else if (std::getenv("OMP_NUM_THREADS") == nullptr)
    omp_set_num_threads(
        int(dist::perRankShare(uint64_t(physicalCpuCores()), parallel_->topology().ranksOnHost)));
  for (auto& [name, p] : objective_->model().namedParameters())
    STRATA_CHECK(p.device() == device_, "parameter '{}' is on {} but train.device is {}", name,
                 toString(p.device()), toString(device_));
  compute_ = config::computeDTypeFor(config_, device_);
  STRATA_USER_CHECK(config_.zero.offloadParamDevice == "none",
                    "{}: zero_optimization.offload_param (device {}) is not read: set store.parameter_home: "
                    "host to home the parameters in host memory (auto homes there what store.gpu_budget_gb "
                    "cannot hold)",
                    config_.sourcePath, config_.zero.offloadParamDevice);
  // Everything that would otherwise fail only after training has run is checked before any work.
  ensureWritableDirectory(config_.train.outDir, "train.out_dir");
  if (!saveDirectory().empty()) {
    ensureWritableDirectory(saveDirectory(), "checkpoint.save");
    if (parallel_->isMain())
      for (const auto& name : removeStaleTemporaries(saveDirectory()))
        spdlog::info("removed {} left by an interrupted save in {}", name, saveDirectory());
  }
  std::string cacheDir = (fs::path(config_.train.outDir) / "cache").string();
  if (config_.data.format == "random") {
    // 16M tokens: enough distinct windows for any benchmark length; drawn from the run's seed.
    data_ = std::make_unique<data::TokenDataset>(
        data::TokenDataset::random(objective_->dataVocabSize(), int64_t(1) << 24,
                                   uint64_t(config_.train.seed), config_.data.valFraction));
  } else {
    data_ = std::make_unique<data::TokenDataset>(data::TokenDataset::open(
        config_.data.path, config_.data.format, *tokenizer_, cacheDir, config_.data.valFraction));
  }
  int64_t maxToken = data_->maxToken();
  if (objective_->dataVocabSize() == config_.model.vocabSize)
    STRATA_USER_CHECK(maxToken < objective_->dataVocabSize(),
                      "{} holds token id {} but model.vocab_size is {}", config_.data.path, maxToken,
                      config_.model.vocabSize);
  else
    STRATA_USER_CHECK(
        maxToken < objective_->dataVocabSize(),
        "{} holds token id {} but model.arch {} with model.vocab_size {} takes data ids below {} "
        "(the ids above are its special tokens)",
        config_.data.path, maxToken, config_.model.arch, config_.model.vocabSize,
        objective_->dataVocabSize());
  // The data's windows: the objective's length, plus the next-token targets' one.
  int64_t window = objective_->windowLength() + 1;
  STRATA_USER_CHECK(data_->splitSize(data::Split::Train) > window,
                    "the training split of {} has {} tokens, fewer than one window of {} (model.seq_length + "
                    "1); use more data or a shorter model.seq_length",
                    config_.data.path, data_->splitSize(data::Split::Train), window);
  if (config_.train.evalInterval > 0)
    STRATA_USER_CHECK(
        data_->splitSize(data::Split::Val) > window,
        "the validation split of {} has {} tokens, fewer than one window of {} (model.seq_length "
        "+ 1); raise data.val_fraction (now {}) or set train.eval_interval=0",
        config_.data.path, data_->splitSize(data::Split::Val), window, config_.data.valFraction);
  if (!config_.checkpoint.load.empty()) {
    std::string dir = resolveCheckpoint(config_.checkpoint.load);
    checkModelSection(dir, readCheckpointState(dir).model, config_);
  }
  // Last, once nothing else can stop the run: its id (a resume keeps its run's; a fresh start, or a
  // checkpoint from before run ids, makes one), and its directories (NOTE [Run lineage]), by rank 0 alone.
  if (parallel_->isMain()) {
    runId_ = start_.runId.empty() ? newRunId() : start_.runId;
    for (const auto& removed : claimRunDirectories(start_, runId_)) spdlog::info("removed {}", removed);
  }
}

std::string Trainer::saveDirectory() const {
  return saveDirectoryOf(config_);
}

void Trainer::materializeModel() {
  // A model the trainer built and has not laid out yet (a run that found nothing to train, or a caller
  // reading the model before run()).
  if (!mayBeDeferred_) return;
  mayBeDeferred_ = false;
  if (nn::hasDeferredParameters(objective_->model())) nn::materializeParameters(objective_->model());
}

DType Trainer::modelDType() {
  // fp32 before training lays the parameters out in the compute dtype, compute_ after.
  auto params = objective_->model().parameters();
  return params.empty() ? compute_ : params.front().dtype();
}

data::TokenBatch Trainer::batch(data::Split split, int64_t index) const {
  auto [ids, targets] = data_->batch(split, index, config_.train.microBatchSize, objective_->windowLength(),
                                     config_.train.seed, device_);
  return data::TokenBatch{ids, targets, index, split};
}

double Trainer::evaluate(int64_t iters) {
  NoGradGuard noGrad;
  materializeModel();
  objective_->model().eval();
  Tensor total = ops::zeros({1}, DType::F32, device_);
  // Each rank evaluates its share of the batches (batch i on rank i mod N); the sums meet in one all-reduce.
  // Every rank runs the same number of forwards (ZeRO-3's forwards are collectives): a rank whose last round
  // has no batch left runs one that does not count.
  // Under tensor parallelism the ranks of a tensor-parallel group evaluate the same batches together.
  dist::ProcessGroup* batchGroup = dataGroup();
  int ranks = batchGroup ? batchGroup->size() : 1, rank = batchGroup ? batchGroup->rank() : 0;
  int64_t rounds = (iters + ranks - 1) / ranks;
  for (int64_t k = 0; k < rounds; ++k) {
    int64_t i = k * ranks + rank;
    data::TokenBatch b = batch(data::Split::Val, i < iters ? i : i % iters);
    // Under a pipeline the last stage holds the loss; the others add nothing.
    Tensor loss = pipelineGroup() ? pipelineLoss(b) : objective_->loss(b, modelDType());
    if (i < iters && loss.defined()) total = ops::add(total, ops::to(loss, device_, DType::F32).view({1}));
  }
  objective_->model().train();
  if (batchGroup) {
    // NOTE [Collective ordering and completion] in distributed/Communicator.h.
    const Stream& comm = deviceStreams(device_).comm;
    streamWaits(comm, currentStream(device_), device_);
    batchGroup->communicator().allReduce(total);
    streamWaits(currentStream(device_), comm, device_);
  }
  if (dist::ProcessGroup* stages = pipelineGroup()) {
    const Stream& comm = deviceStreams(device_).comm;
    streamWaits(comm, currentStream(device_), device_);
    stages->communicator().allReduce(total);
    streamWaits(currentStream(device_), comm, device_);
  }
  return total.item() / double(iters);
}

// The ranks of `comm` as the group that saves a checkpoint together.
static CheckpointGroup checkpointGroup(dist::Communicator& comm) {
  if (comm.size() == 1) return CheckpointGroup::single();
  CheckpointGroup g;
  g.rank = comm.rank();
  g.worldSize = comm.size();
  g.barrier = [&comm] { comm.barrier(); };
  g.allGather = [&comm](const std::string& text) { return dist::allGatherText(comm, text); };
  return g;
}

std::string Trainer::sample(const std::string& prompt, int64_t length, double temperature, int64_t topK,
                            uint64_t seed) {
  materializeModel();
  std::optional<data::Generation> g =
      objective_->generate(prompt, data::GenerateOptions{length, temperature, topK, seed}, modelDType());
  return g ? g->text : std::string();
}

TrainResult Trainer::run() {
  const auto& c = config_;
  int64_t T = objective_->tokensPerSequence();
  int ranks = parallel_->worldSize(), rank = parallel_->rank();
  bool main = parallel_->isMain();
  TrainResult result;
  result.valLoss = NAN;
  if (!start_.checkpoint.empty() && start_.step >= c.train.trainIters) {
    result.steps = start_.step;
    result.checkpoint = start_.checkpoint;
    result.alreadyComplete = true;
    spdlog::info(
        "{} holds iteration {} and train.train_iters is {}: the run is complete, there is nothing to train "
        "(a larger train.train_iters continues it)",
        start_.checkpoint, start_.step, c.train.trainIters);
    return result;
  }
  std::string saveDir = saveDirectory();
  // From here on signals only ask the loop to stop, mpirun's notice included, and a write past the file-size
  // limit is an error, not SIGXFSZ (NOTE [Interrupts]); the SSD tier's file is made just below.
  bool openMpi = launchedByOpenMpi();
  KillTimeout killTimeout = openMpiKillTimeout();
  InterruptMonitor::Options monitorOptions;
  monitorOptions.rank = rank;
  monitorOptions.worldSize = ranks;
  monitorOptions.openMpi = openMpi;
  monitorOptions.killTimeoutSeconds = openMpi ? killTimeout.seconds : 0;
  monitorOptions.ranks = rankProcesses_;
  InterruptMonitor interrupts(monitorOptions);
  interrupts.setResumeCommand(resumeCommand_);
  if (!start_.checkpoint.empty()) interrupts.checkpointSaved(start_.checkpoint, start_.step);
  double killWindow = 2 * killTimeout.seconds;
  if (main && openMpi && !saveDir.empty() && !killTimeout.set)
    spdlog::warn(
        "under mpirun, Ctrl-C leaves the ranks {:.0f} s (2 x Open MPI's odls_base_sigkill_timeout, {} {:.0f} "
        "s) "
        "to finish the step and save a checkpoint before it kills them: launch with `mpirun --mca "
        "odls_base_sigkill_timeout 30 ...` (docs/checkpoints.md)",
        killWindow, killTimeout.source, killTimeout.seconds);
  // The ranks that split each global batch, and this rank's place among them (under tensor parallelism the
  // ranks of a tensor-parallel group train on the same micro-batches).
  dist::ProcessGroup* batchGroup = dataGroup();
  int dataRanks = batchGroup ? batchGroup->size() : 1, dataRank = batchGroup ? batchGroup->rank() : 0;
  int64_t accum = c.train.globalBatchSize / (c.train.microBatchSize * dataRanks);
  optim::LrSchedule schedule{optim::lrStyleFromName(c.lrSchedule.style), c.optimizer.lr, c.optimizer.minLr,
                             c.lrSchedule.warmupIters,
                             c.lrSchedule.decayIters > 0 ? c.lrSchedule.decayIters : c.train.trainIters};
  ZeroStepEngine engine(*objective_, c, device_, compute_, batchGroup,
                        c.model.moeExpertParallelSize > 1
                            ? &parallel_->group(expertDataGroupName(c.model.moeExpertParallelSize,
                                                                    std::max<int64_t>(1, c.parallel.tensor)))
                            : nullptr,
                        RankShares{parallel_->topology().ranksOnHost, parallel_->topology().ranksOnDevice,
                                   plannedDeviceBudget_},
                        PipelineGroups{pipelineGroup(), embeddingGroup()});
  mayBeDeferred_ = false;  // laid out: every parameter holds its value in its chunk
  if (main && engine.placement().bytes[int(zero::Tier::Device)] != engine.placement().total())
    spdlog::info("{}", engine.placement().table());
  const zero::GradientReducer& reducer = engine.gradientReducer();
  result.reducedBytes = 4 * reducer.plainElements();
  result.reducedBytesPowerSgd =
      c.dist.powersgdRank > 0 ? 4 * reducer.powerSgdElements() : result.reducedBytes;
  if (main && c.dist.powersgdRank > 0 && result.reducedBytes > 0)
    spdlog::info(
        "PowerSGD at rank {} from iteration {}: the gradient reduction sends {} bytes a step instead of {} "
        "({:.1f}x less); {} bytes of error feedback and Q matrices per rank on {}",
        c.dist.powersgdRank, c.dist.powersgdStartIter, result.reducedBytesPowerSgd, result.reducedBytes,
        double(result.reducedBytes) / double(std::max<int64_t>(result.reducedBytesPowerSgd, 1)),
        reducer.powerSgdStateBytes(), toString(device_));

  int64_t startStep = 0, dataIndex = 0;
  defaultGenerator().manualSeed(c.train.seed);
  if (!c.checkpoint.load.empty()) {
    // Every rank reads the parts of the checkpoint its own state covers, whatever the world size and chunk
    // size that wrote it (NOTE [Sharded chunk checkpoints]).
    ChunkCheckpointReader reader(c.checkpoint.load);
    std::string dir = reader.directory();
    const CheckpointState& st = reader.state();
    checkTensorLayout(st, dir, c.parallel.tensor, ranks);
    checkPipelineLayout(st, dir, c.parallel.pipeline, c.parallel.virtualStages);
    engine.loadState(reader, !c.checkpoint.loadModelOnly);
    if (c.checkpoint.loadModelOnly) {
      spdlog::info(
          "loaded the model weights of {} (checkpoint.load_model_only: the optimizer, step and data "
          "position start fresh)",
          dir);
    } else {
      startStep = st.step;
      dataIndex = st.dataIndex;
      engine.restore(StepEngineState{st.optimizerSteps, st.lossScale, st.lossScaleGoodSteps});
      defaultGenerator().setState(st.rng);
      spdlog::info("resumed from {} at iteration {}", dir, startStep);
    }
  }
  int64_t lastSaved = -1;
  double lastSaveSeconds = 0, slowestStepSeconds = 0;
  bool windowWarned = false;
  auto save = [&](int64_t step) {
    auto saveStart = std::chrono::steady_clock::now();
    CheckpointState st;
    StepEngineState engineState = engine.state();
    st.step = step;
    st.optimizerSteps = engineState.optimizerSteps;
    st.lossScale = engineState.lossScale;
    st.lossScaleGoodSteps = engineState.lossScaleGoodSteps;
    st.rng = defaultGenerator().state();
    st.dataIndex = dataIndex;
    st.config = c.values;
    st.model = config::effectiveValues(c, "model.");
    st.effective = config::effectiveValues(c);
    st.runId = runId_;
    st.layout = engine.checkpointLayout();
    if (c.parallel.tensor > 1) {
      st.tensorSlices = nn::tensorParallelSlices(objective_->model());
      // Under a pipeline each stage knows its own parameters' cuts; rank 0 records every stage's.
      if (dist::ProcessGroup* stages = pipelineGroup()) {
        std::string mine;
        for (const auto& [name, how] : st.tensorSlices)
          mine += fmt::format("{} {} {}\n", name, how.dim, how.groups);
        for (const std::string& text : dist::allGatherText(stages->communicator(), mine)) {
          std::istringstream lines(text);
          std::string name;
          nn::TensorSlice how;
          while (lines >> name >> how.dim >> how.groups) st.tensorSlices[name] = how;
        }
      }
    }
    st.chunked = true;
    // Each rank writes the pieces of state its shards hold, nothing gathered; rank 0 the manifest.
    std::string dir = saveCheckpoint(saveDir, engine.checkpointModel(), engine.checkpointOptimizer(), st,
                                     checkpointGroup(parallel_->world().communicator()));
    if (main) {
      spdlog::info("saved checkpoint {}", dir);
      for (const auto& name : pruneCheckpoints(saveDir, c.checkpoint.keepLast, runId_))
        spdlog::info("removed old checkpoint {} (checkpoint.keep_last {})", name, c.checkpoint.keepLast);
    }
    result.checkpoint = dir;
    lastSaved = step;
    interrupts.checkpointSaved(dir, step);
    lastSaveSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - saveStart).count();
    // Checked once a step and a save are timed: would a stop under mpirun fit Open MPI's window?
    if (main && openMpi && !windowWarned && slowestStepSeconds + lastSaveSeconds > 0.8 * killWindow) {
      windowWarned = true;
      spdlog::warn(
          "a step and a save take {:.1f} s here, but under mpirun Ctrl-C leaves the ranks {:.0f} s (2 x "
          "odls_base_sigkill_timeout, {:.0f} s from {}) before Open MPI kills them: launch with `mpirun "
          "--mca "
          "odls_base_sigkill_timeout {:.0f} ...` (docs/checkpoints.md)",
          slowestStepSeconds + lastSaveSeconds, killWindow, killTimeout.seconds, killTimeout.source,
          std::ceil(slowestStepSeconds + lastSaveSeconds) + 10);
    }
  };

  std::unique_ptr<MetricsLogger> logger =
      main ? std::make_unique<MetricsLogger>(c.train.outDir, startStep, runId_) : nullptr;
  // The whole model's parameters: under tensor parallelism each slice counts once per rank of the group.
  int64_t parameters = objective_->model().numParameters();
  std::string split;
  if (c.parallel.tensor > 1) {
    std::map<std::string, nn::TensorSlice> slices = nn::tensorParallelSlices(objective_->model());
    for (const auto& [name, p] : objective_->model().namedParameters())
      if (slices.count(name)) parameters += p.numel() * (c.parallel.tensor - 1);
    split = fmt::format(", split over {} tensor-parallel ranks", c.parallel.tensor);
  }
  spdlog::info("training {} ({} parameters{}) on {} ({}) in {}: {} iterations of {} sequences x {} tokens{}",
               objective_->modelName(), parameters, split, toString(device_), deviceName(device_),
               dtypeName(compute_), c.train.trainIters, c.train.globalBatchSize, T,
               device_.isCpu() ? fmt::format(", {} CPU threads", omp_get_max_threads()) : std::string());

  objective_->model().train();
  double lastNorm = 0, lastScale = 1;
  double intervalLoss = 0;
  int64_t intervalSteps = 0, intervalCounted = 0, intervalSkipped = 0, nonfiniteRun = 0;
  double intervalOffload = 0;
  optim::OffloadPhases intervalPhases;
  auto runStart = std::chrono::steady_clock::now();
  auto intervalStart = runStart;
  double trainingSeconds = 0;  // measured step time since the start (evals and saves excluded), for the ETA
  std::optional<double> flopsPerToken = objective_->flopsPerToken();
  double peak = peakFlops(device_, compute_);
  // STRATA_PROFILE=1: profile a few steps after warm-up and print where the time went (core/Profiler.h);
  // STRATA_PROFILE=gpu times the ops with events instead of synchronising at each.
  const char* profileEnv = std::getenv("STRATA_PROFILE");
  int64_t profileFrom = profileEnv && std::string(profileEnv) != "0" ? startStep + 3 : -1;
  profiler::Mode profileMode =
      profileEnv && std::string(profileEnv) == "gpu" ? profiler::Mode::Events : profiler::Mode::Synchronise;
  int64_t profileSteps = std::max<int64_t>(1, std::min<int64_t>(5, c.train.trainIters - profileFrom));
  // <out_dir>/loss.svg at the end of every run, interrupted ones included; a chart never fails a run.
  auto plotLoss = [&] {
    std::string svg = (fs::path(c.train.outDir) / "loss.svg").string();
    try {
      std::string title =
          c.sourcePath.empty() ? objective_->modelName() : fs::path(c.sourcePath).stem().string();
      if (logger && writeLossPlot(logger->jsonlPath(), svg, title)) spdlog::info("loss curves: {}", svg);
    } catch (const std::exception& e) {
      spdlog::warn("could not draw {}: {}", svg, e.what());
    }
  };
  for (int64_t iter = startStep; iter < c.train.trainIters; ++iter) {
    auto stepStart = std::chrono::steady_clock::now();
    if (iter == profileFrom) profiler::start(device_, profileMode);
    double lr = schedule.at(iter);
    // This rank's slice of the global batch: the same windows a single rank would draw, in the same order.
    int64_t micro = 0, first = dataIndex + int64_t(dataRank) * accum;
    StepOutcome step;
    try {
      step = engine.step([&] { return batch(data::Split::Train, first + micro++); }, accum, lr);
    } catch (const OutOfMemory& e) {
      // NOTE [Out of memory]: what the memory holds, and what to change. Checkpoints already written stay.
      const zero::StorePlacement& p = engine.placement();
      auto gib = [](uint64_t b) { return fmt::format("{:.2f} GiB", double(b) / double(1ull << 30)); };
      throw OutOfMemory(
          e, fmt::format(
                 "at iteration {}, with model state {} on the device and {} on the host (strata plan shows "
                 "the placement); lower train.micro_batch_size, set train.recompute to selective or full, or "
                 "lower store.gpu_budget_gb to leave the step more room",
                 iter + 1, gib(p.bytes[int(zero::Tier::Device)]), gib(p.bytes[int(zero::Tier::Host)])));
    }
    dataIndex += accum * dataRanks;
    lastNorm = step.gradNorm;
    lastScale = step.lossScale;
    intervalOffload += step.offloadSeconds;
    intervalPhases.gradientsOut += step.offloadPhases.gradientsOut;
    intervalPhases.cpuUpdate += step.offloadPhases.cpuUpdate;
    intervalPhases.parametersIn += step.offloadPhases.parametersIn;
    intervalPhases.ssdWait += step.offloadPhases.ssdWait;
    intervalPhases.gpuLaneWait += step.offloadPhases.gpuLaneWait;
    intervalPhases.gpuLaneShare += step.offloadPhases.gpuLaneShare;
    if (iter == startStep && plannedWorkingBytes_ > 0 && main) {
      // The plan's activations, gradient buffers and workspace against the first step's (NOTE [Plan model]).
      uint64_t measured = engine.firstStepWorkingBytes();
      double ratio = double(measured) / double(plannedWorkingBytes_);
      auto gib = [](uint64_t b) { return double(b) / double(1ull << 30); };
      uint64_t gap =
          measured > plannedWorkingBytes_ ? measured - plannedWorkingBytes_ : plannedWorkingBytes_ - measured;
      if (measured > 0 && (ratio > 1.1 || ratio < 0.9) && gap > (128ull << 20))
        spdlog::warn(
            "the first step held {:.2f} GiB on the device beside the model state (activations, gradient "
            "buffers, workspace); the plan estimated {:.2f} GiB ({:+.0f}%)",
            gib(measured), gib(plannedWorkingBytes_), 100.0 * (ratio - 1));
    }
    if (result.chunks == 0) {
      result.chunks = engine.chunks().numChunks();
      const zero::ChunkLayout& layout = engine.chunks().layout();
      spdlog::info(
          "parameters in {} chunks of {:.1f} MiB, {:.1f}% filled, in first-use order (strata info lists "
          "them)",
          layout.chunks.size(),
          double(layout.chunkElems * int64_t(dtypeSize(layout.dtype))) / double(1 << 20),
          100.0 * double(layout.payloadElems()) / double(layout.capacityElems()));
    }
    if (!step.applied && compute_ == DType::F16) {
      spdlog::warn("iteration {}: gradient overflow; step skipped, loss scale now {:.0f}", iter + 1,
                   step.lossScale);
    } else if (!step.finite) {
      // bf16/fp32 have no loss scale to lower: the engine skipped the update so the weights stay finite; the
      // run stops when it keeps happening (train.max_nonfinite_steps).
      ++nonfiniteRun;
      spdlog::warn(
          "iteration {}: loss {} / gradient norm {} is not finite; step skipped ({} in a row, the run "
          "stops at train.max_nonfinite_steps = {})",
          iter + 1, step.loss, step.gradNorm, nonfiniteRun, c.train.maxNonfiniteSteps);
      if (nonfiniteRun >= c.train.maxNonfiniteSteps)
        throw DivergedError(detail::format(
            "training diverged: {} steps in a row had a non-finite loss or gradient norm (the last at "
            "iteration {}). No checkpoint was written from that state{}. Lower optimizer.lr, raise "
            "lr_schedule.warmup_iters, or set optimizer.clip_grad, then resume from the last checkpoint.",
            nonfiniteRun, iter + 1,
            result.checkpoint.empty() ? std::string() : "; the last good one is " + result.checkpoint));
    } else {
      nonfiniteRun = 0;
    }
    double stepLossHost = step.loss;
    bool applied = step.applied;
    if (profileFrom >= 0 && iter + 1 == profileFrom + profileSteps) {
      spdlog::info("profile of {} steps (STRATA_PROFILE; {}):\n{}", profileSteps,
                   profileMode == profiler::Mode::Events
                       ? "GPU time per op from events, idle gaps included"
                       : "each op synchronised, so the total exceeds a step",
                   profiler::stop());
    }
    ++intervalSteps;
    if (std::isfinite(stepLossHost)) {
      intervalLoss += stepLossHost;
      ++intervalCounted;
    }
    if (!applied) {
      ++intervalSkipped;
      ++result.skippedSteps;
    }
    int64_t done = iter + 1;
    slowestStepSeconds =
        std::max(slowestStepSeconds,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - stepStart).count());
    interrupts.progress(
        done, !saveDir.empty() && nonfiniteRun == 0,
        saveDir.empty() ? "no save directory: set checkpoint.save" : "the last step was not finite",
        slowestStepSeconds + lastSaveSeconds);
    if (onIteration_) onIteration_(done);
    int signal = interrupts.pending();
    if (ranks > 1) {
      // The ranks stop together: at the first iteration after which any of them saw a signal. The second
      // value finds the lowest rank that saw one.
      Tensor flag = Tensor::fromVector<int32_t>({signal, signal != 0 ? ranks - rank : 0}, {2});
      parallel_->world().communicator().allReduce(flag, dist::ReduceOp::Max);
      std::vector<int32_t> agreed = flag.toVector<int32_t>();
      signal = agreed[0];
      if (main && signal != 0 && agreed[1] != ranks)
        spdlog::warn("{} reached rank {}: every rank stops after iteration {}",
                     signal == SIGINT ? "SIGINT" : "SIGTERM", ranks - agreed[1], done);
    }
    if (signal != 0) interrupts.setPhase(InterruptMonitor::Phase::Stopping);
    bool exiting = c.train.exitInterval > 0 && done % c.train.exitInterval == 0 && done < c.train.trainIters;
    bool last = done == c.train.trainIters || exiting || signal != 0;
    if (done % c.train.logInterval == 0 || last) {
      TrainRecord r;
      r.step = done;
      r.totalSteps = c.train.trainIters;
      // The mean over the interval's finite losses (NaN, written as null, when none was).
      r.loss = intervalCounted > 0 ? intervalLoss / double(intervalCounted) : NAN;
      r.gradNorm = lastNorm;
      r.lr = lr;
      r.lossScale = lastScale;
      r.skippedSteps = intervalSkipped;
      r.offloadMs = 1000.0 * intervalOffload / double(intervalSteps);
      if (intervalOffload > 0) {
        double perStep = 1000.0 / double(intervalSteps);
        r.offloadPhasesMs = {{"grads_out", intervalPhases.gradientsOut * perStep},
                             {"cpu", intervalPhases.cpuUpdate * perStep},
                             {"params_in", intervalPhases.parametersIn * perStep},
                             {"ssd_wait", intervalPhases.ssdWait * perStep},
                             {"gpu_wait", intervalPhases.gpuLaneWait * perStep}};
        r.offloadGpuShare = intervalPhases.gpuLaneShare / double(intervalSteps);
      }
      synchronizeDevice(device_);  // the interval's time covers all of its work
      auto now = std::chrono::steady_clock::now();
      double seconds = std::chrono::duration<double>(now - intervalStart).count();
      trainingSeconds += seconds;
      r.msPerIter = 1000.0 * seconds / double(intervalSteps);
      r.tokensPerSec = double(intervalSteps * c.train.globalBatchSize * T) / seconds;
      setThroughput(r, flopsPerToken, peak, ranks);  // per GPU (per rank)
      r.elapsedSeconds = std::chrono::duration<double>(now - runStart).count();
      r.etaSeconds = trainingSeconds / double(done - startStep) * double(c.train.trainIters - done);
      if (device_.isCuda()) {
        AllocatorStats gpu = deviceAllocator(device_).stats();
        r.memoryGb["gpu"] = gib(gpu.allocatedBytes);
        r.memoryGb["gpu_peak"] = gib(gpu.peakAllocatedBytes);
        // NOTE [Fragmentation] in core/Allocator.h: the reserve and what of it was unused at its peak.
        r.memoryGb["reserved"] = gib(gpu.reservedBytes);
        r.memoryGb["reserved_peak"] = gib(gpu.peakReservedBytes);
        r.memoryGb["frag"] = gib(gpu.fragmentedAtPeakBytes());
        r.counts["alloc_failures"] = int64_t(gpu.numRawFailures);
        r.counts["alloc_retries"] = int64_t(gpu.numCacheFlushes);
      }
      // Stage 3, and parameters homed off the device (NOTE [Parameter homes]), gather chunks into slots.
      if (c.zero.stage == 3 || engine.peakGatheredChunks() > 0) {
        r.counts["gathered_peak"] = int64_t(engine.peakGatheredChunks());
        if (!engine.arenas().empty()) {
          // Part of the allocated bytes: slots sized for the largest chunk of their class, in use or not.
          int64_t slots = 0, grown = 0;
          uint64_t bytes = 0;
          for (const zero::ChunkArena* arena : engine.arenas()) {
            slots += int64_t(arena->stats().slots);
            grown += int64_t(arena->stats().reservations) - 1;  // slots reserved past the first reservation
            bytes += arena->stats().reservedBytes();
          }
          r.counts["arena_slots"] = slots;
          r.counts["arena_grown"] = grown;
          r.memoryGb["arena"] = gib(bytes);
        }
      }
      r.memoryGb["host"] =
          gib(cpuAllocator().stats().allocatedBytes + hostStateAllocator(false).stats().allocatedBytes +
              hostStateAllocator(true).stats().allocatedBytes);
      r.memoryGb["model_state"] = gib(engine.modelStateBytes());
      for (auto& [name, module] : objective_->model().namedModules())
        if (auto* moe = dynamic_cast<nn::MoE*>(module)) {
          const nn::MoEStats& s = moe->stats();
          r.moe.push_back({name, s.tokensPerExpert, s.droppedFraction(), s.auxLossValue(), s.zLossValue()});
        }
      // The store's tiers (NOTE [Store placement]); together they are model_state.
      for (int t = 0; t < zero::kNumTiers; ++t)
        r.memoryGb[std::string("state_") + zero::tierName(zero::Tier(t))] = gib(engine.placement().bytes[t]);
      if (ranks > 1) {
        // Per rank; the log line and metrics show the largest.
        std::vector<double> values;
        for (const auto& [tier, gb] : r.memoryGb) values.push_back(gb);
        for (const auto& [name, n] : r.counts) values.push_back(double(n));
        Tensor t = Tensor::fromVector<double>(values, {int64_t(values.size())});
        parallel_->world().communicator().allReduce(t, dist::ReduceOp::Max);
        std::vector<double> maxima = t.toVector<double>();
        size_t i = 0;
        for (auto& [tier, gb] : r.memoryGb) gb = maxima[i++];
        for (auto& [name, n] : r.counts) n = int64_t(maxima[i++]);
      }
      if (logger) logger->train(r);
      result.trainLoss = r.loss;
      result.last = r;
      intervalLoss = 0;
      intervalSteps = intervalCounted = intervalSkipped = 0;
      intervalOffload = 0;
      intervalPhases = {};
      intervalStart = std::chrono::steady_clock::now();
    }
    if (c.train.evalInterval > 0 && (done % c.train.evalInterval == 0 || last) && signal == 0) {
      result.valLoss = evaluate(c.train.evalIters);
      ++result.evaluations;
      if (logger) logger->eval(done, result.valLoss);
      if (!std::isfinite(result.valLoss))
        spdlog::warn("iteration {}: the validation loss is not finite ({})", done, result.valLoss);
      intervalStart = std::chrono::steady_clock::now();  // evaluation time is not training time
    }
    bool saveNow = !saveDir.empty() &&
                   ((c.checkpoint.saveInterval > 0 && done % c.checkpoint.saveInterval == 0) || last);
    if (saveNow && nonfiniteRun > 0) {
      // The weights are those of the last finite step, but a run that is going non-finite is not a state
      // worth resuming: keep the last good checkpoint as `latest`.
      spdlog::warn("iteration {}: not saving a checkpoint after a non-finite step", done);
    } else if (saveNow) {
      save(done);
      intervalStart = std::chrono::steady_clock::now();
    }
    result.steps = done;
    if (signal != 0) {
      result.interruptSignal = signal;
      result.stoppedByMpirun = interrupts.fromMpirun();
      if (main)
        spdlog::warn("stopped by {} after iteration {}{}", signal == SIGINT ? "SIGINT" : "SIGTERM", done,
                     lastSaved == done ? "; checkpoint " + result.checkpoint + " holds it" : "");
      plotLoss();
      return result;
    }
    if (exiting) {
      spdlog::info("stopping at iteration {} (train.exit_interval {})", done, c.train.exitInterval);
      break;
    }
  }
  interrupts.setPhase(InterruptMonitor::Phase::Finished);
  plotLoss();
  if (c.train.sampleLength > 0 && pipelineGroup()) {
    if (main)
      spdlog::info(
          "no sample: generation needs the whole model, and each rank holds a pipeline stage "
          "(parallel.pipeline "
          "{}); `strata convert` joins the stages of a checkpoint for `strata generate`",
          c.parallel.pipeline);
  } else if (c.train.sampleLength > 0) {
    // Every rank samples the same tokens (ZeRO-3's forwards are collectives); rank 0 shows them. An
    // objective that makes nothing of the prompt (BERT without a [MASK]) shows nothing.
    std::optional<data::Generation> g =
        objective_->generate(c.train.samplePrompt,
                             data::GenerateOptions{c.train.sampleLength, -1, 40, c.train.seed}, modelDType());
    if (g) {
      result.sample = g->text;
      if (main) spdlog::info("sample:\n{}", g->display(c.train.samplePrompt));
    }
  }
  return result;
}

}  // namespace strata::train
