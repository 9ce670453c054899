#include <cmath>

#include "TestUtil.h"
#include "strata/optim/AdamW.h"
#include "strata/optim/LossScaler.h"
#include "strata/optim/LrSchedule.h"

using namespace strata;

TEST_CASE("AdamW matches a scalar reference over several steps", "[optim][adamw]") {
  Tensor w = Tensor::fromVector<float>({0.5f, -1.0f, 2.0f, 0.25f}, {2, 2});
  w.setRequiresGrad(true);
  Tensor b = Tensor::fromVector<float>({0.1f, -0.2f}, {2});
  b.setRequiresGrad(true);
  optim::AdamWConfig cfg{0.01, 0.9, 0.95, 1e-8, 0.1};
  optim::AdamW opt({{"w", w}, {"b", b}}, cfg);
  std::vector<double> rw = {0.5, -1.0, 2.0, 0.25}, rb = {0.1, -0.2};
  std::vector<double> mw(4, 0), vw(4, 0), mb(2, 0), vb(2, 0);
  for (int step = 1; step <= 5; ++step) {
    // loss = sum(w^2) + 3 sum(b): grads 2w and 3.
    backward(sum(w * w) + sum(b) * 3.0);
    opt.step(cfg.lr);
    opt.zeroGrad();
    double c1 = 1 - std::pow(0.9, step), c2 = 1 - std::pow(0.95, step);
    for (int i = 0; i < 4; ++i) {
      double g = 2 * rw[i];
      mw[i] = 0.9 * mw[i] + 0.1 * g;
      vw[i] = 0.95 * vw[i] + 0.05 * g * g;
      rw[i] = rw[i] * (1 - 0.01 * 0.1) - 0.01 * (mw[i] / c1) / (std::sqrt(vw[i] / c2) + 1e-8);
    }
    for (int i = 0; i < 2; ++i) {  // biases get no weight decay
      double g = 3;
      mb[i] = 0.9 * mb[i] + 0.1 * g;
      vb[i] = 0.95 * vb[i] + 0.05 * g * g;
      rb[i] = rb[i] - 0.01 * (mb[i] / c1) / (std::sqrt(vb[i] / c2) + 1e-8);
    }
  }
  REQUIRE(test::closeness(w.toVector<double>(), rw, 1e-6, 1e-5) <= 1.0);
  REQUIRE(test::closeness(b.toVector<double>(), rb, 1e-6, 1e-5) <= 1.0);
  REQUIRE(opt.stepCount() == 5);
  REQUIRE(opt.namedState().size() == 4);
  REQUIRE(opt.namedState()[0].first == "m.w");
}

TEST_CASE("gradient norm and clipping coefficient", "[optim][clip]") {
  Tensor a = ops::zeros({2});
  a.setRequiresGrad(true);
  Tensor b = ops::zeros({1});
  b.setRequiresGrad(true);
  a.setGrad(Tensor::fromVector<float>({3, 0}, {2}));
  b.setGrad(Tensor::fromVector<float>({4}, {1}));
  Tensor norm = optim::gradNorm({a, b}, Device::cpu());
  REQUIRE(norm.item() == Approx(5.0));
  REQUIRE(optim::clipCoefficient(norm, 1.0).item() == Approx(0.2).epsilon(1e-5));
  REQUIRE(optim::clipCoefficient(norm, 10.0).item() == 1.0);
}

TEST_CASE("learning-rate schedules warm up and decay to min_lr", "[optim][schedule]") {
  optim::LrSchedule cosine{optim::LrStyle::Cosine, 1.0, 0.1, 10, 110};
  REQUIRE(cosine.at(0) == Approx(0.1));
  REQUIRE(cosine.at(9) == Approx(1.0));
  REQUIRE(cosine.at(10) == Approx(1.0));
  REQUIRE(cosine.at(60) == Approx(0.55));
  REQUIRE(cosine.at(110) == Approx(0.1));
  REQUIRE(cosine.at(500) == Approx(0.1));
  optim::LrSchedule linear{optim::LrStyle::Linear, 1.0, 0.0, 0, 100};
  REQUIRE(linear.at(50) == Approx(0.5));
  optim::LrSchedule constant{optim::LrStyle::Constant, 0.3, 0.0, 5, 100};
  REQUIRE(constant.at(2) == Approx(0.18));
  REQUIRE(constant.at(99) == Approx(0.3));
  REQUIRE_THROWS_AS(optim::lrStyleFromName("step"), Error);
}

