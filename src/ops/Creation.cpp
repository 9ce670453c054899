// Front ends of creation and copy ops.
#include <cmath>

#include "Kernels.h"
#include "strata/ops/Ops.h"

namespace strata::ops {

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  fill(t, value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor emptyLike(const Tensor& t) {
  return Tensor::empty(t.shape(), t.dtype(), t.device());
}
Tensor zerosLike(const Tensor& t) {
  return zeros(t.shape(), t.dtype(), t.device());
}

void spin(Device device, double microseconds) {
  STRATA_CHECK(microseconds >= 0 && std::isfinite(microseconds), "spin: {} microseconds", microseconds);
  if (microseconds > 0) kernel<SpinKernel>("spin", device)(device, microseconds);
}

void fill(const Tensor& t, double value) {
  if (t.numel() == 0) return;
  t.storage()->bumpVersion();
  if (t.isContiguous()) {
    kernel<FillKernel>("fill", t.device())(t, value);
    return;
  }
  copy(t, full(t.shape(), value, t.dtype(), t.device()));
}

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  STRATA_CHECK(step != 0.0, "arange: step must be non-zero");
  int64_t n = std::max<int64_t>(0, int64_t(std::ceil((end - start) / step)));
  Tensor t = Tensor::empty({n}, dtype, device);
  if (n > 0) kernel<ArangeKernel>("arange", device)(t, start, step);
  return t;
}

Tensor rand(const Shape& shape, Generator& gen, DType dtype, Device device, double low, double high) {
  STRATA_CHECK(isFloating(dtype), "rand: dtype must be floating, got {}", dtype);
  Tensor t = Tensor::empty(shape, dtype, device);
  uint64_t offset = gen.reserve(uint64_t(t.numel()));
  if (t.numel() > 0) kernel<RandomKernel>("random", device)(t, gen.seed(), offset, false, low, high);
  return t;
}

Tensor randn(const Shape& shape, Generator& gen, DType dtype, Device device, double mean, double std) {
  STRATA_CHECK(isFloating(dtype), "randn: dtype must be floating, got {}", dtype);
  Tensor t = Tensor::empty(shape, dtype, device);
  uint64_t offset = gen.reserve(uint64_t(t.numel()));
  if (t.numel() > 0) kernel<RandomKernel>("random", device)(t, gen.seed(), offset, true, mean, std);
  return t;
}

void copy(const Tensor& dst, const Tensor& src) {
  STRATA_CHECK(dst.shape() == src.shape(), "copy: destination shape {} differs from source shape {}",
               toString(dst.shape()), toString(src.shape()));
  if (dst.numel() == 0) return;
  dst.storage()->bumpVersion();
  if (dst.device() == src.device()) {
    kernel<CopyKernel>("copy", dst.device())(dst, src);
    return;
  }
  // Across devices: move contiguous bytes, then convert/scatter on the destination device if needed.
  Tensor from = src.isContiguous() ? src : contiguous(src);
  if (dst.isContiguous() && dst.dtype() == from.dtype()) {
    copyBytes(dst.data(), dst.device(), from.data(), from.device(), dst.nbytes());
    return;
  }
  Tensor staged = Tensor::empty(from.shape(), from.dtype(), dst.device());
  copyBytes(staged.data(), staged.device(), from.data(), from.device(), staged.nbytes());
  kernel<CopyKernel>("copy", dst.device())(dst, staged);
}

Tensor contiguous(const Tensor& t) {
  if (t.isContiguous()) return t;
  Tensor out = emptyLike(t);
  copy(out, t);
  return out;
}

Tensor to(const Tensor& t, Device device, DType dtype) {
  if (t.device() == device && t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype, device);
  copy(out, t);
  return out;
}

}  // namespace strata::ops
