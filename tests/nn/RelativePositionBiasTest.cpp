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
