#include "strata/zero/PowerSgd.h"

#include <algorithm>

#include "strata/core/Error.h"
#include "strata/core/Generator.h"
#include "strata/core/Stream.h"
#include "strata/distributed/Communicator.h"
#include "strata/ops/Ops.h"

namespace strata::zero {

namespace {

// The rows of pt (r x n) made orthonormal in order: the columns of P^. Block Gram-Schmidt, twice ("twice is
// enough", Giraud et al.): each row loses its projection on all the rows before it in two GEMMs, and again to
// remove what rounding left, so a row costs a few kernels instead of one per earlier row (r = 32 on a GPU:
// 32 x 8 launches a matrix instead of 32 x 31 / 2 x 5). A row that is zero (or lies in the span of the rows
// before it) stays zero, not NaN.
void orthonormalizeRows(const Tensor& pt) {
  const int64_t n = pt.size(1);
  for (int64_t i = 0; i < pt.size(0); ++i) {
    Tensor row = pt.select(0, i);
    if (i > 0) {
      Tensor before = pt.narrow(0, 0, i);
      for (int pass = 0; pass < 2; ++pass) {
        Tensor coefficients = ops::matmul(row.view({1, n}), before.transpose(0, 1));  // [1, i]
        ops::copy(row, ops::sub(row, ops::matmul(coefficients, before).view({n})));
      }
    }
    Tensor norm2 = ops::sum(ops::mul(row, row));
    ops::copy(row, ops::mul(row, ops::rsqrt(ops::affine(norm2, 1.0, 1e-30))));
  }
}

}  // namespace

PowerSgd::PowerSgd(int64_t rank, uint64_t seed) : rank_(rank), seed_(seed) {
  STRATA_CHECK(rank >= 1, "PowerSgd: rank {} (at least 1)", rank);
}

bool PowerSgd::compresses(const Shape& shape, int64_t rank) {
  if (shape.size() != 2 || rank < 1) return false;
  int64_t n = shape[0], m = shape[1];
  return rank < std::min(n, m) && rank * (n + m) < n * m;
}

int64_t PowerSgd::sentElements(const std::vector<Shape>& shapes, int64_t rank) {
  int64_t total = 0;
  for (const Shape& s : shapes) total += compresses(s, rank) ? rank * (s[0] + s[1]) : numelOf(s);
  return total;
}

int64_t PowerSgd::stateBytes(const std::vector<Shape>& shapes, int64_t rank) {
  int64_t total = 0;
  for (const Shape& s : shapes)
    if (compresses(s, rank)) total += 4 * (s[0] * s[1] + rank * s[1]);
  return total;
}

int64_t PowerSgd::stateElements(const std::vector<Shape>& shapes, int64_t rank) {
  return stateBytes(shapes, rank) / 4;
}

Tensor PowerSgd::saveState(size_t key) const {
  const ListState& st = lists_.at(key);
  int64_t total = 0;
  for (const Tensor& t : st.qt) total += t.numel();
  for (const Tensor& t : st.error) total += t.numel();
  Tensor flat = Tensor::empty({total}, DType::F32, st.qt.empty() ? Device::cpu() : st.qt[0].device());
  int64_t at = 0;
  for (const auto* part : {&st.qt, &st.error})
    for (const Tensor& t : *part) {
      ops::copy(flat.narrow(0, at, t.numel()).view(t.shape()), t);
      at += t.numel();
    }
  return flat;
}

void PowerSgd::loadState(size_t key, const std::vector<Shape>& shapes, const Tensor& flat, Device device) {
  STRATA_CHECK(flat.numel() == stateElements(shapes, rank_),
               "PowerSgd: {} state elements for list {}, not {}", flat.numel(), key,
               stateElements(shapes, rank_));
  ListState st;
  int64_t at = 0;
  auto take = [&](const Shape& shape) {
    Tensor t = Tensor::empty(shape, DType::F32, device);
    ops::copy(t, flat.narrow(0, at, numelOf(shape)).view(shape).to(device));
    at += numelOf(shape);
    return t;
  };
  for (const Shape& s : shapes)
    if (compresses(s, rank_)) st.qt.push_back(take({rank_, s[1]}));
  for (const Shape& s : shapes)
    if (compresses(s, rank_)) st.error.push_back(take(s));
  lists_[key] = std::move(st);
}

void PowerSgd::reduce(size_t key, const std::vector<Tensor>& grads, dist::Communicator& comm, Device device) {
  std::vector<size_t> low, exact;
  for (size_t i = 0; i < grads.size(); ++i) (compresses(grads[i].shape(), rank_) ? low : exact).push_back(i);
  ListState& st = lists_[key];
  if (st.qt.empty()) {
    for (size_t k = 0; k < low.size(); ++k) {
      const Tensor& g = grads[low[k]];
      // One generator per gradient: the same Q on every rank, whichever order the lists first arrive in.
      Generator gen(seed_ + 0x9E3779B97F4A7C15ULL * (uint64_t(key) + 1) + uint64_t(k));
      st.qt.push_back(ops::randn({rank_, g.size(1)}, gen, DType::F32, device));
      st.error.push_back(ops::zeros(g.shape(), DType::F32, device));
    }
  }
  STRATA_CHECK(st.qt.size() == low.size(), "PowerSgd: list {} changed from {} to {} compressed gradients",
               key, st.qt.size(), low.size());
  // NOTE [Collective ordering and completion] in distributed/Communicator.h: the comm stream waits for what
  // the compute stream wrote, and the compute stream for the sum.
  const Stream& commStream = deviceStreams(device).comm;
  auto sum = [&](const Tensor& t) {
    streamWaits(commStream, currentStream(device), device);
    comm.allReduce(t);
    streamWaits(currentStream(device), commStream, device);
  };

  if (!exact.empty()) {
    int64_t total = 0;
    for (size_t i : exact) total += grads[i].numel();
    Tensor packed = Tensor::empty({total}, DType::F32, device);
    int64_t at = 0;
    for (size_t i : exact) {
      ops::copy(packed.narrow(0, at, grads[i].numel()).view(grads[i].shape()), grads[i]);
      at += grads[i].numel();
    }
    sum(packed);
    at = 0;
    for (size_t i : exact) {
      ops::copy(grads[i], packed.narrow(0, at, grads[i].numel()).view(grads[i].shape()));
      at += grads[i].numel();
    }
  }
  if (low.empty()) return;

  int64_t pTotal = 0, qTotal = 0;
  for (size_t i : low) {
    pTotal += rank_ * grads[i].size(0);
    qTotal += rank_ * grads[i].size(1);
  }
  Tensor pPacked = Tensor::empty({pTotal}, DType::F32, device);
  Tensor qPacked = Tensor::empty({qTotal}, DType::F32, device);
  std::vector<Tensor> local(low.size()), pt(low.size()), qt(low.size());
  int64_t pAt = 0, qAt = 0;
  for (size_t k = 0; k < low.size(); ++k) {
    const Tensor& g = grads[low[k]];
    int64_t n = g.size(0), m = g.size(1);
    local[k] = ops::add(g.dtype() == DType::F32 ? g : ops::to(g, device, DType::F32), st.error[k]);
    // P^T = Q^T M'^T, packed as r rows of n: contiguous rows for the Gram-Schmidt.
    pt[k] = pPacked.narrow(0, pAt, rank_ * n).view({rank_, n});
    ops::matmulInto(pt[k], st.qt[k], local[k].transpose(0, 1));
    qt[k] = qPacked.narrow(0, qAt, rank_ * m).view({rank_, m});
    pAt += rank_ * n;
    qAt += rank_ * m;
  }
  sum(pPacked);
  for (size_t k = 0; k < low.size(); ++k) {
    orthonormalizeRows(pt[k]);
    // Q^T = P^^T M' (this rank's), and the error feedback: what P^ (this rank's Q)^T missed of M'.
    ops::matmulInto(qt[k], pt[k], local[k]);
    ops::copy(st.error[k], ops::sub(local[k], ops::matmul(pt[k].transpose(0, 1), qt[k])));
  }
  sum(qPacked);
  for (size_t k = 0; k < low.size(); ++k) {
    ops::copy(grads[low[k]], ops::matmul(pt[k].transpose(0, 1), qt[k]));
    ops::copy(st.qt[k], qt[k]);  // the next step's warm start
  }
}

}  // namespace strata::zero
