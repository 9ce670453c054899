// Front ends of embedding, cross-entropy and cat.
#include "Kernels.h"
#include "strata/ops/Ops.h"

namespace strata::ops {

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  STRATA_CHECK(weight.dim() == 2, "embedding: weight must be [num_embeddings, dim], got {}",
               toString(weight.shape()));
  STRATA_CHECK(indices.dtype() == DType::I64 || indices.dtype() == DType::I32,
               "embedding: indices must be i32 or i64, got {}", indices.dtype());
  STRATA_CHECK(indices.device() == weight.device(), "embedding: indices on {} but weight on {}",
               toString(indices.device()), toString(weight.device()));
  Shape outShape = indices.shape();
  outShape.push_back(weight.size(1));
  Tensor out = Tensor::empty(outShape, weight.dtype(), weight.device());
  if (out.numel() > 0)
    kernel<EmbeddingKernel>("embedding", weight.device())(contiguous(weight), contiguous(indices), out);
  return out;
}

Tensor embeddingBackward(const Tensor& gy, const Tensor& indices, int64_t numEmbeddings, DType dtype) {
  int64_t C = gy.size(-1);
  Tensor gw = zeros({numEmbeddings, C}, statsDType(gy.dtype()), gy.device());
  if (indices.numel() > 0)
    kernel<EmbeddingBackwardKernel>("embedding_backward", gy.device())(contiguous(gy), contiguous(indices),
                                                                       gw);
  return to(gw, gy.device(), dtype);
}

void embeddingBackwardInto(const Tensor& gy, const Tensor& indices, const Tensor& out, bool accumulate) {
  STRATA_CHECK(gy.dim() == 2 && out.dim() == 2 && gy.size(1) == out.size(1) && out.isContiguous() &&
                   out.dtype() == statsDType(gy.dtype()) && out.device() == gy.device(),
               "embeddingBackwardInto: gradient {} {} into {} {} (contiguous, {})", toString(gy.shape()),
               gy.dtype(), toString(out.shape()), out.dtype(), statsDType(gy.dtype()));
  if (!accumulate) fill(out, 0.0);
  out.storage()->bumpVersion();
  if (indices.numel() > 0)
    kernel<EmbeddingBackwardKernel>("embedding_backward", gy.device())(contiguous(gy), contiguous(indices),
                                                                       out);
}

CrossEntropyResult crossEntropy(const Tensor& logits, const Tensor& target, int64_t ignoreIndex) {
  STRATA_CHECK(logits.dim() == 2, "cross_entropy: logits must be [N, V], got {}", toString(logits.shape()));
  STRATA_CHECK(target.dim() == 1 && target.size(0) == logits.size(0),
               "cross_entropy: target must be [N] = [{}], got {}", logits.size(0), toString(target.shape()));
  STRATA_CHECK(target.dtype() == DType::I64 || target.dtype() == DType::I32,
               "cross_entropy: target must be i32 or i64, got {}", target.dtype());
  STRATA_CHECK(isFloating(logits.dtype()), "cross_entropy: floating logits required, got {}", logits.dtype());
  int64_t N = logits.size(0);
  DType sd = statsDType(logits.dtype());
  Tensor rowLoss = Tensor::empty({N}, sd, logits.device());
  Tensor valid = Tensor::empty({N}, sd, logits.device());
  CrossEntropyResult r;
  r.lse = Tensor::empty({N}, sd, logits.device());
  if (N > 0)
    kernel<CrossEntropyKernel>("cross_entropy", logits.device())(contiguous(logits), contiguous(target),
                                                                 rowLoss, r.lse, valid, ignoreIndex);
  // The mean stays on the device: no host round trip for the count of counted targets.
  r.counted = sum(valid);
  r.count = maximum(r.counted, ones({}, sd, logits.device()));
  r.loss = div(sum(rowLoss), r.count);
  return r;
}

Tensor crossEntropyBackward(const Tensor& gradLoss, const Tensor& logits, const Tensor& target,
                            const CrossEntropyResult& saved, int64_t ignoreIndex) {
  DType sd = statsDType(logits.dtype());
  Tensor scale = div(to(gradLoss, logits.device(), sd), saved.count);
  Tensor in = contiguous(logits);
  Tensor g = emptyLike(in);
  if (g.numel() > 0)
    kernel<CrossEntropyBackwardKernel>("cross_entropy_backward", logits.device())(
        in, contiguous(target), saved.lse, scale, g, ignoreIndex);
  return g;
}

void crossEntropyInPlace(const Tensor& logits, const Tensor& target, const Tensor& rowLoss,
                         const Tensor& valid, bool grad, int64_t ignoreIndex) {
  STRATA_CHECK(logits.dim() == 2 && logits.isContiguous(),
               "cross_entropy_in_place: logits must be contiguous [N, V], got {}", toString(logits.shape()));
  int64_t N = logits.size(0);
  STRATA_CHECK(target.dim() == 1 && target.size(0) == N && target.isContiguous(),
               "cross_entropy_in_place: target must be contiguous [{}], got {}", N, toString(target.shape()));
  STRATA_CHECK(target.dtype() == DType::I64 || target.dtype() == DType::I32,
               "cross_entropy_in_place: target must be i32 or i64, got {}", target.dtype());
  STRATA_CHECK(isFloating(logits.dtype()), "cross_entropy_in_place: floating logits required, got {}",
               logits.dtype());
  DType sd = statsDType(logits.dtype());
  for (const Tensor* t : {&rowLoss, &valid})
    STRATA_CHECK(
        t->shape() == Shape({N}) && t->isContiguous() && t->dtype() == sd && t->device() == logits.device(),
        "cross_entropy_in_place: row outputs must be contiguous [{}] {} on {}, got {} {}", N, sd,
        toString(logits.device()), toString(t->shape()), t->dtype());
  if (N == 0) return;
  if (grad) logits.storage()->bumpVersion();
  rowLoss.storage()->bumpVersion();
  valid.storage()->bumpVersion();
  kernel<CrossEntropyInPlaceKernel>("cross_entropy_in_place", logits.device())(logits, target, rowLoss, valid,
                                                                               grad, ignoreIndex);
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  STRATA_CHECK(!tensors.empty(), "cat: no tensors given");
  const Tensor& first = tensors[0];
  int64_t d = wrapDim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    STRATA_CHECK(t.dim() == first.dim(), "cat: tensor {} has {} dims, tensor 0 has {}", i, t.dim(),
                 first.dim());
    STRATA_CHECK(t.dtype() == first.dtype() && t.device() == first.device(),
                 "cat: tensor {} differs in dtype or device from tensor 0", i);
    for (int64_t j = 0; j < t.dim(); ++j)
      STRATA_CHECK(j == d || t.shape()[size_t(j)] == shape[size_t(j)],
                   "cat: tensor {} has shape {}, incompatible with {} along dims other than {}", i,
                   toString(t.shape()), toString(shape), d);
    total += t.shape()[size_t(d)];
  }
  shape[size_t(d)] = total;
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    int64_t len = t.shape()[size_t(d)];
    if (len > 0) copy(detail::narrowRaw(out, d, offset, len), t);
    offset += len;
  }
  return out;
}

}  // namespace strata::ops
