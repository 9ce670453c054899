// Private to the step engine: its start-up, and what the start-up leaves, a plain description of where every
// byte of this rank's model state lives (NOTE [Step engine parts] in train/StepEngine.h).
//
// The start-up, in this order (ZeroStepEngine's constructor):
//   1. layOutModelState: the model in chunks of the compute dtype (layOutModelChunks), the fp32 masters of
//      16-bit chunks taken out, and the shards this rank keeps: the optimizer state's range of each chunk (its
//      shard at stage >= 1), and at stage 3 the parameters' shard too. A model built with deferred parameters
//      is laid out sharded: only those shards are ever made (NOTE [Sharded layout] in zero/ChunkManager.h);
//      one built with its values is laid out whole and every rank's chunks broadcast from its group's rank 0.
//   2. placeModelState: the store's placement of each chunk's parameters (device or host) and optimizer
//      state (device, host or SSD; NOTE [Store placement] in zero/Store.h); the parameters homed off the
//      device move there (NOTE [Parameter homes] in zero/ParameterGatherer.h).
//   3. (stage 3, or parameters homed off the device) zero::ParameterGatherer evicts the chunks it gathers
//      and reserves its arena, before any optimizer state is allocated.
//   4. makeChunkOptimizer: the SSD tier and the optimizer over the placement.
//   5. (traced runs) after the first step, promoteTracedState moves optimizer state onto the device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/config/Config.h"
#include "strata/data/Objective.h"
#include "strata/nn/Pipeline.h"
#include "strata/nn/TensorParallel.h"
#include "strata/optim/ChunkOptimizer.h"
#include "strata/train/StepEngine.h"
#include "strata/zero/ChunkGroups.h"
#include "strata/zero/ChunkManager.h"
#include "strata/zero/NvmeTier.h"
#include "strata/zero/Store.h"

namespace strata::dist {
class ProcessGroup;
}

namespace strata::train {

// The expert parameters of expert-parallel MoE layers (NOTE [Expert parallelism] in nn/MoE.h): each one's
// name on this rank with a function giving its name on expert-parallel rank r (the checkpoint's names: NOTE
// [Expert-parallel checkpoints] in train/CheckpointPieces.h), the expert-parallel size and this rank's place.
struct ExpertNames {
  std::vector<std::pair<std::string, std::function<std::string(int)>>> rename;
  int ranks = 1, rank = 0;
};

struct ModelState {
  int stage = 0;  // zero_optimization.stage
  Device device = Device::cpu();
  // The parameters: views into the chunks, whose bytes are resident between steps below stage 3.
  std::unique_ptr<zero::ChunkManager> chunks;
  zero::ChunkGroups groups;
  ExpertNames experts;
  // Tensor parallelism (NOTE [Tensor parallelism] in nn/TensorParallel.h): the model's tensor-parallel
  // group (size 1: none) and, per slot of the chunks' layout, whether its parameter is this rank's slice
  // (else it is whole and equal on every rank of the group). `groups` is then the data-parallel group.
  nn::TensorParallel tensor;
  std::vector<bool> sliceSlots;
  // Pipeline parallelism (NOTE [Pipeline stages] in nn/Pipeline.h): this rank's stage, the group of the
  // stages (null without a pipeline) and the two ranks holding the tied embedding (null on the other stages),
  // and per slot whether it is the last stage's copy of a tied parameter, which the norm does not count.
  nn::PipelineParallel pipeline;
  dist::ProcessGroup* pipelineGroup = nullptr;
  dist::ProcessGroup* embeddingGroup = nullptr;
  std::vector<bool> tiedCopySlots;
  // Per chunk: the elements whose optimizer state this rank keeps (the whole padded chunk at stage 0, this
  // rank's shard above).
  std::vector<zero::ShardRange> ranges;
  // Stage 3: this rank's shard of each chunk's parameters; stage 0 with parameters homed off the device
  // (NOTE [Parameter homes] in zero/ParameterGatherer.h): each whole chunk's home. Else empty. A chunk homed
  // on the SSD (in `nvme`'s Parameters field) has a view of a scratch buffer here, which checkpoint loads
  // fill before writing the extent.
  std::vector<Tensor> parameterShards;
  std::vector<Tensor> masters;  // 16-bit chunks' fp32 masters over `ranges`, until the optimizer's
  // This rank's share of the device's memory (or STRATA_DEVICE_MEMORY_GB, `deviceMemoryGiven`).
  uint64_t deviceMemory = 0;
  bool deviceMemoryGiven = false;
  // NOTE [Memory tracer] in zero/Store.h: the first step is traced, then optimizer state moves onto the
  // device.
  bool traced = false;
  zero::StorePlacement placement;  // bytes per tier, and each chunk's optimizer-state tier
  // The SSD tier, when the placement uses it. Declared before the optimizer so that it is destroyed after
  // it: a delayed SSD update may still be using the tier when the engine goes (the optimizer waits for it).
  std::unique_ptr<zero::NvmeTier> nvme;
  std::unique_ptr<optim::ChunkOptimizer> optimizer;  // AdamW or Adafactor over `ranges`, homed by `placement`

  // Chunk c's parameters as this rank keeps them between steps: the padded chunk, or at stage 3 its shard.
  Tensor parameterHome(size_t c) const {
    return parameterShards.empty() ? chunks->paddedFlat(c) : parameterShards[c];
  }
  // Whether chunks are gathered into slots (stage 3, or parameters homed off the device).
  bool gathers() const { return !parameterShards.empty(); }
  // Bytes of parameters, masters and optimizer state (every tier).
  size_t bytes() const;
};

// Step 1 of the start-up: the chunks, the broadcast and the shards, over `group` (null: one rank) and, for
// expert chunks, `expertDataGroup`.
ModelState layOutModelState(data::Objective& objective, const config::Config& config, Device device,
                            DType compute, dist::ProcessGroup* group, dist::ProcessGroup* expertDataGroup,
                            RankShares shares);
// Step 2: the placement, and the parameters homed off the device moved there.
void placeModelState(ModelState& state, const config::Config& config, DType compute, RankShares shares);
// Step 4: the SSD tier and the optimizer (which takes the masters).
void makeChunkOptimizer(ModelState& state, const config::Config& config);
// Step 4 (NOTE [Memory tracer]): after the traced first step, the optimizer state of the chunks that fit
// beside its peak moves onto the device (a pending delayed SSD update stays pending; the moved chunks'
// pending parameters are written into this rank's part of them). Rank 0 logs the new placement.
// `gradientsBack` (per chunk; empty: none): the device bytes of gradients that left the device in the traced
// step and would stay on it once the chunk's state is there (NOTE [Gradient homes] in
// zero/GradientReducer.h), which the chunk's move must find room for too.
void promoteTracedState(ModelState& state, const std::vector<uint64_t>& gradientsBack = {});

}  // namespace strata::train
