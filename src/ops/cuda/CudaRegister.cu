#include "src/ops/cuda/CudaCommon.h"

namespace strata::ops {

void registerCudaKernels(Registry& r) {
  cuda::registerCreation(r);
  cuda::registerElementwise(r);
  cuda::registerReduce(r);
  cuda::registerGemm(r);
  cuda::registerNormalization(r);
  cuda::registerNn(r);
  cuda::registerOptim(r);
  cuda::registerAttention(r);
}

}  // namespace strata::ops
