#include "strata/train/StepEngine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "strata/autograd/Engine.h"
#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"
#include "strata/autograd/Node.h"
#include "strata/core/Allocator.h"
#include "strata/core/Generator.h"
#include "strata/core/Profiler.h"
#include "strata/core/Stream.h"
#include "strata/dist/Launch.h"
#include "strata/dist/ProcessGroup.h"
#include "strata/nn/MoE.h"
#include "strata/ops/Ops.h"
#include "strata/optim/Adafactor.h"
#include "strata/optim/AdamW.h"
#include "strata/train/PlacementInputs.h"

namespace strata::train {

namespace {
// STRATA_MEMLOG=1: the device's allocated and peak bytes at the phases of the first steps (where a peak
// comes from).
void memlog(Device device, const char* phase, int64_t step) {
  static const bool on = [] {
    const char* e = std::getenv("STRATA_MEMLOG");
    return e != nullptr && std::string(e) != "0";
  }();
  if (!on || step > 2) return;
  AllocatorStats st = deviceAllocator(device).stats();
  spdlog::info("memory, step {} {}: allocated {:.2f} GiB, peak {:.2f} GiB", step, phase,
               double(st.allocatedBytes) / double(1 << 30), double(st.peakAllocatedBytes) / double(1 << 30));
}
}  // namespace

std::unique_ptr<zero::ChunkManager> layOutModelChunks(Objective& objective, Device device, DType compute,
                                                      int64_t chunkBytes, int shards, bool mastersOnHost,
                                                      const zero::ChunkFamilies& families) {
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
      objective.loss(TokenBatch{ids, ids}, source);
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
      mastersOnHost ? std::optional<Device>(Device::cpu()) : std::nullopt, families);
  // The model's old per-parameter storages went back to the caching allocator; return them to the device so
  // the chunks' layout is what the step's activations see.
  if (auto* caching = dynamic_cast<CachingAllocator*>(&deviceAllocator(device))) caching->emptyCache();
  return chunks;
}

