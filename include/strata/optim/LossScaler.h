// Dynamic loss scaling for fp16 training. The loss is multiplied by scale() before backward; after it, the
// caller hands the (scaled) gradient norm to update(). A non-finite norm means an overflow: the step is
// skipped and the scale halves. After `window` good steps in a row the scale doubles.
#pragma once

#include <cstdint>

namespace strata::optim {

struct LossScalerConfig {
  double initialScale = 65536.0;
  int64_t window = 1000;
  double minScale = 1.0;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& config = {}) : config_(config), scale_(config.initialScale) {}

  double scale() const { return scale_; }
  // Given the norm of the scaled gradients: returns true when the step should be applied, and adapts the
  // scale.
  bool update(double scaledGradNorm);
  int64_t skippedSteps() const { return skipped_; }
  // Good steps since the last change of scale: with scale(), all a checkpoint needs to resume exactly.
  int64_t goodSteps() const { return goodSteps_; }
  void setScale(double s) { scale_ = s; }
  void restore(double scale, int64_t goodSteps) {
    scale_ = scale;
    goodSteps_ = goodSteps;
  }

 private:
  LossScalerConfig config_;
  double scale_;
  int64_t goodSteps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace strata::optim
