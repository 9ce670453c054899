// The CPU AdamW kernel's AVX-512, AVX2 and scalar paths agree bit for bit (NOTE [CPU AdamW paths]).
#include <omp.h>

#include <cstring>
#include <optional>

#include "TestUtil.h"
#include "src/ops/cpu/CpuAdamW.h"

using namespace strata;
using ops::cpu::CpuIsa;

namespace {

// The raw bytes of a contiguous CPU tensor: NaNs compare by their bits too.
std::vector<uint8_t> bytesOf(const Tensor& t) {
  std::vector<uint8_t> out(t.nbytes());
  std::memcpy(out.data(), t.data(), out.size());
  return out;
}

// The first index where two byte strings differ, or -1 (a REQUIRE on the vectors would print them whole).
int64_t firstDifference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return int64_t(i);
  return -1;
}

// The paths this CPU runs besides scalar; WARNs for the ones it cannot.
std::vector<CpuIsa> vectorPaths() {
  std::vector<CpuIsa> paths;
  for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (ops::cpu::cpuIsaSupported(isa))
      paths.push_back(isa);
    else
      WARN("this CPU lacks the " << ops::cpu::cpuIsaName(isa) << " path: skipped");
  }
  return paths;
}

// Sets of odd sizes (vector tails), some starting mid-buffer (unaligned loads, and copies that need the
// vector paths' alignment peel), over the kernel's parallel threshold in total so that the thread ranges
// cut through sets.
// m and v in `momentDType` (fp32, or bf16: optimizer.moments_dtype).
std::vector<ops::AdamWTensors> makeSets(uint64_t seed, std::optional<DType> copyDType, float weightDecay,
                                        DType momentDType = DType::F32) {
  Generator gen(seed);
  std::vector<ops::AdamWTensors> sets;
  int index = 0;
  for (int64_t n : {1, 7, 15, 17, 33, 1000, 4099, 70001}) {
    int64_t skip = index++ % 3;  // 0, 1 or 2 elements in
    auto make = [&](double lo, double hi, DType dt = DType::F32) {
      return ops::rand({n + skip}, gen, DType::F32, Device::cpu(), lo, hi).to(dt).narrow(0, skip, n);
    };
    ops::AdamWTensors s;
    s.param = make(-1, 1);
    s.grad = ops::randn({n}, gen, DType::F32, Device::cpu());
    s.m = make(-0.1, 0.1, momentDType);
    s.v = make(0, 0.01, momentDType);
    s.weightDecay = weightDecay;
    if (copyDType) s.copy = Tensor::empty({n + skip}, *copyDType).narrow(0, skip, n);
    sets.push_back(s);
  }
  return sets;
}

std::vector<ops::AdamWTensors> cloneSets(const std::vector<ops::AdamWTensors>& sets) {
  std::vector<ops::AdamWTensors> out;
  for (const auto& s : sets)
    out.push_back(ops::AdamWTensors{s.param.clone(), s.grad.clone(), s.m.clone(), s.v.clone(), s.weightDecay,
                                    s.copy.defined()
                                        ? Tensor::empty({s.copy.offset() + s.copy.numel()}, s.copy.dtype())
                                              .narrow(0, s.copy.offset(), s.copy.numel())
                                        : Tensor()});
  return out;
}

void requireSameBits(const std::vector<ops::AdamWTensors>& a, const std::vector<ops::AdamWTensors>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("set " << i << " of " << a[i].param.numel() << " elements");
    REQUIRE(firstDifference(bytesOf(a[i].param), bytesOf(b[i].param)) == -1);
    REQUIRE(firstDifference(bytesOf(a[i].m), bytesOf(b[i].m)) == -1);
    REQUIRE(firstDifference(bytesOf(a[i].v), bytesOf(b[i].v)) == -1);
    if (a[i].copy.defined()) REQUIRE(firstDifference(bytesOf(a[i].copy), bytesOf(b[i].copy)) == -1);
  }
}

ops::AdamWHyper hyperAt(int step) {
  ops::AdamWHyper h;
  h.lr = 3e-3f;
  h.beta1 = 0.9f;
  h.beta2 = 0.95f;
  h.eps = 1e-8f;
  h.biasCorrection1 = float(1 - std::pow(0.9, step));
  h.biasCorrection2 = float(1 - std::pow(0.95, step));
  return h;
}

}  // namespace

