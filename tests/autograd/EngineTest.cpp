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

TEST_CASE("end-of-backward callbacks run after every node, in order, once per pass", "[autograd][engine]") {
  Tensor x = leaf({1, 2});
  Tensor a = x * 2.0;
  Tensor b = a * 3.0;
  std::vector<std::string> order;
  uint64_t pass = 0;
  REQUIRE(!autograd::inBackwardPass());
  REQUIRE(autograd::currentBackwardPass() == 0);
  REQUIRE_THROWS_AS(autograd::queueEndOfBackwardCallback([] {}), Error);
  x.registerGradCompleteHook([&](Tensor&) { order.push_back("x complete"); });
  b.gradFn()->addPreHook([&] {
    order.push_back("b");
    pass = autograd::currentBackwardPass();
    autograd::queueEndOfBackwardCallback([&] {
      order.push_back("end 1");
      REQUIRE(autograd::currentBackwardPass() == pass);
      // A callback may queue another; it runs in the same pass.
      autograd::queueEndOfBackwardCallback([&] { order.push_back("end 3"); });
    });
    autograd::queueEndOfBackwardCallback([&] { order.push_back("end 2"); });
  });
  a.gradFn()->addPreHook([&] { order.push_back("a"); });
  backward(sum(b));
  REQUIRE(order == std::vector<std::string>{"b", "a", "x complete", "end 1", "end 2", "end 3"});
  REQUIRE(pass > 0);
  REQUIRE(!autograd::inBackwardPass());
  // The next pass has a new id, and the callbacks of the last one are gone.
  order.clear();
  uint64_t second = 0;
  Tensor c = x * 5.0;
  c.gradFn()->addPreHook([&] { second = autograd::currentBackwardPass(); });
  backward(sum(c));
  REQUIRE(second > pass);
  REQUIRE(order == std::vector<std::string>{"x complete"});
}

TEST_CASE("a leaf in the graph that gets no gradient is still notified, once", "[autograd][hooks]") {
  Tensor w = leaf({1, 2});
  Tensor v = leaf({3, 4});
  // An op whose backward gives w nothing.
  Tensor out = ops::add(w.detach(), v.detach());
  autograd::recordFunction("NoGradForW", {w, v}, {out}, [](const autograd::Grads& g) {
    return autograd::Grads{Tensor(), g[0]};
  });
  int wHeard = 0, vHeard = 0;
  bool wHadGrad = true;
  w.registerGradCompleteHook([&](Tensor& t) {
    ++wHeard;
    wHadGrad = t.grad().defined();
  });
  v.registerGradCompleteHook([&](Tensor&) { ++vHeard; });
  Tensor loss = sum(out);
  loss.gradFn()->addPreHook([&] {
    // Declaring it complete again at the end changes nothing: one notice per pass.
    autograd::queueEndOfBackwardCallback([&] {
      autograd::completeGradient(w);
      autograd::completeGradient(v);
      REQUIRE(autograd::gradientCompleted(w));
    });
  });
  backward(loss);
  REQUIRE(wHeard == 1);
  REQUIRE(!wHadGrad);
  REQUIRE(vHeard == 1);
  REQUIRE(v.grad().toVector<double>() == std::vector<double>{1, 1});
}

