// Which ranks each chunk is sharded over: the data-parallel group for most chunks, and under expert
// parallelism (NOTE [Expert parallelism] in nn/MoE.h) the expert-data-parallel group for the experts' chunks
// (zero::ChunkFamilies). Every part of the step that runs a chunk's collectives asks here: the gradient
// reduction, the update's gathers, stage 3's parameter gathers and the checkpoint's shards.
//
// A chunk's collectives run when its group communicates (dist::Communicator::communicates()): several ranks,
// or one rank given NCCL, which must still send every collective. Without a group (one rank) they are
// skipped and the chunk is its own whole shard.
#pragma once

#include <vector>

#include "strata/zero/ChunkManager.h"

namespace strata::dist {
class Communicator;
class ProcessGroup;
}  // namespace strata::dist

namespace strata::zero {

class ChunkGroups {
 public:
  ChunkGroups() = default;
  // `group`: every rank of the data-parallel group (null: one rank); `expertDataGroup`: the ranks holding
  // the same experts, for family 1's chunks.
  ChunkGroups(const ChunkManager& chunks, dist::ProcessGroup* group, dist::ProcessGroup* expertDataGroup);

  // The data-parallel group: its size, this rank in it, whether it communicates, and its communicator.
  int ranks() const;
  int rank() const;
  bool communicates() const;
  dist::Communicator& comm() const;

  // The group chunk c is sharded over (null: one rank), this rank's place in it, whether its collectives
  // communicate, its communicator, and this rank's shard of chunk c.
  dist::ProcessGroup* of(size_t c) const { return chunkGroups_[c]; }
  int rankIn(size_t c) const;
  bool communicates(size_t c) const;
  dist::Communicator& comm(size_t c) const;
  ShardRange shard(size_t c) const { return chunks_->shard(c, rankIn(c)); }

 private:
  const ChunkManager* chunks_ = nullptr;
  dist::ProcessGroup* group_ = nullptr;
  std::vector<dist::ProcessGroup*> chunkGroups_;  // by chunk
};

}  // namespace strata::zero
