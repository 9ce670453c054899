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

TEST_CASE("a kept bf16 copy stays valid when its fp32 master moves, and goes stale when it is written",
          "[autograd][storage][mixed]") {
  Generator gen(33);
  Tensor w = leafCopy(ops::rand({8, 4}, gen, DType::F32, Device::cpu(), -0.5, 0.5));
  Tensor x = ops::rand({3, 8}, gen, DType::F32, Device::cpu(), -1, 1).to(DType::BF16);
  keepComputeCopies({w});
  Tensor y0 = linear(x, w);
  std::shared_ptr<TensorImpl> copy = w.impl().castCache->copy;
  REQUIRE(copy);
  std::vector<float> elsewhere = w.toVector<float>();
  w.storage()->evict();
  w.storage()->repoint(elsewhere.data(), Device::cpu());
  REQUIRE(w.impl().castCache->fresh(w.storage()->version()));
  Tensor y1 = linear(x, w);
  REQUIRE(w.impl().castCache->copy == copy);  // reused, not recast
  REQUIRE(y1.toVector<double>() == y0.toVector<double>());
  ops::copy(w.detach(), ops::zeros({8, 4}));
  REQUIRE(!w.impl().castCache->fresh(w.storage()->version()));
  Tensor y2 = linear(x, w);
  REQUIRE(w.impl().castCache->copy != copy);
  REQUIRE(y2.toVector<double>() == std::vector<double>(12, 0.0));
}
