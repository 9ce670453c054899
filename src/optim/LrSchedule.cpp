#include "strata/optim/LrSchedule.h"

#include <algorithm>
#include <cmath>

#include "strata/core/Error.h"

namespace strata::optim {

LrStyle lrStyleFromName(const std::string& name) {
  if (name == "constant") return LrStyle::Constant;
  if (name == "linear") return LrStyle::Linear;
  if (name == "cosine") return LrStyle::Cosine;
  STRATA_FAIL("unknown learning-rate style '{}' (expected constant, linear or cosine)", name);
}

double LrSchedule::at(int64_t iter) const {
  if (warmupIters > 0 && iter < warmupIters) return maxLr * double(iter + 1) / double(warmupIters);
  if (style == LrStyle::Constant) return maxLr;
  if (iter >= decayIters) return minLr;
  double progress = double(iter - warmupIters) / double(std::max<int64_t>(decayIters - warmupIters, 1));
  progress = std::clamp(progress, 0.0, 1.0);
  double factor = style == LrStyle::Linear ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  return minLr + factor * (maxLr - minLr);
}

}  // namespace strata::optim