TEST_CASE("CPU AdamW: the AVX-512, AVX2 and scalar paths agree bit for bit", "[optim][adamw][cpu]") {
  REQUIRE(ops::cpu::cpuIsaSupported(CpuIsa::Scalar));
  auto paths = vectorPaths();
  for (std::optional<DType> copy : {std::optional<DType>(), std::optional(DType::F32),
                                    std::optional(DType::BF16), std::optional(DType::F16)}) {
    for (float weightDecay : {0.0f, 0.1f}) {
      for (auto [scale, moments] : {std::pair{1.0f, DType::F32}, std::pair{0.37f, DType::F32},
                                    std::pair{1.0f, DType::BF16}, std::pair{0.37f, DType::BF16}}) {
        INFO("copy " << (copy ? dtypeName(*copy) : "none") << ", weight decay " << weightDecay
                     << ", gradient scale " << scale << ", moments " << dtypeName(moments));
        auto reference = makeSets(21, copy, weightDecay, moments);
        std::vector<std::vector<ops::AdamWTensors>> runs;
        for (size_t p = 0; p < paths.size(); ++p) runs.push_back(cloneSets(reference));
        auto before = bytesOf(reference.back().param);
        for (int step = 1; step <= 3; ++step) {
          ops::cpu::adamwOnPath(CpuIsa::Scalar, reference, hyperAt(step), scale);
          for (size_t p = 0; p < paths.size(); ++p)
            ops::cpu::adamwOnPath(paths[p], runs[p], hyperAt(step), scale);
        }
        REQUIRE(firstDifference(bytesOf(reference.back().param), before) != -1);  // the update did something
        for (size_t p = 0; p < paths.size(); ++p) {
          INFO("path " << ops::cpu::cpuIsaName(paths[p]));
          requireSameBits(runs[p], reference);
        }
        // The copy is the new master rounded once, as a cast rounds it.
        if (copy)
          for (const auto& s : reference)
            REQUIRE(firstDifference(bytesOf(s.copy), bytesOf(s.param.to(*copy))) == -1);
      }
    }
  }
}

TEST_CASE("CPU AdamW: the stealing split gives the static split's bits", "[optim][adamw][cpu]") {
  // Enough elements for many blocks per thread's range (NOTE [CPU AdamW split]), on more threads than this
  // machine may have, so that ranges finish unevenly and blocks are taken from others.
  int before = omp_get_max_threads();
  omp_set_num_threads(5);
  auto reference = makeSets(33, DType::BF16, 0.1f);
  Generator gen(34);
  int64_t n = 1'000'003;
  reference.push_back(ops::AdamWTensors{
      ops::rand({n}, gen, DType::F32, Device::cpu(), -1, 1), ops::randn({n}, gen, DType::F32, Device::cpu()),
      ops::zeros({n}, DType::F32, Device::cpu()), ops::zeros({n}, DType::F32, Device::cpu()), 0.1f,
      Tensor::empty({n}, DType::BF16)});
  auto stolen = cloneSets(reference);
  for (int step = 1; step <= 2; ++step) {
    ops::cpu::adamwOnPath(ops::cpu::activeCpuIsa(), reference, hyperAt(step), 0.5f,
                          ops::cpu::CpuSplit::Static);
    ops::cpu::adamwOnPath(ops::cpu::activeCpuIsa(), stolen, hyperAt(step), 0.5f, ops::cpu::CpuSplit::Steal);
  }
  omp_set_num_threads(before);
  requireSameBits(stolen, reference);
  REQUIRE(std::string(ops::cpu::cpuSplitName(ops::cpu::CpuSplit::Steal)) == "steal");
  REQUIRE(std::string(ops::cpu::cpuSplitName(ops::cpu::CpuSplit::Static)) == "static");
}

