#include "TestUtil.h"

using namespace strata;

namespace {
Tensor leaf(std::vector<double> v) {
  Tensor t = Tensor::fromVector<double>(v, {int64_t(v.size())});
  t.setRequiresGrad(true);
  return t;
}
}  // namespace

TEST_CASE("reused tensors and shared subexpressions accumulate", "[autograd][engine]") {
  Tensor x = leaf({1, 2, 3});
  Tensor y = x * x;           // dy/dx = 2x
  Tensor z = sum(y + y * x);  // d/dx (x^2 + x^3) = 2x + 3x^2
  backward(z);
  REQUIRE(x.grad().toVector<double>() == std::vector<double>{5, 16, 33});
  REQUIRE(!y.isLeaf());
  REQUIRE(y.gradFn()->name() == "MulBackward");
  // A second backward on a fresh graph accumulates into .grad.
  backward(sum(x));
  REQUIRE(x.grad().toVector<double>() == std::vector<double>{6, 17, 34});
}

TEST_CASE("no_grad records nothing", "[autograd][engine]") {
  Tensor x = leaf({1, 2});
  {
    NoGradGuard guard;
    Tensor y = x * 2.0;
    REQUIRE(!y.requiresGrad());
    REQUIRE(y.gradFn() == nullptr);
  }
  Tensor y = x * 2.0;
  REQUIRE(y.requiresGrad());
  Tensor d = y.detach();
  REQUIRE(!d.requiresGrad());
  REQUIRE_THROWS_AS(backward(sum(d)), Error);
}

TEST_CASE("retain_graph allows a second backward; otherwise it fails loudly", "[autograd][engine]") {
  Tensor x = leaf({1, 2});
  Tensor loss = sum(exp(x));
  backward(loss, true);
  backward(loss, false);
  auto g = x.grad().toVector<double>();
  REQUIRE(g[0] == Approx(2 * std::exp(1.0)));
  try {
    backward(loss);
    FAIL("a third backward through a freed graph must throw");
  } catch (const Error& e) {
    REQUIRE(std::string(e.what()).find("retainGraph") != std::string::npos);
  }
}

TEST_CASE("gradient-complete hooks fire once per leaf, after all contributions", "[autograd][hooks]") {
  Tensor w = leaf({1, 1});
  Tensor b = leaf({0, 0});
  std::vector<std::string> order;
  std::vector<double> seenGrad;
  w.registerGradCompleteHook([&](Tensor& t) {
    order.push_back("w");
    seenGrad = t.grad().toVector<double>();
  });
  b.registerGradCompleteHook([&](Tensor&) { order.push_back("b"); });
  // w is used three times; its hook must see the full sum.
  Tensor h = w * 2.0 + b;
  Tensor out = sum(h * w + w);
  backward(out);
  REQUIRE(std::count(order.begin(), order.end(), "w") == 1);
  REQUIRE(std::count(order.begin(), order.end(), "b") == 1);
  // d/dw (2w^2 + b w + w) = 4w + b + 1 = 5
  REQUIRE(seenGrad == std::vector<double>{5, 5});
  // Gradient hooks may rewrite the incoming gradient.
  Tensor v = leaf({1, 2});
  v.registerGradHook([](const Tensor& g) { return ops::affine(g, 10.0, 0.0); });
  backward(sum(v * v));
  REQUIRE(v.grad().toVector<double>() == std::vector<double>{20, 40});
}

TEST_CASE("backward runs nodes in reverse creation order", "[autograd][engine]") {
  Tensor x = leaf({1});
  Tensor a = x * 2.0;
  Tensor b = a * 3.0;
  std::vector<std::string> order;
  a.gradFn()->addPreHook([&] { order.push_back("a"); });
  b.gradFn()->addPreHook([&] { order.push_back("b"); });
  backward(sum(b + a));
  REQUIRE(order == std::vector<std::string>{"b", "a"});
  REQUIRE(x.grad().item() == 8.0);
}

TEST_CASE("checkpoint recomputes and matches the plain backward, dropout included",
          "[autograd][checkpoint]") {
  Tensor w = test::randomDouble({6, 6}, 70);
  w.setRequiresGrad(true);
  Tensor x = test::randomDouble({4, 6}, 71);
  x.setRequiresGrad(true);
  int calls = 0;
  CheckpointFn block = [&](const std::vector<Tensor>& in) {
    ++calls;
    Tensor h = gelu(matmul(in[0], w));
    return std::vector<Tensor>{dropout(h, 0.5, true)};
  };
  manualSeed(5);
  Tensor plain = sum(block({x})[0]);
  backward(plain);
  Tensor gw = w.grad(), gx = x.grad();
  w.setGrad(Tensor());
  x.setGrad(Tensor());

  manualSeed(5);
  calls = 0;
  Tensor ck = sum(checkpoint(block, {x})[0]);
  REQUIRE(calls == 1);
  REQUIRE(ck.item() == Approx(plain.item()).epsilon(1e-12));
  backward(ck);
  REQUIRE(calls == 2);  // recomputed in backward
  test::requireClose(w.grad(), gw, 1e-12, 1e-12);
  test::requireClose(x.grad(), gx, 1e-12, 1e-12);
}

TEST_CASE("checkpoint trains parameters even when no input needs grad", "[autograd][checkpoint]") {
  Tensor w = leaf({2, 3});
  Tensor x = Tensor::fromVector<double>({1, 1}, {2});
  auto out = checkpoint([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * w}; }, {x});
  backward(sum(out[0]));
  REQUIRE(w.grad().toVector<double>() == std::vector<double>{1, 1});
}
