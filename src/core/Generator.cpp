#include "strata/core/Generator.h"

namespace strata {

Generator& defaultGenerator() {
  thread_local Generator generator(0);
  return generator;
}

}  // namespace strata
