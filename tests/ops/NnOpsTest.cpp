#include <cmath>

#include "TestUtil.h"

using namespace strata;

TEST_CASE("softmax and log-softmax rows", "[ops][softmax]") {
  Tensor x = Tensor::fromVector<double>({1, 2, 3, 1000, 1000, 1000}, {2, 3});
  auto s = ops::softmax(x).toVector<double>();
  double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  REQUIRE(s[0] == Approx(std::exp(1.0) / z));
  REQUIRE(s[3] == Approx(1.0 / 3));  // stable for large inputs
  auto ls = ops::logSoftmax(x).toVector<double>();
  REQUIRE(ls[2] == Approx(3.0 - std::log(z)));
  // Over a non-last dim.
  Tensor cols = ops::softmax(x, 0);
  REQUIRE(cols.shape() == Shape{2, 3});
  REQUIRE(cols.toVector<double>()[0] == Approx(0.0).margin(1e-12));
  REQUIRE(cols.toVector<double>()[3] == Approx(1.0));
}

TEST_CASE("layer norm and rms norm normalise rows", "[ops][norm]") {
  Tensor x = test::randomDouble({4, 16}, 3, -2, 2);
  Tensor w = test::randomDouble({16}, 4, 0.5, 1.5), b = test::randomDouble({16}, 5);
  ops::NormResult r = ops::layerNorm(x, Tensor(), Tensor(), 1e-5);
  auto y = r.y.toVector<double>();
  for (int row = 0; row < 4; ++row) {
    double m = 0, v = 0;
    for (int c = 0; c < 16; ++c) m += y[size_t(row * 16 + c)];
    m /= 16;
    for (int c = 0; c < 16; ++c) v += (y[size_t(row * 16 + c)] - m) * (y[size_t(row * 16 + c)] - m);
    REQUIRE(m == Approx(0.0).margin(1e-12));
    REQUIRE(v / 16 == Approx(1.0).epsilon(1e-4));
  }
  Tensor yw = ops::layerNorm(x, w, b, 1e-5).y;
  test::requireClose(yw, ops::add(ops::mul(r.y, w), b), 1e-12, 1e-12);
  ops::NormResult rr = ops::rmsNorm(x, w, 1e-6);
  auto xv = x.toVector<double>();
  double ms = 0;
  for (int c = 0; c < 16; ++c) ms += xv[size_t(c)] * xv[size_t(c)];
  REQUIRE(rr.rstd.toVector<double>()[0] == Approx(1.0 / std::sqrt(ms / 16 + 1e-6)));
  REQUIRE_THROWS_AS(ops::layerNorm(x, ops::ones({8}, DType::F64), Tensor(), 1e-5), Error);
}

TEST_CASE("embedding gathers rows and scatters gradients", "[ops][embedding]") {
  Tensor w = ops::arange(0, 12).view({4, 3});
  Tensor idx = Tensor::fromVector<int64_t>({2, 0, 2}, {3});
  Tensor e = ops::embedding(w, idx);
  REQUIRE(e.shape() == Shape{3, 3});
  REQUIRE(e.toVector<float>() == std::vector<float>{6, 7, 8, 0, 1, 2, 6, 7, 8});
  Tensor gw = ops::embeddingBackward(ops::ones({3, 3}), idx, 4, DType::F32);
  REQUIRE(gw.toVector<float>() == std::vector<float>{1, 1, 1, 0, 0, 0, 2, 2, 2, 0, 0, 0});
  REQUIRE_THROWS_AS(ops::embedding(w, Tensor::fromVector<int64_t>({4}, {1})), Error);
}

TEST_CASE("cross entropy matches log-softmax and skips ignore_index", "[ops][loss]") {
  Tensor logits = test::randomDouble({5, 7}, 6, -3, 3);
  Tensor target = Tensor::fromVector<int64_t>({1, 6, -100, 0, 3}, {5});
  ops::CrossEntropyResult r = ops::crossEntropy(logits, target);
  auto ls = ops::logSoftmax(logits).toVector<double>();
  double expect = -(ls[0 * 7 + 1] + ls[1 * 7 + 6] + ls[3 * 7 + 0] + ls[4 * 7 + 3]) / 4.0;
  REQUIRE(r.loss.item() == Approx(expect).epsilon(1e-12));
  REQUIRE(r.count.item() == 4.0);
  Tensor g = ops::crossEntropyBackward(ops::full({}, 1.0, DType::F64), logits, target, r);
  auto gv = g.toVector<double>();
  for (int c = 0; c < 7; ++c) REQUIRE(gv[size_t(2 * 7 + c)] == 0.0);  // ignored row
  double rowSum = 0;
  for (int c = 0; c < 7; ++c) rowSum += gv[size_t(c)];
  REQUIRE(rowSum == Approx(0.0).margin(1e-12));
  REQUIRE_THROWS_AS(ops::crossEntropy(logits, Tensor::fromVector<int64_t>({1}, {1})), Error);
}