TEST_CASE("CPU AdamW: one step matches the formula in double precision", "[optim][adamw][cpu]") {
  for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (!ops::cpu::cpuIsaSupported(isa)) {
      WARN("this CPU lacks the " << ops::cpu::cpuIsaName(isa) << " path: skipped");
      continue;
    }
    INFO("path " << ops::cpu::cpuIsaName(isa));
    auto sets = makeSets(5, DType::BF16, 0.1f);
    auto start = cloneSets(sets);
    ops::AdamWHyper h = hyperAt(2);
    ops::cpu::adamwOnPath(isa, sets, h, 0.5f);
    for (size_t i = 0; i < sets.size(); ++i) {
      auto p0 = start[i].param.toVector<double>(), g = start[i].grad.toVector<double>();
      auto m0 = start[i].m.toVector<double>(), v0 = start[i].v.toVector<double>();
      std::vector<double> p(p0.size());
      for (size_t j = 0; j < p.size(); ++j) {
        double gj = 0.5 * g[j], m = 0.9 * m0[j] + 0.1 * gj, v = 0.95 * v0[j] + 0.05 * gj * gj;
        p[j] = p0[j] * (1 - 3e-3 * 0.1) -
               3e-3 * (m / h.biasCorrection1) / (std::sqrt(v / h.biasCorrection2) + 1e-8);
      }
      REQUIRE(test::closeness(sets[i].param.toVector<double>(), p, 1e-6, 1e-5) <= 1.0);
    }
  }
}

TEST_CASE("CPU AdamW: the 16-bit copies round special values as BFloat16 and Half do",
          "[optim][adamw][cpu]") {
  // lr 0 leaves every master as it was (fma(p, 1, -0) = p; NaNs come out quiet), so the copy is the
  // conversion of arbitrary float bit patterns: NaNs with payloads and either sign, infinities, subnormals,
  // values at the fp16 overflow edge and halfway cases of both formats.
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                                0x7f800001u, 0xff812345u, 0x7fbfffffu, 0x00000001u, 0x807fffffu, 0x477fe000u,
                                0x477ff000u, 0x477fefffu, 0x47800000u, 0xc77ff000u, 0x33800000u, 0x33000000u,
                                0x33000001u, 0x387fc000u, 0x38800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u,
                                0x7f7fffffu, 0xff7f8000u, 0x3f801000u, 0x3f803000u, 0x40490fdbu};
  Generator gen(3);
  std::vector<float> values;
  for (uint32_t b : bits) values.push_back(bitsFloat(b));
  auto randomBits = ops::rand({4096}, gen, DType::F32, Device::cpu(), 0, 1).toVector<float>();
  for (float r : randomBits) values.push_back(bitsFloat(uint32_t(double(r) * 4294967295.0)));
  int64_t n = int64_t(values.size());
  for (DType copy : {DType::BF16, DType::F16}) {
    INFO("copy " << dtypeName(copy));
    std::vector<std::vector<uint8_t>> results;
    for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512}) {
      if (!ops::cpu::cpuIsaSupported(isa)) {
        WARN("this CPU lacks the " << ops::cpu::cpuIsaName(isa) << " path: skipped");
        continue;
      }
      INFO("path " << ops::cpu::cpuIsaName(isa));
      ops::AdamWTensors s{Tensor::fromVector<float>(values, {n}),
                          ops::full({n}, 1.0, DType::F32, Device::cpu()),
                          ops::zeros({n}),
                          ops::zeros({n}),
                          0.0f,
                          Tensor::empty({n}, copy)};
      ops::AdamWHyper h;  // lr 0
      ops::cpu::adamwOnPath(isa, {s}, h, 1.0f);
      const float* p = static_cast<const float*>(s.param.data());
      const uint16_t* c = static_cast<const uint16_t*>(s.copy.data());
      for (int64_t i = 0; i < n; ++i) {
        INFO("element " << i << ", bits 0x" << std::hex << floatBits(values[size_t(i)]));
        if (!std::isnan(values[size_t(i)])) REQUIRE(floatBits(p[i]) == floatBits(values[size_t(i)]));
        REQUIRE(c[i] == (copy == DType::BF16 ? BFloat16::fromFloat(p[i]) : Half::fromFloat(p[i])));
      }
      results.push_back(bytesOf(s.copy));
    }
    for (size_t r = 1; r < results.size(); ++r) REQUIRE(firstDifference(results[r], results[0]) == -1);
  }
}

