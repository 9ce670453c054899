// How the Adafactor kernels (CPU and CUDA) cut their sets into blocks of work. The cut depends only on the
// sets' sizes, never on the thread count, so a set's sums (taken per block, then added block by block in
// order) come out the same on any number of threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "strata/ops/Ops.h"

namespace strata::ops {

// Elements [begin, end) of set `set`: whole rows of a factored set (one row at least), else any range.
struct AdafactorBlock {
  int64_t set = 0;
  int64_t begin = 0, end = 0;
};

// Columns [begin, end) of factored set `set`, reduced over all its rows.
struct AdafactorColumns {
  int64_t set = 0;
  int64_t begin = 0, end = 0;
};

inline bool adafactorFactored(const AdafactorTensors& s) {
  return s.row.defined();
}

// Blocks of about `target` elements; `firstBlock` (sets.size() + 1 entries): where each set's blocks start.
inline void adafactorBlocks(const std::vector<AdafactorTensors>& sets, int64_t target,
                            std::vector<AdafactorBlock>& blocks, std::vector<int64_t>& firstBlock) {
  blocks.clear();
  firstBlock.clear();
  for (size_t k = 0; k < sets.size(); ++k) {
    firstBlock.push_back(int64_t(blocks.size()));
    const AdafactorTensors& s = sets[k];
    int64_t n = s.param.numel();
    int64_t step = target;
    if (adafactorFactored(s)) {
      int64_t cols = s.col.numel();
      step = std::max<int64_t>(1, target / cols) * cols;
    }
    for (int64_t b = 0; b < n; b += step)
      blocks.push_back(AdafactorBlock{int64_t(k), b, std::min(n, b + step)});
  }
  firstBlock.push_back(int64_t(blocks.size()));
}

// Every factored set's columns in groups of `width`.
inline void adafactorColumnGroups(const std::vector<AdafactorTensors>& sets, int64_t width,
                                  std::vector<AdafactorColumns>& groups) {
  groups.clear();
  for (size_t k = 0; k < sets.size(); ++k) {
    if (!adafactorFactored(sets[k])) continue;
    int64_t cols = sets[k].col.numel();
    for (int64_t c = 0; c < cols; c += width)
      groups.push_back(AdafactorColumns{int64_t(k), c, std::min(cols, c + width)});
  }
}

}  // namespace strata::ops
