#include "TestUtil.h"

using namespace strata;

namespace {
// Reference product in double over logical indices of [B, m, k] @ [B, k, n] (already broadcast).
std::vector<double> reference(const Tensor& a, const Tensor& b) {
  auto av = a.contiguous().toVector<double>(), bv = b.contiguous().toVector<double>();
  int64_t B = a.numel() / (a.size(-2) * a.size(-1)), m = a.size(-2), k = a.size(-1), n = b.size(-1);
  std::vector<double> out(size_t(B * m * n), 0.0);
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p)
          acc += av[size_t((bi * m + i) * k + p)] * bv[size_t((bi * k + p) * n + j)];
        out[size_t((bi * m + i) * n + j)] = acc;
      }
  return out;
}
}  // namespace

TEST_CASE("matmul of plain and transposed operands", "[ops][matmul]") {
  Tensor a = test::randomDouble({5, 7}, 1), b = test::randomDouble({7, 3}, 2);
  REQUIRE(test::closeness(ops::matmul(a, b).toVector<double>(), reference(a, b), 1e-12, 1e-12) <= 1);
  Tensor at = test::randomDouble({7, 5}, 3).transpose(0, 1);  // a transposed view, no copy
  Tensor bt = test::randomDouble({3, 7}, 4).transpose(0, 1);
  REQUIRE(test::closeness(ops::matmul(at, bt).toVector<double>(), reference(at, bt), 1e-12, 1e-12) <= 1);
  Tensor f = test::randomDouble({6, 9}, 5).to(DType::F32), g = test::randomDouble({9, 4}, 6).to(DType::F32);
  REQUIRE(test::closeness(ops::matmul(f, g).toVector<double>(), reference(f, g), 1e-5, 1e-5) <= 1);
  REQUIRE_THROWS_AS(ops::matmul(a, a), Error);
}

TEST_CASE("batched matmul with broadcast batch dims", "[ops][matmul]") {
  Tensor a = test::randomDouble({2, 3, 4, 5}, 7), b = test::randomDouble({5, 6}, 8);
  Tensor out = ops::matmul(a, b);
  REQUIRE(out.shape() == Shape{2, 3, 4, 6});
  REQUIRE(test::closeness(out.toVector<double>(), reference(a, b.expand({2, 3, 5, 6})), 1e-12, 1e-12) <= 1);
  Tensor c = test::randomDouble({3, 5, 2}, 9);
  Tensor out2 = ops::matmul(a, c);  // [2,3,4,5] @ [3,5,2] -> [2,3,4,2]
  REQUIRE(out2.shape() == Shape{2, 3, 4, 2});
  REQUIRE(test::closeness(out2.toVector<double>(), reference(a, c.expand({2, 3, 5, 2})), 1e-12, 1e-12) <= 1);
  // Attention-style: k transposed inside a permuted [B, H, S, D] view.
  Tensor q = test::randomDouble({2, 4, 3, 8}, 10).permute({0, 2, 1, 3});  // [2, 3, 4, 8] non-contiguous
  Tensor k = test::randomDouble({2, 3, 4, 8}, 11);
  Tensor s = ops::matmul(q, k.transpose(-1, -2));
  REQUIRE(test::closeness(s.toVector<double>(), reference(q, k.transpose(-1, -2)), 1e-12, 1e-12) <= 1);
}

TEST_CASE("matmul of vectors and low precision", "[ops][matmul]") {
  Tensor v = test::randomDouble({5}, 12), m = test::randomDouble({5, 3}, 13);
  Tensor vm = ops::matmul(v, m);
  REQUIRE(vm.shape() == Shape{3});
  Tensor mv = ops::matmul(m.transpose(0, 1), v);
  REQUIRE(mv.shape() == Shape{3});
  REQUIRE(test::closeness(vm.toVector<double>(), mv.toVector<double>(), 1e-12, 1e-12) <= 1);
  Tensor a = test::randomDouble({16, 32}, 14), b = test::randomDouble({32, 8}, 15);
  for (DType dt : {DType::BF16, DType::F16}) {
    Tensor lo = ops::matmul(a.to(dt), b.to(dt));
    REQUIRE(lo.dtype() == dt);
    REQUIRE(test::closeness(lo.toVector<double>(), reference(a.to(dt), b.to(dt)), 2e-2, 1e-2) <= 1);
  }
}

TEST_CASE("[cuda] GEMMs on two streams at once each get their own cuBLASLt workspace",
          "[cuda][matmul][stream]") {
  STRATA_REQUIRE_CUDA();
  Device gpu = Device::cuda(0);
  auto& alloc = dynamic_cast<CachingAllocator&>(deviceAllocator(gpu));
  // Long-k, small-output products: the shapes for which cuBLASLt picks split-k algorithms that use the
  // workspace.
  Generator gen(21);
  Tensor a1 = ops::randn({128, 16384}, gen, DType::BF16, gpu),
         b1 = ops::randn({16384, 128}, gen, DType::BF16, gpu);
  Tensor a2 = ops::randn({128, 16384}, gen, DType::BF16, gpu),
         b2 = ops::randn({16384, 128}, gen, DType::BF16, gpu);
  Tensor ref1 = ops::matmul(a1, b1), ref2 = ops::matmul(a2, b2);
  Stream s1 = Stream::create(gpu), s2 = Stream::create(gpu);
  Event inputs(gpu);
  inputs.record(currentStream(gpu));
  inputs.block(s1);
  inputs.block(s2);
  std::vector<Tensor> out1, out2;
  for (int i = 0; i < 20; ++i) {
    {
      StreamGuard guard(s1);
      out1.push_back(ops::matmul(a1, b1));
    }
    StreamGuard guard(s2);
    out2.push_back(ops::matmul(a2, b2));
  }
  // Each stream now holds a workspace-sized block of its own in its pool.
  {
    StreamGuard guard(s1);
    REQUIRE(alloc.hasCachedFit(32u << 20));
  }
  {
    StreamGuard guard(Stream::create(gpu));
    REQUIRE(!alloc.hasCachedFit(32u << 20));
  }
  synchronizeDevice(gpu);
  auto r1 = ref1.toVector<double>(), r2 = ref2.toVector<double>();
  for (int i = 0; i < 20; ++i) {
    INFO("repeat " << i);
    REQUIRE(test::closeness(out1[size_t(i)].toVector<double>(), r1, 1e-2, 1e-2) <= 1.0);
    REQUIRE(test::closeness(out2[size_t(i)].toVector<double>(), r2, 1e-2, 1e-2) <= 1.0);
  }
}
