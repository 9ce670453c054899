// Learning-rate schedules: linear warmup from 0, then constant, linear or cosine decay to min_lr at
// decay_iters.
#pragma once

#include <cstdint>
#include <string>

namespace strata::optim {

enum class LrStyle { Constant, Linear, Cosine };

LrStyle lrStyleFromName(const std::string& name);  // "constant", "linear", "cosine"

struct LrSchedule {
  LrStyle style = LrStyle::Cosine;
  double maxLr = 6e-4;
  double minLr = 6e-5;
  int64_t warmupIters = 0;
  int64_t decayIters = 0;  // 0: decay over the whole run (the trainer fills in train_iters)

  double at(int64_t iter) const;
};

}  // namespace strata::optim