ZeroStepEngine::ZeroStepEngine(Objective& objective, const Config& c, Device device, DType compute,
                               dist::ProcessGroup* group, dist::ProcessGroup* expertDataGroup,
                               RankShares shares)
    : objective_(objective),
      model_(objective.model()),
      device_(device),
      compute_(compute),
      clipGrad_(c.optimizer.clipGrad),
      stage_(int(c.zero.stage)),
      group_(group),
      expertDataGroup_(expertDataGroup) {
  int ranks = group_ ? group_->size() : 1;
  rank_ = group_ ? group_->rank() : 0;
  delayedUpdate_ = c.store.delayedUpdate;
  if (compute_ == DType::F16)
    scaler_ = std::make_unique<optim::LossScaler>(optim::LossScalerConfig{
        c.precision.initialLossScale, c.precision.lossScaleWindow, c.precision.minLossScale});
  // The device's memory (STRATA_DEVICE_MEMORY_GB stands in for it in tests), this rank's share of it where
  // ranks share the device (NOTE [Per-node shares] in dist/Launch.h).
  const char* memoryOverride = std::getenv("STRATA_DEVICE_MEMORY_GB");
  deviceMemory_ = memoryOverride ? zero::parseBudgetGb(memoryOverride, 0, "STRATA_DEVICE_MEMORY_GB")
                                 : dist::perRankShare(deviceMemoryBytes(device_), shares.ranksOnDevice);
  // A model whose fp32 masters and 16-bit chunks would crowd the device together: the masters are made in
  // host memory, and those of chunks whose state the placement keeps on the device move there after it. On
  // several ranks too: every rank builds the whole model's masters before it keeps its shard of them.
  uint64_t modelElems = 0;
  for (const Tensor& p : model_.parameters()) modelElems += uint64_t(p.numel());
  bool mastersOnHost = !device_.isCpu() && dtypeSize(compute_) == 2 && deviceMemory_ > 0 &&
                       double(modelElems) * 6 > 0.7 * double(deviceMemory_);
  // NOTE [Expert parallelism] in nn/MoE.h: the experts of expert-parallel MoE layers (family 1) are
  // sharded over the ranks that hold the same experts.
  // Each expert parameter's name, and its name on another expert-parallel rank (for checkpoints).
  std::vector<std::pair<std::string, std::function<std::string(int)>>> rename;
  std::set<std::string> expertNames;
  int expertRanks = 1, expertRank = 0;
  for (auto& [name, module] : model_.namedModules())
    if (auto* moe = dynamic_cast<nn::MoE*>(module); moe && moe->config().expertParallel.size > 1) {
      expertRanks = moe->config().expertParallel.size;
      expertRank = moe->config().expertParallel.rank;
      for (int64_t e = 0; e < moe->numLocalExperts(); ++e)
        for (auto& [pname, p] : moe->expert(size_t(e)).namedParameters()) {
          auto nameOn = [prefix = name + ".experts.", e, local = moe->numLocalExperts(), rest = "." + pname](
                            int rank) { return prefix + std::to_string(local * rank + e) + rest; };
          expertNames.insert(nameOn(expertRank));
          rename.emplace_back(nameOn(expertRank), nameOn);
        }
    }
  zero::ChunkFamilies families;
  if (!expertNames.empty()) {
    STRATA_CHECK(expertDataGroup_ != nullptr || ranks == 1,
                 "ZeroStepEngine: expert-parallel MoE layers without an expert-data-parallel group");
    families.of = [&](const std::string& name) { return expertNames.count(name) ? 1 : 0; };
    families.shards = {ranks, expertDataGroup_ ? expertDataGroup_->size() : 1};
  }
  chunks_ = layOutModelChunks(objective_, device_, compute_, int64_t(c.zero.chunkSizeMb * double(1 << 20)),
                              ranks, mastersOnHost, families);
  for (size_t i = 0; i < chunks_->numChunks(); ++i)
    chunkGroups_.push_back(chunks_->family(i) == 1 ? expertDataGroup_ : group_);
  planCheckpointLayout(rename, expertRanks, expertRank);
  // precision.grad_accum_dtype: 16-bit gradient buffers for 16-bit chunks (a CPU run of a bf16 config
  // computes in fp32 and keeps fp32 ones).
  bool adafactor = c.optimizer.type == "adafactor";
  if (c.precision.gradAccumDType != "fp32" && dtypeSize(compute_) == 2) chunks_->setGradientDType(compute_);
  std::vector<Tensor> masters = chunks_->takeMasters();
  // Every rank starts from the weights of its group's rank 0 (they are equal when built from one seed; this
  // makes it so). NOTE [Collective ordering and completion] in dist/Communicator.h: the broadcasts wait for
  // the layout's writes, and the copies into the chunks wait for the broadcasts.
  const Stream& commStream = deviceStreams(device_).comm;
  streamWaits(commStream, currentStream(device_), device_);
  for (size_t i = 0; i < chunks_->numChunks(); ++i) {
    if (!communicates(i)) continue;
    comm(i).broadcast(masters.empty() ? chunks_->paddedFlat(i) : masters[i], 0);
  }
  streamWaits(currentStream(device_), commStream, device_);
  for (size_t i = 0; i < masters.size(); ++i)
    if (communicates(i)) ops::copy(chunks_->paddedFlat(i), masters[i]);
  std::vector<zero::ShardRange> ranges;
  if (stage_ >= 1) {
    // Stages 1 and 2: this rank keeps the masters and moments of its shard of each chunk only.
    for (size_t i = 0; i < chunks_->numChunks(); ++i) {
      ranges.push_back(shard(i));
      if (!masters.empty()) masters[i] = masters[i].narrow(0, ranges[i].begin, ranges[i].size()).clone();
    }
    if (auto* caching = dynamic_cast<CachingAllocator*>(&deviceAllocator(device_))) caching->emptyCache();
  } else {
    for (size_t i = 0; i < chunks_->numChunks(); ++i) ranges.push_back({0, chunks_->paddedElems(i)});
  }
  if (stage_ == 3) {
    // Stage 3: each rank keeps only its shard of the parameters too; a chunk is gathered whole into a slot
    // while a module that uses it runs, forward and backward (NOTE [Parameter gathering]).
    for (size_t i = 0; i < chunks_->numChunks(); ++i)
      paramShards_.push_back(chunks_->paddedFlat(i).narrow(0, ranges[i].begin, ranges[i].size()).clone());
    slots_.resize(chunks_->numChunks());
    for (size_t i = 0; i < chunks_->numChunks(); ++i) gathered_.push_back(std::make_unique<Event>(device_));
    prefetched_.assign(chunks_->numChunks(), false);
    prefetchDepth_ = c.zero.prefetchDepth;
    for (size_t i = 0; i < chunks_->numChunks(); ++i) chunks_->evict(i);
    if (auto* caching = dynamic_cast<CachingAllocator*>(&deviceAllocator(device_))) caching->emptyCache();
    arenaSlot_.assign(chunks_->numChunks(), -1);
    if (c.store.arena) {
      // NOTE [Chunk arena] in zero/ChunkArena.h: one reservation per slot class (the chunks of the layout's
      // size, and the oversized ones), each of slots the size of its largest chunk.
      std::vector<int64_t> used, padded;
      for (size_t i = 0; i < chunks_->numChunks(); ++i) {
        used.push_back(chunks_->layout().chunks[i].used);
        padded.push_back(chunks_->paddedElems(i));
      }
      zero::ChunkArenaPlan plan =
          zero::planChunkArena(used, padded, chunks_->layout().chunkElems, prefetchDepth_);
      for (size_t k = 0; k < plan.slots.size(); ++k) {
        arenas_.push_back(std::make_unique<zero::ChunkArena>(
            deviceAllocator(device_), size_t(plan.slotElems[k]) * dtypeSize(chunks_->dtype()),
            plan.slots[k]));
        arenas_.back()->recordStream(deviceStreams(device_).gather);
      }
      arenaClass_ = plan.classOf;
    }
    hookModules();
  }
  // The store's placement (NOTE [Store placement] in zero/Store.h): the parameters stay on the device; each
  // chunk's optimizer state goes to the device while its budget lasts, then to host memory.
  uint64_t parameterBytes = 0;
  std::vector<uint64_t> optimizerBytes;
  optim::AdafactorConfig adafactorConfig = adafactorConfigFrom(c);
  adafactorConfig.pinHostState = c.zero.pinMemory;
  for (size_t i = 0; i < chunks_->numChunks(); ++i) {
    parameterBytes += stage_ == 3 ? paramShards_[i].nbytes() : chunks_->paddedFlat(i).nbytes();
    // AdamW: master, m, v (fp32); Adafactor: the master and its state.
    optimizerBytes.push_back(
        adafactor ? uint64_t(ranges[i].size()) * 4 +
                        optim::adafactorStateBytes(chunks_->layout(), i, ranges[i], adafactorConfig)
                  : uint64_t(ranges[i].size()) * 4 * 3);
  }
  // The budgets as `strata plan` reads them (train/PlacementInputs.h), so the two place alike.
  const std::string& offload = c.zero.offloadOptimizerDevice;
  if (!c.zero.nvmePath.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(c.zero.nvmePath, ec);
    zero::removeStaleTierFiles(c.zero.nvmePath);  // before the free space is read
  }
  // Masters made in host memory (mastersOnHost) are the host state's own bytes, not memory in use.
  uint64_t hostMasters = 0;
  for (const Tensor& m : masters)
    if (m.device().isCpu() && !device_.isCpu()) hostMasters += uint64_t(m.nbytes());
  // The host's memory and disk are shared by the ranks on it (NOTE [Per-node shares] in dist/Launch.h).
  uint64_t hostAvailable = zero::availableHostBytes();
  if (hostAvailable != zero::kUnlimited)
    hostAvailable = dist::perRankShare(hostAvailable, shares.ranksOnHost) + hostMasters;
  zero::StoreBudgets budgets =
      storeBudgets(c, parameterBytes, zero::kUnlimited, hostAvailable,
                   dist::perRankShare(freeDiskBytes(c.zero.nvmePath), shares.ranksOnHost));
  // NOTE [Memory tracer] in zero/Store.h: a model whose state would crowd the device starts with its
  // optimizer state off it, and the first step decides how much comes back.
  // On the SSD, m and v may be kept in half precision (the master stays fp32).
  DType nvmeDType = nvmeStateDType(c);
  std::vector<uint64_t> nvmeBytes;
  for (size_t i = 0; i < chunks_->numChunks(); ++i)
    nvmeBytes.push_back(uint64_t(ranges[i].size()) * (4 + 2 * dtypeSize(nvmeDType)));
  bool autoDevice = offload == "none" && (c.store.gpuBudgetGb.empty() || c.store.gpuBudgetGb == "auto");
  auto place = [&](zero::StoreBudgets b) {
    if (autoDevice && deviceMemory_ > 0 && (!device_.isCpu() || memoryOverride)) {
      uint64_t estimate = parameterBytes;
      for (size_t i = 0; i < chunks_->numChunks(); ++i)
        estimate += optimizerBytes[i] + uint64_t(chunks_->paddedElems(i)) *
                                            dtypeSize(chunks_->gradientDType());  // state, gradient buffers
      if (double(estimate) > 0.8 * double(deviceMemory_)) {
        // Off the device what the host and the SSD can hold; the first step measures what may come back.
        uint64_t least = zero::smallestDeviceBudget(parameterBytes, optimizerBytes, b, nvmeBytes);
        if (least != zero::kUnlimited) b.device = least;
        trace_ = true;
      }
    }
    return zero::placeModelState(parameterBytes, optimizerBytes, b, nvmeBytes);
  };
  // NOTE [Delayed SSD update] in optim/AdamW.h: the automatic host budget leaves room for the pending update.
  std::vector<int64_t> rangeElems;
  for (const auto& r : ranges) rangeElems.push_back(r.size());
  placement_ = placeWithDelayedReserve(c, compute_, rangeElems, budgets, place);
  std::vector<int64_t> nvmeElems(chunks_->numChunks(), 0);
  for (size_t i = 0; i < chunks_->numChunks(); ++i)
    if (placement_.optimizerTier[i] == zero::Tier::Nvme) nvmeElems[i] = ranges[i].size();
  if (placement_.chunksOn(zero::Tier::Nvme) > 0)
    nvme_ = std::make_unique<zero::NvmeTier>(c.zero.nvmePath, rank_, nvmeElems, nvmeDType,
                                             zero::NvmeIoConfig{c.zero.aioBlockSize, c.zero.aioQueueDepth});
  for (size_t i = 0; i < masters.size(); ++i)
    if (placement_.optimizerTier[i] == zero::Tier::Device && masters[i].device() != device_)
      masters[i] = ops::to(masters[i], device_, DType::F32);
  if (adafactor) {
    optimizer_ = std::make_unique<optim::Adafactor>(*chunks_, std::move(masters), adafactorConfig, ranges,
                                                    paramShards_, placement_.optimizerTier);
  } else {
    optimizer_ = std::make_unique<optim::AdamW>(
        *chunks_, std::move(masters),
        optim::AdamWConfig{c.optimizer.lr, c.optimizer.betas[0], c.optimizer.betas[1], c.optimizer.eps,
                           c.optimizer.weightDecay, c.optimizer.pipeline, c.zero.pinMemory,
                           std::max<int64_t>(1, int64_t(c.optimizer.pipelinePieceMb * double(1 << 20) / 4)),
                           c.store.delayedUpdate, int(c.zero.bufferCount)},
        ranges, paramShards_, placement_.optimizerTier, nvme_.get());
  }
  STRATA_CHECK(optimizer_->acceptsGradients(chunks_->gradientDType()),
               "optimizer.type {} does not read {} gradients", c.optimizer.type, chunks_->gradientDType());
  // The bytes as they are: an fp32 chunk's state on the device has no separate master, and the SSD may keep
  // m and v in half precision.
  for (uint64_t& b : placement_.bytes) b = 0;
  for (size_t i = 0; i < chunks_->numChunks(); ++i) {
    uint64_t state = optimizer_->stateBytes(i);
    if (placement_.optimizerTier[i] == zero::Tier::Nvme)
      state = uint64_t(nvmeElems[i]) * (4 + 2 * dtypeSize(nvme_->stateDType()));
    placement_.optimizerBytes[i] = state;
    placement_.bytes[int(placement_.optimizerTier[i])] += state;
  }
  placement_.bytes[int(zero::Tier::Device)] += parameterBytes;
  STRATA_CHECK(placement_.total() == modelStateBytes(),
               "the store holds {} bytes across its tiers, {} of model state", placement_.total(),
               modelStateBytes());
  shardGrads_.resize(chunks_->numChunks());
  chunkNotices_.assign(chunks_->numChunks(), 0);
  chunks_->onGradientsComplete([this](size_t chunk) { gradientsComplete(chunk); });
  memlog(device_, "engine built", 0);
}

