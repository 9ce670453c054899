// Core Tensor: construction, properties, host import/export, raw views. The differentiable view methods live
// in src/autograd/Views.cpp.
#include "strata/core/Tensor.h"

#include <algorithm>
#include <cstring>
#include <iomanip>

#include "core/cuda/CudaContext.h"

namespace strata {

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t s : shape) STRATA_CHECK(s >= 0, "negative dimension in shape {}", toString(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = makeStorage(size_t(numelOf(shape)) * dtypeSize(dtype), device);
  impl->shape = shape;
  impl->strides = contiguousStrides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::fromStorage(Storage storage, const Shape& shape, const Shape& strides, int64_t offset,
                           DType dtype) {
  STRATA_CHECK(shape.size() == strides.size(), "shape {} and strides {} differ in rank", toString(shape),
               toString(strides));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

namespace {

template <class Fn>
void forEachIndex(const Shape& shape, const Shape& strides, int64_t base, Fn&& fn) {
  int64_t n = numelOf(shape);
  if (n == 0) return;
  size_t nd = shape.size();
  std::vector<int64_t> idx(nd, 0);
  int64_t off = base;
  for (int64_t i = 0; i < n; ++i) {
    fn(i, off);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace

Tensor Tensor::fromHost(const void* data, DType dtype, size_t count, const Shape& shape, Device device) {
  STRATA_CHECK(int64_t(count) == numelOf(shape), "{} values given for shape {} ({} elements)", count,
               toString(shape), numelOf(shape));
  Tensor t = empty(shape, dtype, device);
  copyBytes(t.data(), device, data, Device::cpu(), count * dtypeSize(dtype));
  return t;
}

int64_t Tensor::size(int64_t d) const {
  return impl().shape[size_t(wrapDim(d, dim(), "size"))];
}
int64_t Tensor::stride(int64_t d) const {
  return impl().strides[size_t(wrapDim(d, dim(), "stride"))];
}

bool Tensor::isContiguous() const {
  const auto& sh = shape();
  const auto& st = strides();
  int64_t expected = 1;
  for (size_t i = sh.size(); i-- > 0;) {
    if (sh[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= sh[i];
  }
  return true;
}

void* Tensor::data() const {
  const StorageImpl& storage = *impl().storage;
  size_t esz = dtypeSize(dtype()), begin = size_t(impl().offset) * esz;
  if (!storage.resident()) {
    // The bytes this view spans, so that the owner's error can name what lies there (a chunk's parameter).
    int64_t lo = 0, hi = -1;  // the lowest and highest element from the offset (none when empty)
    if (numel() > 0) {
      hi = 0;
      for (size_t d = 0; d < shape().size(); ++d) {
        int64_t ext = (shape()[d] - 1) * strides()[d];
        (ext < 0 ? lo : hi) += ext;
      }
    }
    storage.failNotResident(size_t(impl().offset + lo) * esz, size_t(impl().offset + hi + 1) * esz);
  }
  return static_cast<char*>(storage.dataUnchecked()) + begin;
}

void Tensor::copyToHost(void* dst, DType dstType) const {
  int64_t n = numel();
  if (n == 0) return;
  // Bring the span of storage this view covers to the host, then gather and convert there.
  int64_t lo = 0, hi = 0;
  for (size_t d = 0; d < shape().size(); ++d) {
    int64_t ext = (shape()[d] - 1) * strides()[d];
    if (ext < 0)
      lo += ext;
    else
      hi += ext;
  }
  size_t esz = dtypeSize(dtype());
  std::vector<char> span(size_t(hi - lo + 1) * esz);
  const char* src = static_cast<const char*>(data()) + lo * int64_t(esz);
  copyBytes(span.data(), Device::cpu(), src, device(), span.size());
  visitDType(dtype(), [&](auto srcTag) {
    using S = typename decltype(srcTag)::type;
    const S* s = reinterpret_cast<const S*>(span.data()) - lo;
    visitDType(dstType, [&](auto dstTag) {
      using D = typename decltype(dstTag)::type;
      D* out = static_cast<D*>(dst);
      forEachIndex(shape(), strides(), 0, [&](int64_t i, int64_t off) {
        if constexpr (std::is_same_v<S, D>) {
          out[i] = s[off];
        } else {
          out[i] = D(double(s[off]));
        }
      });
    });
  });
}

double Tensor::item() const {
  STRATA_CHECK(numel() == 1, "item() needs a tensor with one element, got shape {}", toString(shape()));
  double v = 0;
  copyToHost(&v, DType::F64);
  return v;
}

Tensor& Tensor::setRequiresGrad(bool on) {
  STRATA_CHECK(!on || isFloating(dtype()), "only floating tensors can require grad (dtype is {})", dtype());
  STRATA_CHECK(isLeaf(), "setRequiresGrad on a non-leaf tensor; detach() it first");
  impl().autograd.requiresGrad = on;
  return *this;
}

Tensor Tensor::grad() const {
  const auto& g = impl().autograd.grad;
  return g ? *g : Tensor();
}

void Tensor::setGrad(const Tensor& grad) const {
  auto& meta = impl().autograd;
  if (!grad.defined()) {
    meta.grad.reset();
    return;
  }
  STRATA_CHECK(grad.shape() == shape(), "gradient shape {} does not match tensor shape {}",
               toString(grad.shape()), toString(shape()));
  STRATA_CHECK(!meta.gradHome || (meta.grad && grad.storage() == meta.grad->storage() &&
                                  grad.offset() == meta.grad->offset() && grad.dtype() == meta.grad->dtype()),
               "setGrad: '{}' keeps its gradient in a home of its own (autograd::setGradHome); write into "
               "that instead",
               name());
  meta.grad = std::make_shared<Tensor>(grad);
}

Tensor Tensor::detach() const {
  return fromStorage(storage(), shape(), strides(), offset(), dtype());
}

void Tensor::registerGradHook(std::function<Tensor(const Tensor&)> hook) const {
  STRATA_CHECK(requiresGrad() || !isLeaf(),
               "registering a gradient hook on a tensor that does not require grad");
  impl().autograd.gradHooks.push_back(std::move(hook));
}

void Tensor::registerGradCompleteHook(std::function<void(Tensor&)> hook) const {
  STRATA_CHECK(isLeaf() && requiresGrad(), "gradient-complete hooks are for leaf tensors that require grad");
  impl().autograd.gradCompleteHooks.push_back(std::move(hook));
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  os << "Tensor(" << t.dtype() << ", " << toString(t.shape()) << ", " << t.device();
  if (t.requiresGrad()) os << ", requires_grad";
  os << ") [";
  if (t.storage()->resident()) {
    auto values = t.toVector<double>();
    size_t shown = std::min<size_t>(values.size(), 16);
    for (size_t i = 0; i < shown; ++i) os << (i ? ", " : "") << std::setprecision(6) << values[i];
    if (shown < values.size()) os << ", ... (" << values.size() << " values)";
  } else {
    os << "not resident";
  }
  return os << "]";
}

namespace detail {

Tensor asStrided(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
  return Tensor::fromStorage(base.storage(), shape, strides, offset, base.dtype());
}

Shape inferShape(const Shape& shape, int64_t numel) {
  Shape out = shape;
  int64_t known = 1, inferAt = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      STRATA_CHECK(inferAt < 0, "view: only one dimension can be -1 in {}", toString(shape));
      inferAt = int64_t(i);
    } else {
      STRATA_CHECK(out[i] >= 0, "view: invalid dimension in {}", toString(shape));
      known *= out[i];
    }
  }
  if (inferAt >= 0) {
    STRATA_CHECK(known > 0 && numel % known == 0, "view: cannot infer -1 in {} for {} elements",
                 toString(shape), numel);
    out[size_t(inferAt)] = numel / known;
  }
  STRATA_CHECK(numelOf(out) == numel, "view: shape {} does not hold {} elements", toString(out), numel);
  return out;
}

Shape computeViewStrides(const Shape& oldShape, const Shape& oldStrides, const Shape& newShape) {
  // Walks chunks of old dims that are contiguous among themselves, matching them to new dims (as in PyTorch).
  if (numelOf(oldShape) == 0 || oldShape.empty()) return contiguousStrides(newShape);
  Shape newStrides(newShape.size());
  int64_t viewD = int64_t(newShape.size()) - 1;
  int64_t chunkBaseStride = oldStrides.empty() ? 1 : oldStrides.back();
  int64_t tensorNumel = 1, viewNumel = 1;
  for (int64_t d = int64_t(oldShape.size()) - 1; d >= 0; --d) {
    tensorNumel *= oldShape[size_t(d)];
    if (d == 0 ||
        (oldShape[size_t(d - 1)] != 1 && oldStrides[size_t(d - 1)] != tensorNumel * chunkBaseStride)) {
      while (viewD >= 0 && (viewNumel < tensorNumel || newShape[size_t(viewD)] == 1)) {
        newStrides[size_t(viewD)] = viewNumel * chunkBaseStride;
        viewNumel *= newShape[size_t(viewD)];
        viewD--;
      }
      if (viewNumel != tensorNumel) return {};
      if (d > 0) {
        chunkBaseStride = oldStrides[size_t(d - 1)];
        tensorNumel = 1;
        viewNumel = 1;
      }
    }
  }
  if (viewD != -1) return {};
  return newStrides;
}

Tensor viewRaw(const Tensor& t, const Shape& shape) {
  Shape target = inferShape(shape, t.numel());
  if (target.empty()) return asStrided(t, target, {}, t.offset());
  Shape strides = computeViewStrides(t.shape(), t.strides(), target);
  STRATA_CHECK(!strides.empty(),
               "view: shape {} is not compatible with the strides {} of a {} tensor; use reshape()",
               toString(target), toString(t.strides()), toString(t.shape()));
  return asStrided(t, target, strides, t.offset());
}

Tensor permuteRaw(const Tensor& t, const std::vector<int64_t>& dims) {
  STRATA_CHECK(int64_t(dims.size()) == t.dim(), "permute: {} dims given for a tensor of {} dims", dims.size(),
               t.dim());
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrapDim(dims[i], t.dim(), "permute");
    STRATA_CHECK(!seen[size_t(d)], "permute: dimension {} repeated", d);
    seen[size_t(d)] = true;
    shape[i] = t.shape()[size_t(d)];
    strides[i] = t.strides()[size_t(d)];
  }
  return asStrided(t, shape, strides, t.offset());
}

Tensor narrowRaw(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  int64_t d = wrapDim(dim, t.dim(), "narrow");
  int64_t size = t.shape()[size_t(d)];
  if (start < 0) start += size;
  STRATA_CHECK(start >= 0 && length >= 0 && start + length <= size,
               "narrow: range [{}, {}) out of bounds for dimension {} of size {}", start, start + length, d,
               size);
  Shape shape = t.shape();
  shape[size_t(d)] = length;
  return asStrided(t, shape, t.strides(), t.offset() + start * t.strides()[size_t(d)]);
}

Tensor expandRaw(const Tensor& t, const Shape& shape) {
  STRATA_CHECK(shape.size() >= t.shape().size(), "expand: cannot expand {} to fewer dims {}",
               toString(t.shape()), toString(shape));
  size_t lead = shape.size() - t.shape().size();
  Shape outShape(shape.size()), strides(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      STRATA_CHECK(shape[i] >= 0, "expand: new leading dims must be given explicitly, got {}",
                   toString(shape));
      outShape[i] = shape[i];
      strides[i] = 0;
      continue;
    }
    int64_t have = t.shape()[i - lead];
    int64_t want = shape[i] == -1 ? have : shape[i];
    STRATA_CHECK(have == want || have == 1, "expand: dimension {} of size {} cannot expand to {} ({} -> {})",
                 i, have, want, toString(t.shape()), toString(shape));
    outShape[i] = want;
    strides[i] = have == want ? t.strides()[i - lead] : 0;
  }
  return asStrided(t, outShape, strides, t.offset());
}

Tensor squeezeRaw(const Tensor& t, int64_t dim) {
  int64_t d = wrapDim(dim, t.dim(), "squeeze");
  if (t.shape()[size_t(d)] != 1) return t.detach();
  Shape shape = t.shape(), strides = t.strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return asStrided(t, shape, strides, t.offset());
}

Tensor unsqueezeRaw(const Tensor& t, int64_t dim) {
  int64_t d = wrapDim(dim, t.dim() + 1, "unsqueeze");
  Shape shape = t.shape(), strides = t.strides();
  int64_t st = size_t(d) < strides.size() ? strides[size_t(d)] * shape[size_t(d)] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, st);
  return asStrided(t, shape, strides, t.offset());
}

}  // namespace detail
}  // namespace strata
