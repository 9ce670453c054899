// Saved weights across moves and writes: see NOTE [Content version and residency] in Storage.h.
#include "TestUtil.h"

using namespace strata;

namespace {

Tensor leafCopy(const Tensor& t) {
  Tensor c = ops::emptyLike(t);
  ops::copy(c, t);
  c.setRequiresGrad(true);
  return c;
}

enum class Between { Nothing, Move, MoveAndWrite, Write };

// Forward of linear(x, w, b) or matmul(x, w), then (optionally) the weight's bytes are evicted and re-pointed
// at a copy of the same values in another buffer, and/or written, then the backward. Returns the gradients
// of x, w and b.
std::vector<std::vector<double>> gradsAfter(bool useLinear, Between between) {
  Generator gen(31);
  Tensor x = leafCopy(ops::rand({5, 6}, gen, DType::F32, Device::cpu(), -1, 1));
  Tensor w = leafCopy(ops::rand({6, 3}, gen, DType::F32, Device::cpu(), -1, 1));
  Tensor b = leafCopy(ops::rand({3}, gen, DType::F32, Device::cpu(), -1, 1));
  w.storage()->setLabel("h.0.mlp.weight");
  Tensor y = useLinear ? linear(x, w, b) : matmul(x, w) + b;
  Tensor loss = sum(y * y);
  std::vector<float> elsewhere;  // the weight's new home; outlives the backward
  if (between == Between::Move || between == Between::MoveAndWrite) {
    elsewhere = w.toVector<float>();
    w.storage()->evict();
    REQUIRE(!w.storage()->resident());
    w.storage()->repoint(elsewhere.data(), Device::cpu());
  }
  if (between == Between::Write || between == Between::MoveAndWrite)
    ops::copy(w.detach(), ops::full({6, 3}, 0.5, DType::F32, Device::cpu()));
  backward(loss);
  return {x.grad().toVector<double>(), w.grad().toVector<double>(), b.grad().toVector<double>()};
}

}  // namespace

TEST_CASE("a weight evicted after the forward and re-pointed before the backward gives the same gradients",
          "[autograd][storage]") {
  for (bool useLinear : {true, false}) {
    INFO((useLinear ? "linear" : "matmul"));
    auto reference = gradsAfter(useLinear, Between::Nothing);
    auto moved = gradsAfter(useLinear, Between::Move);
    REQUIRE(moved == reference);
  }
}

TEST_CASE("a weight written between the forward and the backward still fails loudly", "[autograd][storage]") {
  for (Between between : {Between::Write, Between::MoveAndWrite}) {
    std::string error = test::errorOf([&] { gradsAfter(true, between); });
    REQUIRE(error.find("written in place") != std::string::npos);
  }
}

TEST_CASE("a weight evicted while not needed fails loudly when the backward touches it",
          "[autograd][storage]") {
  Generator gen(32);
  Tensor x = leafCopy(ops::rand({2, 4}, gen, DType::F32, Device::cpu(), -1, 1));
  Tensor w = leafCopy(ops::rand({4, 3}, gen, DType::F32, Device::cpu(), -1, 1));
  w.storage()->setLabel("h.1.attn.weight");
  Tensor loss = sum(linear(x, w));
  w.storage()->evict();
  std::string error = test::errorOf([&] { backward(loss); });
  REQUIRE(error.find("h.1.attn.weight") != std::string::npos);
  REQUIRE(error.find("not resident") != std::string::npos);
}

TEST_CASE("gradients go into a leaf's fp32 buffer: stored by the first backward, added by the next",
          "[autograd][grad-buffer]") {
  Generator gen(33);
  auto bf16Leaf = [&](const Shape& shape) {
    return leafCopy(ops::rand(shape, gen, DType::F32, Device::cpu(), -0.5, 0.5).to(DType::BF16));
  };
  Tensor w = bf16Leaf({8, 4}), b = bf16Leaf({4}), table = bf16Leaf({10, 8});
  // NaN in the buffers: a first write that added instead of storing would show.
  Tensor gw = ops::full({8, 4}, NAN, DType::F32, Device::cpu());
  Tensor gb = ops::full({4}, NAN, DType::F32, Device::cpu());
  Tensor gt = ops::full({10, 8}, NAN, DType::F32, Device::cpu());
  autograd::setGradBuffer(w, gw);
  autograd::setGradBuffer(b, gb);
  autograd::setGradBuffer(table, gt);
  REQUIRE(autograd::gradDType(w) == DType::F32);
  REQUIRE(!w.grad().defined());
  std::vector<int> completes(3, 0);
  int k = 0;
  for (Tensor* t : {&w, &b, &table}) {
    int i = k++;
    t->registerGradCompleteHook([&completes, i](Tensor&) { ++completes[size_t(i)]; });
  }
  // The references: the same backward on fp32 copies of the bf16 values, with plain .grad accumulation.
  Tensor rw = leafCopy(w.to(DType::F32)), rb = leafCopy(b.to(DType::F32)),
         rt = leafCopy(table.to(DType::F32));
  auto micro = [&](uint64_t seed, bool reference) {
    Tensor ids =
        Tensor::fromVector<int64_t>({int64_t(seed % 10), int64_t(seed * 3 % 10), int64_t(seed % 10)}, {3});
    if (reference) return backward(sum(linear(embedding(rt, ids), rw, rb)));
    backward(sum(linear(embedding(table, ids), w, b).to(DType::F32)));
  };
  for (uint64_t s : {1, 2}) {
    micro(s, false);
    micro(s, true);
    REQUIRE(w.grad().storage() == gw.storage());
    REQUIRE(b.grad().storage() == gb.storage());
    REQUIRE(table.grad().storage() == gt.storage());
    test::requireClose(w.grad(), rw.grad(), 1e-2);
    test::requireClose(b.grad(), rb.grad(), 1e-2);
    test::requireClose(table.grad(), rt.grad(), 1e-2);
  }
  REQUIRE(completes == std::vector<int>{2, 2, 2});
  // Zeroing marks the buffers empty without touching them; the next backward stores again.
  for (Tensor* t : {&w, &b, &table}) t->setGrad(Tensor());
  REQUIRE(!w.grad().defined());
  for (Tensor* t : {&rw, &rb, &rt}) t->setGrad(Tensor());
  micro(3, false);
  micro(3, true);
  test::requireClose(w.grad(), rw.grad(), 1e-2);
  test::requireClose(table.grad(), rt.grad(), 1e-2);
  // A leaf with a buffer takes no foreign gradient tensor.
  REQUIRE(test::errorOf([&] { w.setGrad(ops::zeros({8, 4})); }).find("setGradHome") != std::string::npos);
}