// NOTE [Expert-parallel checkpoints]
// Under expert parallelism the ranks' layouts differ in their expert chunks: the same shapes, other experts.
// A checkpoint's manifest records one layout of the whole model: this rank's chunks, the expert chunks
// holding expert-parallel rank 0's experts, followed by the expert chunks of ranks 1, 2, ... (their experts'
// names). Each rank saves its pieces under its chunks' indices in that layout, so the pieces of different
// experts never share a name. Every piece is found by parameter name, so the checkpoint loads at any
// expert-parallel size (one included), world size and chunk size, and `strata convert` sees every expert.
void ZeroStepEngine::planCheckpointLayout(
    const std::vector<std::pair<std::string, std::function<std::string(int)>>>& rename, int expertRanks,
    int expertRank) {
  const zero::ChunkLayout& local = chunks_->layout();
  checkpointLayout_ = local;
  savedIndex_.clear();
  for (size_t c = 0; c < local.chunks.size(); ++c) savedIndex_.push_back(int64_t(c));
  if (rename.empty()) return;
  std::map<std::string, const std::function<std::string(int)>*> byName;
  for (const auto& [name, fn] : rename) byName[name] = &fn;
  auto nameOn = [&](const std::string& name, int rank) {
    auto it = byName.find(name);
    STRATA_CHECK(it != byName.end(), "expert chunk parameter '{}' is not an expert's", name);
    return (*it->second)(rank);
  };
  std::vector<size_t> expertChunks;
  for (size_t c = 0; c < local.chunks.size(); ++c)
    if (local.chunks[c].family == 1) expertChunks.push_back(c);
  for (auto& slot : checkpointLayout_.slots)
    if (local.chunks[size_t(slot.chunk)].family == 1) slot.name = nameOn(slot.name, 0);
  for (int rank = 1; rank < expertRanks; ++rank)
    for (size_t c : expertChunks) {
      int64_t index = int64_t(checkpointLayout_.chunks.size());
      if (rank == expertRank) savedIndex_[c] = index;
      zero::ChunkInfo info = local.chunks[c];
      info.slots.clear();
      for (int64_t k : local.chunks[c].slots) {
        zero::ChunkSlot slot = local.slots[size_t(k)];
        slot.name = nameOn(slot.name, rank);
        slot.chunk = index;
        info.slots.push_back(int64_t(checkpointLayout_.slots.size()));
        checkpointLayout_.slots.push_back(std::move(slot));
      }
      checkpointLayout_.chunks.push_back(std::move(info));
    }
}

dist::Communicator& ZeroStepEngine::comm() const {
  return group_->communicator();
}

int ZeroStepEngine::rankIn(size_t c) const {
  return chunkGroups_[c] ? chunkGroups_[c]->rank() : 0;
}

bool ZeroStepEngine::communicates(size_t c) const {
  return chunkGroups_[c] && chunkGroups_[c]->communicator().communicates();
}

bool ZeroStepEngine::communicates() const {
  return group_ && group_->communicator().communicates();
}

