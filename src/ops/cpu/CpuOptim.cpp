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

double squares(const Tensor& t) {
  const float* g = static_cast<const float*>(t.data());
  int64_t n = t.numel();
  double s = 0;
#pragma omp parallel for reduction(+ : s) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) s += double(g[i]) * double(g[i]);
  return s;
}

void sumOfSquares(const std::vector<Tensor>& tensors, const Tensor& out) {
  double total = 0;
  for (const auto& t : tensors) total += squares(t);
  static_cast<float*>(out.data())[0] = float(total);
}

// One fp64 sum per tensor; their sum adds them in order, as sumOfSquares does.
Tensor sumOfSquaresParts(const std::vector<Tensor>& tensors) {
  Tensor parts = Tensor::empty({int64_t(tensors.size())}, DType::F64, Device::cpu());
  double* p = static_cast<double*>(parts.data());
  for (size_t i = 0; i < tensors.size(); ++i) p[i] = squares(tensors[i]);
  return parts;
}

void sumParts(const std::vector<Tensor>& parts, const Tensor& out) {
  double total = 0;
  for (const auto& part : parts) {
    const double* p = static_cast<const double*>(part.data());
    for (int64_t i = 0; i < part.numel(); ++i) total += p[i];
  }
  static_cast<float*>(out.data())[0] = float(total);
}

}  // namespace

void registerOptim(Registry& r) {
  r.add<SumOfSquaresKernel>("sum_of_squares", DeviceType::CPU, &sumOfSquares);
  r.add<SquarePartsKernel>("sum_of_squares_parts", DeviceType::CPU, &sumOfSquaresParts);
  r.add<SumPartsKernel>("sum_parts", DeviceType::CPU, &sumParts);
  r.add<AdamWKernel>("adamw", DeviceType::CPU, &adamw);
  r.add<AdafactorKernel>("adafactor", DeviceType::CPU, &cpu::adafactor);
}

}  // namespace strata::ops::cpu