TEST_CASE("gradients accumulate in place, bitwise as an out-of-place sum", "[autograd][engine]") {
  Generator gen(11);
  Tensor w = ops::rand({64, 33}, gen, DType::F32, Device::cpu(), -1, 1);
  w.setRequiresGrad(true);
  Tensor x1 = ops::rand({7, 64}, gen, DType::F32, Device::cpu(), -1, 1);
  Tensor x2 = ops::rand({7, 64}, gen, DType::F32, Device::cpu(), -1, 1);
  auto microBatch = [&](const Tensor& x) { backward(sum(exp(matmul(x, w) * 0.1))); };

  microBatch(x1);
  Tensor first = w.grad().clone();
  Tensor grad = w.grad();
  StorageImpl* storage = grad.storage().get();
  w.setGrad(Tensor());
  microBatch(x2);
  Tensor second = w.grad().clone();
  w.setGrad(grad);
  microBatch(x2);
  // The same buffer, holding first + second exactly as ops::add computes it.
  REQUIRE(w.grad().storage().get() == storage);
  REQUIRE(w.grad().toVector<float>() == ops::add(first, second).toVector<float>());
  // As in PyTorch, a handle to .grad sees the accumulation.
  REQUIRE(grad.toVector<float>() == w.grad().toVector<float>());

  // A .grad that is a view into a flat buffer (a chunk's gradients) keeps receiving them there.
  Tensor flat = ops::zeros({10 + 64 * 33}, DType::F32);
  Tensor view = flat.narrow(0, 10, 64 * 33).view({64, 33});
  w.setGrad(view);
  microBatch(x1);
  microBatch(x2);
  REQUIRE(w.grad().isSameAs(view));
  REQUIRE(view.toVector<float>() ==
          ops::add(ops::add(ops::zeros({64, 33}), first), second).toVector<float>());
  REQUIRE(flat.narrow(0, 0, 10).toVector<float>() == std::vector<float>(10, 0.0f));

  // A .grad that cannot take it in place (not contiguous) is replaced by the sum; the old one is untouched.
  Tensor transposed = first.clone().transpose(0, 1).contiguous().transpose(0, 1);
  REQUIRE(!transposed.isContiguous());
  w.setGrad(transposed);
  microBatch(x2);
  REQUIRE(!w.grad().isSameAs(transposed));
  REQUIRE(transposed.toVector<float>() == first.toVector<float>());
  REQUIRE(w.grad().toVector<float>() == ops::add(first, second).toVector<float>());
}

TEST_CASE("a nested backward (checkpoint) is a pass of its own whose leaves count for the outer one",
          "[autograd][checkpoint][hooks]") {
  Tensor w = leaf({2, 3});
  Tensor x = leaf({1, 1});
  std::vector<uint64_t> wPasses;
  w.registerGradCompleteHook([&](Tensor&) { wPasses.push_back(autograd::currentBackwardPass()); });
  auto out = checkpoint([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * w}; }, {x});
  Tensor loss = sum(out[0]);
  uint64_t outer = 0;
  bool completedInOuter = false;
  loss.gradFn()->addPreHook([&] {
    outer = autograd::currentBackwardPass();
    autograd::queueEndOfBackwardCallback([&] {
      completedInOuter = autograd::gradientCompleted(w);
      autograd::completeGradient(w);  // no second notice
    });
  });
  backward(loss);
  REQUIRE(wPasses.size() == 1);
  REQUIRE(wPasses[0] != outer);  // notified by the inner pass
  REQUIRE(completedInOuter);
  REQUIRE(w.grad().toVector<double>() == std::vector<double>{1, 1});
}

TEST_CASE("backward from a non-scalar output with a given gradient, as a pipeline stage runs it",
          "[autograd][engine]") {
  // A stage's input is a leaf received from the previous stage; its backward starts from the gradient the
  // next stage sent for its output.
  Tensor x = leaf({1, 2, 3});
  Tensor w = leaf({0.5, -1, 2});
  Tensor y = x * w + x * x;  // dy/dx = w + 2x, dy/dw = x
  Tensor dy = Tensor::fromVector<double>({1, 10, 100}, {3});
  backward({y}, {dy});
  REQUIRE(x.grad().toVector<double>() == std::vector<double>{2.5, 30, 800});
  REQUIRE(w.grad().toVector<double>() == std::vector<double>{1, 20, 300});
  // Without a gradient a non-scalar root is refused, and a gradient of the wrong shape too.
  Tensor z = x * w;
  REQUIRE_THROWS_AS(backward(z), Error);
  Tensor z2 = x * w;
  REQUIRE_THROWS_AS(backward({z2}, {Tensor::fromVector<double>({1, 2}, {2})}), Error);
}
