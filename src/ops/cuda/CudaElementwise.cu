// CUDA launchers and registration: map ops, copy, fill, arange, random, dropout.
#include <cstring>

#include "kernels/Elementwise.cuh"
#include "src/ops/ElementwiseFunctors.h"
#include "src/ops/Strided.h"
#include "src/ops/cuda/CudaCommon.h"

namespace strata::ops::cuda {
namespace {

constexpr int kThreads = 256;

// Calls launch(index, grid) with a uint32_t index when the layout's indices and offsets fit, int64_t
// otherwise.
template <int N, class Launch>
void launchStrided(int64_t work, const StridedLayout<N>& layout, Launch&& launch) {
  if (layout.fitsIn32(work))
    launch(uint32_t{}, gridFor(work, kThreads));
  else
    launch(int64_t{}, gridFor(work, kThreads));
}

template <class F, class T, int N, size_t... I>
void launchMap(const Tensor& out, const std::vector<Tensor>& inputs, const F& f, std::index_sequence<I...>) {
  T* o = static_cast<T*>(out.data());
  kernels::InputPtrs<T, N> in{{static_cast<const T*>(inputs[I].data())...}};
  int64_t n = out.numel();
  cudaStream_t stream = streamOf(out);
  if (allContiguousSameShape(out, inputs)) {
    constexpr int V = kernels::kVec<T>;
    bool packed = aligned16(o) && (aligned16(in.p[I]) && ...);
    if (packed) {
      kernels::mapPackedKernel<F, T, N, V>
          <<<gridFor(std::max<int64_t>(n / V, 1), kThreads), kThreads, 0, stream>>>(o, in, n, f);
    } else {
      kernels::mapPackedKernel<F, T, N, 1><<<gridFor(n, kThreads), kThreads, 0, stream>>>(o, in, n, f);
    }
  } else {
    auto layout = makeLayout<N + 1>({&out, &inputs[I]...});
    constexpr int V = kernels::kVec<T>;
    bool aligned = aligned16(o) && (aligned16(in.p[I]) && ...);
    if (aligned && layout.packInner(V)) {
      launchStrided(n / V, layout, [&](auto idx, unsigned grid) {
        using Idx = decltype(idx);
        kernels::mapStridedKernel<F, T, N, V, Idx>
            <<<grid, kThreads, 0, stream>>>(o, in, Idx(n / V), layout, f);
      });
    } else {
      launchStrided(n, layout, [&](auto idx, unsigned grid) {
        using Idx = decltype(idx);
        kernels::mapStridedKernel<F, T, N, 1, Idx><<<grid, kThreads, 0, stream>>>(o, in, Idx(n), layout, f);
      });
    }
  }
  STRATA_CUDA_CHECK_LAUNCH();
}

template <class F, int N>
void mapKernel(const Tensor& out, const std::vector<Tensor>& inputs, const ScalarArgs& args) {
  DeviceGuard guard(out.device().index);
  F f(args);
  visitFloatingCuda(out.dtype(), "elementwise", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launchMap<F, T, N>(out, inputs, f, std::make_index_sequence<N>{});
  });
}

void copy(const Tensor& dst, const Tensor& src) {
  DeviceGuard guard(dst.device().index);
  cudaStream_t stream = streamOf(dst);
  int64_t n = dst.numel();
  bool contiguous = dst.isContiguous() && src.isContiguous();
  if (contiguous && dst.dtype() == src.dtype()) {
    STRATA_CUDA_CHECK(
        cudaMemcpyAsync(dst.data(), src.data(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  auto layout = makeLayout<2>({&dst, &src});
  if (!contiguous && dst.dtype() == src.dtype() && aligned16(dst.data()) && aligned16(src.data())) {
    int64_t elementSize = int64_t(dtypeSize(dst.dtype()));
    int v = int(16 / elementSize);
    if (16 % elementSize == 0 && layout.packInner(v)) {
      // Move 16-byte packs; the element type only sets the pack width.
      launchStrided(n / v, layout, [&](auto idx, unsigned grid) {
        using Idx = decltype(idx);
        kernels::copyPackedStridedKernel<uint4, 1, Idx><<<grid, kThreads, 0, stream>>>(
            static_cast<uint4*>(dst.data()), static_cast<const uint4*>(src.data()), Idx(n / v), layout);
      });
      STRATA_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  visitAllCuda(dst.dtype(), [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    visitAllCuda(src.dtype(), [&](auto stag) {
      using S = typename decltype(stag)::type;
      D* d = static_cast<D*>(dst.data());
      const S* s = static_cast<const S*>(src.data());
      if (contiguous) {
        kernels::convertContiguousKernel<D, S><<<gridFor(n), kThreads, 0, stream>>>(d, s, n);
      } else {
        launchStrided(n, layout, [&](auto idx, unsigned grid) {
          using Idx = decltype(idx);
          kernels::copyStridedKernel<D, S, Idx><<<grid, kThreads, 0, stream>>>(d, s, Idx(n), layout);
        });
      }
      STRATA_CUDA_CHECK_LAUNCH();
    });
  });
}

void fill(const Tensor& out, double value) {
  DeviceGuard guard(out.device().index);
  visitDType(out.dtype(), [&](auto tag) {
    using H = typename decltype(tag)::type;
    using T = kernels::DevT<H>;
    H hv = H(value);
    T v;
    std::memcpy(&v, &hv, sizeof(T));  // host and device types share the bit layout
    kernels::fillKernel<T>
        <<<gridFor(out.numel()), kThreads, 0, streamOf(out)>>>(static_cast<T*>(out.data()), out.numel(), v);
    STRATA_CUDA_CHECK_LAUNCH();
  });
}

void arange(const Tensor& out, double start, double step) {
  DeviceGuard guard(out.device().index);
  visitAllCuda(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::arangeKernel<T><<<gridFor(out.numel()), kThreads, 0, streamOf(out)>>>(
        static_cast<T*>(out.data()), out.numel(), start, step);
    STRATA_CUDA_CHECK_LAUNCH();
  });
}

void random(const Tensor& out, uint64_t seed, uint64_t offset, bool normal, double a, double b) {
  DeviceGuard guard(out.device().index);
  visitFloatingCuda(out.dtype(), "rand", [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::randomKernel<T><<<gridFor(out.numel()), kThreads, 0, streamOf(out)>>>(
        static_cast<T*>(out.data()), out.numel(), seed, offset, normal, float(a), float(b));
    STRATA_CUDA_CHECK_LAUNCH();
  });
}

void dropout(const Tensor& x, const Tensor& out, double p, uint64_t seed, uint64_t offset) {
  DeviceGuard guard(x.device().index);
  visitFloatingCuda(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    int64_t n = x.numel();
    if (n == 0) return;
    auto groups = int64_t(((offset + uint64_t(n) - 1) >> 3) - (offset >> 3) + 1);
    kernels::dropoutKernel<T><<<gridFor(groups), kThreads, 0, streamOf(x)>>>(
        static_cast<T*>(out.data()), static_cast<const T*>(x.data()), n, groups, dropThreshold(p),
        kernels::AccT<T>(1.0 / (1.0 - p)), seed, offset);
    STRATA_CUDA_CHECK_LAUNCH();
  });
}

void spin(Device device, double microseconds) {
  DeviceGuard guard(device.index);
  kernels::spinKernel<<<1, 1, 0, strata::cuda::nativeStream(currentStream(device))>>>(
      uint64_t(microseconds * 1000.0));
  STRATA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void registerCreation(Registry& r) {
  r.add<FillKernel>("fill", DeviceType::CUDA, &fill);
  r.add<ArangeKernel>("arange", DeviceType::CUDA, &arange);
  r.add<RandomKernel>("random", DeviceType::CUDA, &random);
  r.add<CopyKernel>("copy", DeviceType::CUDA, &copy);
  r.add<SpinKernel>("spin", DeviceType::CUDA, &spin);
}

void registerElementwise(Registry& r) {
  fn::forEachMapOp(
      [&]<class F, int N>(const char* name) { r.add<MapKernel>(name, DeviceType::CUDA, &mapKernel<F, N>); });
  r.add<DropoutKernel>("dropout", DeviceType::CUDA, &dropout);
}

}  // namespace strata::ops::cuda
