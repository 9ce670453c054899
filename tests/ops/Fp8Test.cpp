// FP8 ops: the cast with its amax, the FP8 GEMM and delayed scaling's update on the CPU against the recipe
// worked by hand; on a GPU, the cast bit for bit against the CPU and the GEMM against fp32.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "TestUtil.h"
#include "strata/core/Fp8.h"

using namespace strata;
using namespace strata::test;

namespace {

// A state as ops::fp8UpdateScales reads it: scales, inverses, three histories of `history` entries.
Tensor stateOf(int64_t history, const std::vector<float>& scales, const std::vector<std::vector<float>>& h,
               Device device = Device::cpu()) {
  std::vector<float> v(kFp8StateHeader, 0.0f);
  for (int role = 0; role < 3; ++role) {
    v[size_t(fp8ScaleSlot(role))] = scales[size_t(role)];
    v[size_t(fp8InverseSlot(role))] = 1 / scales[size_t(role)];
  }
  for (const auto& one : h) v.insert(v.end(), one.begin(), one.end());
  REQUIRE(int64_t(v.size()) == fp8StateElements(history));
  return Tensor::fromVector<float>(v, {int64_t(v.size())}, device);
}

// x [rows, cols] with values over many binades, a few beyond E4M3's range, infinities and a NaN.
Tensor edgy(int64_t rows, int64_t cols, uint64_t seed) {
  Generator g(seed);
  std::vector<float> v = ops::randn({rows * cols}, g).toVector<float>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(v[i], int(i % 23) - 14);
  v[3] = 1e6f;
  v[5] = -std::numeric_limits<float>::infinity();
  v[7] = std::nanf("");
  return Tensor::fromVector<float>(v, {rows, cols});
}

// A float tensor's bits (NaNs compare equal when their bits do).
std::vector<uint32_t> floatBits(const Tensor& t) {
  std::vector<float> v = ops::to(t, Device::cpu(), DType::F32).toVector<float>();
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

}  // namespace

TEST_CASE("fp8Cast writes the scaled codes plain and transposed and maxes the finite amax", "[ops][fp8]") {
  Tensor x = Tensor::fromVector<float>({1.0f, -2.0f, 3.0f, 0.5f, 0.0f, -0.25f}, {2, 3});
  Tensor scale = Tensor::fromVector<float>({2.0f}, {1});
  Tensor amax = Tensor::fromVector<float>({0.5f}, {1});
  ops::Fp8Codes c = ops::fp8Cast(x, Fp8Format::E4M3, scale, amax, true, true);
  // 2x: 2, -4, 6 / 1, 0, -0.5.
  std::vector<uint8_t> plain{0x40, 0xC8, 0x4C, 0x38, 0x00, 0xB0};
  std::vector<uint8_t> transposed{0x40, 0x38, 0xC8, 0x00, 0x4C, 0xB0};
  REQUIRE(c.plain.toVector<uint8_t>() == plain);
  REQUIRE(c.transposed.shape() == Shape({3, 2}));
  REQUIRE(c.transposed.toVector<uint8_t>() == transposed);
  REQUIRE(amax.item() == 3.0);
  // Only the larger amax stays; infinities and NaNs are passed over.
  Tensor y =
      Tensor::fromVector<float>({1.0f, std::numeric_limits<float>::infinity(), std::nanf(""), -2.5f}, {1, 4});
  ops::Fp8Codes d = ops::fp8Cast(y, Fp8Format::E5M2, scale, amax, false, true);
  REQUIRE(!d.plain.defined());
  REQUIRE(amax.item() == 3.0);
  REQUIRE(d.transposed.toVector<uint8_t>() == std::vector<uint8_t>{0x40, 0x7B, 0x7E, 0xC5});
}

TEST_CASE(
    "fp8CastFused casts the GELU or its backward as the ops store them, and sums columns in blocks of 64",
    "[ops][fp8]") {
  // 130 rows: two whole blocks of 64 and a partial one.
  const int64_t rows = 130, cols = 24;
  Generator g(5);
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtypeName(dt));
    Tensor x = ops::to(ops::randn({rows, cols}, g), Device::cpu(), dt);
    Tensor pre = ops::to(ops::randn({rows, cols}, g), Device::cpu(), dt);
    Tensor scale = Tensor::fromVector<float>({5.0f}, {1});
    struct Case {
      ops::Fp8Prologue prologue;
      Tensor aux, composed;
    };
    for (const Case& c : {Case{ops::Fp8Prologue::None, Tensor(), x},
                          Case{ops::Fp8Prologue::GeluTanh, Tensor(), ops::geluTanh(x)},
                          Case{ops::Fp8Prologue::GeluTanhBackward, pre, ops::geluTanhBackward(x, pre)}}) {
      INFO("prologue " << int(c.prologue));
      Tensor amaxF = ops::zeros({1}), amaxC = ops::zeros({1}), sums = ops::zeros({cols});
      ops::Fp8Codes fused =
          ops::fp8CastFused(x, c.prologue, c.aux, Fp8Format::E5M2, scale, amaxF, true, true, sums);
      ops::Fp8Codes composed = ops::fp8Cast(c.composed, Fp8Format::E5M2, scale, amaxC, true, true);
      REQUIRE(fused.plain.toVector<uint8_t>() == composed.plain.toVector<uint8_t>());
      REQUIRE(fused.transposed.toVector<uint8_t>() == composed.transposed.toVector<uint8_t>());
      REQUIRE(amaxF.item() == amaxC.item());
      // The sums' order written out: each block of 64 rows row by row, then the blocks in order.
      std::vector<float> v = ops::to(c.composed, Device::cpu(), DType::F32).toVector<float>();
      std::vector<float> want(size_t(cols), 0.0f);
      for (int64_t c0 = 0; c0 < cols; ++c0)
        for (int64_t b = 0; b < rows; b += 64) {
          float block = 0.0f;
          for (int64_t r = b; r < std::min(rows, b + 64); ++r) block += v[size_t(r * cols + c0)];
          want[size_t(c0)] += block;
        }
      REQUIRE(sums.toVector<float>() == want);
    }
  }
}

