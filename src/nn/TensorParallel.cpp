// The conjugate operators of tensor parallelism, the vocabulary-parallel cross-entropy, and the slices of
// the one-rank weights each rank holds (NOTE [Tensor parallelism] in nn/TensorParallel.h).
#include "strata/nn/TensorParallel.h"

#include "strata/autograd/Functions.h"
#include "strata/autograd/Node.h"
#include "strata/nn/Embedding.h"
#include "strata/nn/Linear.h"
#include "strata/ops/Ops.h"

namespace strata::nn {

namespace {

// A second handle on x's elements, so that a node recorded on it leaves x's own history alone.
Tensor alias(const Tensor& x) {
  return detail::asStrided(x, x.shape(), x.strides(), x.offset());
}

// The sum over the group of a contiguous copy of t (t itself is left as it is).
Tensor summed(const Tensor& t, const TensorParallel& tp) {
  Tensor out = t.clone();
  tp.allReduceSum(out);
  return out;
}

}  // namespace

void checkTensorSplit(const TensorParallel& tp, const std::string& model, int64_t heads, int64_t ffn,
                      const char* ffnKey, int64_t vocab, bool allowsSequenceParallel) {
  if (!tp.active()) return;
  auto divides = [&](const char* key, int64_t n) {
    STRATA_USER_CHECK(n % tp.size == 0, "parallel.tensor ({}) must divide {} ({})", tp.size, key, n);
  };
  divides("model.num_attention_heads", heads);
  divides(ffnKey, ffn);
  divides("model.vocab_size (pad the vocabulary to a multiple of it)", vocab);
  STRATA_USER_CHECK(
      allowsSequenceParallel || !tp.sequenceParallel,
      "parallel.sequence_parallel splits gpt's sequence only; {} splits its heads, widths and "
      "vocabulary over parallel.tensor ({}) without it: set parallel.sequence_parallel to false",
      model, tp.size);
}

Tensor copyToTensorParallel(const Tensor& x, const TensorParallel& tp) {
  if (!tp.active()) return x;
  Tensor out = alias(x);
  TensorParallel group = tp;
  autograd::recordFunction("CopyToTensorParallelBackward", {x}, {out}, [group](const autograd::Grads& g) {
    return autograd::Grads{g[0].defined() ? summed(g[0], group) : Tensor()};
  });
  return out;
}

Tensor reduceFromTensorParallel(const Tensor& x, const TensorParallel& tp) {
  if (!tp.active()) return x;
  Tensor out = summed(x, tp);
  autograd::recordFunction("ReduceFromTensorParallelBackward", {x}, {out},
                           [](const autograd::Grads& g) { return autograd::Grads{g[0]}; });
  return out;
}

Tensor gatherFromTensorParallel(const Tensor& x, const TensorParallel& tp) {
  if (!tp.active()) return x;
  Tensor in = x.contiguous();
  int64_t n = x.size(x.dim() - 1), rows = x.numel() / n;
  Tensor blocks = Tensor::empty({int64_t(tp.size), rows, n}, x.dtype(), x.device());
  tp.allGather(blocks, in);
  Shape shape = x.shape();
  shape.back() = n * tp.size;
  // [T, rows, n] -> [rows, T, n]: each row's parts side by side.
  Tensor out = ops::contiguous(detail::permuteRaw(blocks, {1, 0, 2})).view(shape);
  int rank = tp.rank;
  autograd::recordFunction(
      "GatherFromTensorParallelBackward", {x}, {out}, [rank, n](const autograd::Grads& g) {
        if (!g[0].defined()) return autograd::Grads{Tensor()};
        return autograd::Grads{
            ops::contiguous(detail::narrowRaw(g[0], g[0].dim() - 1, int64_t(rank) * n, n))};
      });
  return out;
}

namespace {

// The ranks' x side by side along `dim` (no autograd).
Tensor allGatherAlong(const Tensor& x, const TensorParallel& tp, int64_t dim) {
  Shape blockShape = x.shape();
  blockShape.insert(blockShape.begin(), int64_t(tp.size));
  Tensor blocks = Tensor::empty(blockShape, x.dtype(), x.device());
  tp.allGather(blocks, x.contiguous());
  // [T, ..., n, ...] -> [..., T, n, ...] -> [..., T n, ...].
  std::vector<int64_t> order;
  for (int64_t d = 1; d <= dim; ++d) order.push_back(d);
  order.push_back(0);
  for (int64_t d = dim + 1; d < int64_t(blockShape.size()); ++d) order.push_back(d);
  Shape shape = x.shape();
  shape[size_t(dim)] *= tp.size;
  Tensor moved = dim == 0 ? blocks : ops::contiguous(detail::permuteRaw(blocks, order));
  return detail::viewRaw(moved, shape);
}

// This rank's part along `dim` of the sum over the ranks of x (no autograd).
Tensor reduceScatterAlong(const Tensor& x, const TensorParallel& tp, int64_t dim) {
  STRATA_CHECK(x.size(dim) % tp.size == 0, "sequence parallelism: {} positions over {} ranks", x.size(dim),
               tp.size);
  // [..., T n, ...] -> [..., T, n, ...] -> [T, ..., n, ...].
  Shape split = x.shape();
  split[size_t(dim)] /= tp.size;
  split.insert(split.begin() + dim, int64_t(tp.size));
  std::vector<int64_t> order{dim};
  for (int64_t d = 0; d < int64_t(split.size()); ++d)
    if (d != dim) order.push_back(d);
  Tensor in = ops::contiguous(detail::permuteRaw(detail::viewRaw(x.contiguous(), split), order));
  Shape shape = x.shape();
  shape[size_t(dim)] /= tp.size;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  tp.reduceScatter(out, in);
  return out;
}

Tensor localPart(const Tensor& x, const TensorParallel& tp, int64_t dim) {
  int64_t n = x.size(dim) / tp.size;
  return ops::contiguous(detail::narrowRaw(x, dim, n * tp.rank, n));
}

}  // namespace

Tensor gatherSequence(const Tensor& x, const TensorParallel& tp, int64_t dim) {
  if (!tp.active()) return x;
  Tensor out = allGatherAlong(x, tp, dim);
  TensorParallel group = tp;
  autograd::recordFunction("GatherSequenceBackward", {x}, {out}, [group, dim](const autograd::Grads& g) {
    return autograd::Grads{g[0].defined() ? reduceScatterAlong(g[0], group, dim) : Tensor()};
  });
  return out;
}

Tensor scatterSequence(const Tensor& x, const TensorParallel& tp, int64_t dim) {
  if (!tp.active()) return x;
  Tensor out = reduceScatterAlong(x, tp, dim);
  TensorParallel group = tp;
  autograd::recordFunction("ScatterSequenceBackward", {x}, {out}, [group, dim](const autograd::Grads& g) {
    return autograd::Grads{g[0].defined() ? allGatherAlong(g[0], group, dim) : Tensor()};
  });
  return out;
}

Tensor splitSequence(const Tensor& x, const TensorParallel& tp, int64_t dim) {
  if (!tp.active()) return x;
  STRATA_CHECK(x.size(dim) % tp.size == 0, "sequence parallelism: {} positions over {} ranks", x.size(dim),
               tp.size);
  Tensor out = localPart(x, tp, dim);
  TensorParallel group = tp;
  autograd::recordFunction("SplitSequenceBackward", {x}, {out}, [group, dim](const autograd::Grads& g) {
    return autograd::Grads{g[0].defined() ? allGatherAlong(g[0], group, dim) : Tensor()};
  });
  return out;
}

Tensor sequenceParallelParameter(const Tensor& p, const TensorParallel& tp) {
  return tp.splitsSequence() && p.defined() ? copyToTensorParallel(p, tp) : p;
}

Tensor vocabParallelCrossEntropy(const Tensor& logits, const Tensor& target, const TensorParallel& tp,
                                 int64_t ignoreIndex) {
  STRATA_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0),
               "vocabParallelCrossEntropy: logits [N, V/T] and target [N], got {} and {}",
               toString(logits.shape()), toString(target.shape()));
  Device device = logits.device();
  DType work = logits.dtype() == DType::F64 ? DType::F64 : DType::F32;
  int64_t N = logits.size(0), local = logits.size(1), first = local * tp.rank;
  int64_t vocab = local * std::max(1, tp.size);
  // Token ids compared as floats (exact below 2^24 ids). As the one-rank loss (ops::crossEntropy) has it, a
  // row counts unless its target is ignoreIndex; a counted target outside [0, V) adds no loss and its row's
  // gradient is the softmax alone.
  Tensor t = ops::to(target, device, work).view({N, 1});
  auto inside = [&](double lo, double hi) {  // 1 where lo <= t < hi
    return ops::mul(ops::gt(t, ops::full({}, lo - 0.5, work, device)),
                    ops::gt(ops::full({}, hi - 0.5, work, device), t));
  };
  Tensor counted = ops::affine(ops::eq(t, ops::full({1, 1}, double(ignoreIndex), work, device)), -1, 1);
  Tensor inVocab = inside(0, double(vocab));
  // The targets this rank holds: a 1 in `held`, and the flat index of the target's logit in [N x local]
  // (row n's first logit where the target is elsewhere, gathered times 0). No [N, local] one-hot.
  Tensor held = ops::mul(inside(double(first), double(first + local)), counted);
  Tensor rowStart = ops::arange(0, double(N * local), double(local), work, device).view({N, 1});
  Tensor at =
      ops::to(ops::add(rowStart, ops::mul(ops::affine(t, 1, -double(first)), held)), device, DType::I64)
          .view({N});
  // At least one, as linearCrossEntropy has it: a micro-batch with no counted target has loss 0, not NaN.
  Tensor count = ops::maximum(ops::sum(counted), ops::full({}, 1.0, work, device));
  Tensor lf = ops::to(logits, device, work);
  // The row maxima over the whole vocabulary, then the shifted logits' exponentials summed over it, and the
  // target's shifted logit (zero on the ranks that do not hold it): one all-reduce of [2N].
  Tensor rowMax = ops::amax(lf, {1}, true).contiguous();
  if (tp.active()) tp.allReduceMax(rowMax);
  Tensor shifted = ops::sub(lf, rowMax);
  Tensor e = ops::exp(shifted);
  Tensor targetLogit = ops::mul(ops::embedding(shifted.view({N * local, 1}), at), held);
  Tensor sums = ops::cat({ops::sum(e, {1}), targetLogit.view({N})}, 0);
  if (tp.active()) tp.allReduceSum(sums);
  Tensor sumExp = sums.narrow(0, 0, N).view({N, 1}), picked = sums.narrow(0, N, N).view({N, 1});
  // loss = sum over counted rows with a target in the vocabulary of log(sum exp) - (target logit - max),
  // over the count of counted rows.
  Tensor perRow = ops::mul(ops::sub(ops::log(sumExp), picked), ops::mul(counted, inVocab));
  Tensor loss = ops::div(ops::sum(perRow), count);
  // Backward: d loss / d logit = (softmax - one-hot) x counted / count, times the incoming gradient: the
  // softmax scaled, then the target's column lowered by its scale on the rank holding it (a scatter of N
  // values). It keeps the logits in their own dtype and per-row values, not the [N, local] fp32
  // exponentials: it makes them again, the same numbers.
  auto gradient = [logits, rowMax, sumExp, counted, held, at, count, device, work, N,
                   local](const autograd::Grads& g) {
    if (!g[0].defined()) return autograd::Grads{Tensor()};
    Tensor softmax = ops::div(ops::exp(ops::sub(ops::to(logits, device, work), rowMax)), sumExp);
    Tensor scale = ops::mul(ops::div(counted, count), ops::to(g[0], device, work));  // [N, 1]
    Tensor grad = ops::contiguous(ops::mul(softmax, scale));
    ops::embeddingBackwardInto(ops::contiguous(ops::affine(ops::mul(scale, held), -1, 0)), at,
                               grad.view({N * local, 1}), true);
    return autograd::Grads{logits.dtype() == work ? grad : ops::to(grad, device, logits.dtype())};
  };
  autograd::recordFunction("VocabParallelCrossEntropyBackward", {logits}, {loss}, gradient);
  return loss;
}

