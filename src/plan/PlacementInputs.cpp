#include "strata/plan/PlacementInputs.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "models/Zoo.h"
#include "models/gpt/Gpt.h"
#include "strata/config/Resolve.h"
#include "strata/core/Device.h"
#include "strata/core/Error.h"
#include "strata/distributed/Launch.h"
#include "strata/optim/Adafactor.h"
#include "strata/zero/ChunkArena.h"
#include "strata/zero/PowerSgd.h"

namespace strata::plan {

int64_t ModelStateInputs::rangeElemsTotal() const {
  int64_t n = 0;
  for (int64_t r : rangeElems) n += r;
  return n;
}

namespace {

// The parameters of the most loaded rank of a pipeline (NOTE [Layouts] in plan/Plan.h): rank p's blocks
// (`rankBlocks`), the embeddings on the first rank, the final norm and the tied head's copy of the token
// table on the last; the rank with the most elements.
std::vector<std::pair<std::string, Shape>> pipelineStage(
    const std::vector<std::pair<std::string, Shape>>& all,
    const std::vector<std::vector<int64_t>>& rankBlocks) {
  size_t P = rankBlocks.size();
  std::vector<std::vector<std::pair<std::string, Shape>>> ranks(P);
  std::vector<int> owner;
  for (size_t r = 0; r < P; ++r)
    for (int64_t block : rankBlocks[r]) {
      if (size_t(block) >= owner.size()) owner.resize(size_t(block) + 1, 0);
      owner[size_t(block)] = int(r);
    }
  for (const auto& [name, shape] : all) {
    if (name.rfind("h.", 0) == 0) {
      ranks[size_t(owner.at(size_t(std::stoll(name.substr(2)))))].emplace_back(name, shape);
    } else if (name.rfind("wte.", 0) == 0) {
      ranks.front().emplace_back(name, shape);
      ranks.back().emplace_back(name, shape);  // the tied head's copy
    } else if (name.rfind("wpe.", 0) == 0) {
      ranks.front().emplace_back(name, shape);
    } else {
      ranks.back().emplace_back(name, shape);
    }
  }
  auto elements = [](const std::vector<std::pair<std::string, Shape>>& stage) {
    int64_t n = 0;
    for (const auto& [name, shape] : stage) n += numelOf(shape);
    return n;
  };
  return *std::max_element(ranks.begin(), ranks.end(),
                           [&](const auto& x, const auto& y) { return elements(x) < elements(y); });
}

}  // namespace

std::vector<std::vector<int64_t>> pipelineRankBlocks(const models::ModelSpec& whole, int pipeline,
                                                     int virtualStages) {
  models::ModelSpec spec = whole;
  spec.pipeline.size = std::max(1, pipeline);
  spec.pipeline.virtualStages = std::max(1, virtualStages);
  std::vector<nn::BlockRange> chunks = models::gptConfig(spec).pipelineSplit();
  std::vector<std::vector<int64_t>> out(size_t(spec.pipeline.size));
  for (size_t chunk = 0; chunk < chunks.size(); ++chunk)
    for (int64_t b = chunks[chunk].begin; b < chunks[chunk].end; ++b) out[chunk % out.size()].push_back(b);
  return out;
}

ModelStateInputs modelStateInputs(const config::Config& c, int ranks, DType compute) {
  ModelStateInputs in;
  in.compute = compute;
  // Tensor parallelism (parallel.tensor): a rank holds its slices of the split layers, and ZeRO shards them
  // over the data-parallel ranks (ranks / tensor, and / pipeline stages).
  int tensor = int(std::max<int64_t>(1, c.parallel.tensor));
  int pipeline = int(std::max<int64_t>(1, c.parallel.pipeline));
  in.ranks = std::max(1, ranks / (tensor * pipeline));
  in.stage = int(c.zero.stage);
  models::ModelSpec spec = config::modelSpecFrom(c, Device::cpu());
  spec.tensorParallel.size = tensor;
  auto shapes = models::parameterShapes(spec);
  if (pipeline > 1) {
    // The trainer's refusals, in its words.
    STRATA_USER_CHECK(c.model.arch == "gpt",
                      "parallel.pipeline ({}) splits gpt only, not model.arch '{}'; train it with "
                      "parallel.pipeline: 1",
                      pipeline, c.model.arch);
    STRATA_USER_CHECK(c.model.moeNumExperts == 0,
                      "parallel.pipeline ({}) with mixture-of-experts layers (model.moe_num_experts) is not "
                      "supported; train MoE models with parallel.pipeline: 1",
                      pipeline);
    shapes = pipelineStage(shapes, pipelineRankBlocks(spec, pipeline, int(c.parallel.virtualStages)));
  }
  // Expert parallelism (NOTE [Expert parallelism] in nn/MoE.h): a rank holds 1/P of each MoE layer's experts
  // (rank 0's, "experts.0" .. "experts.E/P-1"), in chunks of their own sharded over the ranks / P that hold
  // the same experts.
  int64_t expertRanks = std::max<int64_t>(1, c.model.moeExpertParallelSize);
  std::vector<int> families;
  if (expertRanks > 1 && c.model.moeNumExperts > 0) {
    int64_t local = c.model.moeNumExperts / expertRanks;
    std::vector<std::pair<std::string, Shape>> kept;
    for (auto& [name, shape] : shapes) {
      size_t at = name.find(".experts.");
      if (at == std::string::npos) {
        kept.emplace_back(name, shape);
        families.push_back(0);
      } else if (std::stoll(name.substr(at + 9)) < local) {
        kept.emplace_back(name, shape);
        families.push_back(1);
      }
    }
    shapes = std::move(kept);
  }
  if (c.dist.powersgdRank > 0 && in.ranks > 1 && in.stage <= 1) {
    std::vector<Shape> all;
    for (const auto& [name, shape] : shapes) all.push_back(shape);
    in.powerSgdBytes = uint64_t(zero::PowerSgd::stateBytes(all, c.dist.powersgdRank));
  }
  in.layout = zero::planChunks(shapes, int64_t(c.zero.chunkSizeMb * double(1 << 20)), compute, families);
  int expertDataRanks = std::max(1, in.ranks / int(expertRanks));
  uint64_t elemBytes = dtypeSize(compute);
  int64_t largest = 0;
  bool adafactor = c.optimizer.type == "adafactor";
  optim::AdafactorConfig adafactorConfig = config::adafactorConfigFrom(c);
  for (size_t i = 0; i < in.layout.chunks.size(); ++i) {
    const zero::ChunkInfo& chunk = in.layout.chunks[i];
    // ChunkManager::padTo: the used length, rounded up to equal shards (of its family's ranks).
    int shards = chunk.family == 1 ? expertDataRanks : in.ranks;
    int64_t padded = (chunk.used + shards - 1) / shards * shards;
    int64_t range = in.stage >= 1 ? padded / shards : padded;
    in.paddedElems.push_back(padded);
    in.rangeElems.push_back(range);
    in.parameterChunkBytes.push_back(uint64_t(in.stage == 3 ? range : padded) * elemBytes);
    in.parameterBytes += in.parameterChunkBytes.back();
    // AdamW's m and v in optimizer.moments_dtype (NOTE [AdamW moments dtype] in optim/AdamW.h).
    uint64_t first = uint64_t(range) * dtypeSize(momentsDType(c)), second = first;
    if (adafactor) {
      uint64_t state = optim::adafactorStateBytes(in.layout, i, zero::ShardRange{0, range}, adafactorConfig);
      first =
          adafactorConfig.hasFirstMoment() ? uint64_t(range) * (adafactorConfig.firstMomentBf16 ? 2 : 4) : 0;
      second = state - first;
    }
    in.firstMomentBytes.push_back(first);
    in.secondMomentBytes.push_back(second);
    in.optimizerBytes.push_back(uint64_t(range) * 4 + first + second);
    zero::NvmeTier::ChunkFields ssd =
        adafactor ? optim::adafactorTierFields(in.layout, i, zero::ShardRange{0, range}, adafactorConfig,
                                               nvmeStateDType(c))
                  : zero::NvmeTier::ChunkFields::uniform(range, nvmeStateDType(c));
    in.nvmeBytes.push_back(ssd.bytes());
    in.nvmeFirstMomentBytes.push_back(uint64_t(ssd.elems[1]) * dtypeSize(ssd.dtypes[1]));
    in.nvmeSecondMomentBytes.push_back(uint64_t(ssd.elems[2]) * dtypeSize(ssd.dtypes[2]));
    largest = std::max(largest, padded);
  }
  // Gradients accumulate in fp32 for 16-bit parameters (ChunkManager), in the parameters' dtype otherwise,
  // or in the 16-bit compute dtype when precision.grad_accum_dtype asks (as ZeroStepEngine sets it).
  uint64_t gradBytes = std::max<uint64_t>(elemBytes, 4);
  if (c.precision.gradAccumDType != "fp32" && elemBytes == 2) gradBytes = 2;
  in.gradientDType = gradBytes == 2 ? compute : gradBytes == 4 ? DType::F32 : compute;
  for (int64_t padded : in.paddedElems) in.gradientBytes += uint64_t(padded) * gradBytes;
  // Several ranks reduce 16-bit buffers in fp32, into fp32 shards (zero::GradientReducer).
  in.gradientShardBytes = uint64_t(in.rangeElemsTotal()) * (in.ranks > 1 ? 4 : gradBytes);
  in.largestChunkElems = largest;
  // The chunk arena's slots (zero/ChunkArena.h), or without it the chunk in use and those prefetched.
  uint64_t slots = 0;
  if (c.store.arena) {
    std::vector<int64_t> used;
    for (const zero::ChunkInfo& chunk : in.layout.chunks) used.push_back(chunk.used);
    slots = zero::planChunkArena(used, in.paddedElems, in.layout.chunkElems, c.zero.prefetchDepth)
                .bytes(elemBytes);
  } else {
    slots = uint64_t(1 + std::max<int64_t>(0, c.zero.prefetchDepth)) * uint64_t(largest) * elemBytes;
  }
  (in.stage == 3 ? in.gatherBytes : in.homeGatherBytes) = slots;
  return in;
}

uint64_t hostHeadroomBytes(const config::Config& c, int64_t largestChunkElems, uint64_t hostTotal) {
  uint64_t reserve = std::max(hostTotal / 20, std::min<uint64_t>(8ull << 30, hostTotal / 4));
  uint64_t piece = std::max<int64_t>(1, int64_t(c.optimizer.pipelinePieceMb * double(1 << 20) / 4));
  uint64_t staging = uint64_t(std::max<int64_t>(2, c.zero.bufferCount)) * 2 * 4 * piece;
  // Two SSD buffer sets of the largest chunk's master, m and v (NOTE [AdamW moments dtype]).
  uint64_t ssd = c.zero.nvmePath.empty()
                     ? 0
                     : 2 * (4 + 2 * uint64_t(dtypeSize(momentsDType(c)))) * uint64_t(largestChunkElems);
  return reserve + staging + ssd + kProcessHostBytes;
}

LayoutElems layoutElems(uint64_t modelElems, int stage, int ranks) {
  uint64_t shard = modelElems / uint64_t(std::max(1, ranks));
  return LayoutElems{stage >= 1 ? shard : modelElems, stage == 3 ? shard : modelElems};
}

MasterLayout mastersAtLayout(const config::Config& c, LayoutElems elems, uint64_t deviceMemory,
                             uint64_t hostAvailable, uint64_t hostTotal, int ranksOnHost) {
  MasterLayout l;
  l.masters = elems.masters * 4;
  uint64_t chunks = elems.chunks * 2;
  if (double(l.masters + chunks) <= 0.7 * double(deviceMemory)) return l;  // all on the device
  if (hostAvailable == zero::kUnlimited) {
    l.hostBytes = l.hostRoom = l.masters;
    return l;
  }
  int64_t chunkElems = std::max<int64_t>(1, int64_t(c.zero.chunkSizeMb * double(1 << 20) / 2));
  uint64_t available = dist::perRankShare(hostAvailable, ranksOnHost);
  uint64_t headroom = dist::perRankShare(hostHeadroomBytes(c, chunkElems, hostTotal), ranksOnHost);
  l.hostRoom = available > headroom ? available - headroom : 0;
  uint64_t usable = usableDeviceBytes(deviceMemory);
  l.deviceRoom = usable > chunks ? usable - chunks : 0;
  if (l.masters <= l.hostRoom) {
    l.hostBytes = l.masters;
    return l;
  }
  l.hostBytes = l.masters > l.deviceRoom ? l.masters - l.deviceRoom : 0;
  l.fits = l.hostBytes <= l.hostRoom;
  return l;
}

uint64_t usableDeviceBytes(uint64_t capacity) {
  uint64_t margin = std::min<uint64_t>(1ull << 30, capacity / 16);
  uint64_t limit = uint64_t(0.92 * double(capacity));
  return limit > margin ? limit - margin : 0;
}

uint64_t hostAvailableBytes() {
  if (const char* gb = std::getenv("STRATA_HOST_MEMORY_GB"))
    return zero::parseBudgetGb(gb, 0, "STRATA_HOST_MEMORY_GB");
  return zero::availableHostBytes();
}

zero::StoreBudgets storeBudgets(const config::Config& c, uint64_t parameterBytes, uint64_t deviceAuto,
                                uint64_t hostAvailable, uint64_t nvmeFree, uint64_t hostHeadroom) {
  zero::StoreBudgets b;
  const std::string& offload = c.zero.offloadOptimizerDevice;
  b.device = offload == "cpu" || offload == "nvme"
                 ? parameterBytes
                 : zero::parseBudgetGb(c.store.gpuBudgetGb, deviceAuto, "store.gpu_budget_gb");
  b.host = offload == "nvme"
               ? 0
               : zero::parseBudgetGb(
                     c.store.hostBudgetGb,
                     hostAvailable == zero::kUnlimited
                         ? hostAvailable
                         : std::min(hostAvailable / 10 * 9,
                                    hostAvailable > hostHeadroom ? hostAvailable - hostHeadroom : 0),
                     "store.host_budget_gb");
  b.nvme = zero::parseBudgetGb(c.store.nvmeBudgetGb, c.zero.nvmePath.empty() ? 0 : nvmeFree / 10 * 9,
                               "store.nvme_budget_gb");
  return b;
}

uint64_t delayedUpdateReserveBytes(const config::Config& c, DType compute,
                                   const std::vector<int64_t>& rangeElems,
                                   const zero::StorePlacement& placement) {
  if (!c.store.delayedUpdate || c.optimizer.type == "adafactor") return 0;
  // The gradients as they accumulate: fp32, or 16-bit buffers (precision.grad_accum_dtype) for 16-bit chunks.
  uint64_t gradBytes = c.precision.gradAccumDType != "fp32" && dtypeSize(compute) == 2 ? 2 : 4;
  uint64_t reserve = 0;
  for (size_t i = 0; i < rangeElems.size() && i < placement.optimizerTier.size(); ++i)
    if (placement.optimizerTier[i] == zero::Tier::Nvme)
      reserve += uint64_t(rangeElems[i]) * (gradBytes + dtypeSize(compute));
  return reserve;
}

GradientHomes gradientHomes(const config::Config& c, const GradientBuffers& buffers,
                            const zero::StorePlacement& placement) {
  GradientHomes homes;
  const std::string& setting = c.store.gradientHome;
  if (setting == "device" || !buffers.onGpu || (buffers.stage != 0 && buffers.stage != 3) ||
      buffers.pipeline || c.dist.powersgdRank > 0)
    return homes;
  bool sharded = buffers.stage >= 2 && buffers.ranks > 1;
  for (size_t i = 0; i < placement.optimizerTier.size() && i < buffers.paddedElems.size(); ++i) {
    if (placement.optimizerTier[i] == zero::Tier::Device) continue;
    if (setting == "auto" && placement.parameterHome(i) == zero::Tier::Device) continue;
    int64_t elems = sharded ? buffers.rangeElems[i] : buffers.paddedElems[i];
    homes.elems += elems;
    homes.bytes += uint64_t(elems) * (sharded ? 4 : dtypeSize(buffers.dtype));
  }
  return homes;
}

zero::StorePlacement placeWithHostReserves(
    const config::Config& c, DType compute, const GradientBuffers& buffers, zero::StoreBudgets& budgets,
    const std::function<zero::StorePlacement(const zero::StoreBudgets&)>& place) {
  zero::StorePlacement placement = place(budgets);
  bool autoHost = c.store.hostBudgetGb.empty() || c.store.hostBudgetGb == "auto";
  if (!autoHost || budgets.host == zero::kUnlimited) return placement;
  uint64_t host = budgets.host;
  for (size_t round = 0; round <= buffers.rangeElems.size(); ++round) {
    uint64_t reserve = delayedUpdateReserveBytes(c, compute, buffers.rangeElems, placement) +
                       gradientHomes(c, buffers, placement).bytes;
    uint64_t wanted = host > reserve ? host - reserve : 0;
    if (wanted == budgets.host) break;
    budgets.host = wanted;
    placement = place(budgets);
  }
  return placement;
}

DType momentsDType(const config::Config& c) {
  return c.optimizer.type != "adafactor" && c.optimizer.momentsDType == "bf16" ? DType::BF16 : DType::F32;
}

DType nvmeStateDType(const config::Config& c) {
  if (momentsDType(c) == DType::BF16) return DType::BF16;  // stored as they are in memory
  return c.store.nvmeStateDType == "bf16"   ? DType::BF16
         : c.store.nvmeStateDType == "fp16" ? DType::F16
                                            : DType::F32;
}

uint64_t freeDiskBytes(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  while (!p.empty() && !fs::exists(p, ec)) {
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  fs::space_info space = fs::space(p, ec);
  return ec ? 0 : uint64_t(space.available);
}

}  // namespace strata::plan