dist::Communicator& ZeroStepEngine::comm(size_t c) const {
  return chunkGroups_[c]->communicator();
}

void ZeroStepEngine::gradientsComplete(size_t chunk) {
  ++chunkNotices_[chunk];
  NoGradGuard noGrad;
  // A parameter that got no gradient in the step counts as a zero gradient: every element of the chunk is
  // then a gradient the update may read (and the ranks agree on what they reduce).
  for (const Tensor& p : chunks_->parameters(chunk)) {
    if (p.grad().defined()) continue;
    autograd::GradSink sink = autograd::claimGradBuffer(p, /*evenWithHooks=*/true);
    ops::fill(sink.buffer, 0.0);
  }
  Tensor grads = chunks_->ensureGradients(chunk);
  if (!communicates(chunk)) return;
  // 16-bit gradient buffers (precision.grad_accum_dtype) are summed over the ranks in fp32: a 16-bit
  // reduction would round at every hop of NCCL's ring.
  Tensor wide = grads.dtype() == DType::F32 ? grads : ops::to(grads, device_, DType::F32);
  // NOTE [Collective ordering and completion] in dist/Communicator.h: the comm stream waits for the
  // backward that wrote the gradients.
  const Stream& commStream = deviceStreams(device_).comm;
  streamWaits(commStream, currentStream(device_), device_);
  if (stage_ >= 2) {
    // Stages 2 and 3: reduce-scatter at once into this rank's fp32 shard; the chunk's full buffer goes back
    // to the allocator for the next chunk's gradients.
    zero::ShardRange r = shard(chunk);
    shardGrads_[chunk] = Tensor::empty({r.size()}, DType::F32, device_);
    comm(chunk).reduceScatter(shardGrads_[chunk], wide);
    chunks_->releaseGradients(chunk);
  } else {
    comm(chunk).allReduce(wide);
    if (wide.data() != grads.data()) {
      // Back into the 16-bit buffer, once the sum is there.
      streamWaits(currentStream(device_), commStream, device_);
      ops::copy(grads, wide);
    }
  }
}

void ZeroStepEngine::promoteTracedState() {
  // NOTE [Delayed SSD update] in optim/AdamW.h: a pending delayed update stays pending; moveToDevice writes
  // the moved chunks' own parameters.
  optimizer_->waitDelayed();
  synchronizeDevice(device_);
  AllocatorStats stats = deviceAllocator(device_).stats();
  // With collectives on other streams, freed blocks wait for those streams before reuse and hold memory
  // meanwhile: the step took its reserved peak from the device, not only its allocated one.
  uint64_t peak =
      communicates() ? std::max(stats.peakAllocatedBytes, stats.peakReservedBytes) : stats.peakAllocatedBytes;
  if (device_.isCpu())
    peak -= std::min(peak, placement_.bytes[int(zero::Tier::Host)]);  // one pool on the CPU
  uint64_t margin = std::min<uint64_t>(1ull << 30, deviceMemory_ / 16);
  uint64_t limit = uint64_t(0.92 * double(deviceMemory_));
  uint64_t room = limit > peak + margin ? limit - peak - margin : 0;
  if (!device_.isCpu() && !std::getenv("STRATA_DEVICE_MEMORY_GB")) {
    // What the device really has left: other processes' contexts (ranks sharing the GPU) and libraries'
    // own buffers (NCCL's) are not in this allocator's figures. The step's transient peak above what is
    // held now must still fit beside the promoted state.
    uint64_t held = stats.allocatedBytes, cached = stats.reservedBytes - stats.allocatedBytes;
    uint64_t free = deviceFreeBytes(device_) + cached;
    uint64_t transient = peak > held ? peak - held : 0;
    room = std::min(room, free > transient + margin ? free - transient - margin : 0);
  }
  std::vector<uint64_t> deviceBytes;
  for (size_t c = 0; c < chunks_->numChunks(); ++c) deviceBytes.push_back(optimizer_->deviceStateBytes(c));
  std::vector<size_t> moved = zero::chunksToPromote(placement_, deviceBytes, room);
  uint64_t movedBytes = 0;
  for (size_t c : moved) {
    zero::Tier from = placement_.optimizerTier[c];
    optimizer_->moveToDevice(c, device_);
    if (from == zero::Tier::Nvme) nvme_->release(c);
    placement_.bytes[int(from)] -= placement_.optimizerBytes[c];
    placement_.optimizerBytes[c] = deviceBytes[c];
    placement_.optimizerTier[c] = zero::Tier::Device;
    placement_.bytes[int(zero::Tier::Device)] += deviceBytes[c];
    movedBytes += deviceBytes[c];
  }
  STRATA_CHECK(placement_.total() == modelStateBytes(),
               "the store holds {} bytes across its tiers, {} of model state", placement_.total(),
               modelStateBytes());
  // A moved chunk's pending parameters went into this rank's shard only: every rank gathers the chunks
  // again (the same collectives on every rank, whatever each one moved).
  if (delayedUpdate_ && (stage_ == 1 || stage_ == 2)) gatherShards();
  if (rank_ == 0) {
    auto gib = [](uint64_t b) { return double(b) / double(1ull << 30); };
    spdlog::info(
        "memory tracer: the first step peaked at {:.2f} GiB of the device's {:.2f} GiB; moved the "
        "optimizer state of {} chunk{} ({:.2f} GiB) onto the device\n{}",
        gib(peak), gib(deviceMemory_), moved.size(), moved.size() == 1 ? "" : "s", gib(movedBytes),
        placement_.table());
  }
}

