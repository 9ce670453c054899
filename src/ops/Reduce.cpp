// Front ends of the reductions. Each reduction is laid out as a contiguous [A, R, B] problem: without a copy
// when the reduced dims are adjacent in a contiguous tensor, else after moving them last.
#include <algorithm>
#include <cmath>

#include "Kernels.h"
#include "strata/ops/Ops.h"

namespace strata::ops {
namespace {

Tensor reduce(const char* op, const Tensor& x, const std::vector<int64_t>& dimsIn, bool keepdim,
              std::optional<DType> outDtype = std::nullopt) {
  STRATA_CHECK(isFloating(x.dtype()), "{}: floating input required, got {}", op, x.dtype());
  int64_t nd = x.dim();
  std::vector<bool> reduced(static_cast<size_t>(nd), dimsIn.empty());
  for (int64_t d : dimsIn) reduced[size_t(wrapDim(d, nd, op))] = true;
  Shape outShape, keptShape;
  for (int64_t d = 0; d < nd; ++d) {
    if (reduced[size_t(d)]) {
      if (keepdim) outShape.push_back(1);
    } else {
      outShape.push_back(x.shape()[size_t(d)]);
      keptShape.push_back(x.shape()[size_t(d)]);
    }
  }
  int64_t first = -1, last = -1;
  for (int64_t d = 0; d < nd; ++d)
    if (reduced[size_t(d)]) {
      if (first < 0) first = d;
      last = d;
    }
  STRATA_CHECK(!outDtype || *outDtype == x.dtype() || *outDtype == DType::F32,
               "{}: results in {} or fp32 only, not {}", op, x.dtype(), *outDtype);
  Tensor out = Tensor::empty(outShape, outDtype.value_or(x.dtype()), x.device());
  if (first < 0) {  // nothing to reduce (0-d input or no dims)
    copy(out, detail::viewRaw(x, outShape));
    return out;
  }
  bool adjacent = true;
  for (int64_t d = first; d <= last; ++d) adjacent = adjacent && reduced[size_t(d)];
  Tensor in;
  int64_t A = 1, R = 1, B = 1;
  if (adjacent && x.isContiguous()) {
    in = x;
    for (int64_t d = 0; d < first; ++d) A *= x.shape()[size_t(d)];
    for (int64_t d = first; d <= last; ++d) R *= x.shape()[size_t(d)];
    for (int64_t d = last + 1; d < nd; ++d) B *= x.shape()[size_t(d)];
  } else {
    std::vector<int64_t> perm;
    for (int64_t d = 0; d < nd; ++d)
      if (!reduced[size_t(d)]) perm.push_back(d);
    for (int64_t d = 0; d < nd; ++d)
      if (reduced[size_t(d)]) {
        perm.push_back(d);
        R *= x.shape()[size_t(d)];
      }
    A = numelOf(keptShape);
    in = contiguous(detail::permuteRaw(x, perm));
  }
  if (out.numel() == 0) return out;
  if (R == 0) {
    fill(out, std::string(op) == "sum" ? 0.0 : -INFINITY);
    return out;
  }
  kernel<ReduceKernel>(op, x.device())(in, out, A, R, B);
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, std::optional<DType> out) {
  return reduce("sum", x, dims, keepdim, out);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor s = reduce("sum", x, dims, keepdim);
  int64_t count = x.numel() / std::max<int64_t>(s.numel(), 1);
  return affine(s, 1.0 / double(std::max<int64_t>(count, 1)), 0.0);
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return reduce("amax", x, dims, keepdim);
}

Tensor sumTo(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  int64_t lead = x.dim() - int64_t(shape.size());
  STRATA_CHECK(lead >= 0, "sumTo: cannot reduce {} to {}", toString(x.shape()), toString(shape));
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead)
      dims.push_back(d);
    else if (shape[size_t(d - lead)] == 1 && x.shape()[size_t(d)] != 1)
      dims.push_back(d);
  }
  Tensor s = dims.empty() ? x : sum(x, dims, true);
  // Drop the leading dims that were kept as size 1.
  return detail::viewRaw(contiguous(s), shape);
}

}  // namespace strata::ops
