// A random stream: a seed and an offset into the Philox counter space. Each draw reserves a range of
// counters, so draws never overlap and replaying the same (seed, offset) replays the same numbers (activation
// recomputation relies on this).
#pragma once

#include <cstdint>

namespace strata {

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : state_{seed, 0} {}
  // Replays a stream from a state taken earlier (a deferred parameter's draws: nn/DeferredInit.h).
  explicit Generator(GeneratorState state) : state_(state) {}
  void manualSeed(uint64_t seed) { state_ = {seed, 0}; }
  // Reserves `count` counters and returns the first, a multiple of `align` (dropout draws start on a group of
  // 8: NOTE [Dropout bits] in core/Philox.h).
  uint64_t reserve(uint64_t count, uint64_t align = 1) {
    if (align == 0) align = 1;
    uint64_t first = (state_.offset + align - 1) / align * align;
    state_.offset = first + count;
    return first;
  }
  uint64_t seed() const { return state_.seed; }
  GeneratorState state() const { return state_; }
  void setState(GeneratorState s) { state_ = s; }

 private:
  GeneratorState state_;
};

// The calling thread's default generator (one per thread, like a per-thread RNG; seed it with manualSeed).
Generator& defaultGenerator();

}  // namespace strata
