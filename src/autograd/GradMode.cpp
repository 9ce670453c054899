#include "strata/autograd/GradMode.h"

namespace strata {
namespace {
thread_local bool tGradEnabled = true;
}

bool gradEnabled() {
  return tGradEnabled;
}
void setGradEnabled(bool enabled) {
  tGradEnabled = enabled;
}

}  // namespace strata
