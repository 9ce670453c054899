// FP8 on the CPU: the emulation of the CUDA kernels (NOTE [FP8 training] in autograd/Fp8.h). The cast uses
// core/Fp8.h's conversion, the one the device runs, so the codes are the same bits; the update runs the
// recipe's arithmetic in fp32 as the device does.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../ElementwiseFunctors.h"
#include "CpuKernels.h"
#include "strata/core/Fp8.h"

namespace strata::ops::cpu {
namespace {

// The value the cast converts (ops::fp8CastFused): computed as the elementwise ops compute it and rounded
// to T as they store it.
template <class T>
float prologueValue(Fp8Prologue prologue, T x, const T* aux, int64_t i) {
  using C = typename ComputeOf<T>::type;
  if (prologue == Fp8Prologue::GeluTanh) return float(T(fn::GeluTanh{ScalarArgs{}}(C(x))));
  if (prologue == Fp8Prologue::GeluTanhBackward)
    return float(T(fn::GeluTanhBackward{ScalarArgs{}}(C(x), C(aux[i]))));
  return float(x);
}

// Rows in the order NOTE [FP8 fused casts] gives the column sums: blocks of 64 rows, each summed row by row,
// the blocks' sums then added in order.
constexpr int64_t kSumBlock = 64;

template <class T>
void castRows(const Tensor& x, Fp8Prologue prologue, const Tensor& aux, Fp8Format format, float scale,
              uint8_t* plain, uint8_t* transposed, float& amax, float* columnSums) {
  const T* in = static_cast<const T*>(x.data());
  const T* a = aux.defined() ? static_cast<const T*>(aux.data()) : nullptr;
  int64_t rows = x.size(0), cols = x.size(1);
  float largest = 0.0f;
  std::vector<float> block(columnSums ? size_t(cols) : 0, 0.0f);
  if (columnSums) std::fill(columnSums, columnSums + cols, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      float v = prologueValue<T>(prologue, in[r * cols + c], a, r * cols + c);
      if (std::isfinite(v)) largest = std::fmax(largest, std::fabs(v));
      if (columnSums) block[size_t(c)] += v;
      uint8_t code = floatToFp8(v * scale, format);
      if (plain) plain[r * cols + c] = code;
      if (transposed) transposed[c * rows + r] = code;
    }
    if (columnSums && ((r + 1) % kSumBlock == 0 || r + 1 == rows))
      for (int64_t c = 0; c < cols; ++c) {
        columnSums[c] += block[size_t(c)];
        block[size_t(c)] = 0.0f;
      }
  }
  amax = std::fmax(amax, largest);
}

bool fp8Cast(const Tensor& x, Fp8Prologue prologue, const Tensor& aux, Fp8Format format, const Tensor& scale,
             const Tensor& amax, const Tensor& plain, const Tensor& transposed, const Tensor& columnSums) {
  float s = *static_cast<const float*>(scale.data());
  float& a = *static_cast<float*>(amax.data());
  auto* p = plain.defined() ? static_cast<uint8_t*>(plain.data()) : nullptr;
  auto* t = transposed.defined() ? static_cast<uint8_t*>(transposed.data()) : nullptr;
  auto* sums = columnSums.defined() ? static_cast<float*>(columnSums.data()) : nullptr;
  visitFloating(x.dtype(), "fp8Cast", [&](auto tag) {
    castRows<typename decltype(tag)::type>(x, prologue, aux, format, s, p, t, a, sums);
  });
  return true;
}

void fp8UpdateScales(const std::vector<Tensor>& states, int64_t history, int64_t position, int margin,
                     bool mostRecent) {
  for (const Tensor& state : states) {
    float* s = static_cast<float*>(state.data());
    for (int role = 0; role < 3; ++role) {
      float* h = s + fp8HistorySlot(role, history);
      float amax = h[position];
      if (!mostRecent)
        for (int64_t i = 0; i < history; ++i) amax = std::fmax(amax, h[i]);
      float& scale = s[fp8ScaleSlot(role)];
      scale = fp8NextScale(amax, scale, role == 2 ? Fp8Format::E5M2 : Fp8Format::E4M3, margin);
      s[fp8InverseSlot(role)] = 1.0f / scale;
      h[(position + 1) % history] = 0.0f;
    }
  }
}

}  // namespace

void registerFp8(Registry& r) {
  r.add<Fp8CastKernel>("fp8Cast", DeviceType::CPU, &fp8Cast);
  r.add<Fp8UpdateScalesKernel>("fp8UpdateScales", DeviceType::CPU, &fp8UpdateScales);
}

}  // namespace strata::ops::cpu