TEST_CASE("CPU AdamW: a NaN or infinite gradient spreads alike on every path", "[optim][adamw][cpu]") {
  std::vector<std::vector<uint8_t>> results;
  for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (!ops::cpu::cpuIsaSupported(isa)) continue;
    auto sets = makeSets(9, DType::BF16, 0.1f);
    float* g = static_cast<float*>(sets.back().grad.data());
    g[3] = NAN;
    g[40] = INFINITY;
    g[41] = -INFINITY;
    g[42] = 1e30f;  // g^2 overflows
    ops::cpu::adamwOnPath(isa, sets, hyperAt(1), 1.0f);
    const float* p = static_cast<const float*>(sets.back().param.data());
    REQUIRE(std::isnan(p[3]));
    REQUIRE(std::isnan(p[40]));  // inf / inf
    std::vector<uint8_t> all;
    for (const auto& s : sets)
      for (const Tensor* t : {&s.param, &s.m, &s.v, &s.copy}) {
        auto b = bytesOf(*t);
        all.insert(all.end(), b.begin(), b.end());
      }
    results.push_back(all);
  }
  for (size_t r = 1; r < results.size(); ++r) REQUIRE(firstDifference(results[r], results[0]) == -1);
}

TEST_CASE("CPU AdamW: the path names and the active path", "[optim][adamw][cpu]") {
  REQUIRE(std::string(ops::cpu::cpuIsaName(CpuIsa::Avx512)) == "avx512");
  REQUIRE(std::string(ops::cpu::cpuIsaName(CpuIsa::Avx2)) == "avx2");
  REQUIRE(std::string(ops::cpu::cpuIsaName(CpuIsa::Scalar)) == "scalar");
  CpuIsa active = ops::cpu::activeCpuIsa();
  REQUIRE(ops::cpu::cpuIsaSupported(active));
  if (std::getenv("STRATA_CPU_ISA") == nullptr && ops::cpu::cpuIsaSupported(CpuIsa::Avx512))
    REQUIRE(active == CpuIsa::Avx512);
  if (!ops::cpu::cpuIsaSupported(CpuIsa::Avx512))
    REQUIRE_THROWS_AS(ops::cpu::adamwOnPath(CpuIsa::Avx512, {}, ops::AdamWHyper{}, 1.0f), Error);
}

TEST_CASE("CPU AdamW: bf16 and f16 gradients update as their fp32 widening does, on every path",
          "[optim][adamw][cpu]") {
  // 16-bit gradient buffers (precision.grad_accum_dtype): each path widens them as it reads, exactly, so the
  // update is the one from the same gradients in fp32, bit for bit (special values included: a NaN's payload
  // survives, quieted). Gradients start mid-buffer too (the vector loads are unaligned), and the sets' sizes
  // leave vector tails.
  std::vector<CpuIsa> paths = vectorPaths();
  paths.push_back(CpuIsa::Scalar);
  for (DType gradDType : {DType::BF16, DType::F16}) {
    for (std::optional<DType> copy : {std::optional<DType>(), std::optional(DType::BF16)}) {
      INFO("gradients " << dtypeName(gradDType) << ", copy " << (copy ? dtypeName(*copy) : "none"));
      auto reference = makeSets(33, copy, 0.1f);
      std::vector<ops::AdamWTensors> narrow = cloneSets(reference);
      for (size_t i = 0; i < reference.size(); ++i) {
        int64_t n = reference[i].grad.numel(), skip = int64_t(i % 3);
        Tensor g16 = Tensor::empty({n + skip}, gradDType).narrow(0, skip, n);
        ops::copy(g16, reference[i].grad);
        if (n >= 64) {
          // Special values in a vector-path stretch: infinities, quiet and signalling NaNs, subnormals, -0.
          std::vector<uint16_t> special =
              gradDType == DType::BF16
                  ? std::vector<uint16_t>{0x7f80, 0xff80, 0x7fc1, 0x7f81, 0x0001, 0x8000, 0x807f, 0x0080}
                  : std::vector<uint16_t>{0x7c00, 0xfc00, 0x7e01, 0x7c01, 0x0001, 0x8000, 0x83ff, 0x0400};
          auto* bits = static_cast<uint16_t*>(g16.data());
          for (size_t k = 0; k < special.size(); ++k) bits[32 + k] = special[k];
        }
        narrow[i].grad = g16;
        reference[i].grad = g16.to(DType::F32);  // the widening, exact
      }
      for (CpuIsa isa : paths) {
        INFO("path " << ops::cpu::cpuIsaName(isa));
        auto wide = cloneSets(reference), halfGrads = cloneSets(narrow);
        for (size_t i = 0; i < narrow.size(); ++i) halfGrads[i].grad = narrow[i].grad;
        for (int step = 1; step <= 2; ++step) {
          ops::cpu::adamwOnPath(isa, wide, hyperAt(step), 0.37f);
          ops::cpu::adamwOnPath(isa, halfGrads, hyperAt(step), 0.37f);
        }
        requireSameBits(halfGrads, wide);
      }
    }
  }
}