std::map<std::string, TensorSlice> tensorParallelSlices(Module& model) {
  std::map<std::string, TensorSlice> out;
  for (auto& [name, module] : model.namedModules()) {
    std::string prefix = name.empty() ? std::string() : name + ".";
    if (auto* linear = dynamic_cast<Linear*>(module); linear && linear->splitsOverTensorParallel()) {
      bool columns = linear->split() == TensorSplit::Columns;
      out[prefix + "weight"] = columns ? TensorSlice{1, linear->splitGroups()} : TensorSlice{0, 1};
      if (linear->bias.defined() && columns) out[prefix + "bias"] = TensorSlice{0, linear->splitGroups()};
    }
    if (auto* embedding = dynamic_cast<Embedding*>(module); embedding && embedding->vocabParallel())
      out[prefix + "weight"] = TensorSlice{0, 1};
    if (auto* sliced = dynamic_cast<TensorParallelSliced*>(module))
      for (auto& [own, how] : sliced->ownSlices()) out[prefix + own] = how;
  }
  return out;
}

Tensor joinSlices(const std::vector<Tensor>& slices, const TensorSlice& how) {
  STRATA_CHECK(!slices.empty(), "joinSlices: no slices");
  const Shape& shape = slices[0].shape();
  STRATA_CHECK(how.dim >= 0 && how.dim < int64_t(shape.size()) && shape[size_t(how.dim)] % how.groups == 0,
               "joinSlices: {} cannot be cut along dimension {} in {} groups", toString(shape), how.dim,
               how.groups);
  // Each slice as [before, groups, part, after]; the whole is the slices side by side within each group.
  int64_t before = 1, after = 1;
  for (int64_t d = 0; d < how.dim; ++d) before *= shape[size_t(d)];
  for (size_t d = size_t(how.dim) + 1; d < shape.size(); ++d) after *= shape[d];
  int64_t part = shape[size_t(how.dim)] / how.groups;
  std::vector<Tensor> views;
  for (const Tensor& s : slices) {
    STRATA_CHECK(s.shape() == shape, "joinSlices: slices of {} and {}", toString(shape), toString(s.shape()));
    views.push_back(detail::viewRaw(s.contiguous(), {before, how.groups, part, after}));
  }
  Shape whole = shape;
  whole[size_t(how.dim)] *= int64_t(slices.size());
  return detail::viewRaw(ops::cat(views, 2), whole);
}

