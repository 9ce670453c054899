// What both GPU allocators (core/Allocator.h, core/ExpandableAllocator.h) do alike with the streams that use
// a block besides the one it was allocated on (NOTE [Stream-ordered reuse] in strata/core/Allocator.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "strata/core/Allocator.h"
#include "strata/core/Stream.h"

namespace strata::detail {

// Adds `stream` to a live block's `uses` unless it is the block's own stream (id `own`) or already there.
inline void addStreamUse(std::vector<Stream>& uses, uint64_t own, const Stream& stream) {
  if (stream.id() == own) return;
  for (const Stream& s : uses)
    if (s == stream) return;
  uses.push_back(stream);
}

// Drops a freed block's completed fences (with `wait`, waits for each first, so all go); true when none is
// left and the block may be reused.
inline bool retireFences(std::vector<std::unique_ptr<StreamFence>>& fences, bool wait) {
  for (size_t f = 0; f < fences.size();) {
    if (wait) fences[f]->wait();
    if (wait || fences[f]->done()) {
      fences[f] = std::move(fences.back());
      fences.pop_back();
    } else {
      ++f;
    }
  }
  return fences.empty();
}

}  // namespace strata::detail
