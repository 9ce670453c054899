// CPU AdamW: one vectorisable loop per tensor, threads over elements.
#include <cmath>

#include "CpuKernels.h"

namespace strata::ops::cpu {
namespace {

void adamw(const std::vector<AdamWTensors>& sets, const AdamWHyper& h, const Tensor& gradScale) {
  float scale = gradScale.defined() ? static_cast<const float*>(gradScale.data())[0] : 1.0f;
  for (const auto& s : sets) {
    float* p = static_cast<float*>(s.param.data());
    const float* g = static_cast<const float*>(s.grad.data());
    float* m = static_cast<float*>(s.m.data());
    float* v = static_cast<float*>(s.v.data());
    int64_t n = s.param.numel();
    const float lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, decay = 1.0f - h.lr * s.weightDecay;
    const float c1 = 1.0f / h.biasCorrection1, c2 = 1.0f / h.biasCorrection2;
#pragma omp parallel for simd if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      float gi = g[i] * scale;
      float mi = b1 * m[i] + (1.0f - b1) * gi;
      float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] * decay - lr * (mi * c1) / (std::sqrt(vi * c2) + eps);
    }
    if (s.copy.defined()) {
      if (s.copy.dtype() == DType::BF16) {
        BFloat16* out = static_cast<BFloat16*>(s.copy.data());
#pragma omp parallel for if (n > kParallelGrain)
        for (int64_t i = 0; i < n; ++i) out[i] = BFloat16(p[i]);
      } else if (s.copy.dtype() == DType::F32) {
        float* out = static_cast<float*>(s.copy.data());
#pragma omp parallel for simd if (n > kParallelGrain)
        for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      } else {
        Half* out = static_cast<Half*>(s.copy.data());
#pragma omp parallel for if (n > kParallelGrain)
        for (int64_t i = 0; i < n; ++i) out[i] = Half(p[i]);
      }
    }
  }
}

void sumOfSquares(const std::vector<Tensor>& tensors, const Tensor& out) {
  double total = 0;
  for (const auto& t : tensors) {
    const float* g = static_cast<const float*>(t.data());
    int64_t n = t.numel();
    double s = 0;
#pragma omp parallel for reduction(+ : s) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) s += double(g[i]) * double(g[i]);
    total += s;
  }
  static_cast<float*>(out.data())[0] = float(total);
}

}  // namespace

void registerOptim(Registry& r) {
  r.add<SumOfSquaresKernel>("sum_of_squares", DeviceType::CPU, &sumOfSquares);
  r.add<AdamWKernel>("adamw", DeviceType::CPU, &adamw);
}

}  // namespace strata::ops::cpu
