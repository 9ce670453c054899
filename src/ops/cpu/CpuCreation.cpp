// CPU fill, arange, Philox random and strided copy with dtype conversion.
#include <chrono>
#include <cstring>

#include "../Strided.h"
#include "CpuKernels.h"
#include "strata/core/Philox.h"

namespace strata::ops::cpu {
namespace {

void fill(const Tensor& out, double value) {
  visitDType(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v = T(value);
    T* p = static_cast<T*>(out.data());
    int64_t n = out.numel();
#pragma omp parallel for if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) p[i] = v;
  });
}

void spin(Device, double microseconds) {
  auto until =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double, std::micro>(microseconds));
  while (std::chrono::steady_clock::now() < until) {
  }
}

void arange(const Tensor& out, double start, double step) {
  visitDType(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(out.data());
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = T(start + double(i) * step);
  });
}

void random(const Tensor& out, uint64_t seed, uint64_t offset, bool normal, double a, double b) {
  visitFloating(out.dtype(), "rand", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(out.data());
    int64_t n = out.numel();
#pragma omp parallel for if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      uint64_t idx = offset + uint64_t(i);
      float v = normal ? float(a) + float(b) * philoxNormal(seed, idx)
                       : float(a) + float(b - a) * philoxUniform(seed, idx);
      p[i] = T(v);
    }
  });
}

template <class D, class S>
inline D convert(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else {
    return D(static_cast<double>(s));
  }
}

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.isContiguous() && src.isContiguous()) {
    std::memcpy(dst.data(), src.data(), dst.nbytes());
    return;
  }
  auto layout = makeLayout<2>({&dst, &src});
  int64_t n = dst.numel();
  visitDType(dst.dtype(), [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    visitDType(src.dtype(), [&](auto stag) {
      using S = typename decltype(stag)::type;
      D* d = static_cast<D*>(dst.data());
      const S* s = static_cast<const S*>(src.data());
      parallelRanges(n, [&](int64_t begin, int64_t end) {
        forEachOffset(layout, begin, end, [&](const int64_t* off) { d[off[0]] = convert<D>(s[off[1]]); });
      });
    });
  });
}

}  // namespace

void registerCreation(Registry& r) {
  r.add<FillKernel>("fill", DeviceType::CPU, &fill);
  r.add<ArangeKernel>("arange", DeviceType::CPU, &arange);
  r.add<RandomKernel>("random", DeviceType::CPU, &random);
  r.add<CopyKernel>("copy", DeviceType::CPU, &copy);
  r.add<SpinKernel>("spin", DeviceType::CPU, &spin);
}

}  // namespace strata::ops::cpu
