#include "train/ModelState.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "strata/autograd/GradMode.h"
#include "strata/core/Allocator.h"
#include "strata/core/Generator.h"
#include "strata/core/Stream.h"
#include "strata/distributed/Communicator.h"
#include "strata/distributed/Launch.h"
#include "strata/distributed/ProcessGroup.h"
#include "strata/nn/DeferredInit.h"
#include "strata/nn/MoE.h"
#include "strata/ops/Ops.h"
#include "strata/optim/Adafactor.h"
#include "strata/optim/AdamW.h"
#include "strata/plan/PlacementInputs.h"

namespace strata::train {

namespace {

void emptyDeviceCache(Device device) {
  if (auto* caching = dynamic_cast<CachingAllocator*>(&deviceAllocator(device))) caching->emptyCache();
}

// NOTE [Expert parallelism] in nn/MoE.h: the experts of expert-parallel MoE layers (family 1) are sharded
// over the ranks that hold the same experts. Their names go into `names`.
ExpertNames findExperts(nn::Module& model, std::set<std::string>& names) {
  ExpertNames experts;
  for (auto& [name, module] : model.namedModules())
    if (auto* moe = dynamic_cast<nn::MoE*>(module); moe && moe->config().expertParallel.size > 1) {
      experts.ranks = moe->config().expertParallel.size;
      experts.rank = moe->config().expertParallel.rank;
      for (int64_t e = 0; e < moe->numLocalExperts(); ++e)
        for (auto& [pname, p] : moe->expert(size_t(e)).namedParameters()) {
          auto nameOn = [prefix = name + ".experts.", e, local = moe->numLocalExperts(), rest = "." + pname](
                            int rank) { return prefix + std::to_string(local * rank + e) + rest; };
          names.insert(nameOn(experts.rank));
          experts.rename.emplace_back(nameOn(experts.rank), nameOn);
        }
    }
  return experts;
}

// Every rank starts from the weights of its group's rank 0 (they are equal when built from one seed; this
// makes it so). NOTE [Collective ordering and completion] in distributed/Communicator.h: the broadcasts wait
// for the layout's writes, and the copies into the chunks wait for the broadcasts.
void broadcastStartingWeights(ModelState& s) {
  const Stream& commStream = deviceStreams(s.device).comm;
  streamWaits(commStream, currentStream(s.device), s.device);
  for (size_t i = 0; i < s.chunks->numChunks(); ++i) {
    if (!s.groups.communicates(i)) continue;
    s.groups.comm(i).broadcast(s.masters.empty() ? s.chunks->paddedFlat(i) : s.masters[i], 0);
  }
  streamWaits(currentStream(s.device), commStream, s.device);
  for (size_t i = 0; i < s.masters.size(); ++i)
    if (s.groups.communicates(i)) ops::copy(s.chunks->paddedFlat(i), s.masters[i]);
}

// Whether the model is laid out from deferred parameters (NOTE [Sharded layout] in zero/ChunkManager.h): the
// ranks of the group agree, since a model laid out whole is broadcast, and all of them take part. Where a
// rank's model holds its values (a caller read them before the layout), every rank makes its own.
bool deferredOnEveryRank(nn::Module& model, dist::ProcessGroup* group, Device device) {
  bool mine = nn::hasDeferredParameters(model);
  if (group != nullptr && group->size() > 1) {
    Tensor count = ops::full({1}, mine ? 1.0 : 0.0, DType::F32, device);
    const Stream& commStream = deviceStreams(device).comm;
    streamWaits(commStream, currentStream(device), device);
    group->communicator().allReduce(count);
    streamWaits(currentStream(device), commStream, device);
    bool all = count.item() == double(group->size());
    if (mine && !all) nn::materializeParameters(model);
    return all;
  }
  return mine;
}

// The ranges of optimizer state this rank keeps, and the shards of the masters and (stage 3) parameters.
void keepShards(ModelState& s) {
  size_t n = s.chunks->numChunks();
  if (s.stage >= 1) {
    // Stages 1 and 2: this rank keeps the masters and moments of its shard of each chunk only.
    for (size_t i = 0; i < n; ++i) {
      s.ranges.push_back(s.groups.shard(i));
      // Masters of a sharded layout are this shard's already (NOTE [Sharded layout] in zero/ChunkManager.h).
      if (!s.masters.empty() && s.masters[i].numel() != s.ranges[i].size())
        s.masters[i] = s.masters[i].narrow(0, s.ranges[i].begin, s.ranges[i].size()).clone();
    }
    emptyDeviceCache(s.device);
  } else {
    for (size_t i = 0; i < n; ++i) s.ranges.push_back({0, s.chunks->paddedElems(i)});
  }
  // Stage 3: each rank keeps only its shard of the parameters too; a chunk is gathered whole into a slot
  // while a module that uses it runs, forward and backward (NOTE [Parameter gathering] in
  // zero/ParameterGatherer.h).
  if (s.stage == 3) {
    s.parameterShards = s.chunks->takeParameterShards();
    if (s.parameterShards.empty())
      for (size_t i = 0; i < n; ++i)
        s.parameterShards.push_back(
            s.chunks->paddedFlat(i).narrow(0, s.ranges[i].begin, s.ranges[i].size()).clone());
  }
}

}  // namespace

std::unique_ptr<zero::ChunkManager> layOutModelChunks(data::Objective& objective, Device device,
                                                      DType compute, int64_t chunkBytes, int shards,
                                                      uint64_t hostMasterBytes,
                                                      const zero::ChunkFamilies& families,
                                                      const std::optional<zero::ShardedLayout>& sharded) {
  // The first-use order from one loss of one sequence (token 0 throughout: the order of the module calls
  // does not depend on the data), in eval mode, without gradients, in the parameters' own dtype, with the
  // RNG state put back: the trace changes no number of the run.
  nn::Module& model = objective.model();
  GeneratorState rng = defaultGenerator().state();
  bool training = model.isTraining();
  model.eval();
  auto params = model.parameters();
  STRATA_CHECK(!params.empty(), "the model has no parameters");
  DType source = params.front().dtype();
  int64_t T = std::max<int64_t>(1, objective.windowLength());
  Tensor ids = ops::zeros({1, T}, DType::I64, device);
  std::vector<std::string> order;
  try {
    order = zero::recordFirstUse(model, [&] {
      NoGradGuard noGrad;
      auto* stages = dynamic_cast<nn::PipelineStageModel*>(&model);
      if (stages == nullptr || !stages->pipeline().active()) {
        objective.loss(data::TokenBatch{ids, ids}, source);
        return;
      }
      // A pipeline stage runs its own model chunks, each from zeros in place of the previous chunk's output.
      const nn::PipelineParallel& pp = stages->pipeline();
      for (int64_t local = 0; local < pp.virtualStages; ++local) {
        Tensor input;
        if (pp.chunkOf(local) > 0)
          input = ops::zeros(stages->stageActivationShape(ids.shape()), source, device);
        stages->stageForward(local, input, ids, ids, source);
      }
    });
  } catch (...) {
    model.train(training);
    defaultGenerator().setState(rng);
    throw;
  }
  model.train(training);
  defaultGenerator().setState(rng);
  auto named = model.namedParameters();
  std::vector<std::pair<std::string, Tensor>> ordered;
  for (const auto& name : order)
    for (const auto& [n, p] : named)
      if (n == name) ordered.emplace_back(n, p);
  auto chunks = std::make_unique<zero::ChunkManager>(
      ordered, chunkBytes, compute, shards,
      hostMasterBytes > 0 ? std::optional<Device>(Device::cpu()) : std::nullopt, families, hostMasterBytes,
      sharded);
  // The model's old per-parameter storages went back to the caching allocator; return them to the device so
  // the chunks' layout is what the step's activations see.
  emptyDeviceCache(device);
  return chunks;
}

namespace {

// The host's memory: MemTotal, or STRATA_HOST_MEMORY_GB (a smaller machine, in tests).
uint64_t hostTotalBytes() {
  const char* hostOverride = std::getenv("STRATA_HOST_MEMORY_GB");
  return hostOverride ? zero::parseBudgetGb(hostOverride, 0, "STRATA_HOST_MEMORY_GB")
                      : deviceMemoryBytes(Device::cpu());
}

// The bytes of fp32 masters a model of `modelElems` parameters makes in host memory (NOTE [Masters at
// layout] in plan/PlacementInputs.h); refused where host and device together cannot hold them.
uint64_t mastersOnHostBytes(const config::Config& c, plan::LayoutElems elems, uint64_t deviceMemory,
                            RankShares shares) {
  plan::MasterLayout l = plan::mastersAtLayout(c, elems, deviceMemory, plan::hostAvailableBytes(),
                                               hostTotalBytes(), shares.ranksOnHost);
  auto gib = [](uint64_t b) { return double(b) / double(1ull << 30); };
  STRATA_USER_CHECK(l.fits,
                    "the model's fp32 masters ({:.1f} GiB) fit neither host memory ({:.1f} GiB free beyond "
                    "the headroom) nor the device beside the 16-bit chunks ({:.1f} GiB of room), nor the two "
                    "together, while the model is laid out in chunks; a smaller model.num_layers or "
                    "model.hidden_size fits",
                    gib(l.masters), gib(l.hostRoom), gib(l.deviceRoom));
  if (l.hostBytes < l.masters && l.hostBytes > 0)
    spdlog::info(
        "the fp32 masters ({:.1f} GiB) outgrow host memory ({:.1f} GiB free beyond the headroom): {:.1f} GiB "
        "are made there and {:.1f} GiB on the device, until the optimizer takes each to its tier",
        gib(l.masters), gib(l.hostRoom), gib(l.hostBytes), gib(l.masters - l.hostBytes));
  return l.hostBytes;
}

}  // namespace

ModelState layOutModelState(data::Objective& objective, const config::Config& c, Device device, DType compute,
                            dist::ProcessGroup* group, dist::ProcessGroup* expertDataGroup,
                            RankShares shares) {
  ModelState s;
  s.stage = int(c.zero.stage);
  s.device = device;
  int ranks = group ? group->size() : 1;
  // The device's memory (STRATA_DEVICE_MEMORY_GB stands in for it in tests), this rank's share of it where
  // ranks share the device (NOTE [Per-node shares] in distributed/Launch.h).
  const char* memoryOverride = std::getenv("STRATA_DEVICE_MEMORY_GB");
  s.deviceMemoryGiven = memoryOverride != nullptr;
  s.deviceMemory = memoryOverride ? zero::parseBudgetGb(memoryOverride, 0, "STRATA_DEVICE_MEMORY_GB")
                                  : dist::perRankShare(deviceMemoryBytes(device), shares.ranksOnDevice);
  // A model whose fp32 masters and 16-bit chunks would crowd the device together: the masters are made in
  // host memory, and those of chunks whose state the placement keeps on the device move there after it. On
  // several ranks too: every rank builds the whole model's masters before it keeps its shard of them.
  // Masters that outgrow the host's memory are split between it and the device, and the optimizer moves each
  // to its tier, the SSD's first (NOTE [Masters at layout] in plan/PlacementInputs.h).
  // A model built with deferred parameters is laid out sharded from the start at stages 1 to 3: this rank
  // makes the masters of its shards only, and at stage 3 only its shards of the parameters (NOTE [Sharded
  // layout] in zero/ChunkManager.h). Every rank makes the same values from the seed, so none is broadcast.
  bool deferred = deferredOnEveryRank(objective.model(), group, device);
  std::set<std::string> expertNames;
  s.experts = findExperts(objective.model(), expertNames);
  zero::ChunkFamilies families;
  int expertRanks = expertDataGroup ? expertDataGroup->size() : 1;
  if (!expertNames.empty()) {
    STRATA_CHECK(expertDataGroup != nullptr || ranks == 1,
                 "ZeroStepEngine: expert-parallel MoE layers without an expert-data-parallel group");
    families.of = [&](const std::string& name) { return expertNames.count(name) ? 1 : 0; };
    families.shards = {ranks, expertRanks};
  }
  std::optional<zero::ShardedLayout> sharded;
  if (deferred && s.stage >= 1)
    sharded = zero::ShardedLayout{{group ? group->rank() : 0, expertDataGroup ? expertDataGroup->rank() : 0},
                                  s.stage == 3};
  plan::LayoutElems elems;
  uint64_t modelElems = 0;
  std::set<const TensorImpl*> counted;
  for (const auto& [name, p] : objective.model().namedParameters()) {
    if (!counted.insert(&p.impl()).second) continue;
    modelElems += uint64_t(p.numel());
    uint64_t n = uint64_t(p.numel()), shards = uint64_t(expertNames.count(name) ? expertRanks : ranks);
    elems.masters += sharded ? n / shards : n;
    elems.chunks += sharded && sharded->parameters ? n / shards : n;
  }
  uint64_t hostMasterBytes = !device.isCpu() && dtypeSize(compute) == 2 && s.deviceMemory > 0
                                 ? mastersOnHostBytes(c, elems, s.deviceMemory, shares)
                                 : 0;
  // A large model's layout makes every value it keeps: say so before, and how long it took after.
  bool report = modelElems >= 1'000'000'000 && (group == nullptr || group->rank() == 0);
  auto start = std::chrono::steady_clock::now();
  if (report)
    spdlog::info(
        "laying out {:.2f} B parameters in {} chunks{}", double(modelElems) / 1e9, dtypeName(compute),
        sharded ? (sharded->parameters ? ": this rank makes its shards of the values and the masters"
                                       : ": this rank makes every value and its shards of the masters")
                : "");
  s.chunks = layOutModelChunks(objective, device, compute, int64_t(c.zero.chunkSizeMb * double(1 << 20)),
                               ranks, hostMasterBytes, families, sharded);
  if (report)
    spdlog::info("laid out in {:.1f} s",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  s.groups = zero::ChunkGroups(*s.chunks, group, expertDataGroup);
  s.tensor = nn::tensorParallelOf(objective.model());
  if (s.tensor.active()) {
    std::map<std::string, nn::TensorSlice> slices = nn::tensorParallelSlices(objective.model());
    for (const zero::ChunkSlot& slot : s.chunks->layout().slots)
      s.sliceSlots.push_back(slices.count(slot.name) > 0);
  }
  // precision.grad_accum_dtype: 16-bit gradient buffers for 16-bit chunks (a CPU run of a bf16 config
  // computes in fp32 and keeps fp32 ones).
  if (c.precision.gradAccumDType != "fp32" && dtypeSize(compute) == 2) s.chunks->setGradientDType(compute);
  s.masters = s.chunks->takeMasters();
  if (!deferred) broadcastStartingWeights(s);
  keepShards(s);
  return s;
}

namespace {

// The store's budgets as `strata plan` reads them (plan/PlacementInputs.h), so the two place alike, with
// this rank's share of the host's memory and disk (NOTE [Per-node shares] in distributed/Launch.h).
zero::StoreBudgets budgetsFor(const ModelState& s, const config::Config& c, uint64_t parameterBytes,
                              RankShares shares) {
  if (!c.zero.nvmePath.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(c.zero.nvmePath, ec);
    zero::removeStaleTierFiles(c.zero.nvmePath);  // before the free space is read
  }
  // Masters made in host memory (hostMasterBytes) are the host state's own bytes, not memory in use.
  uint64_t hostMasters = 0;
  for (const Tensor& m : s.masters)
    if (m.device().isCpu() && !s.device.isCpu()) hostMasters += uint64_t(m.nbytes());
  uint64_t hostAvailable = plan::hostAvailableBytes();
  if (hostAvailable != zero::kUnlimited)
    hostAvailable = dist::perRankShare(hostAvailable, shares.ranksOnHost) + hostMasters;
  // NOTE [Host headroom] in plan/PlacementInputs.h.
  uint64_t hostTotal = hostTotalBytes();
  int64_t largest = 0;
  for (size_t i = 0; i < s.chunks->numChunks(); ++i) largest = std::max(largest, s.chunks->paddedElems(i));
  uint64_t headroom = dist::perRankShare(plan::hostHeadroomBytes(c, largest, hostTotal), shares.ranksOnHost);
  return plan::storeBudgets(c, parameterBytes, zero::kUnlimited, hostAvailable,
                            dist::perRankShare(plan::freeDiskBytes(c.zero.nvmePath), shares.ranksOnHost),
                            headroom);
}

// Chunk i's extent in the SSD tier, were its state there: AdamW's master, m and v over its range, or
// Adafactor's fields (NOTE [Adafactor SSD chunks] in optim/Adafactor.h).
zero::NvmeTier::ChunkFields nvmeFields(const ModelState& s, const config::Config& c,
                                       const optim::AdafactorConfig& adafactor, size_t i) {
  if (c.optimizer.type == "adafactor")
    return optim::adafactorTierFields(s.chunks->layout(), i, s.ranges[i], adafactor, plan::nvmeStateDType(c));
  return zero::NvmeTier::ChunkFields::uniform(s.ranges[i].size(), plan::nvmeStateDType(c));
}

// What the placement weighs for each chunk: this rank's parameter bytes (on the device), each chunk's
// optimizer state in memory and on the SSD (where m and v may be kept in half precision).
struct StateBytes {
  uint64_t parameters = 0;
  std::vector<uint64_t> parameterChunks, optimizer, nvme;  // per chunk
};

StateBytes stateBytes(const ModelState& s, const config::Config& c, const optim::AdafactorConfig& adafactor) {
  StateBytes b;
  for (size_t i = 0; i < s.chunks->numChunks(); ++i) {
    b.parameterChunks.push_back(uint64_t(s.parameterHome(i).nbytes()));
    b.parameters += b.parameterChunks.back();
    // AdamW: the fp32 master, m and v (fp32 or bf16, optimizer.moments_dtype); Adafactor: the master and its
    // state.
    uint64_t elems = uint64_t(s.ranges[i].size());
    b.optimizer.push_back(c.optimizer.type == "adafactor"
                              ? elems * 4 +
                                    optim::adafactorStateBytes(s.chunks->layout(), i, s.ranges[i], adafactor)
                              : elems * (4 + 2 * dtypeSize(plan::momentsDType(c))));
    b.nvme.push_back(nvmeFields(s, c, adafactor, i).bytes());
  }
  return b;
}

// NOTE [Store placement] in zero/Store.h: the parameters go to the device while its budget lasts (or where
// store.parameter_home puts them), then to host memory; each chunk's optimizer state goes to the device while
// its budget lasts, then to host memory, then to the SSD. NOTE [Memory tracer]: a model whose state would
// crowd the device starts with its optimizer state off it, and the first step decides how much comes back
// (s.traced).
void place(ModelState& s, const config::Config& c, DType compute, const StateBytes& bytes,
           zero::StoreBudgets budgets, uint64_t plannedDeviceBudget) {
  bool autoDevice = c.zero.offloadOptimizerDevice == "none" &&
                    (c.store.gpuBudgetGb.empty() || c.store.gpuBudgetGb == "auto");
  zero::ParameterHome home = zero::parseParameterHome(c.store.parameterHome);
  // The parameters the device must hold whatever its budget, and those it may hold (none when they are all
  // homed off it).
  uint64_t deviceParameters = home == zero::ParameterHome::Device ? bytes.parameters : 0;
  bool allOffDevice = home == zero::ParameterHome::Host || home == zero::ParameterHome::Nvme;
  // One placement truth: the plan's budget for the device (plan/Plan.h), where the trainer made one.
  if (autoDevice && plannedDeviceBudget > 0) budgets.device = std::max(plannedDeviceBudget, deviceParameters);
  auto placeWithin = [&](zero::StoreBudgets b) {
    if (autoDevice && s.deviceMemory > 0 && (!s.device.isCpu() || s.deviceMemoryGiven)) {
      uint64_t estimate = allOffDevice ? 0 : bytes.parameters;
      for (size_t i = 0; i < s.chunks->numChunks(); ++i)
        estimate += bytes.optimizer[i] + uint64_t(s.chunks->paddedElems(i)) *
                                             dtypeSize(s.chunks->gradientDType());  // state, gradient buffers
      if (double(estimate) > 0.8 * double(s.deviceMemory)) {
        // Off the device what the host and the SSD can hold; the first step measures what may come back.
        uint64_t least =
            zero::smallestDeviceBudget(allOffDevice ? 0 : bytes.parameters, bytes.optimizer, b, bytes.nvme);
        // A device budget (the plan's) that homes parameters in host memory stays: the smallest one
        // assumes every parameter on the device.
        bool homesParameters = home != zero::ParameterHome::Device && b.device < bytes.parameters;
        if (least != zero::kUnlimited && !homesParameters) b.device = least;
        s.traced = true;
      }
    }
    return zero::placeModelState(bytes.parameterChunks, home, bytes.optimizer, b, bytes.nvme);
  };
  // The automatic host budget leaves room for the delayed SSD update's pending update (NOTE [Delayed SSD
  // update] in optim/AdamW.h) and the gradient homes' buffers (NOTE [Gradient homes] in
  // zero/GradientReducer.h).
  plan::GradientBuffers buffers;
  for (const auto& r : s.ranges) buffers.rangeElems.push_back(r.size());
  for (size_t i = 0; i < s.chunks->numChunks(); ++i) buffers.paddedElems.push_back(s.chunks->paddedElems(i));
  buffers.dtype = s.chunks->gradientDType();
  buffers.stage = s.stage;
  buffers.ranks = s.groups.ranks();
  buffers.pipeline = s.pipeline.active();
  buffers.onGpu = s.device.isCuda();
  s.placement = plan::placeWithHostReserves(c, compute, buffers, budgets, placeWithin);
}

// The SSD tier the placement asks for: the optimizer state of its chunks there, and the parameters homed
// there (NOTE [Parameter homes] in zero/ParameterGatherer.h).
void makeNvmeTier(ModelState& s, const config::Config& c, const optim::AdafactorConfig& adafactorConfig) {
  std::vector<zero::NvmeTier::ChunkFields> nvmeFieldsOf(s.chunks->numChunks());
  for (size_t i = 0; i < s.chunks->numChunks(); ++i) {
    if (s.placement.optimizerTier[i] == zero::Tier::Nvme)
      nvmeFieldsOf[i] = nvmeFields(s, c, adafactorConfig, i);
    if (s.placement.parameterHome(i) == zero::Tier::Nvme)
      nvmeFieldsOf[i].withParameters(s.parameterHome(i).numel(), s.parameterHome(i).dtype());
  }
  if (s.placement.chunksOn(zero::Tier::Nvme) > 0 || s.placement.parameterChunksOn(zero::Tier::Nvme) > 0)
    s.nvme = std::make_unique<zero::NvmeTier>(c.zero.nvmePath, s.groups.rank(), plan::nvmeStateDType(c),
                                              nvmeFieldsOf,
                                              zero::NvmeIoConfig{c.zero.aioBlockSize, c.zero.aioQueueDepth});
}

// The optimizer over every tier, which takes the masters.
void makeOptimizer(ModelState& s, const config::Config& c, const optim::AdafactorConfig& adafactorConfig) {
  for (size_t i = 0; i < s.masters.size(); ++i)
    if (s.placement.optimizerTier[i] == zero::Tier::Device && s.masters[i].defined() &&
        s.masters[i].device() != s.device)
      s.masters[i] = ops::to(s.masters[i], s.device, DType::F32);
  if (c.optimizer.type == "adafactor") {
    s.optimizer =
        std::make_unique<optim::Adafactor>(*s.chunks, std::move(s.masters), adafactorConfig, s.ranges,
                                           s.parameterShards, s.placement.optimizerTier, s.nvme.get());
  } else {
    s.optimizer = std::make_unique<optim::AdamW>(
        *s.chunks, std::move(s.masters),
        optim::AdamWConfig{c.optimizer.lr, c.optimizer.betas[0], c.optimizer.betas[1], c.optimizer.eps,
                           c.optimizer.weightDecay, c.optimizer.pipeline, c.zero.pinMemory,
                           std::max<int64_t>(1, int64_t(c.optimizer.pipelinePieceMb * double(1 << 20) / 4)),
                           c.store.delayedUpdate, int(c.zero.bufferCount), plan::momentsDType(c)},
        s.ranges, s.parameterShards, s.placement.optimizerTier, s.nvme.get());
  }
  s.masters.clear();
  emptyDeviceCache(s.device);  // masters left on the device by the layout went to their tiers
  STRATA_CHECK(s.optimizer->acceptsGradients(s.chunks->gradientDType()),
               "optimizer.type {} does not read {} gradients", c.optimizer.type, s.chunks->gradientDType());
}

// NOTE [Parameter homes] in zero/ParameterGatherer.h: the chunks the placement homes in host memory move
// there (this rank's shard at stage 3, the whole chunk at stage 0), page-locked where a GPU copies from
// them, and those it homes on the SSD are written into the tier's Parameters field; what the engine cannot
// drive with homes off the device is refused before any work.
void homeParameters(ModelState& s, const config::Config& c) {
  size_t offDevice =
      s.placement.parameterChunksOn(zero::Tier::Host) + s.placement.parameterChunksOn(zero::Tier::Nvme);
  if (offDevice == 0) return;
  std::string why = c.store.parameterHome == "host"
                        ? std::string("store.parameter_home is host")
                        : detail::format(
                              "store.parameter_home is auto and {} chunks' parameters do not fit "
                              "store.gpu_budget_gb",
                              offDevice);
  STRATA_USER_CHECK(s.stage == 0 || s.stage == 3,
                    "{}: parameters homed off the GPU need zero_optimization.stage 0 or 3 (it is {}: stages "
                    "1 and 2 all-gather the updated shards into resident chunks); set "
                    "zero_optimization.stage to 3 (or 0), or store.parameter_home: device with a larger "
                    "store.gpu_budget_gb",
                    why, s.stage);
  STRATA_USER_CHECK(!c.store.delayedUpdate,
                    "{}: parameters homed off the GPU do not combine with store.delayed_update; set "
                    "store.delayed_update: false, or store.parameter_home: device",
                    why);
  STRATA_USER_CHECK(!s.pipeline.active(),
                    "{}: parameters homed off the GPU do not combine with parallel.pipeline; set "
                    "store.parameter_home: device",
                    why);
  NoGradGuard noGrad;
  if (s.parameterShards.empty())
    for (size_t i = 0; i < s.chunks->numChunks(); ++i) s.parameterShards.push_back(s.chunks->paddedFlat(i));
  bool pin = c.zero.pinMemory && s.device.isCuda();
  // The SSD chunks' parameterShards[c] become views of one host buffer of the largest of them: the
  // checkpoint load fills it a chunk at a time before writing the chunk's extent, and the update writes the
  // new values into the extent from its own staging.
  int64_t largestOnSsd = 0;
  for (size_t i = 0; i < s.chunks->numChunks(); ++i)
    if (s.placement.parameterHome(i) == zero::Tier::Nvme)
      largestOnSsd = std::max(largestOnSsd, s.parameterShards[i].numel());
  Tensor scratch =
      largestOnSsd > 0 ? Tensor::empty({largestOnSsd}, s.chunks->dtype(), Device::cpu()) : Tensor();
  for (size_t i = 0; i < s.chunks->numChunks(); ++i) {
    zero::Tier tier = s.placement.parameterHome(i);
    if (tier == zero::Tier::Device) continue;
    const Tensor& values = s.parameterShards[i];
    if (tier == zero::Tier::Host) {
      Tensor home = optim::hostStateTensor(values.numel(), values.dtype(), pin);
      ops::copy(home, values);
      s.parameterShards[i] = home;
      continue;
    }
    // A copy of its own: the chunk's storage goes when the gatherer evicts it.
    Tensor host = values.device().isCpu() ? values.clone() : ops::to(values, Device::cpu(), values.dtype());
    s.nvme->wait(s.nvme->writeAsync(i, {{zero::NvmeTier::Parameters, host.data(), host.dtype()}}));
    // fp32 chunks have no masters: the optimizer takes the values it starts from here, as the parameters
    // no longer hold them.
    if (host.dtype() == DType::F32) {
      s.masters.resize(s.chunks->numChunks());
      s.masters[i] = host;
    }
    s.parameterShards[i] = scratch.narrow(0, 0, values.numel());
  }
  emptyDeviceCache(s.device);
}

void checkPlacementTotal(const ModelState& s) {
  STRATA_CHECK(s.placement.total() == s.bytes(),
               "the store holds {} bytes across its tiers, {} of model state", s.placement.total(),
               s.bytes());
}

}  // namespace

void placeModelState(ModelState& s, const config::Config& c, DType compute, RankShares shares) {
  optim::AdafactorConfig adafactorConfig = config::adafactorConfigFrom(c);
  adafactorConfig.pinHostState = c.zero.pinMemory;
  StateBytes bytes = stateBytes(s, c, adafactorConfig);
  place(s, c, compute, bytes, budgetsFor(s, c, bytes.parameters, shares), shares.plannedDeviceBudget);
  makeNvmeTier(s, c, adafactorConfig);
  homeParameters(s, c);
}

void makeChunkOptimizer(ModelState& s, const config::Config& c) {
  optim::AdafactorConfig adafactorConfig = config::adafactorConfigFrom(c);
  adafactorConfig.pinHostState = c.zero.pinMemory;
  // Making a large model's state off the device takes a while (the SSD's is written at its speed, the host's
  // is page-locked): say so before, and how long it took after.
  std::array<uint64_t, 3> byTier{};
  for (size_t i = 0; i < s.chunks->numChunks(); ++i)
    byTier[size_t(s.placement.optimizerTier[i])] += s.placement.optimizerBytes[i];
  uint64_t offDevice = byTier[size_t(zero::Tier::Host)] + byTier[size_t(zero::Tier::Nvme)];
  bool report = offDevice >= (4ull << 30) && s.groups.rank() == 0;
  auto gib = [](uint64_t b) { return double(b) / double(1ull << 30); };
  auto start = std::chrono::steady_clock::now();
  if (report)
    spdlog::info(
        "making the optimizer state: {:.1f} GiB in host memory{}, {:.1f} GiB written to the SSD, {:.1f} "
        "GiB on the device",
        gib(byTier[size_t(zero::Tier::Host)]), c.zero.pinMemory ? " (page-locked)" : "",
        gib(byTier[size_t(zero::Tier::Nvme)]), gib(byTier[size_t(zero::Tier::Device)]));
  makeOptimizer(s, c, adafactorConfig);
  if (report)
    spdlog::info("optimizer state made in {:.1f} s",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  // The bytes as they are: an fp32 chunk's state on the device has no separate master, and the SSD may keep
  // m and v in half precision.
  for (uint64_t& b : s.placement.bytes) b = 0;
  for (size_t i = 0; i < s.chunks->numChunks(); ++i) {
    uint64_t state = s.optimizer->stateBytes(i);
    if (s.placement.optimizerTier[i] == zero::Tier::Nvme) state = s.nvme->chunkStateBytes(i);
    s.placement.optimizerBytes[i] = state;
    s.placement.bytes[int(s.placement.optimizerTier[i])] += state;
  }
  s.placement.bytes[int(zero::Tier::Device)] += s.placement.parameterBytes;
  s.placement.bytes[int(zero::Tier::Host)] += s.placement.parameterHostBytes;
  s.placement.bytes[int(zero::Tier::Nvme)] += s.placement.parameterNvmeBytes;
  checkPlacementTotal(s);
}

void promoteTracedState(ModelState& s, const std::vector<uint64_t>& gradientsBack) {
  // NOTE [Delayed SSD update] in optim/AdamW.h: a pending delayed update stays pending; moveToDevice writes
  // the moved chunks' own parameters.
  s.optimizer->waitDelayed();
  synchronizeDevice(s.device);
  AllocatorStats stats = deviceAllocator(s.device).stats();
  // With collectives on other streams, freed blocks wait for those streams before reuse and hold memory
  // meanwhile: the step took its reserved peak from the device, not only its allocated one.
  uint64_t peak = s.groups.communicates() ? std::max(stats.peakAllocatedBytes, stats.peakReservedBytes)
                                          : stats.peakAllocatedBytes;
  if (s.device.isCpu())
    peak -= std::min(peak, s.placement.bytes[int(zero::Tier::Host)]);  // one pool on the CPU
  uint64_t margin = std::min<uint64_t>(1ull << 30, s.deviceMemory / 16);
  uint64_t usable = plan::usableDeviceBytes(s.deviceMemory);  // what `strata plan` fits within too
  uint64_t room = usable > peak ? usable - peak : 0;
  if (!s.device.isCpu() && !std::getenv("STRATA_DEVICE_MEMORY_GB")) {
    // What the device really has left: other processes' contexts (ranks sharing the GPU) and libraries'
    // own buffers (NCCL's) are not in this allocator's figures. The step's transient peak above what is
    // held now must still fit beside the promoted state.
    uint64_t held = stats.allocatedBytes, cached = stats.reservedBytes - stats.allocatedBytes;
    uint64_t free = deviceFreeBytes(s.device) + cached;
    uint64_t transient = peak > held ? peak - held : 0;
    room = std::min(room, free > transient + margin ? free - transient - margin : 0);
  }
  std::vector<uint64_t> deviceBytes;
  for (size_t c = 0; c < s.chunks->numChunks(); ++c) deviceBytes.push_back(s.optimizer->deviceStateBytes(c));
  // A chunk whose gradients went to the host in the traced step keeps them on the device once its state is
  // there: its move takes their room too.
  std::vector<uint64_t> takes = deviceBytes;
  for (size_t c = 0; c < gradientsBack.size(); ++c) takes[c] += gradientsBack[c];
  std::vector<size_t> moved = zero::chunksToPromote(s.placement, takes, room);
  uint64_t movedBytes = 0;
  for (size_t c : moved) {
    zero::Tier from = s.placement.optimizerTier[c];
    s.optimizer->moveToDevice(c, s.device);
    if (from == zero::Tier::Nvme) s.nvme->release(c);
    s.placement.bytes[int(from)] -= s.placement.optimizerBytes[c];
    s.placement.optimizerBytes[c] = deviceBytes[c];
    s.placement.optimizerTier[c] = zero::Tier::Device;
    s.placement.bytes[int(zero::Tier::Device)] += deviceBytes[c];
    movedBytes += deviceBytes[c];
  }
  checkPlacementTotal(s);
  if (s.groups.rank() == 0) {
    auto gib = [](uint64_t b) { return double(b) / double(1ull << 30); };
    spdlog::info(
        "memory tracer: the first step peaked at {:.2f} GiB of the device's {:.2f} GiB; moved the "
        "optimizer state of {} chunk{} ({:.2f} GiB) onto the device\n{}",
        gib(peak), gib(s.deviceMemory), moved.size(), moved.size() == 1 ? "" : "s", gib(movedBytes),
        s.placement.table());
  }
}

size_t ModelState::bytes() const {
  size_t total = 0;
  for (size_t c = 0; c < chunks->numChunks(); ++c) total += parameterHome(c).nbytes();
  for (size_t c = 0; c < chunks->numChunks(); ++c) total += optimizer->stateBytes(c);
  if (nvme) total += nvme->stateBytes();
  return total;
}

}  // namespace strata::train
