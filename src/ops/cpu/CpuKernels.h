// Private helpers of the CPU backend.
#pragma once

#include <omp.h>

#include <algorithm>

#include "../Kernels.h"
#include "strata/core/DType.h"

namespace strata::ops::cpu {

// The arithmetic type for a storage type: float for f32/bf16/f16, double for f64.
template <class T>
struct ComputeOf {
  using type = float;
};
template <>
struct ComputeOf<double> {
  using type = double;
};

template <class Fn>
void visitFloating(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::F32:
      fn(TypeTag<float>{});
      return;
    case DType::F64:
      fn(TypeTag<double>{});
      return;
    case DType::BF16:
      fn(TypeTag<BFloat16>{});
      return;
    case DType::F16:
      fn(TypeTag<Half>{});
      return;
    default:
      STRATA_FAIL("{}: dtype {} is not supported on the cpu (floating dtypes only)", op, t);
  }
}

// Minimum elements per thread before a loop goes parallel.
constexpr int64_t kParallelGrain = 16384;

// Splits [0, n) into one contiguous range per thread and calls fn(begin, end) in parallel.
template <class Fn>
void parallelRanges(int64_t n, Fn&& fn) {
  if (n <= kParallelGrain) {
    fn(int64_t(0), n);
    return;
  }
#pragma omp parallel
  {
    int threads = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t chunk = (n + threads - 1) / threads;
    int64_t begin = std::min<int64_t>(n, chunk * t), end = std::min<int64_t>(n, begin + chunk);
    fn(begin, end);
  }
}

void registerCreation(Registry& r);
void registerElementwise(Registry& r);
void registerReduce(Registry& r);
void registerGemm(Registry& r);
void registerNormalization(Registry& r);
void registerNn(Registry& r);
void registerOptim(Registry& r);
void registerAttention(Registry& r);
void registerFp8(Registry& r);

}  // namespace strata::ops::cpu
