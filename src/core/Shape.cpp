#include "strata/core/Shape.h"

#include "strata/core/Error.h"

namespace strata {

int64_t numelOf(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguousStrides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int64_t i = int64_t(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

int64_t wrapDim(int64_t dim, int64_t ndim, const char* op) {
  int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  STRATA_CHECK(dim >= lo && dim <= hi, "{}: dimension {} out of range for a tensor of {} dims", op, dim,
               ndim);
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Shape broadcastShapes(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    STRATA_CHECK(da == db || da == 1 || db == 1, "shapes {} and {} do not broadcast", toString(a),
                 toString(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::string toString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace strata
