#include "src/ops/cuda/CudaCommon.h"

namespace strata::ops {

#if STRATA_CUDNN_SDPA
void registerCudnnAttention(Registry& r);  // src/ops/cudnn/CudnnAttention.cpp
#endif

void registerCudaKernels(Registry& r) {
  cuda::registerCreation(r);
  cuda::registerElementwise(r);
  cuda::registerReduce(r);
  cuda::registerGemm(r);
  cuda::registerNormalization(r);
  cuda::registerNn(r);
  cuda::registerOptim(r);
  cuda::registerAttention(r);
  cuda::registerFp8(r);
#if STRATA_CUDNN_SDPA
  registerCudnnAttention(r);
#endif
}

}  // namespace strata::ops