TEST_CASE("the FP8 GEMM multiplies the decoded codes and applies both scales and the bias", "[ops][fp8]") {
  const int64_t m = 32, n = 48, k = 64;
  Generator g(11);
  Tensor a = ops::randn({m, k}, g), b = ops::randn({n, k}, g), bias = ops::randn({n}, g);
  Tensor one = Tensor::fromVector<float>({1.0f}, {1}), amax = ops::zeros({1});
  ops::Fp8Codes qa = ops::fp8Cast(a, Fp8Format::E4M3, one, amax, true, false);
  ops::Fp8Codes qb = ops::fp8Cast(b, Fp8Format::E5M2, one, amax, true, false);
  Tensor sa = Tensor::fromVector<float>({0.5f}, {1}), sb = Tensor::fromVector<float>({4.0f}, {1});
  Tensor out = Tensor::empty({m, n}, DType::F32, Device::cpu());
  ops::fp8MatmulInto(out, qa.plain, Fp8Format::E4M3, sa, qb.plain, Fp8Format::E5M2, sb, bias, false);
  std::vector<uint8_t> ca = qa.plain.toVector<uint8_t>(), cb = qb.plain.toVector<uint8_t>();
  std::vector<float> bv = bias.toVector<float>(), got = out.toVector<float>();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0;
      for (int64_t t = 0; t < k; ++t)
        ref += double(e4m3ToFloat(ca[size_t(i * k + t)])) * double(e5m2ToFloat(cb[size_t(j * k + t)]));
      ref = 2.0 * ref + bv[size_t(j)];
      REQUIRE(std::abs(got[size_t(i * n + j)] - ref) <= 1e-4 * (1 + std::abs(ref)));
    }
  // Accumulating adds the product to what is there.
  Tensor before = out.clone();
  ops::fp8MatmulInto(out, qa.plain, Fp8Format::E4M3, sa, qb.plain, Fp8Format::E5M2, sb, Tensor(), true);
  Tensor product = Tensor::empty({m, n}, DType::F32, Device::cpu());
  ops::fp8MatmulInto(product, qa.plain, Fp8Format::E4M3, sa, qb.plain, Fp8Format::E5M2, sb, Tensor(), false);
  requireClose(out, ops::add(before, product), 1e-5, 1e-5);
  // E5M2 on both sides has no tensor-core kernel.
  REQUIRE_THROWS(ops::fp8MatmulInto(product, qb.plain.narrow(0, 0, m).contiguous(), Fp8Format::E5M2, sa,
                                    qb.plain, Fp8Format::E5M2, sb, Tensor(), false));
}

