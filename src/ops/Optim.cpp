// Front end of the optimizer update kernels.
#include "Kernels.h"
#include "strata/ops/Ops.h"

namespace strata::ops {

Tensor sumOfSquares(const std::vector<Tensor>& tensors) {
  STRATA_CHECK(!tensors.empty(), "sumOfSquares: no tensors");
  Device dev = tensors[0].device();
  for (const auto& t : tensors)
    STRATA_CHECK(t.defined() && t.dtype() == DType::F32 && t.isContiguous() && t.device() == dev,
                 "sumOfSquares: tensors must be fp32, contiguous and on {}", toString(dev));
  Tensor out = Tensor::empty({}, DType::F32, dev);
  kernel<SumOfSquaresKernel>("sum_of_squares", dev)(tensors, out);
  return out;
}

Tensor sumOfSquaresParts(const std::vector<Tensor>& tensors) {
  STRATA_CHECK(!tensors.empty(), "sumOfSquaresParts: no tensors");
  Device dev = tensors[0].device();
  for (const auto& t : tensors)
    STRATA_CHECK(t.defined() && t.dtype() == DType::F32 && t.isContiguous() && t.device() == dev,
                 "sumOfSquaresParts: tensors must be fp32, contiguous and on {}", toString(dev));
  return kernel<SquarePartsKernel>("sum_of_squares_parts", dev)(tensors);
}

Tensor sumParts(const std::vector<Tensor>& parts) {
  STRATA_CHECK(!parts.empty(), "sumParts: no parts");
  Device dev = parts[0].device();
  for (const auto& p : parts)
    STRATA_CHECK(
        p.defined() && p.dtype() == parts[0].dtype() && p.isContiguous() && p.dim() == 1 && p.device() == dev,
        "sumParts: the parts must be flat tensors of one dtype from sumOfSquaresParts, on {}", toString(dev));
  Tensor out = Tensor::empty({}, DType::F32, dev);
  kernel<SumPartsKernel>("sum_parts", dev)(parts, out);
  return out;
}

void adamw(const std::vector<AdamWTensors>& sets, const AdamWHyper& hyper, const Tensor& gradScale) {
  if (sets.empty()) return;
  Device dev = sets[0].param.device();
  for (const auto& s : sets) {
    for (const Tensor* t : {&s.param, &s.grad, &s.m, &s.v}) {
      bool gradDtype = t == &s.grad && (t->dtype() == DType::BF16 || t->dtype() == DType::F16);
      bool momentDtype = (t == &s.m || t == &s.v) && t->dtype() == DType::BF16;
      STRATA_CHECK(
          t->defined() && (t->dtype() == DType::F32 || gradDtype || momentDtype) && t->isContiguous() &&
              t->device() == dev,
          "adamw: '{}' needs an fp32 contiguous param, fp32 or bf16 contiguous m and v, and an fp32, "
          "bf16 or f16 contiguous grad on {}",
          s.param.name(), toString(dev));
      STRATA_CHECK(t->numel() == s.param.numel(), "adamw: state of '{}' has the wrong size", s.param.name());
    }
    STRATA_CHECK(s.m.dtype() == s.v.dtype(), "adamw: m and v of '{}' must share a dtype (got {} and {})",
                 s.param.name(), s.m.dtype(), s.v.dtype());
    STRATA_CHECK(!s.copy.defined() ||
                     ((s.copy.dtype() == DType::BF16 || s.copy.dtype() == DType::F16 ||
                       s.copy.dtype() == DType::F32) &&
                      s.copy.isContiguous() && s.copy.device() == dev && s.copy.numel() == s.param.numel()),
                 "adamw: the copy of '{}' must be a contiguous bf16, f16 or f32 tensor of its size on {}",
                 s.param.name(), toString(dev));
  }
  if (gradScale.defined())
    STRATA_CHECK(gradScale.dtype() == DType::F32 && gradScale.numel() == 1 && gradScale.device() == dev,
                 "adamw: the gradient scale must be one fp32 value on {}", toString(dev));
  kernel<AdamWKernel>("adamw", dev)(sets, hyper, gradScale);
  for (const auto& s : sets) {
    s.param.storage()->bumpVersion();
    if (s.copy.defined()) s.copy.storage()->bumpVersion();
  }
}

void adafactor(const std::vector<AdafactorTensors>& sets, const AdafactorHyper& hyper,
               const Tensor& gradScale) {
  if (sets.empty()) return;
  Device dev = sets[0].param.device();
  auto fp32On = [&](const Tensor& t) {
    return t.defined() && t.dtype() == DType::F32 && t.isContiguous() && t.device() == dev;
  };
  for (const auto& s : sets) {
    int64_t n = s.param.numel();
    STRATA_CHECK(fp32On(s.param) && fp32On(s.grad) && s.grad.numel() == n,
                 "adafactor: '{}' needs an fp32 contiguous param and grad of its size on {}", s.param.name(),
                 toString(dev));
    STRATA_CHECK(
        !s.m.defined() || ((s.m.dtype() == DType::F32 || s.m.dtype() == DType::BF16) && s.m.isContiguous() &&
                           s.m.device() == dev && s.m.numel() == n),
        "adafactor: the first moment of '{}' must be a contiguous fp32 or bf16 tensor of its size on {}",
        s.param.name(), toString(dev));
    bool factored = s.row.defined() || s.col.defined();
    if (factored)
      STRATA_CHECK(
          fp32On(s.row) && fp32On(s.col) && !s.v.defined() && s.row.numel() * s.col.numel() == n && n > 0,
          "adafactor: '{}' ({} elements) needs fp32 row and column statistics whose sizes multiply to "
          "its size, and no full second moment",
          s.param.name(), n);
    else
      STRATA_CHECK(fp32On(s.v) && s.v.numel() == n,
                   "adafactor: '{}' needs an fp32 second moment of its size (or row and column statistics)",
                   s.param.name());
    STRATA_CHECK(
        !s.copy.defined() || ((s.copy.dtype() == DType::BF16 || s.copy.dtype() == DType::F16 ||
                               (s.copy.dtype() == DType::F32 && dev.isCpu())) &&
                              s.copy.isContiguous() && s.copy.device() == dev && s.copy.numel() == n),
        "adafactor: the copy of '{}' must be a contiguous bf16/f16 (or, on the CPU, f32) tensor of its "
        "size on {}",
        s.param.name(), toString(dev));
  }
  if (gradScale.defined())
    STRATA_CHECK(gradScale.dtype() == DType::F32 && gradScale.numel() == 1 && gradScale.device() == dev,
                 "adafactor: the gradient scale must be one fp32 value on {}", toString(dev));
  kernel<AdafactorKernel>("adafactor", dev)(sets, hyper, gradScale);
  for (const auto& s : sets) {
    s.param.storage()->bumpVersion();
    if (s.copy.defined()) s.copy.storage()->bumpVersion();
  }
}

}  // namespace strata::ops
