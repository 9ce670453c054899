#include "strata/zero/ChunkGroups.h"

#include "strata/distributed/ProcessGroup.h"

namespace strata::zero {

ChunkGroups::ChunkGroups(const ChunkManager& chunks, dist::ProcessGroup* group,
                         dist::ProcessGroup* expertDataGroup)
    : chunks_(&chunks), group_(group) {
  for (size_t c = 0; c < chunks.numChunks(); ++c)
    chunkGroups_.push_back(chunks.family(c) == 1 ? expertDataGroup : group);
}

int ChunkGroups::ranks() const {
  return group_ ? group_->size() : 1;
}

int ChunkGroups::rank() const {
  return group_ ? group_->rank() : 0;
}

bool ChunkGroups::communicates() const {
  return group_ && group_->communicator().communicates();
}

dist::Communicator& ChunkGroups::comm() const {
  return group_->communicator();
}

int ChunkGroups::rankIn(size_t c) const {
  return chunkGroups_[c] ? chunkGroups_[c]->rank() : 0;
}

bool ChunkGroups::communicates(size_t c) const {
  return chunkGroups_[c] && chunkGroups_[c]->communicator().communicates();
}

dist::Communicator& ChunkGroups::comm(size_t c) const {
  return chunkGroups_[c]->communicator();
}

}  // namespace strata::zero
