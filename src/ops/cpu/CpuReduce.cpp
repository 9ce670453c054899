// CPU reductions over the middle dim of a contiguous [A, R, B] view.
#include <limits>

#include "CpuKernels.h"

namespace strata::ops::cpu {
namespace {

struct SumOp {
  template <class C>
  static C identity() {
    return C(0);
  }
  template <class C>
  static C combine(C a, C b) {
    return a + b;
  }
};
struct MaxOp {
  template <class C>
  static C identity() {
    return -std::numeric_limits<C>::infinity();
  }
  template <class C>
  static C combine(C a, C b) {
    return a > b ? a : b;
  }
};

template <class Op>
void reduce(const Tensor& in, const Tensor& out, int64_t A, int64_t R, int64_t B) {
  visitFloating(in.dtype(), "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = typename ComputeOf<T>::type;
    const T* x = static_cast<const T*>(in.data());
    auto run = [&](auto* o) {
      using U = std::remove_pointer_t<decltype(o)>;
      if (B == 1) {
#pragma omp parallel for if (A * R > kParallelGrain)
        for (int64_t a = 0; a < A; ++a) {
          C acc = Op::template identity<C>();
          const T* row = x + a * R;
          for (int64_t r = 0; r < R; ++r) acc = Op::combine(acc, C(row[r]));
          o[a] = U(acc);
        }
        return;
      }
#pragma omp parallel for if (A * R * B > kParallelGrain)
      for (int64_t a = 0; a < A; ++a) {
        std::vector<C> acc(size_t(B), Op::template identity<C>());
        for (int64_t r = 0; r < R; ++r) {
          const T* row = x + (a * R + r) * B;
          for (int64_t b = 0; b < B; ++b) acc[size_t(b)] = Op::combine(acc[size_t(b)], C(row[b]));
        }
        for (int64_t b = 0; b < B; ++b) o[a * B + b] = U(acc[size_t(b)]);
      }
    };
    if (out.dtype() == in.dtype()) {
      run(static_cast<T*>(out.data()));
    } else {
      STRATA_CHECK(out.dtype() == DType::F32, "reduce: output dtype {} must be {} or f32", out.dtype(),
                   in.dtype());
      run(static_cast<float*>(out.data()));
    }
  });
}

}  // namespace

void registerReduce(Registry& r) {
  r.add<ReduceKernel>("sum", DeviceType::CPU, &reduce<SumOp>);
  r.add<ReduceKernel>("amax", DeviceType::CPU, &reduce<MaxOp>);
}

}  // namespace strata::ops::cpu
