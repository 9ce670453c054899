// The inputs of the store's placement (NOTE [Store placement] in zero/Store.h) for a config, from the
// architecture's parameter shapes alone: what ZeroStepEngine's constructor computes from its real chunks,
// without building a tensor, so `strata plan` answers for a 20B model on a laptop. The chunk layout is the
// one the engine records (models::parameterShapes lists the parameters in the first-use order the engine's
// trace finds; a test checks it against the built model), padded to equal shards as ChunkManager pads it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "strata/config/Config.h"
#include "strata/core/DType.h"
#include "strata/zero/ChunkLayout.h"
#include "strata/zero/Store.h"

namespace strata::models {
struct ModelSpec;
}  // namespace strata::models

namespace strata::plan {

struct ModelStateInputs {
  DType compute = DType::BF16;
  int ranks = 1;
  int stage = 0;
  zero::ChunkLayout layout;
  std::vector<int64_t> paddedElems;  // per chunk: its length padded to a multiple of the ranks
  std::vector<int64_t> rangeElems;   // per chunk: the elements whose optimizer state this rank keeps
  // This rank's parameters: the padded chunks, or their shards at stage 3; in all and per chunk (their homes
  // are placed chunk by chunk: NOTE [Store placement] in zero/Store.h).
  uint64_t parameterBytes = 0;
  std::vector<uint64_t> parameterChunkBytes;
  // Per chunk: this rank's optimizer state as the engine asks the placement: AdamW's range x 12 bytes (fp32
  // master, m, v), or range x 8 with m and v in bf16 (optimizer.moments_dtype); Adafactor's fp32 master
  // (range x 4) and its state (optim::adafactorStateBytes, the pieces of rank 0's range).
  std::vector<uint64_t> optimizerBytes;
  // Per chunk, the parts of optimizerBytes: first and second moments (on the device or the host).
  std::vector<uint64_t> firstMomentBytes, secondMomentBytes;
  // Per chunk, its state were it on the SSD, as the engine makes the SSD tier's extents: the whole (what
  // the placement weighs) and the first and second moments' parts of it (AdamW's m and v in
  // store.nvme_state_dtype, or bf16 with optimizer.moments_dtype bf16; Adafactor's first moment in bf16 or
  // store.nvme_state_dtype, its second moment in fp32: NOTE [Adafactor SSD chunks] in optim/Adafactor.h).
  std::vector<uint64_t> nvmeBytes, nvmeFirstMomentBytes, nvmeSecondMomentBytes;
  // Gradient buffers on the device: every padded chunk's (what backward accumulates into, across the
  // micro-batches of a step), and this rank's shards of them (stage >= 2 on several ranks: what is left
  // after the last backward's reduce-scatter; fp32, since several ranks reduce in fp32).
  uint64_t gradientBytes = 0;
  DType gradientDType = DType::F32;  // what they accumulate in (precision.grad_accum_dtype)
  uint64_t gradientShardBytes = 0;
  // PowerSGD's fp32 error feedback and Q matrices on the device (dist.powersgd_rank, several data-parallel
  // ranks at stage 0 or 1; NOTE [PowerSGD] in zero/PowerSgd.h), kept across steps.
  uint64_t powerSgdBytes = 0;
  int64_t largestChunkElems = 0;  // padded
  // Stage 3: the slots whole chunks are gathered into (the chunk arena's, store.arena; without it the one in
  // use and prefetch_depth ahead).
  uint64_t gatherBytes = 0;
  // Below stage 3, the chunk arena that chunks homed off the device are copied into (NOTE [Parameter homes]
  // in zero/ParameterGatherer.h): sized as at stage 3, over every chunk (a bound: the engine sizes it over
  // the homed chunks only).
  uint64_t homeGatherBytes = 0;