TEST_CASE("CPU AdamW: plain, copy-streaming and streaming stores give the same bits at any length and start",
          "[optim][adamw][cpu]") {
  // NOTE [CPU AdamW stores]: the vector loops store whole 64-byte lines after a scalar head that reaches the
  // anchor's line boundary. Sets of odd lengths (shorter than a line, one element either side of a loop
  // iteration) start 0, 1, 5 or 17 elements into 64-byte aligned buffers, the copy on the state's phase (the
  // streaming loop runs) or off it (master, m and v fall back to plain stores), with 40 guard elements after
  // each: the result is the scalar path's, bit for bit, and nothing outside a set's elements is written.
  // Three threads, so that their ranges start mid-set at other phases.
  int before = omp_get_max_threads();
  omp_set_num_threads(3);
  constexpr int64_t kGuard = 40;
  struct Buffers {
    std::vector<Tensor> whole;  // param, grad, m, v, copy (undefined without one), guards included
    std::vector<ops::AdamWTensors> sets;
  };
  auto makeBuffers = [&](std::optional<DType> copy, DType gradDType, DType momentDType) {
    Generator gen(77);
    Buffers b;
    int index = 0;
    for (int64_t n : {1, 31, 32, 33, 63, 95, 97, 1000, 4099, 70001}) {
      int64_t skip = std::vector<int64_t>{0, 1, 5, 17}[size_t(index) % 4];
      int64_t copySkip = index % 3 == 2 ? skip + 3 : skip;  // every third set's copy off the state's phase
      ++index;
      Tensor param = ops::rand({skip + n + kGuard}, gen, DType::F32, Device::cpu(), -1, 1);
      Tensor grad = ops::randn({skip + n + kGuard}, gen, DType::F32, Device::cpu()).to(gradDType);
      Tensor m = ops::rand({skip + n + kGuard}, gen, DType::F32, Device::cpu(), -0.1, 0.1).to(momentDType);
      Tensor v = ops::rand({skip + n + kGuard}, gen, DType::F32, Device::cpu(), 0, 0.01).to(momentDType);
      Tensor c;
      if (copy) {
        c = Tensor::empty({copySkip + n + kGuard}, *copy);
        std::memset(c.data(), 0x5a, c.nbytes());
      }
      b.whole.insert(b.whole.end(), {param, grad, m, v, c});
      b.sets.push_back(ops::AdamWTensors{param.narrow(0, skip, n), grad.narrow(0, skip, n),
                                         m.narrow(0, skip, n), v.narrow(0, skip, n), 0.1f,
                                         copy ? c.narrow(0, copySkip, n) : Tensor()});
    }
    return b;
  };
  auto paths = vectorPaths();
  // m and v in fp32, or in bf16 (half a line per 32 elements) with fp32 or bf16 gradients.
  for (auto [gradDType, momentDType] :
       {std::pair{DType::F32, DType::F32}, std::pair{DType::BF16, DType::F32},
        std::pair{DType::F32, DType::BF16}, std::pair{DType::BF16, DType::BF16}}) {
    for (std::optional<DType> copy : {std::optional<DType>(), std::optional(DType::BF16),
                                      std::optional(DType::F16), std::optional(DType::F32)}) {
      Buffers reference = makeBuffers(copy, gradDType, momentDType);
      for (int step = 1; step <= 2; ++step)
        ops::cpu::adamwOnPath(CpuIsa::Scalar, reference.sets, hyperAt(step), 0.37f);
      for (CpuIsa isa : paths) {
        for (auto stores :
             {ops::cpu::CpuStores::Plain, ops::cpu::CpuStores::Copy, ops::cpu::CpuStores::Stream}) {
          for (int64_t prefetch : {0, 256}) {
            INFO("gradients " << dtypeName(gradDType) << ", moments " << dtypeName(momentDType) << ", copy "
                              << (copy ? dtypeName(*copy) : "none") << ", path " << ops::cpu::cpuIsaName(isa)
                              << ", stores " << ops::cpu::cpuStoresName(stores) << ", prefetch " << prefetch);
            Buffers run = makeBuffers(copy, gradDType, momentDType);
            ops::cpu::CpuAdamWOptions options{
                .split = ops::cpu::CpuSplit::Static, .stores = stores, .prefetchElems = prefetch};
            for (int step = 1; step <= 2; ++step)
              ops::cpu::adamwOnPath(isa, run.sets, hyperAt(step), 0.37f, options);
            for (size_t t = 0; t < run.whole.size(); ++t) {
              if (!run.whole[t].defined()) continue;
              INFO("set " << t / 5 << ", buffer " << t % 5 << " (param, grad, m, v, copy)");
              REQUIRE(firstDifference(bytesOf(run.whole[t]), bytesOf(reference.whole[t])) == -1);
            }
          }
        }
      }
    }
  }
  omp_set_num_threads(before);
  REQUIRE(std::string(ops::cpu::cpuStoresName(ops::cpu::CpuStores::Plain)) == "plain");
  REQUIRE(std::string(ops::cpu::cpuStoresName(ops::cpu::CpuStores::Copy)) == "copy");
  REQUIRE(std::string(ops::cpu::cpuStoresName(ops::cpu::CpuStores::Stream)) == "stream");
}