StepOutcome ZeroStepEngine::step(const MicroBatchSource& next, int64_t microBatches, double lr) {
  if (trace_ && steps_ == 0) deviceAllocator(device_).resetPeakStats();
  StepOutcome outcome;
  int ranks = group_ ? group_->size() : 1;
  Tensor stepLoss = ops::zeros({}, DType::F32, device_);
  double scale = scaler_ ? scaler_->scale() : 1.0;
  // Every micro-batch of every rank counts 1 / (micro-batches x ranks): the gradients' sum over ranks is the
  // global batch's mean gradient.
  double share = 1.0 / double(microBatches * ranks);
  for (int64_t micro = 0; micro < microBatches; ++micro) {
    TokenBatch batch = next();
    profiler::mark("data");
    Tensor loss = objective_.loss(batch, compute_);
    // Backward gathers again, module by module (what was prefetched for it stays).
    if (stage_ == 3) releaseAll(/*prefetchedToo=*/false);
    memlog(device_, "forward", steps_ + 1);
    Tensor scaled = share != 1.0 ? loss * share : loss;
    // fp16: scale the loss so small gradients stay representable; the update unscales them.
    chunks_->beginBackward(micro + 1 == microBatches);
    backward(scaler_ ? scaled * scale : scaled);
    if (stage_ == 3) {
      releaseAll(/*prefetchedToo=*/true);
      // The first micro-batch's forward and backward recorded the order the later ones prefetch in.
      if (recording_) recording_ = false;
      cursor_ = 0;
    }
    memlog(device_, "backward", steps_ + 1);
    NoGradGuard noGrad;
    stepLoss = ops::add(stepLoss, ops::to(scaled.detach(), device_, DType::F32));
    profiler::mark("loss bookkeeping");
  }
  NoGradGuard noGrad;
  // NOTE [Chunk gradients complete]: every chunk heard exactly once in the step's last backward.
  for (size_t c = 0; c < chunkNotices_.size(); ++c) {
    STRATA_CHECK(chunkNotices_[c] == 1, "chunk {}: {} gradient-complete notices in one step", c,
                 chunkNotices_[c]);
    chunkNotices_[c] = 0;
  }
  // The gradients this rank updates from: the reduced chunks, or (stage 2) the reduced shards.
  std::vector<Tensor> grads(chunks_->numChunks());
  for (size_t c = 0; c < grads.size(); ++c)
    grads[c] = stage_ >= 2 && communicates(c) ? shardGrads_[c] : chunks_->gradients(c);
  if (communicates()) {
    // The reductions ran on the comm stream: the update's reads wait for them.
    streamWaits(currentStream(device_), deviceStreams(device_).comm, device_);
  }
  // The squared norm over this rank's shard of every chunk (the whole chunks on one rank), summed over the
  // ranks in rank order: the same pieces, so the same bits, at every stage.
  Tensor sumSq = shardSquares(grads);
  if (communicates()) {
    Tensor both = ops::cat({sumSq.view({1}), stepLoss.view({1})}, 0);
    streamWaits(deviceStreams(device_).comm, currentStream(device_), device_);
    comm().allReduce(both);
    streamWaits(currentStream(device_), deviceStreams(device_).comm, device_);
    sumSq = both.narrow(0, 0, 1).view({});
    stepLoss = both.narrow(0, 1, 1).view({});
  }
  Tensor norm = ops::sqrt(sumSq);
  profiler::mark("grad norm");
  // NOTE [Step-end decision]: one host read decides the step. The next step's data is staged synchronously
  // anyway, so this costs no overlap.
  outcome.loss = stepLoss.item();
  double scaledNorm = norm.item();
  outcome.finite = std::isfinite(outcome.loss) && std::isfinite(scaledNorm);
  outcome.gradNorm = scaledNorm / scale;
  Tensor coef;
  if (scaler_) {
    if (scaler_->update(outcome.finite ? scaledNorm : NAN)) {
      // Unscale and clip in one factor handed to the fused update.
      double c = 1.0 / scale;
      if (clipGrad_ > 0 && outcome.gradNorm > clipGrad_) c *= clipGrad_ / (outcome.gradNorm + 1e-6);
      coef = ops::full({}, c, DType::F32, device_);
      outcome.applied = true;
    }
    outcome.lossScale = scaler_->scale();
  } else if (outcome.finite) {
    if (clipGrad_ > 0) coef = optim::clipCoefficient(norm, clipGrad_);
    outcome.applied = true;
  }
  if (outcome.applied) {
    optimizer_->stepChunks(lr, grads, coef);
    outcome.offloadSeconds = optimizer_->offDeviceSeconds();
    outcome.offloadPhases = optimizer_->offloadPhases();
    // Each rank updated its shard of the 16-bit parameters: gather the chunks whole again.
    if (stage_ == 1 || stage_ == 2) gatherShards();
  }
  profiler::mark("optimizer step");
  chunks_->releaseGradients();
  for (auto& g : shardGrads_) g = Tensor();
  profiler::mark("zero grad");
  memlog(device_, "update", ++steps_);
  if (trace_ && steps_ == 1) promoteTracedState();
  return outcome;
}

void ZeroStepEngine::gatherShards() {
  if (!communicates()) return;
  // On the gather lane (NOTE [Collective lanes] in dist/Communicator.h).
  const Stream& gatherStream = deviceStreams(device_).gather;
  streamWaits(gatherStream, currentStream(device_), device_);
  for (size_t c = 0; c < chunks_->numChunks(); ++c) {
    if (!communicates(c)) continue;
    zero::ShardRange r = shard(c);
    Tensor full = chunks_->paddedFlat(c);
    comm(c).allGather(full, full.narrow(0, r.begin, r.size()));
  }
  streamWaits(currentStream(device_), gatherStream, device_);
}

Tensor ZeroStepEngine::shardSquares(const std::vector<Tensor>& grads) const {
  // The pieces of the parameters inside this rank's shard of each chunk, in layout order; `grads` holds, per
  // chunk, the whole (padded) chunk's gradients or just the shard's.
  // 16-bit gradient buffers (precision.grad_accum_dtype) are widened to fp32 one chunk at a time, and the
  // chunks' sums added in chunk order.
  std::vector<Tensor> pieces;
  Tensor sum;
  const zero::ChunkLayout& layout = chunks_->layout();
  for (size_t c = 0; c < grads.size(); ++c) {
    zero::ShardRange r = shard(c);
    int64_t base = grads[c].numel() == r.size() ? r.begin : 0;
    bool widen = grads[c].dtype() != DType::F32;
    Tensor g = widen ? ops::to(grads[c], device_, DType::F32) : grads[c];
    for (int64_t k : layout.chunks[c].slots) {
      const zero::ChunkSlot& slot = layout.slots[size_t(k)];
      int64_t a = std::max(slot.offset, r.begin), b = std::min(slot.offset + slot.numel, r.end);
      if (a < b) pieces.push_back(g.narrow(0, a - base, b - a));
    }
    if (widen && !pieces.empty()) {
      Tensor part = ops::sumOfSquares(pieces);
      sum = sum.defined() ? ops::add(sum, part) : part;
      pieces.clear();
    }
  }
  if (!pieces.empty()) {
    Tensor part = ops::sumOfSquares(pieces);
    sum = sum.defined() ? ops::add(sum, part) : part;
  }
  return sum.defined() ? sum : ops::zeros({}, DType::F32, device_);
}

namespace {

// Elements [a, b) of chunk state `t`: the whole padded chunk, or the shard `r` of it.
Tensor chunkRange(const Tensor& t, zero::ShardRange r, int64_t a, int64_t b) {
  int64_t base = t.numel() == r.size() ? r.begin : 0;
  return t.narrow(0, a - base, b - a);
}

}  // namespace

