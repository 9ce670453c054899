// CPU optimizer kernels: AdamW (CpuAdamW.cpp), Adafactor (CpuAdafactor.cpp) and the gradient norm's sum of
// squares.
#include "CpuAdafactor.h"
#include "CpuAdamW.h"
#include "CpuKernels.h"

namespace strata::ops::cpu {
namespace {

void adamw(const std::vector<AdamWTensors>& sets, const AdamWHyper& h, const Tensor& gradScale) {
  float scale = gradScale.defined() ? static_cast<const float*>(gradScale.data())[0] : 1.0f;
  adamwOnPath(activeCpuIsa(), sets, h, scale);
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
  r.add<AdafactorKernel>("adafactor", DeviceType::CPU, &cpu::adafactor);
}

}  // namespace strata::ops::cpu
