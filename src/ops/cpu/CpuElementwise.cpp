// CPU elementwise kernels: one template instantiated per functor of ElementwiseFunctors.h, plus dropout.
#include <utility>

#include "../ElementwiseFunctors.h"
#include "../Strided.h"
#include "CpuKernels.h"

namespace strata::ops::cpu {
namespace {

template <class F, int N, size_t... I>
void mapImpl(const Tensor& out, const std::vector<Tensor>& inputs, const ScalarArgs& args,
             std::index_sequence<I...>) {
  F f(args);
  int64_t n = out.numel();
  visitFloating(out.dtype(), "elementwise", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = typename ComputeOf<T>::type;
    T* o = static_cast<T*>(out.data());
    const T* in[N] = {static_cast<const T*>(inputs[I].data())...};
    if (allContiguousSameShape(out, inputs)) {
#pragma omp parallel for if (n > kParallelGrain)
      for (int64_t i = 0; i < n; ++i) o[i] = T(f(C(in[I][i])...));
      return;
    }
    auto layout = makeLayout<N + 1>({&out, &inputs[I]...});
    parallelRanges(n, [&](int64_t begin, int64_t end) {
      forEachOffset(layout, begin, end,
                    [&](const int64_t* off) { o[off[0]] = T(f(C(in[I][off[I + 1]])...)); });
    });
  });
}

template <class F, int N>
void mapKernel(const Tensor& out, const std::vector<Tensor>& inputs, const ScalarArgs& args) {
  mapImpl<F, N>(out, inputs, args, std::make_index_sequence<N>{});
}

void dropout(const Tensor& x, const Tensor& out, double p, uint64_t seed, uint64_t offset) {
  visitFloating(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = typename ComputeOf<T>::type;
    const T* in = static_cast<const T*>(x.data());
    T* o = static_cast<T*>(out.data());
    int64_t n = x.numel();
    if (n == 0) return;
    C scale = C(1.0 / (1.0 - p));
    uint32_t threshold = dropThreshold(p);
    // One Philox evaluation per group of 8 counters (NOTE [Dropout bits]); the first and last may be partial.
    uint64_t first = offset >> 3, groups = ((offset + uint64_t(n) - 1) >> 3) - first + 1;
#pragma omp parallel for if (n > kParallelGrain)
    for (int64_t g = 0; g < int64_t(groups); ++g) {
      uint32_t bits = dropKeepByte(seed, first + uint64_t(g), threshold);
      for (int l = 0; l < 8; ++l) {
        int64_t i = int64_t((first + uint64_t(g)) * 8 + uint64_t(l) - offset);
        if (i < 0 || i >= n) continue;
        o[i] = (bits >> l) & 1u ? T(C(in[i]) * scale) : T(C(0));
      }
    }
  });
}

}  // namespace

void registerElementwise(Registry& r) {
  fn::forEachMapOp(
      [&]<class F, int N>(const char* name) { r.add<MapKernel>(name, DeviceType::CPU, &mapKernel<F, N>); });
  r.add<DropoutKernel>("dropout", DeviceType::CPU, &dropout);
}

}  // namespace strata::ops::cpu