SaveTensor ZeroStepEngine::savePiece(const char* kind, size_t c, int field) const {
  zero::ShardRange r = shard(c);
  int64_t end = std::min(r.end, chunks_->layout().chunks[c].used);
  std::string name = chunkPieceName(kind, savedIndex_[c], r.begin);
  if (optimizer_->home(c) == zero::Tier::Nvme) {
    // Read from the SSD when the writer reaches it: one piece in memory at a time.
    zero::NvmeTier* nvme = nvme_.get();
    int64_t offset = r.begin - optimizer_->ranges()[c].begin;
    return SaveTensor{name,
                      {end - r.begin},
                      DType::F32,
                      [nvme, c, field, offset, n = end - r.begin, whole = optimizer_->ranges()[c].size()] {
                        Tensor all = Tensor::empty({whole}, DType::F32, Device::cpu());
                        nvme->read(c, zero::NvmeTier::Field(field), all.data<float>());
                        return all.narrow(0, offset, n);
                      }};
  }
  // The fp32 values: the masters, or fp32 chunks' own parameters (their shard at stage 3); where those lag
  // their state, the values the next update writes into them (NOTE [Delayed update checkpoints]).
  STRATA_CHECK(field == zero::NvmeTier::Master, "savePiece: chunk {}'s state is not on the SSD", c);
  Tensor pending = optimizer_->hasMaster(c) ? Tensor() : optimizer_->pendingParameters(c);
  Tensor values = optimizer_->hasMaster(c) ? optimizer_->masterFlats()[c]
                  : pending.defined()      ? pending
                  : stage_ == 3            ? paramShards_[c]
                                           : chunks_->paddedFlat(c);
  Tensor t = chunkRange(values, r, r.begin, end);
  return SaveTensor{name, t.shape(), t.dtype(), [t] { return t; }};
}

SaveTensor ZeroStepEngine::saveField(const optim::ChunkStateField& field, size_t c) const {
  // Elementwise fields as the masters (this rank's shard, cut at the used length); the optimizer's own
  // layouts whole, named by the first element of the optimizer's range. Saved in fp32 (a bf16 first moment
  // is widened when the writer reaches it).
  zero::ShardRange r = shard(c);
  Tensor t = field.values;
  int64_t begin = field.elementwise ? r.begin : optimizer_->ranges()[c].begin;
  if (field.elementwise) t = chunkRange(t, r, r.begin, std::min(r.end, chunks_->layout().chunks[c].used));
  return SaveTensor{chunkPieceName(field.kind, savedIndex_[c], begin), t.shape(), DType::F32,
                    [t] { return t.dtype() == DType::F32 ? t : ops::to(t, Device::cpu(), DType::F32); }};
}

// NOTE [Delayed update checkpoints]
// With a delayed SSD update pending (NOTE [Delayed SSD update] in optim/AdamW.h) a save changes nothing
// live: it waits for the worker and saves the state as every update left it (the masters, m and v, which
// `strata generate` and `convert` read), and beside it, for each chunk whose parameters lag, this rank's
// shard of the parameters as the next step's forward reads them, "delayed_param.<c>@<begin>" in the
// optimizer file (fp32; 4 bytes per SSD-resident parameter). A full load (not load_model_only) puts those
// into the chunks over the masters' values and hands the masters' values to the optimizer as pending
// (deferParameters): the next step's forward reads the stale parameters and its update first writes the
// new ones, as in the run that saved. At the world size, stage, chunk size and placement that saved it the
// resume continues that run bit for bit. Elsewhere the checkpoint loads as any does (by parameter name):
// the first step after it still reads what the saving run's would, and the updates then follow this run's
// placement, so the curve departs from the saving run's where that placement delays other chunks than it
// did (as another world size's sums do anyway). A run with store.delayed_update off writes the pending
// values at its first update, and delays nothing after that.
SaveTensors ZeroStepEngine::checkpointModel() const {
  optimizer_->waitDelayed();  // NOTE [Delayed update checkpoints]: the state final, nothing written
  SaveTensors out;
  for (size_t c = 0; c < chunks_->numChunks(); ++c) {
    zero::ShardRange r = shard(c);
    if (r.begin < std::min(r.end, chunks_->layout().chunks[c].used))
      out.push_back(savePiece("param", c, zero::NvmeTier::Master));
  }
  return out;
}

SaveTensors ZeroStepEngine::checkpointOptimizer() const {
  optimizer_->waitDelayed();
  SaveTensors out;
  for (size_t c = 0; c < chunks_->numChunks(); ++c) {
    zero::ShardRange r = shard(c);
    int64_t end = std::min(r.end, chunks_->layout().chunks[c].used);
    if (r.begin >= end) continue;
    if (optimizer_->pendingParameters(c).defined()) {
      // NOTE [Delayed update checkpoints]: the parameters the next forward reads, behind their state.
      Tensor t = chunkRange(stage_ == 3 ? paramShards_[c] : chunks_->paddedFlat(c), r, r.begin, end);
      out.push_back(SaveTensor{chunkPieceName("delayed_param", savedIndex_[c], r.begin), t.shape(),
                               DType::F32, [t] { return ops::to(t, Device::cpu(), DType::F32); }});
    }
    if (optimizer_->home(c) == zero::Tier::Nvme) {
      out.push_back(savePiece("exp_avg", c, zero::NvmeTier::FirstMoment));
      out.push_back(savePiece("exp_avg_sq", c, zero::NvmeTier::SecondMoment));
      continue;
    }
    for (const optim::ChunkStateField& field : optimizer_->chunkState(c)) {
      // A field of the optimizer's own layout over a whole chunk (stage 0 on several ranks) is the same on
      // every rank: rank 0 saves it.
      bool whole = optimizer_->ranges()[c].size() == chunks_->paddedElems(c);
      if (!field.elementwise && (field.values.numel() == 0 || (whole && rankIn(c) != 0))) continue;
      out.push_back(saveField(field, c));
    }
  }
  return out;
}