TEST_CASE("dynamic loss scaling halves on overflow and grows after a window", "[optim][lossscale]") {
  optim::LossScaler scaler(optim::LossScalerConfig{1024.0, 3, 256.0});
  REQUIRE(scaler.scale() == 1024.0);
  REQUIRE_FALSE(scaler.update(INFINITY));
  REQUIRE(scaler.scale() == 512.0);
  REQUIRE_FALSE(scaler.update(NAN));
  REQUIRE_FALSE(scaler.update(INFINITY));
  REQUIRE(scaler.scale() == 256.0);  // never below the minimum
  REQUIRE(scaler.skippedSteps() == 3);
  REQUIRE(scaler.update(10.0));
  REQUIRE(scaler.update(10.0));
  REQUIRE(scaler.scale() == 256.0);
  REQUIRE(scaler.update(10.0));  // third good step in a row
  REQUIRE(scaler.scale() == 512.0);
}

TEST_CASE("bf16 copies of fp32 masters stay in step through AdamW updates and direct writes",
          "[optim][adamw][mixed]") {
  // With keepComputeCopies, linear() with bf16 input caches a bf16 copy of each fp32 master; AdamW rewrites
  // it with every update, and any other write into the master (here a checkpoint-style ops::copy) makes the
  // next forward recast it.
  Generator gen(11);
  Tensor w = ops::rand({16, 8}, gen, DType::F32, Device::cpu(), -0.5, 0.5);
  Tensor b = ops::rand({8}, gen, DType::F32, Device::cpu(), -0.5, 0.5);
  w.setRequiresGrad(true);
  b.setRequiresGrad(true);
  Tensor x = ops::rand({4, 16}, gen, DType::F32, Device::cpu(), -1, 1).to(DType::BF16);
  optim::AdamW opt({{"w", w}, {"b", b}}, optim::AdamWConfig{0.05, 0.9, 0.95, 1e-8, 0.1});
  // Without keepComputeCopies nothing is cached.
  linear(x, w, b);
  REQUIRE(!w.impl().castCache);
  keepComputeCopies({w, b});
  auto requireCopyMatches = [](const Tensor& master) {
    const auto& cache = master.impl().castCache;
    REQUIRE(cache);
    REQUIRE(cache->version == master.storage()->version());
    Tensor copy(cache->copy);
    REQUIRE(copy.dtype() == DType::BF16);
    // Bit for bit what a fresh cast gives.
    REQUIRE(copy.toVector<double>() == master.to(DType::BF16).toVector<double>());
  };
  std::shared_ptr<TensorImpl> last;
  for (int step = 0; step < 3; ++step) {
    Tensor y = linear(x, w, b);
    // From the second forward on, the copy AdamW rewrote is reused, not recast.
    if (step > 0) REQUIRE(w.impl().castCache->copy == last);
    backward(sum(y.to(DType::F32) * y.to(DType::F32)));
    opt.step(0.05);
    opt.zeroGrad();
    requireCopyMatches(w);
    requireCopyMatches(b);
    last = w.impl().castCache->copy;
  }
  // A direct write (as a checkpoint load does) leaves the copy stale until the next forward recasts it.
  auto before = w.impl().castCache->version;
  ops::copy(w.detach(), ops::zeros({16, 8}, DType::F32, Device::cpu()));
  REQUIRE(w.storage()->version() != before);
  Tensor y = linear(x, w, b);
  requireCopyMatches(w);
  REQUIRE(Tensor(w.impl().castCache->copy).toVector<double>() == std::vector<double>(128, 0.0));
  // The forward with zero weights gives the bias alone.
  REQUIRE(y.to(DType::F32).toVector<double>()[0] == Approx(b.to(DType::BF16).toVector<double>()[0]));
}

TEST_CASE("a backward after an optimizer step rewrote a saved weight copy fails loudly",
          "[optim][adamw][mixed]") {
  Generator gen(12);
  Tensor w = ops::rand({8, 4}, gen, DType::F32, Device::cpu(), -0.5, 0.5);
  w.setRequiresGrad(true);
  Tensor x = ops::rand({3, 8}, gen, DType::F32, Device::cpu(), -1, 1).to(DType::BF16);
  x.setRequiresGrad(true);
  keepComputeCopies({w});
  optim::AdamW opt({{"w", w}}, optim::AdamWConfig{});
  linear(x, w);  // makes the copy
  Tensor loss = sum(linear(x, w).to(DType::F32));
  backward({loss}, {}, /*retainGraph=*/true);
  opt.step(1e-3);  // rewrites the copy the graph saved
  std::string message;
  try {
    backward({loss}, {}, true);
  } catch (const Error& e) {
    message = e.what();
  }
  REQUIRE(message.find("written in place after the forward") != std::string::npos);
}