TEST_CASE("cross entropy in place equals the forward and backward pair, bitwise", "[ops][loss]") {
  for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
    INFO(dt);
    DType sd = dt == DType::F64 ? DType::F64 : DType::F32;
    Tensor logits = test::randomDouble({5, 7}, 7, -3, 3).to(dt);
    Tensor target = Tensor::fromVector<int64_t>({1, 6, -100, 0, 3}, {5});
    ops::CrossEntropyResult r = ops::crossEntropy(logits, target);
    Tensor g = ops::crossEntropyBackward(ops::ones({}, sd), logits, target,
                                         {Tensor(), r.lse, ops::ones({}, sd), Tensor()});
    Tensor inPlace = ops::contiguous(logits.to(dt).clone());
    Tensor rowLoss = Tensor::empty({5}, sd), valid = Tensor::empty({5}, sd);
    ops::crossEntropyInPlace(inPlace, target, rowLoss, valid, true);
    REQUIRE(inPlace.toVector<double>() == g.toVector<double>());
    REQUIRE(valid.toVector<double>() == std::vector<double>{1, 1, 0, 1, 1});
    REQUIRE(ops::div(ops::sum(rowLoss), r.count).item() == Approx(r.loss.item()).epsilon(1e-6));
    // Without the gradient the logits stay as they were.
    Tensor kept = logits.clone();
    ops::crossEntropyInPlace(kept, target, rowLoss, valid, false);
    REQUIRE(kept.toVector<double>() == logits.toVector<double>());
  }
  Tensor logits = ops::zeros({2, 3});
  REQUIRE_THROWS_AS(ops::crossEntropyInPlace(logits, Tensor::fromVector<int64_t>({0, 1}, {2}),
                                             ops::zeros({3}), ops::zeros({2}), true),
                    Error);
}

TEST_CASE("cat and split join and cut along a dim", "[ops][cat]") {
  Tensor a = ops::arange(0, 6).view({2, 3}), b = ops::arange(6, 10).view({2, 2});
  Tensor c = ops::cat({a, b}, 1);
  REQUIRE(c.shape() == Shape{2, 5});
  REQUIRE(c.toVector<float>() == std::vector<float>{0, 1, 2, 6, 7, 3, 4, 5, 8, 9});
  auto parts = split(c, {3, 2}, 1);
  REQUIRE(parts[0].toVector<float>() == a.toVector<float>());
  REQUIRE(parts[1].toVector<float>() == b.toVector<float>());
  REQUIRE_THROWS_AS(ops::cat({a, ops::zeros({3, 3})}, 1), Error);
  REQUIRE_THROWS_AS(split(c, {3, 3}, 1), Error);
}

TEST_CASE("attention masks: causal and key padding", "[ops][attention]") {
  Tensor q = test::randomDouble({1, 2, 4, 8}, 20), k = test::randomDouble({1, 2, 4, 8}, 21);
  Tensor v = test::randomDouble({1, 2, 4, 8}, 22);
  AttentionMask causal;
  causal.causal = true;
  Tensor out = scaledDotProductAttention(q, k, v, causal);
  // The first query sees only the first key, so its output is v[..., 0, :].
  auto o = out.toVector<double>(), vv = v.toVector<double>();
  for (int d = 0; d < 8; ++d) REQUIRE(o[size_t(d)] == Approx(vv[size_t(d)]));
  AttentionMask pad;
  pad.keyPadding = Tensor::fromVector<uint8_t>({0, 1, 1, 1}, {1, 4});
  Tensor out2 = scaledDotProductAttention(q, k, v, pad);
  auto o2 = out2.toVector<double>();
  for (int s = 0; s < 4; ++s)
    for (int d = 0; d < 8; ++d) REQUIRE(o2[size_t(s * 8 + d)] == Approx(vv[size_t(d)]));
}

TEST_CASE("scaled causal softmax equals masking then softmax", "[ops][softmax]") {
  Tensor x = test::randomDouble({2, 3, 4, 6}, 80, -3, 3);  // 4 queries at the end of 6 keys
  Tensor y = ops::scaledSoftmax(x, 0.5, true);
  auto yv = y.toVector<double>(), xv = x.toVector<double>();
  for (int r = 0; r < 2 * 3 * 4; ++r) {
    int q = r % 4, visible = q + 2 + 1;
    double mx = -1e300, z = 0;
    for (int c = 0; c < visible; ++c) mx = std::max(mx, 0.5 * xv[size_t(r * 6 + c)]);
    for (int c = 0; c < visible; ++c) z += std::exp(0.5 * xv[size_t(r * 6 + c)] - mx);
    for (int c = 0; c < 6; ++c) {
      double expect = c < visible ? std::exp(0.5 * xv[size_t(r * 6 + c)] - mx) / z : 0.0;
      REQUIRE(yv[size_t(r * 6 + c)] == Approx(expect).margin(1e-12));
    }
  }
  test::gradCheck([](const std::vector<Tensor>& in) { return scaledSoftmax(in[0], 0.5, true); },
                  {test::randomDouble({2, 4, 6}, 81)});
}