void ZeroStepEngine::loadState(ChunkCheckpointReader& reader, bool optimizer) {
  NoGradGuard noGrad;
  optimizer_->finishDelayed();
  const zero::ChunkLayout& layout = chunks_->layout();
  reader.checkParameters(checkpointLayout_);
  if (optimizer) {
    // The kinds this optimizer saves (AdamW: exp_avg and exp_avg_sq; Adafactor: adafactor_v, and exp_avg
    // with a first moment).
    std::vector<std::string> kinds;
    for (size_t c = 0; c < chunks_->numChunks() && kinds.empty(); ++c)
      for (const optim::ChunkStateField& field : optimizer_->chunkState(c)) kinds.push_back(field.kind);
    if (kinds.empty()) kinds = {"exp_avg", "exp_avg_sq"};
    for (const std::string& kind : kinds)
      STRATA_USER_CHECK(reader.hasKind(kind),
                        "checkpoint {} holds no {} state (no optimizer state, or another optimizer's); set "
                        "checkpoint.load_model_only: true to start the optimizer fresh from its weights",
                        reader.directory(), kind);
    // A field in the optimizer's own layout (Adafactor's factored statistics) is not resharded by parameter:
    // it reloads only into the chunks and shards it was saved from.
    bool ownLayout = false;
    for (size_t c = 0; c < chunks_->numChunks() && !ownLayout; ++c)
      for (const optim::ChunkStateField& field : optimizer_->chunkState(c)) ownLayout |= !field.elementwise;
    if (ownLayout) {
      const zero::ChunkLayout& saved = reader.state().layout;
      const zero::ChunkLayout& mine = checkpointLayout_;
      bool same = saved.chunks.size() == mine.chunks.size() && saved.slots.size() == mine.slots.size();
      for (size_t k = 0; same && k < mine.slots.size(); ++k)
        same = saved.slots[k].name == mine.slots[k].name && saved.slots[k].chunk == mine.slots[k].chunk &&
               saved.slots[k].offset == mine.slots[k].offset;
      int ranks = group_ ? group_->size() : 1;
      STRATA_USER_CHECK(
          same && (stage_ == 0 || reader.state().worldSize == ranks),
          "checkpoint {}: its optimizer state was saved with {} (world size {}), and reloads only "
          "into the same chunk layout and, at ZeRO stage >= 1, the same world size (this run: {} "
          "rank{}); set checkpoint.load_model_only: true to start the optimizer fresh from its "
          "weights",
          reader.directory(), same ? "these chunks" : "another chunk layout", reader.state().worldSize, ranks,
          ranks == 1 ? "" : "s");
    }
  }
  // Each piece of state reads the range of its chunk it covers (the whole padded chunk, or this rank's
  // shard), as fp32, and converts on the way in: a 16-bit parameter becomes its master rounded.
  std::vector<float> host;
  // `numel` values from the chunk's element `begin` (-1: the shard's first when `numel` is the shard's size,
  // else 0).
  auto read = [&](int64_t numel, size_t c, const char* kind, int64_t begin = -1) {
    zero::ShardRange r = shard(c);
    if (begin < 0) begin = numel == r.size() ? r.begin : 0;
    int64_t end = std::min(begin + numel, layout.chunks[c].used);
    host.assign(size_t(numel), 0.0f);
    if (begin < end) reader.readChunkRange(layout, kind, int64_t(c), begin, end, host.data());
  };
  auto fill = [&](const Tensor& t, size_t c, const char* kind) {
    read(t.numel(), c, kind);
    ops::copy(t, Tensor::fromHost(host.data(), DType::F32, host.size(), {t.numel()}, t.device()));
  };
  for (size_t c = 0; c < chunks_->numChunks(); ++c) {
    fill(stage_ == 3 ? paramShards_[c] : chunks_->paddedFlat(c), c, "param");
    if (optimizer_->home(c) == zero::Tier::Nvme) {
      // The SSD's fields cover the optimizer's range.
      zero::ShardRange range = optimizer_->ranges()[c];
      int64_t n = range.size();
      read(n, c, "param", range.begin);
      nvme_->write(c, zero::NvmeTier::Master, host.data());
      for (auto [kind, field] : {std::pair{"exp_avg", zero::NvmeTier::FirstMoment},
                                 std::pair{"exp_avg_sq", zero::NvmeTier::SecondMoment}}) {
        if (optimizer)
          read(n, c, kind, range.begin);
        else
          host.assign(size_t(n), 0.0f);
        nvme_->write(c, field, host.data());
      }
      continue;
    }
    if (optimizer_->hasMaster(c)) fill(optimizer_->masterFlats()[c], c, "param");
    if (!optimizer) continue;
    for (const optim::ChunkStateField& field : optimizer_->chunkState(c)) {
      if (field.elementwise) {
        fill(field.values, c, field.kind.c_str());
        continue;
      }
      // The optimizer's own layout: the piece saved for this chunk's range (the same layout, checked above).
      if (field.values.numel() == 0) continue;
      host.assign(size_t(field.values.numel()), 0.0f);
      STRATA_USER_CHECK(
          reader.readChunkPiece(field.kind, savedIndex_[c], optimizer_->ranges()[c].begin,
                                field.values.numel(), host.data()),
          "checkpoint {}: its {} state does not match this run's chunks (it reloads only at the chunk "
          "size and world size it was saved with); set checkpoint.load_model_only: true to start the "
          "optimizer fresh from its weights",
          reader.directory(), field.kind);
      ops::copy(field.values, Tensor::fromHost(host.data(), DType::F32, host.size(), {field.values.numel()},
                                               field.values.device()));
    }
  }
  // NOTE [Delayed update checkpoints]: parameters saved behind their state go back into the chunks, and the
  // values just loaded wait for the next update.
  if (!optimizer || !reader.hasKind("delayed_param")) return;
  for (size_t c = 0; c < chunks_->numChunks(); ++c) {
    // What the forward reads: the whole chunk, or at stage 3 this rank's shard of it.
    Tensor live = stage_ == 3 ? paramShards_[c] : chunks_->paddedFlat(c);
    int64_t begin = stage_ == 3 ? shard(c).begin : 0;
    int64_t end = std::min(begin + live.numel(), layout.chunks[c].used);
    if (begin >= end) continue;
    host = live.toVector<float>();
    if (reader.readSavedChunkRange(layout, "delayed_param", int64_t(c), begin, end, host.data()) == 0)
      continue;
    zero::ShardRange range = optimizer_->ranges()[c];
    Tensor next = chunkRange(live, shard(c), range.begin, range.end);
    if (!optimizer_->deferParameters(c, next)) continue;
    ops::copy(live, Tensor::fromHost(host.data(), DType::F32, host.size(), {live.numel()}, live.device()));
  }
}

size_t ZeroStepEngine::modelStateBytes() const {
  size_t bytes = 0;
  for (size_t c = 0; c < chunks_->numChunks(); ++c)
    bytes += stage_ == 3 ? paramShards_[c].nbytes() : chunks_->paddedFlat(c).nbytes();
  for (size_t c = 0; c < chunks_->numChunks(); ++c) bytes += optimizer_->stateBytes(c);
  if (nvme_) bytes += nvme_->stateBytes();
  return bytes;
}

