// Tensor: a cheap handle to a shared TensorImpl (storage, shape, strides, offset, dtype, autograd metadata).
//
// Copying a Tensor copies the handle; views (view/reshape, permute/transpose, narrow, expand,
// squeeze/unsqueeze) share storage. The view methods are differentiable: they are defined in the autograd
// layer, which records a backward node when grad mode is on and the tensor requires grad.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/core/DType.h"
#include "strata/core/Device.h"
#include "strata/core/Error.h"
#include "strata/core/Shape.h"
#include "strata/core/Storage.h"

namespace strata {

namespace autograd {
class Node;
}

class Tensor;

// Where a leaf's gradients accumulate: a tensor of the leaf's shape in `dtype`, made by `make` when the first
// gradient of a step arrives.
struct GradHome {
  DType dtype;
  std::function<Tensor()> make;
};

// Autograd metadata of one tensor. Lives in core so that Tensor can carry it; the autograd layer gives it
// meaning.
struct AutogradMeta {
  bool requiresGrad = false;
  std::shared_ptr<Tensor> grad;                   // the accumulated gradient of a leaf
  std::shared_ptr<autograd::Node> gradFn;         // the node that produced this tensor (non-leaf)
  int outputNr = 0;                               // which output of gradFn this is
  std::weak_ptr<autograd::Node> gradAccumulator;  // the AccumulateGrad node of a leaf, made on demand
  // Hooks on the gradient flowing into this tensor; each may return a replacement (or an undefined tensor to
  // keep).
  std::vector<std::function<Tensor(const Tensor&)>> gradHooks;
  // Hooks that fire on a leaf once its gradient for this backward pass is complete and accumulated.
  std::vector<std::function<void(Tensor&)>> gradCompleteHooks;
  std::string name;
  // A leaf's gradient home (NOTE [Gradient buffers] in strata/autograd/Node.h): where its gradient goes,
  // made on demand by the step's first write (a view into a chunk's flat fp32 gradients for a 16-bit
  // parameter). grad then holds that view until setGrad(undefined).
  std::shared_ptr<GradHome> gradHome;
};

struct TensorImpl {
  Storage storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::F32;
  AutogradMeta autograd;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- construction
  // ------------------------------------------------------------------------------------------- Uninitialised
  // contiguous tensor.
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  // A tensor over existing storage.
  static Tensor fromStorage(Storage storage, const Shape& shape, const Shape& strides, int64_t offset,
                            DType dtype);
  // Copies host values into a new tensor on `device`.
  template <class T>
  static Tensor fromVector(const std::vector<T>& values, const Shape& shape, Device device = Device::cpu()) {
    return fromHost(values.data(), DTypeOf<T>::value, values.size(), shape, device);
  }
  static Tensor fromHost(const void* data, DType dtype, size_t count, const Shape& shape, Device device);

  // ---- properties
  // ---------------------------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t dim() const { return int64_t(impl().shape.size()); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t offset() const { return impl().offset; }
  int64_t numel() const { return numelOf(impl().shape); }
  size_t nbytes() const { return size_t(numel()) * dtypeSize(dtype()); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  const Storage& storage() const { return impl().storage; }
  bool isContiguous() const;

  // Pointer to the first element (storage base + offset). Throws when the storage is not resident.
  void* data() const;
  template <class T>
  T* data() const {
    STRATA_CHECK(DTypeOf<std::remove_const_t<T>>::value == dtype(), "tensor has dtype {}, asked for {}",
                 dtype(), DTypeOf<std::remove_const_t<T>>::value);
    return static_cast<T*>(data());
  }

  // ---- views (differentiable; defined in the autograd layer)
  // --------------------------------------------------
  Tensor view(const Shape& shape) const;     // requires compatible strides; -1 infers one dimension
  Tensor reshape(const Shape& shape) const;  // a view when possible, otherwise a copy
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;  // narrow + squeeze
  Tensor expand(const Shape& shape) const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t startDim = 0, int64_t endDim = -1) const;
  Tensor contiguous() const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype) const;
  Tensor clone() const;

  // ---- host export
  // -------------------------------------------------------------------------------------------- Values in
  // logical (row-major) order, converted to T.
  template <class T>
  std::vector<T> toVector() const {
    std::vector<T> out(static_cast<size_t>(numel()));
    copyToHost(out.data(), DTypeOf<T>::value);
    return out;
  }
  void copyToHost(void* dst, DType dstType) const;
  double item() const;  // the single element as double

  // ---- autograd
  // -----------------------------------------------------------------------------------------------
  bool requiresGrad() const { return impl().autograd.requiresGrad; }
  // Marks a leaf as requiring grad. Throws for non-floating dtypes and for non-leaf tensors.
  Tensor& setRequiresGrad(bool on = true);
  bool isLeaf() const { return impl().autograd.gradFn == nullptr; }
  // A leaf's accumulated gradient; undefined when none was written. With a gradient home
  // (autograd::setGradHome), setGrad(undefined) lets go of the home's buffer and setGrad takes no other
  // tensor.
  Tensor grad() const;
  void setGrad(const Tensor& grad) const;
  const std::shared_ptr<autograd::Node>& gradFn() const { return impl().autograd.gradFn; }
  int outputNr() const { return impl().autograd.outputNr; }
  // A tensor sharing storage with no autograd history.
  Tensor detach() const;
  void setName(std::string name) const { impl().autograd.name = std::move(name); }
  const std::string& name() const { return impl().autograd.name; }
  // See AutogradMeta.
  void registerGradHook(std::function<Tensor(const Tensor&)> hook) const;
  void registerGradCompleteHook(std::function<void(Tensor&)> hook) const;

  TensorImpl& impl() const {
    STRATA_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& implPtr() const { return impl_; }
  bool isSameAs(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

namespace detail {
// Raw view construction (no autograd). Used by the differentiable view methods and the kernels' front ends.
Tensor asStrided(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset);
Tensor viewRaw(const Tensor& t, const Shape& shape);
Tensor permuteRaw(const Tensor& t, const std::vector<int64_t>& dims);
Tensor narrowRaw(const Tensor& t, int64_t dim, int64_t start, int64_t length);
Tensor expandRaw(const Tensor& t, const Shape& shape);
Tensor squeezeRaw(const Tensor& t, int64_t dim);
Tensor unsqueezeRaw(const Tensor& t, int64_t dim);
// Strides for viewing `t` as `shape` without a copy, or an empty vector when that is impossible.
Shape computeViewStrides(const Shape& oldShape, const Shape& oldStrides, const Shape& newShape);
Shape inferShape(const Shape& shape, int64_t numel);
}  // namespace detail

}  // namespace strata
