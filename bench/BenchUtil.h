// Timing helpers for the GPU benches: CUDA events around a region, warm-up, median of repeats.
#pragma once

#include <functional>

#include "strata/strata.h"

namespace strata::bench {

// Median milliseconds of `fn` over `repeats` timed runs after `warmup` untimed ones, on the current stream.
inline double medianMs(Device device, const std::function<void()>& fn, int warmup = 5, int repeats = 20) {
  return medianEventMs(device, fn, warmup, repeats);
}

}  // namespace strata::bench
