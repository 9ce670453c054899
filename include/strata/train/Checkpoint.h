// Checkpoints.
//
// A checkpoint is a directory <save>/step-<N>/ holding, per rank, model and optimizer safetensors shards
// (model-rank<r>.safetensors, optimizer-rank<r>.safetensors) and a JSON manifest (step, RNG and data
// position, the config, the shard list). It is written to a temporary directory, every file and the directory
// are fsynced, the directory is renamed into place, and only then is <save>/latest rewritten (also by
// rename). A crash at any point leaves the previous checkpoint intact and `latest` pointing at it.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/Generator.h"
#include "strata/core/Tensor.h"

namespace strata::train {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// safetensors: 8-byte little-endian header length, a JSON header (dtype, shape, data_offsets per tensor, plus
// string "__metadata__"), then the raw bytes.
void writeSafetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// Reads every tensor to `device`; fills `metadata` when given.
std::map<std::string, Tensor> readSafetensors(const std::string& path, Device device = Device::cpu(),
                                              std::map<std::string, std::string>* metadata = nullptr);

struct CheckpointState {
  int64_t step = 0;            // iterations completed
  int64_t optimizerSteps = 0;  // AdamW's step count (bias correction)
  GeneratorState rng;          // the default generator (dropout)
  int64_t dataIndex = 0;       // next training batch index
  std::map<std::string, std::string> config;
  int rank = 0, worldSize = 1;
};

// Writes a checkpoint under `saveDir`; returns its directory.
std::string saveCheckpoint(const std::string& saveDir, const NamedTensors& model,
                           const NamedTensors& optimizer, const CheckpointState& state);
// Resolves `path` (a step directory, or a save directory with a `latest` file) and loads it into the given
// tensors in place (names must match). Returns the saved state.
CheckpointState loadCheckpoint(const std::string& path, const NamedTensors& model,
                               const NamedTensors& optimizer);
// Every model tensor of a checkpoint, merged across the shards its manifest lists (on the CPU).
std::map<std::string, Tensor> loadModelShards(const std::string& path);
// The step directory `path` refers to.
std::string resolveCheckpoint(const std::string& path);

}  // namespace strata::train