  int64_t rangeElemsTotal() const;
};

// The blocks each rank of a `pipeline`-stage GPT holds with `virtualStages` model chunks a rank: the
// trainer's split (GptConfig::pipelineSplit, NOTE [Pipeline stages] in nn/Pipeline.h), rank p's chunks p, p +
// P, ....
std::vector<std::vector<int64_t>> pipelineRankBlocks(const models::ModelSpec& spec, int pipeline,
                                                     int virtualStages);

// The placement inputs of `config` on `ranks` ranks computing in `compute` (config::computeDTypeFor). With
// parallel.pipeline P > 1 (a GPT): the most loaded stage's (NOTE [Layouts] in plan/Plan.h), its parameters
// sharded over the ranks / (parallel.tensor x P) data-parallel ranks.
ModelStateInputs modelStateInputs(const config::Config& config, int ranks, DType compute);

// NOTE [Host headroom]
// An automatic host budget (store.host_budget_gb auto) is what the host has available less its headroom, and
// at most 90% of it: the headroom is a reserve left to the system, max(5% of the host's memory, min(8 GiB, a
// quarter of it)), plus the store's own working memory beside the state: the pipelined update's page-locked
// staging slots (zero_optimization.buffer_count x one piece's gradients and parameters) and, with an SSD
// tier, its two buffer sets of the largest chunk's fp32 master, m and v (NOTE [SSD tier] in zero/NvmeTier.h),
// plus the process's own (kProcessHostBytes). Ranks on one host split it as they split the memory (NOTE
// [Per-node shares] in distributed/Launch.h). `largestChunkElems`: ModelStateInputs::largestChunkElems.
//
// Measured on the H200 (tools/bench_configs.py, BENCHMARKS.md): the 20.25B run as shipped held 108.0 GiB of
// state in host memory with a host peak of 112.3 GiB, and MemAvailable fell to 8.0 GiB: 0.8 GiB beyond the
// state, the staging and the SSD buffers went to the process (the CUDA runtime's and libraries' host memory,
// the heap), which kProcessHostBytes now counts.
constexpr uint64_t kProcessHostBytes = 1ull << 30;
uint64_t hostHeadroomBytes(const config::Config& config, int64_t largestChunkElems, uint64_t hostTotal);
// What a step may take of a device of `capacity` bytes: 92% of it less a margin of min(1 GiB, 1/16 of it),
// the memory tracer's limit (NOTE [Memory tracer] in zero/Store.h), which `strata plan` fits within.
uint64_t usableDeviceBytes(uint64_t capacity);
// What this host has available: MemAvailable, or STRATA_HOST_MEMORY_GB (a smaller machine, in tests).
uint64_t hostAvailableBytes();

// The store's budgets as the engine reads them: offload_optimizer.device cpu (or nvme) leaves the device the
// parameters only, else store.gpu_budget_gb (auto: `deviceAuto`); store.host_budget_gb (auto: `hostAvailable`
// less `hostHeadroom`, at most 90% of it); store.nvme_budget_gb (auto: 90% of `nvmeFree`, the free space of
// zero_optimization.nvme_path, 0 without one). offload_optimizer.device nvme leaves the host nothing.
zero::StoreBudgets storeBudgets(const config::Config& config, uint64_t parameterBytes, uint64_t deviceAuto,
                                uint64_t hostAvailable, uint64_t nvmeFree, uint64_t hostHeadroom = 0);

// NOTE [Masters at layout]
// The engine lays the model out in 16-bit chunks, making each chunk's fp32 master as it goes
// (zero/ChunkManager.h); until the optimizer moves them to their tiers the masters all exist beside the
// chunks. The model is built with deferred parameters (nn/DeferredInit.h): no fp32 copy of it exists, each
// parameter's value is made as it is laid out, and at ZeRO stages 1 to 3 a rank makes only its shard of the
// masters, at stage 3 only its shard of the chunks too (NOTE [Sharded layout] in zero/ChunkManager.h). A
// rank whose masters and chunks would crowd the device (above 70% of it) makes its masters in host memory.
// Where they outgrow the host's free memory beyond its headroom (hostHeadroomBytes, with chunks of
// zero_optimization.chunk_size_mb), the host takes what the device cannot hold beside the chunks within
// usableDeviceBytes, and the rest stay on the device; where the two together cannot hold them, the model does
// not fit. Measured: 35.9B parameters have 133.8 GiB of masters against the H200 host's 113.4 GiB free beyond
// the headroom: 73.2 GiB were made there and 60.7 GiB on the device.
struct MasterLayout {
  uint64_t masters = 0;                   // the fp32 masters' bytes
  uint64_t hostBytes = 0;                 // made in host memory (the first chunks'), the rest on the device
  uint64_t hostRoom = 0, deviceRoom = 0;  // what each could take
  bool fits = true;
};
// The elements a rank makes at layout: of masters (fp32), and of 16-bit chunks on its device.
struct LayoutElems {
  uint64_t masters = 0, chunks = 0;
};
// A rank's layout: the elements of a model of `modelElems` parameters that a rank of `ranks` (its ZeRO
// group) makes at `stage`.
LayoutElems layoutElems(uint64_t modelElems, int stage, int ranks);
// For `elems` of 16-bit chunks on a GPU of `deviceMemory` bytes (this rank's share), a host with
// `hostAvailable` of `hostTotal` bytes (kUnlimited: unknown, every master there) shared by `ranksOnHost`
// ranks.
MasterLayout mastersAtLayout(const config::Config& config, LayoutElems elems, uint64_t deviceMemory,
                             uint64_t hostAvailable, uint64_t hostTotal, int ranksOnHost);

// The gradient buffers of a rank as the engine makes them: per chunk its padded length and this rank's range,
// their dtype (precision.grad_accum_dtype), the ZeRO stage, the data-parallel ranks, whether a pipeline
// schedules the backward, and whether the device is a GPU.
struct GradientBuffers {
  std::vector<int64_t> paddedElems, rangeElems;
  DType dtype = DType::F32;
  int stage = 0;
  int ranks = 1;
  bool pipeline = false;
  bool onGpu = true;
};
// The gradients a placement homes in host memory (NOTE [Gradient homes] in zero/GradientReducer.h): with
// store.gradient_home host every chunk whose optimizer state is off the device, with auto those whose
// parameters are homed off it too; none on the CPU, at stages 1 and 2, under a pipeline or with PowerSGD.
// Their page-locked buffers (a chunk's padded gradients, or this rank's fp32 shard at stage 3 on several
// ranks) are kept across steps.
struct GradientHomes {
  int64_t elems = 0;
  uint64_t bytes = 0;
};
GradientHomes gradientHomes(const config::Config& config, const GradientBuffers& buffers,
                            const zero::StorePlacement& placement);
// The placement with the host memory that is not state reserved beside it: the delayed SSD update's
// pending gradients and parameters (NOTE [Delayed SSD update] in optim/AdamW.h: with store.delayed_update and
// AdamW, (4 or 2) + compute size bytes per SSD-resident element of the ranges) and the gradient homes'
// buffers (gradientHomes). An automatic host budget (store.host_budget_gb auto) leaves room for them:
// budgets.host is lowered by the reserve and `place` called again, since less room sends more state to the
// SSD, until the reserve settles (it only grows, so within a round per chunk). An explicit host budget is
// taken as given. The engine and `strata plan` both place through it.
zero::StorePlacement placeWithHostReserves(
    const config::Config& config, DType compute, const GradientBuffers& buffers, zero::StoreBudgets& budgets,
    const std::function<zero::StorePlacement(const zero::StoreBudgets&)>& place);
// The reserve of that placement: bytes of host memory the delayed update keeps.
uint64_t delayedUpdateReserveBytes(const config::Config& config, DType compute,
                                   const std::vector<int64_t>& rangeElems,
                                   const zero::StorePlacement& placement);

// AdamW's m and v in memory: optimizer.moments_dtype (fp32, bf16) as a dtype; fp32 for Adafactor.
DType momentsDType(const config::Config& config);
// How the SSD tier stores m and v: store.nvme_state_dtype (fp32, bf16, fp16) as a dtype, or bf16 where
// AdamW keeps them in bf16 (optimizer.moments_dtype; NOTE [AdamW moments dtype] in optim/AdamW.h).
DType nvmeStateDType(const config::Config& config);

// Free bytes of the file system holding `path` (or its nearest existing parent); 0 when none can be read.
uint64_t freeDiskBytes(const std::string& path);

}  // namespace strata::plan