// NOTE [Parameter gathering]
// At stage 3 a chunk's storage is not resident except while gathered into a slot. A module's forward
// pre-hook gathers the chunks that hold its own parameters; outside backward it first releases the gathered
// chunks that neither it nor a module still running (its callers) needs, so a forward holds the chunks of a
// few modules at a time. In backward a module's pre-backward hook gathers its chunks again, and a chunk is
// released as soon as every one of its parameters has its gradient for the pass (nothing later in the pass
// reads it). The step releases everything after each forward and each backward. Gathers run on the comm
// stream, and compute waits on the chunk's event only when a module needs it. The first micro-batch records
// the order of the gathers (forward and backward); from then on each gather also starts the next
// zero_optimization.prefetch_depth chunks of that order, which no release touches until they are used (or
// until a pass leaves the order, as an evaluation's forwards do). A chunk is gathered into a slot of the
// chunk arena (store.arena, NOTE [Chunk arena] in zero/ChunkArena.h), or else into a block of the caching
// allocator.
void ZeroStepEngine::hookModules() {
  std::map<const TensorImpl*, size_t> chunkOf;
  for (size_t c = 0; c < chunks_->numChunks(); ++c)
    for (const Tensor& p : chunks_->parameters(c)) chunkOf[&p.impl()] = c;
  for (auto& [name, module] : model_.namedModules()) {
    std::vector<size_t> own;
    for (const auto& [n, p] : module->namedParameters(/*recurse=*/false)) {
      size_t c = chunkOf.at(&p.impl());
      if (std::find(own.begin(), own.end(), c) == own.end()) own.push_back(c);
    }
    if (own.empty()) {
      module->addForwardPreHook([this](nn::Module& m, const std::vector<Tensor>&) { active_.push_back(&m); });
    } else {
      module->addForwardPreHook([this, own](nn::Module& m, const std::vector<Tensor>&) {
        if (!autograd::inBackwardPass()) {
          // Release what no running module needs (in backward, recomputation must not release).
          std::vector<bool> keep(slots_.size(), false);
          for (size_t c : own) keep[c] = true;
          for (nn::Module* a : active_)
            for (size_t c : moduleChunks_[a]) keep[c] = true;
          for (size_t c = 0; c < slots_.size(); ++c)
            if (!keep[c]) release(c);
        }
        for (size_t c : own) gather(c);
        active_.push_back(&m);
      });
      module->addBackwardPreHook([this, own](nn::Module&) {
        for (size_t c : own) gather(c);
      });
    }
    moduleChunks_[module] = own;
    module->addForwardHook([this](nn::Module& m, const std::vector<Tensor>&, const std::vector<Tensor>&) {
      auto it = std::find(active_.rbegin(), active_.rend(), &m);
      if (it != active_.rend()) active_.erase(std::next(it).base());
    });
  }
  chunks_->onPassGradientsComplete([this](size_t chunk) { release(chunk); });
}

void ZeroStepEngine::gather(size_t chunk) {
  // This chunk's gather first: the prefetches queue behind it on the comm stream.
  if (!slots_[chunk].defined()) startGather(chunk);
  prefetched_[chunk] = false;
  if (recording_) {
    order_.push_back(chunk);
  } else if (!order_.empty()) {
    // Where the recorded order has reached: the next use of this chunk from the cursor on (else from the
    // start: a pass that went otherwise, such as an evaluation).
    size_t n = order_.size();
    size_t at = n;
    for (size_t k = 0; k < n && at == n; ++k)
      if (order_[(cursor_ + k) % n] == chunk) at = (cursor_ + k) % n;
    if (at != n) {
      if (at != cursor_ % n) {
        // The pass left the recorded order (an evaluation: forwards without backward), so what was
        // prefetched for the order's next steps is not coming: unmarked, the releases may take it, instead of
        // it holding memory (an arena slot) until the next backward ends.
        for (size_t c = 0; c < prefetched_.size(); ++c)
          if (c != chunk) prefetched_[c] = false;
      }
      cursor_ = at + 1;
      // The next prefetch_depth chunks in the order go ahead on the comm stream.
      for (size_t k = 0; k < size_t(prefetchDepth_) && cursor_ + k < n; ++k) {
        size_t next = order_[cursor_ + k];
        if (!slots_[next].defined()) {
          startGather(next);
          prefetched_[next] = true;
        }
      }
    }
  }
  // Use-time wait: compute waits for this chunk's gather only now.
  gathered_[chunk]->block(currentStream(device_));
}

void ZeroStepEngine::startGather(size_t chunk) {
  NoGradGuard noGrad;
  // Allocated on the compute stream (or an arena slot), written on the comm stream once compute has reached
  // this point (the block may hold a chunk that compute read just before).
  Tensor slot;
  if (!arenas_.empty()) {
    zero::ChunkArena& arena = *arenas_[size_t(arenaClass_[chunk])];
    arenaSlot_[chunk] = arena.acquire();
    slot = arena.view(arenaSlot_[chunk], chunks_->paddedElems(chunk), chunks_->dtype());
  } else {
    slot = Tensor::empty({chunks_->paddedElems(chunk)}, chunks_->dtype(), device_);
  }
  peakGathered_ = std::max(peakGathered_, ++gatheredNow_);
  const Stream& gatherStream = deviceStreams(device_).gather;
  streamWaits(gatherStream, currentStream(device_), device_);
  if (communicates(chunk)) {
    comm(chunk).allGather(slot, paramShards_[chunk]);
  } else {
    StreamGuard onGather(gatherStream);
    ops::copy(slot, paramShards_[chunk]);
    slot.storage()->recordStream(gatherStream);
  }
  gathered_[chunk]->record(gatherStream);
  chunks_->repoint(chunk, slot.data(), device_);
  slots_[chunk] = slot;
}

void ZeroStepEngine::release(size_t chunk) {
  if (!slots_[chunk].defined() || prefetched_[chunk]) return;
  chunks_->evict(chunk);
  slots_[chunk] = Tensor();
  --gatheredNow_;
  if (!arenas_.empty()) {
    arenas_[size_t(arenaClass_[chunk])]->release(arenaSlot_[chunk]);
    arenaSlot_[chunk] = -1;
  }
}

void ZeroStepEngine::releaseAll(bool prefetchedToo) {
  for (size_t c = 0; c < slots_.size(); ++c) {
    if (prefetchedToo) prefetched_[c] = false;
    release(c);
  }
  active_.clear();
}

StepEngineState ZeroStepEngine::state() const {
  StepEngineState s;
  s.optimizerSteps = optimizer_->stepCount();
  if (scaler_) {
    s.lossScale = scaler_->scale();
    s.lossScaleGoodSteps = scaler_->goodSteps();
  }
  return s;
}

void ZeroStepEngine::restore(const StepEngineState& s) {
  optimizer_->setStepCount(s.optimizerSteps);
  if (scaler_ && s.lossScale > 0) scaler_->restore(s.lossScale, s.lossScaleGoodSteps);
}

}  // namespace strata::train
