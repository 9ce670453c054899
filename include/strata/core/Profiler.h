// A coarse op profiler for finding where a training step's time goes.
//
// While a profile is running, every mark() waits for the device and charges the wall time since the previous
// mark to the named bucket. Autograd marks each differentiable function's forward (when it records its node)
// and each node's backward; the trainer marks the optimizer. Synchronising after every op adds launch latency
// to each bucket, so the sum is a little above an unprofiled step, but the shares are what one needs to pick
// the next kernel to write. Enable it from the command line with STRATA_PROFILE=1 (strata train profiles a
// window of steps after warm-up and prints the table).
//
// Mode::Events (STRATA_PROFILE=gpu) waits for nothing: each mark records a timing event on the device's
// current stream, and stop() charges each bucket the GPU time between its event and the one before. The step
// runs at full speed, so the buckets add up to the step's GPU time, and a bucket also holds any time the GPU
// sat idle waiting for its launches (which shows a launch-bound op). Work on other streams is not seen.
#pragma once

#include <string>
#include <string_view>

#include "strata/core/Device.h"

namespace strata::profiler {

enum class Mode { Synchronise, Events };
// Starts (or restarts) a profile of `device`'s ops: synchronising at each mark, or timing them with events.
void start(Device device, Mode mode = Mode::Synchronise);
// Stops the profile and returns the table: one line per bucket, largest first.
std::string stop();
bool active();
// Charges the time since the previous mark to bucket `name`. Free when no profile runs.
void mark(std::string_view name);
// Resets the clock without charging anything (time spent outside what should be measured).
void skip();

// While a Hold lives, marks are ignored: everything up to the first mark after it is charged to that mark.
// For work whose ops should count as one bucket and must not be synchronised op by op (the pipelined
// optimizer, whose lanes overlap copies and kernels). Holds nest. Marks from threads other than the one that
// started the profile are ignored as well.
class Hold {
 public:
  Hold();
  ~Hold();
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;
};

}  // namespace strata::profiler