TEST_CASE("fp8UpdateScales computes the recipe's scales from the amax histories", "[ops][fp8]") {
  const int64_t H = 4;
  // Position 1. x: the history's max is 4 -> 448 / 4 = 112. W: no amax yet -> the scale stays 3. g (E5M2):
  // max 0.5 -> 57344 / 0.5 = 114688. Entry 2 of each history is zeroed for the next step.
  Tensor s = stateOf(H, {1, 3, 1}, {{1, 4, 2, 0}, {0, 0, 9, 0}, {0.25f, 0.5f, 0, 0.125f}});
  // W's history has 9 in entry 2 left over from a whole history ago; it does count this step.
  ops::fp8UpdateScales({s}, H, 1, 0, false);
  std::vector<float> v = s.toVector<float>();
  REQUIRE(v[fp8ScaleSlot(0)] == 112.0f);
  REQUIRE(v[fp8ScaleSlot(1)] == 448.0f / 9.0f);
  REQUIRE(v[fp8ScaleSlot(2)] == 114688.0f);
  REQUIRE(v[fp8InverseSlot(0)] == 1.0f / 112.0f);
  REQUIRE(v[fp8InverseSlot(1)] == 1.0f / (448.0f / 9.0f));
  REQUIRE(v[fp8InverseSlot(2)] == 1.0f / 114688.0f);
  REQUIRE(v[kFp8StateHeader + 2] == 0.0f);
  REQUIRE(v[kFp8StateHeader + H + 2] == 0.0f);
  REQUIRE(v[kFp8StateHeader + 2 * H + 2] == 0.0f);
  REQUIRE(v[kFp8StateHeader + 1] == 4.0f);  // the rest of the history stays
  // A margin of 2 divides by 4; most_recent takes the entry at the position only.
  Tensor t = stateOf(H, {1, 5, 1}, {{1, 4, 2, 8}, {0, 0, 0, 0}, {0, 2, 0, 0}});
  ops::fp8UpdateScales({t}, H, 3, 2, true);
  std::vector<float> w = t.toVector<float>();
  REQUIRE(w[fp8ScaleSlot(0)] == 448.0f / 8.0f / 4.0f);
  REQUIRE(w[fp8ScaleSlot(1)] == 5.0f);
  REQUIRE(w[fp8ScaleSlot(2)] == 1.0f);      // g's newest entry is 0: the scale stays
  REQUIRE(w[kFp8StateHeader + 0] == 0.0f);  // (3 + 1) mod 4
  REQUIRE(w[kFp8StateHeader + 3] == 8.0f);
}

TEST_CASE("fp8Shape takes multiples of 16 only", "[ops][fp8]") {
  REQUIRE(ops::fp8Shape(48, 96, 80));
  REQUIRE(!ops::fp8Shape(48, 100, 80));
  REQUIRE(!ops::fp8Shape(40, 96, 80));
  REQUIRE(!ops::fp8Shape(48, 96, 72));
  REQUIRE(!ops::fp8Shape(0, 96, 80));
}

