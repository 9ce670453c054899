#include "CpuKernels.h"

namespace strata::ops {

void registerCpuKernels(Registry& r) {
  cpu::registerCreation(r);
  cpu::registerElementwise(r);
  cpu::registerReduce(r);
  cpu::registerGemm(r);
  cpu::registerNormalization(r);
  cpu::registerNn(r);
  cpu::registerOptim(r);
  cpu::registerAttention(r);
  cpu::registerFp8(r);
}

}  // namespace strata::ops
