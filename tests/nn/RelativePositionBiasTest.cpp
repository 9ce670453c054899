// T5's relative position buckets against values from HF's _relative_position_bucket (computed with its fp32
// arithmetic), and the bias module's layout.
#include "TestUtil.h"
#include "strata/nn/RelativePositionBias.h"

using namespace strata;

namespace {
const std::vector<int64_t> kRelative{-200, -128, -127, -100, -64, -50, -32, -31, -16, -15, -12, -9,
                                     -8,   -7,   -1,   0,    1,   2,   7,   8,   9,   12,  15,  16,
                                     20,   31,   32,   50,   63,  64,  100, 127, 128, 1000};
}

TEST_CASE("relative position buckets match HF T5 (32 buckets, max distance 128)", "[nn]") {
  // HF T5Attention._relative_position_bucket(torch.tensor(kRelative), bidirectional, 32, 128).
  std::vector<int64_t> bidirectional{15, 15, 15, 15, 14, 13, 12, 11, 10, 9,  9,  8,  8,  7,  1,  0,  17,
                                     18, 23, 24, 24, 25, 25, 26, 26, 27, 28, 29, 29, 30, 31, 31, 31, 31};
  std::vector<int64_t> causal{31, 31, 31, 30, 26, 24, 21, 21, 16, 15, 12, 9, 8, 7, 1, 0, 0,
                              0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < kRelative.size(); ++i) {
    INFO("relative position " << kRelative[i]);
    REQUIRE(nn::relativePositionBucket(kRelative[i], true, 32, 128) == bidirectional[i]);
    REQUIRE(nn::relativePositionBucket(kRelative[i], false, 32, 128) == causal[i]);
  }
}

TEST_CASE("relative position bucket table and bias layout", "[nn]") {
  Tensor buckets = nn::relativePositionBuckets(3, 4, true, 32, 128, Device::cpu());
  REQUIRE(buckets.shape() == Shape({3, 4}));
  // Entry (i, j) is the bucket of j - i.
  std::vector<int64_t> b = buckets.toVector<int64_t>();
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j)
      REQUIRE(b[size_t(i * 4 + j)] == nn::relativePositionBucket(j - i, true, 32, 128));

  Generator gen(5);
  nn::RelativePositionBias bias({2, 32, 128, false, 1.0, Device::cpu()}, gen);
  REQUIRE(bias.weight.shape() == Shape({32, 2}));
  Tensor values = bias.apply(3, 4, DType::F32);
  REQUIRE(values.shape() == Shape({1, 2, 3, 4}));
  std::vector<float> table = bias.weight.toVector<float>(), v = values.contiguous().toVector<float>();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 4; ++j) {
        int64_t bucket = nn::relativePositionBucket(j - i, false, 32, 128);
        REQUIRE(v[size_t((h * 3 + i) * 4 + j)] == table[size_t(bucket * 2 + h)]);
      }
  REQUIRE_FALSE(test::errorOf([&] { bias.apply(3, 4, DType::BF16); }).empty());
}

TEST_CASE("relative position bias by diagonals: every shape's values, and the table's gradient",
          "[nn][attention]") {
  // NOTE [Relative bias by diagonals]: the skewed lookup equals the table at bucket(j - i) for one query,
  // more queries than keys and the other way round; the table's gradient is the sum of the bias's over each
  // bucket.
  Generator gen(6);
  for (bool bidirectional : {true, false}) {
    nn::RelativePositionBias bias({3, 8, 12, bidirectional, 1.0, Device::cpu()}, gen);
    bias.castParameters(DType::F64);
    for (auto [Sq, Sk] : {std::pair<int64_t, int64_t>{1, 5}, {4, 4}, {6, 3}, {3, 9}, {2, 1}}) {
      INFO((bidirectional ? "bidirectional " : "causal ") << Sq << " x " << Sk);
      bias.weight.setGrad(Tensor());
      Tensor values = bias.apply(Sq, Sk, DType::F64);
      REQUIRE(values.shape() == Shape({1, 3, Sq, Sk}));
      REQUIRE(values.strides()[3] == 1);
      Tensor g = test::randomDouble({1, 3, Sq, Sk}, 7);
      backward(sum(mul(values, g)));
      std::vector<double> table = bias.weight.toVector<double>(), v = values.contiguous().toVector<double>();
      std::vector<double> gv = g.toVector<double>(), want(table.size(), 0.0);
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t i = 0; i < Sq; ++i)
          for (int64_t j = 0; j < Sk; ++j) {
            int64_t bucket = nn::relativePositionBucket(j - i, bidirectional, 8, 12);
            REQUIRE(v[size_t((h * Sq + i) * Sk + j)] == table[size_t(bucket * 3 + h)]);
            want[size_t(bucket * 3 + h)] += gv[size_t((h * Sq + i) * Sk + j)];
          }
      test::requireClose(bias.weight.grad(), Tensor::fromVector<double>(want, {8, 3}), 1e-12, 1e-12);
    }
  }
}
