#include "strata/optim/LossScaler.h"

#include <algorithm>
#include <cmath>

namespace strata::optim {

bool LossScaler::update(double scaledGradNorm) {
  if (!std::isfinite(scaledGradNorm)) {
    scale_ = std::max(config_.minScale, scale_ / 2.0);
    goodSteps_ = 0;
    ++skipped_;
    return false;
  }
  if (++goodSteps_ >= config_.window) {
    scale_ *= 2.0;
    goodSteps_ = 0;
  }
  return true;
}

}  // namespace strata::optim