TEST_CASE("[cuda] the GPU's FP8 cast equals the CPU's bit for bit, amax included", "[cuda][ops][fp8]") {
  STRATA_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  // Odd shapes take the element-wise kernel; multiples of 8 the wide one, with partial 64 x 64 tiles
  // (136 x 200) and more tiles than its grid has blocks (2112 x 2112).
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{37, 53}, {256, 96}, {1, 700}, {2049, 48}, {136, 200}, {2112, 2112}})
    for (DType dt : {DType::F32, DType::BF16})
      for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
        for (auto [plain, transposed] : {std::pair<bool, bool>{true, true}, {true, false}, {false, true}}) {
          INFO(rows << " x " << cols << " " << dtypeName(dt) << " format " << int(f) << " plain " << plain
                    << " transposed " << transposed);
          Tensor x = ops::to(edgy(rows, cols, uint64_t(rows * cols)), Device::cpu(), dt);
          Tensor scale = Tensor::fromVector<float>({3.5f}, {1});
          Tensor cpuAmax = ops::zeros({1}), gpuAmax = ops::zeros({1}, DType::F32, gpu);
          ops::Fp8Codes c = ops::fp8Cast(x, f, scale, cpuAmax, plain, transposed);
          ops::Fp8Codes d = ops::fp8Cast(x.to(gpu), f, scale.to(gpu), gpuAmax, plain, transposed);
          REQUIRE(c.plain.defined() == plain);
          REQUIRE(d.plain.defined() == plain);
          REQUIRE(d.transposed.defined() == transposed);
          if (plain) REQUIRE(c.plain.toVector<uint8_t>() == d.plain.toVector<uint8_t>());
          if (transposed) REQUIRE(c.transposed.toVector<uint8_t>() == d.transposed.toVector<uint8_t>());
          REQUIRE(cpuAmax.item() == gpuAmax.item());
        }
}

TEST_CASE("[cuda] the GPU's fused FP8 casts equal its composed ones, and its column sums the CPU's",
          "[cuda][ops][fp8]") {
  STRATA_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  // Partial blocks of 64 rows and columns (136 x 200), more tiles than blocks (2112 x 2112), and an odd
  // shape the front end composes (37 x 53).
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{136, 200}, {2112, 2112}, {37, 53}})
    for (DType dt : {DType::F32, DType::BF16}) {
      INFO(rows << " x " << cols << " " << dtypeName(dt));
      Tensor x = ops::to(edgy(rows, cols, uint64_t(rows + cols)), Device::cpu(), dt);
      Tensor pre = ops::to(edgy(rows, cols, uint64_t(rows * 3 + cols)), Device::cpu(), dt);
      Tensor xd = x.to(gpu), pd = pre.to(gpu);
      Tensor scale = Tensor::fromVector<float>({0.75f}, {1}, gpu);
      // The GPU's own composed ops: the same codes, amax and sums as the fused kernel.
      for (auto prologue : {ops::Fp8Prologue::GeluTanh, ops::Fp8Prologue::GeluTanhBackward}) {
        INFO("prologue " << int(prologue));
        bool backward = prologue == ops::Fp8Prologue::GeluTanhBackward;
        Tensor composedIn = backward ? ops::geluTanhBackward(xd, pd) : ops::geluTanh(xd);
        Tensor amaxF = ops::zeros({1}, DType::F32, gpu), amaxC = ops::zeros({1}, DType::F32, gpu);
        Tensor sumsF = ops::zeros({cols}, DType::F32, gpu), sumsC = ops::zeros({cols}, DType::F32, gpu);
        ops::Fp8Codes f = ops::fp8CastFused(xd, prologue, backward ? pd : Tensor(), Fp8Format::E5M2, scale,
                                            amaxF, true, true, sumsF);
        ops::Fp8Codes c = ops::fp8CastFused(composedIn, ops::Fp8Prologue::None, Tensor(), Fp8Format::E5M2,
                                            scale, amaxC, true, true, sumsC);
        REQUIRE(f.plain.toVector<uint8_t>() == c.plain.toVector<uint8_t>());
        REQUIRE(f.transposed.toVector<uint8_t>() == c.transposed.toVector<uint8_t>());
        REQUIRE(amaxF.item() == amaxC.item());
        // Bit for bit: edgy()'s infinity and NaN make some columns' sums NaN, the same NaN on both paths.
        REQUIRE(floatBits(sumsF) == floatBits(sumsC));
      }
      // Without a prologue the values are the input's on both devices, so the sums are the CPU's bits where
      // the kernel fuses them.
      if (rows % 8 == 0 && cols % 8 == 0) {
        Tensor sumsG = ops::zeros({cols}, DType::F32, gpu), sumsCpu = ops::zeros({cols});
        Tensor amaxG = ops::zeros({1}, DType::F32, gpu), amaxCpu = ops::zeros({1});
        // edgy() holds an infinity and a NaN; the sums of those columns are not comparable bits.
        std::vector<float> v = edgy(rows, cols, 99).toVector<float>();
        for (float& e : v)
          if (!std::isfinite(e)) e = 1.0f;
        Tensor clean = ops::to(Tensor::fromVector<float>(v, {rows, cols}), Device::cpu(), dt);
        ops::fp8CastFused(clean.to(gpu), ops::Fp8Prologue::None, Tensor(), Fp8Format::E5M2, scale, amaxG,
                          false, false, sumsG);
        ops::fp8CastFused(clean, ops::Fp8Prologue::None, Tensor(), Fp8Format::E5M2,
                          Tensor::fromVector<float>({0.75f}, {1}), amaxCpu, false, false, sumsCpu);
        REQUIRE(ops::to(sumsG, Device::cpu(), DType::F32).toVector<float>() == sumsCpu.toVector<float>());
        REQUIRE(amaxG.item() == amaxCpu.item());
      }
    }
}