TEST_CASE("CPU AdamW: bf16 moments update as the fp32 computation does, rounded once, on every path",
          "[optim][adamw][cpu]") {
  // optimizer.moments_dtype: bf16 (NOTE [AdamW bits] in strata/ops/Ops.h). Each step from the same bf16 m
  // and v: the kernel with bf16 moments gives the parameter and copy that the fp32 kernel gives from the
  // widened moments, and the fp32 kernel's new m and v rounded to nearest even, bit for bit.
  std::vector<CpuIsa> paths = vectorPaths();
  paths.insert(paths.begin(), CpuIsa::Scalar);
  for (CpuIsa isa : paths) {
    for (DType gradDType : {DType::F32, DType::BF16}) {
      INFO("path " << ops::cpu::cpuIsaName(isa) << ", gradients " << dtypeName(gradDType));
      auto narrow = makeSets(41, DType::BF16, 0.1f, DType::BF16);
      for (auto& s : narrow) s.grad = s.grad.to(gradDType);
      for (int step = 1; step <= 3; ++step) {
        // The fp32 run starts from this step's bf16 state, widened.
        auto wide = cloneSets(narrow);
        for (auto& s : wide) {
          s.m = s.m.to(DType::F32);
          s.v = s.v.to(DType::F32);
        }
        auto mBefore = bytesOf(narrow.back().m);
        ops::cpu::adamwOnPath(isa, wide, hyperAt(step), 0.37f);
        ops::cpu::adamwOnPath(isa, narrow, hyperAt(step), 0.37f);
        REQUIRE(firstDifference(bytesOf(narrow.back().m), mBefore) != -1);  // the moments moved
        for (size_t i = 0; i < narrow.size(); ++i) {
          INFO("step " << step << ", set " << i << " of " << narrow[i].param.numel() << " elements");
          REQUIRE(narrow[i].m.dtype() == DType::BF16);
          REQUIRE(firstDifference(bytesOf(narrow[i].param), bytesOf(wide[i].param)) == -1);
          REQUIRE(firstDifference(bytesOf(narrow[i].copy), bytesOf(wide[i].copy)) == -1);
          REQUIRE(firstDifference(bytesOf(narrow[i].m), bytesOf(wide[i].m.to(DType::BF16))) == -1);
          REQUIRE(firstDifference(bytesOf(narrow[i].v), bytesOf(wide[i].v.to(DType::BF16))) == -1);
        }
      }
    }
  }
}
