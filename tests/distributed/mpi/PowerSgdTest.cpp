// The PowerSGD compressor (zero::PowerSgd) on N CPU ranks: where every rank's gradient lies in one rank-r
// column space, the factors lose nothing and the result is the sum of the ranks' gradients; the gradients it
// does not compress are summed exactly.
#include <cmath>
#include <vector>

#include "CatchShim.h"
#include "strata/distributed/ParallelContext.h"
#include "strata/ops/Ops.h"
#include "strata/zero/PowerSgd.h"

using namespace strata;

namespace {

// Rank `rank`'s gradient of step `step`: A (n x r, the same on every rank) times B (r x m, the rank's own).
std::vector<float> lowRankGradient(int rank, int step, int64_t n, int64_t m, int64_t r) {
  std::vector<float> g(size_t(n * m), 0.0f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t k = 0; k < r; ++k)
        g[size_t(i * m + j)] += float(std::sin(0.7 * double(i) + 1.9 * double(k) + 0.3 * step) *
                                      std::cos(0.4 * double(j) * double(k + 1) + 1.1 * rank + 0.5 * step));
  return g;
}

// Pseudo-random values in [-1, 1) (a matrix of them is full rank), different on every rank.
std::vector<float> anyGradient(int rank, int step, int64_t count) {
  std::vector<float> g(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    double x = std::sin(12.9898 * double(i) + 78.233 * rank + 37.719 * step) * 43758.5453;
    g[size_t(i)] = float(2.0 * (x - std::floor(x)) - 1.0);
  }
  return g;
}

}  // namespace

TEST_CASE("PowerSGD sums gradients of rank r exactly, and the rest exactly", "[dist][powersgd]") {
  dist::ParallelContext ctx(dist::ParallelOptions{.timeoutSeconds = 20});
  dist::Communicator& comm = ctx.world().communicator();
  int ranks = ctx.worldSize();
  const int64_t r = 2;
  // A compressed matrix; a 1-D gradient and a matrix too small to save bytes, summed exactly.
  const int64_t n = 24, m = 18, smallN = 3, smallM = 3, biasN = 7;
  CHECK(zero::PowerSgd::compresses({n, m}, r));
  CHECK_FALSE(zero::PowerSgd::compresses({smallN, smallM}, r));
  CHECK_FALSE(zero::PowerSgd::compresses({biasN}, r));
  CHECK_FALSE(zero::PowerSgd::compresses({n, m}, 18));
  CHECK(zero::PowerSgd::sentElements({{n, m}, {biasN}}, r) == r * (n + m) + biasN);

  zero::PowerSgd powerSgd(r, 1234);
  // Three steps: the second and third warm-start from the Q before, with the error feedback the first left.
  for (int step = 0; step < 3; ++step) {
    Tensor big = Tensor::fromVector<float>(lowRankGradient(ctx.rank(), step, n, m, r), {n, m});
    Tensor bias = Tensor::fromVector<float>(anyGradient(ctx.rank(), step, biasN), {biasN});
    Tensor small =
        Tensor::fromVector<float>(anyGradient(ctx.rank(), step + 7, smallN * smallM), {smallN, smallM});
    // A view into a bigger buffer, as gradients are views into their chunk's buffer.
    Tensor buffer = ops::zeros({n * m + 5}, DType::F32);
    Tensor view = buffer.narrow(0, 5, n * m).view({n, m});
    ops::copy(view, big);
    powerSgd.reduce(0, {bias, view, small}, comm, Device::cpu());

    std::vector<float> wantBig(size_t(n * m), 0.0f), wantBias(size_t(biasN), 0.0f),
        wantSmall(size_t(smallN * smallM), 0.0f);
    for (int k = 0; k < ranks; ++k) {
      auto a = lowRankGradient(k, step, n, m, r);
      auto b = anyGradient(k, step, biasN);
      auto s = anyGradient(k, step + 7, smallN * smallM);
      for (size_t i = 0; i < a.size(); ++i) wantBig[i] += a[i];
      for (size_t i = 0; i < b.size(); ++i) wantBias[i] += b[i];
      for (size_t i = 0; i < s.size(); ++i) wantSmall[i] += s[i];
    }
    auto worst = [](const std::vector<float>& got, const std::vector<float>& want) {
      double w = 0;
      for (size_t i = 0; i < want.size(); ++i)
        w = std::max(w,
                     std::abs(double(got[i]) - double(want[i])) / std::max(1.0, std::abs(double(want[i]))));
      return w;
    };
    std::vector<float> gotBig = view.contiguous().toVector<float>();
    INFO("step " << step << " rank " << ctx.rank());
    CHECK(worst(gotBig, wantBig) <= 1e-5);
    CHECK(worst(bias.toVector<float>(), wantBias) == 0.0);
    CHECK(worst(small.toVector<float>(), wantSmall) == 0.0);
    // The bytes around the view are untouched.
    CHECK(buffer.narrow(0, 0, 5).toVector<float>() == std::vector<float>(5, 0.0f));
  }

  // A full-rank gradient is approximated, not summed: the factors are rank r, and what they missed stays in
  // the ranks' error feedback. A zero gradient next step sends part of it (its sum, projected on the new
  // P^): the two steps' sums together come closer to the first gradients' sum than the first step's alone.
  // Without error feedback the second step would send nothing and come no closer.
  zero::PowerSgd lossy(r, 99);
  std::vector<float> want(size_t(n * m), 0.0f);
  for (int k = 0; k < ranks; ++k) {
    auto a = anyGradient(k, 0, n * m);
    for (size_t i = 0; i < a.size(); ++i) want[i] += a[i];
  }
  Tensor first = Tensor::fromVector<float>(anyGradient(ctx.rank(), 0, n * m), {n, m});
  lossy.reduce(0, {first}, comm, Device::cpu());
  auto distance = [](const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d += std::pow(double(a[i]) - double(b[i]), 2);
    return std::sqrt(d);
  };
  std::vector<float> got1 = first.toVector<float>();
  double missed1 = distance(got1, want);
  CHECK(missed1 > 1e-2);
  Tensor second = ops::zeros({n, m}, DType::F32);
  lossy.reduce(0, {second}, comm, Device::cpu());
  std::vector<float> got2 = second.toVector<float>(), both(got1.size());
  for (size_t i = 0; i < both.size(); ++i) both[i] = got1[i] + got2[i];
  double missed2 = distance(both, want);
  INFO("missed after one step " << missed1 << ", after two " << missed2);
  CHECK(missed2 < 0.999 * missed1);
}
