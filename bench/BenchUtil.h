// Timing helpers for the GPU benches: CUDA events around a region, warm-up, median of repeats.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "strata/strata.h"

namespace strata::bench {

// Median milliseconds of `fn` over `repeats` timed runs after `warmup` untimed ones, on the current stream.
inline double medianMs(Device device, const std::function<void()>& fn, int warmup = 5, int repeats = 20) {
  for (int i = 0; i < warmup; ++i) fn();
  Stream stream = currentStream(device);
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    Event start(device, true), stop(device, true);
    start.record(stream);
    fn();
    stop.record(stream);
    stop.synchronize();
    times.push_back(start.elapsedMs(stop));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace strata::bench