TensorParallelRandom::TensorParallelRandom(const TensorParallel& tp, bool on, Generator& gen) {
  if (!on || !tp.active()) return;
  gen_ = &gen;
  seed_ = gen.seed();
  // A rank's own seed: the shared one mixed with the rank (splitmix64's constant spreads the ranks apart).
  gen.setState({seed_ ^ (0x9E3779B97F4A7C15ull * uint64_t(tp.rank + 1)), gen.state().offset});
}

TensorParallelRandom::~TensorParallelRandom() {
  if (gen_ != nullptr) gen_->setState({seed_, gen_->state().offset});
}

TensorParallel tensorParallelOf(Module& model) {
  for (auto& [name, module] : model.namedModules()) {
    if (auto* linear = dynamic_cast<Linear*>(module); linear && linear->splitsOverTensorParallel())
      return linear->tensorParallel();
    if (auto* embedding = dynamic_cast<Embedding*>(module); embedding && embedding->vocabParallel())
      return embedding->tensorParallel();
  }
  return {};
}

Tensor columnSlice(const Tensor& w, int64_t groups, int size, int rank) {
  Tensor m = w.dim() == 1 ? w.view({1, w.size(0)}) : w;
  int64_t in = m.size(0), out = m.size(1);
  STRATA_CHECK(out % (groups * size) == 0, "columnSlice: {} columns in {} groups over {} ranks", out, groups,
               size);
  Tensor part = ops::contiguous(
      detail::narrowRaw(detail::viewRaw(m, {in, groups, size, out / (groups * size)}), 2, rank, 1));
  return part.view(w.dim() == 1 ? Shape{out / size} : Shape{in, out / size});
}

}  // namespace strata::nn