TEST_CASE("[cuda] the GPU's FP8 scale update equals the CPU's bit for bit", "[cuda][ops][fp8]") {
  STRATA_REQUIRE_CUDA();
  const int64_t H = 1000;
  Generator g(5);
  std::vector<std::vector<float>> h(3);
  for (auto& one : h) one = ops::rand({H}, g, DType::F32, Device::cpu(), 0, 30).toVector<float>();
  Tensor c0 = stateOf(H, {1, 2, 3}, h), c1 = stateOf(H, {4, 5, 6}, {h[2], h[0], h[1]});
  Tensor d0 = c0.to(Device::cuda(0)), d1 = c1.to(Device::cuda(0));
  ops::fp8UpdateScales({c0, c1}, H, 17, 1, false);
  ops::fp8UpdateScales({d0, d1}, H, 17, 1, false);
  REQUIRE(c0.toVector<float>() == d0.toVector<float>());
  REQUIRE(c1.toVector<float>() == d1.toVector<float>());
}

TEST_CASE("[cuda] the FP8 GEMM matches fp32 within FP8's error at odd and large shapes", "[cuda][ops][fp8]") {
  STRATA_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  struct Case {
    int64_t m, n, k;
    Fp8Format fa, fb;
    DType out;
    bool bias;
  };
  for (const Case& c : {Case{48, 80, 96, Fp8Format::E4M3, Fp8Format::E4M3, DType::BF16, true},
                        Case{48, 80, 96, Fp8Format::E5M2, Fp8Format::E4M3, DType::BF16, false},
                        Case{96, 48, 80, Fp8Format::E4M3, Fp8Format::E5M2, DType::F32, false},
                        Case{2048, 3072, 1024, Fp8Format::E4M3, Fp8Format::E4M3, DType::BF16, true}}) {
    INFO(c.m << " x " << c.n << " x " << c.k);
    Generator g(uint64_t(c.m + c.n + c.k));
    Tensor a = ops::randn({c.m, c.k}, g), b = ops::randn({c.n, c.k}, g), bias = ops::randn({c.n}, g);
    // Scales that use the formats' range: amax ~ 4.5 sigma.
    auto scaleFor = [](Fp8Format f) { return fp8Max(f) / 5.0f; };
    float sa = scaleFor(c.fa), sb = scaleFor(c.fb);
    Tensor scaleA = Tensor::fromVector<float>({sa}, {1}), scaleB = Tensor::fromVector<float>({sb}, {1});
    Tensor invA = Tensor::fromVector<float>({1 / sa}, {1}), invB = Tensor::fromVector<float>({1 / sb}, {1});
    Tensor amax = ops::zeros({1});
    ops::Fp8Codes qa = ops::fp8Cast(a, c.fa, scaleA, amax, true, false);
    ops::Fp8Codes qb = ops::fp8Cast(b, c.fb, scaleB, amax, true, false);
    Tensor biasOut = ops::to(bias, Device::cpu(), c.out);
    Tensor cpu = Tensor::empty({c.m, c.n}, DType::F32, Device::cpu());
    ops::fp8MatmulInto(cpu, qa.plain, c.fa, invA, qb.plain, c.fb, invB, c.bias ? bias : Tensor(), false);
    Tensor dev = Tensor::empty({c.m, c.n}, c.out, gpu);
    ops::fp8MatmulInto(dev, qa.plain.to(gpu), c.fa, invA.to(gpu), qb.plain.to(gpu), c.fb, invB.to(gpu),
                       c.bias ? biasOut.to(gpu) : Tensor(), false);
    Tensor got = ops::to(dev, Device::cpu(), DType::F32);
    // Against the CPU emulation (the same products; the order of the sums and the output's rounding differ,
    // and Hopper's FP8 tensor cores add with about 14 bits of mantissa between their promotions to fp32).
    // The sums' error grows with k: at k = 1024 a bf16 output was 1.6x the k < 100 tolerance (H200).
    double kScale = std::sqrt(double(c.k) / 96.0);
    requireClose(got, cpu, (c.out == DType::BF16 ? 5e-2 : 2e-2) * kScale, c.out == DType::BF16 ? 1e-2 : 2e-3);
    // Against the unquantised fp32 product: FP8's rounding (relative 2^-4 for E4M3, 2^-3 for E5M2 at most,
    // per operand) leaves an RMS error of a few percent; a wrong scale, layout or format is off by 100%.
    Tensor exact = ops::matmul(a, ops::contiguous(b.transpose(0, 1)));
    if (c.bias) exact = ops::add(exact, bias);
    std::vector<float> x = got.toVector<float>(), y = exact.toVector<float>();
    double err = 0, norm = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
      norm += double(y[i]) * y[i];
    }
    double relative = std::sqrt(err / norm);
    INFO("relative RMS error " << relative);
    REQUIRE(relative < (c.fa == Fp8Format::E5M2 || c.fb == Fp8Format::E5M2 ? 0.12 : 0.08));
    // Fast accumulation (STRATA_FP8_FAST_ACCUM's forward) sums less exactly, still far within FP8's error.
    Tensor fast = Tensor::empty({c.m, c.n}, c.out, gpu);
    ops::fp8MatmulInto(fast, qa.plain.to(gpu), c.fa, invA.to(gpu), qb.plain.to(gpu), c.fb, invB.to(gpu),
                       c.bias ? biasOut.to(gpu) : Tensor(), false, true);
    requireClose(ops::to(fast, Device::cpu(), DType::F32), cpu, 5e-2 * kScale, 2e-2);
  }
}

TEST_CASE("[cuda] an FP8 GEMM writes into an fp32 gradient and adds to it", "[cuda][ops][fp8]") {
  STRATA_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  Generator g(2);
  Tensor a = ops::randn({64, 32}, g), b = ops::randn({48, 32}, g);
  Tensor one = Tensor::fromVector<float>({1.0f}, {1}, gpu), amax = ops::zeros({1}, DType::F32, gpu);
  ops::Fp8Codes qa = ops::fp8Cast(a.to(gpu), Fp8Format::E4M3, one, amax, true, false);
  ops::Fp8Codes qb = ops::fp8Cast(b.to(gpu), Fp8Format::E5M2, one, amax, true, false);
  Tensor out = ops::zeros({64, 48}, DType::F32, gpu);
  ops::fp8MatmulInto(out, qa.plain, Fp8Format::E4M3, one, qb.plain, Fp8Format::E5M2, one, Tensor(), false);
  Tensor first = out.to(Device::cpu());
  ops::fp8MatmulInto(out, qa.plain, Fp8Format::E4M3, one, qb.plain, Fp8Format::E5M2, one, Tensor(), true);
  requireClose(out.to(Device::cpu()), ops::add(first, first), 1e-4, 1e-5);
}
