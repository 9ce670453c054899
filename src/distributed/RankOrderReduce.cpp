#include "distributed/RankOrderReduce.h"

#include <type_traits>

namespace strata::dist {

namespace {

template <class T>
using Accumulator = std::conditional_t<std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>, float, T>;

template <class T>
void reduceTyped(T* out, const T* rows, int64_t n, int numRows, ReduceOp op) {
  using Acc = Accumulator<T>;
  for (int64_t i = 0; i < n; ++i) {
    Acc acc = Acc(rows[i]);
    for (int r = 1; r < numRows; ++r) {
      Acc v = Acc(rows[int64_t(r) * n + i]);
      if (op == ReduceOp::Sum) {
        acc = Acc(acc + v);
      } else if (v > acc || v != v) {  // max; a NaN wins
        if (acc == acc) acc = v;
      }
    }
    out[i] = T(acc);
  }
}

}  // namespace

void reduceRowsInOrder(void* out, const void* rows, int64_t rowElements, int numRows, DType dtype,
                       ReduceOp op) {
  visitDType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    reduceTyped(static_cast<T*>(out), static_cast<const T*>(rows), rowElements, numRows, op);
  });
}

}  // namespace strata::dist
