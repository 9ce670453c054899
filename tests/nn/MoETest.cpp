// The MoE layer (nn/MoE.h, NOTE [MoE dispatch]): routing, capacity and drops on hand-built routings, the
// output against a dense reference, gradients through the router and the dispatch, the auxiliary losses.
#include <algorithm>
#include <cmath>
#include <vector>

#include "TestUtil.h"
#include "strata/autograd/Engine.h"
#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"
#include "strata/nn/MoE.h"

using namespace strata;

namespace {

nn::MoEConfig smallMoE(int64_t experts, int64_t k, double capacityFactor) {
  nn::MoEConfig c;
  c.hiddenSize = 4;
  c.ffnHiddenSize = 8;
  c.numExperts = experts;
  c.topK = k;
  c.capacityFactor = capacityFactor;
  c.evalCapacityFactor = capacityFactor;
  return c;
}

// Router weights [C, E] that send a token whose feature `e` is largest to expert e (for C == E).
void identityRouter(nn::MoE& moe, double scale) {
  int64_t C = moe.config().hiddenSize, E = moe.config().numExperts;
  std::vector<double> w(size_t(C * E), 0.0);
  for (int64_t i = 0; i < std::min(C, E); ++i) w[size_t(i * E + i)] = scale;
  NoGradGuard noGrad;
  ops::copy(moe.router().weight, Tensor::fromVector<double>(w, {C, E}).to(moe.router().weight.dtype()));
}

// Tokens whose largest feature is `route[n]`.
Tensor tokensFor(const std::vector<int64_t>& route, int64_t C, DType dtype) {
  std::vector<double> v(route.size() * size_t(C), 0.1);
  for (size_t n = 0; n < route.size(); ++n) {
    for (int64_t c = 0; c < C; ++c) v[n * size_t(C) + size_t(c)] = 0.1 * double(c + 1) / double(C) - 0.05;
    v[n * size_t(C) + size_t(route[n])] = 1.0 + 0.01 * double(n);
  }
  return Tensor::fromVector<double>(v, {int64_t(route.size()), C}).to(dtype);
}

}  // namespace

TEST_CASE("MoE drops exactly the choices past their expert's capacity, and they pass as zeros", "[nn][moe]") {
  Generator gen(5);
  // 6 tokens, 4 experts, top-1, capacity factor 1: capacity ceil(6 / 4) = 2.
  nn::MoE moe(smallMoE(4, 1, 1.0), gen);
  identityRouter(moe, 20.0);
  std::vector<int64_t> route = {0, 0, 1, 0, 2, 0};  // expert 0 gets 4 tokens: the last two drop
  Tensor x = tokensFor(route, 4, DType::F32);
  Tensor y = moe.apply(x);
  const nn::MoEStats& s = moe.stats();
  REQUIRE(s.capacity == 2);
  REQUIRE(s.choices == 6);
  REQUIRE(s.dropped == 2);
  REQUIRE(s.tokensPerExpert == std::vector<int64_t>{2, 1, 1, 0});
  REQUIRE(s.droppedFraction() == Approx(2.0 / 6.0));
  std::vector<float> out = y.toVector<float>();
  auto rowZero = [&](int64_t n) {
    for (int64_t c = 0; c < 4; ++c)
      if (out[size_t(n * 4 + c)] != 0.0f) return false;
    return true;
  };
  // Tokens 3 and 5 (expert 0's third and fourth) dropped; the others went through an expert.
  for (int64_t n = 0; n < 6; ++n) {
    INFO("token " << n);
    REQUIRE(rowZero(n) == (n == 3 || n == 5));
  }
  // A capacity that holds everything drops nothing.
  nn::MoE roomy(smallMoE(4, 1, 4.0), gen);
  identityRouter(roomy, 20.0);
  roomy.apply(x);
  REQUIRE(roomy.stats().dropped == 0);
  // Top-2: every token's first choice is placed before any second choice takes a slot.
  nn::MoE two(smallMoE(4, 2, 1.0), gen);  // capacity ceil(12 / 4) = 3
  identityRouter(two, 20.0);
  two.apply(x);
  REQUIRE(two.stats().capacity == 3);
  // Expert 0 is every token's first or second choice: 4 firsts (3 kept), then no room for seconds.
  REQUIRE(two.stats().tokensPerExpert[0] == 3);
}

TEST_CASE("every expert runs every pass: one without tokens gets exactly zero gradients", "[nn][moe]") {
  Generator gen(9);
  nn::MoE moe(smallMoE(4, 1, 4.0), gen);
  identityRouter(moe, 20.0);
  Tensor x = tokensFor({0, 1, 1, 0}, 4, DType::F32);  // experts 2 and 3 get no token
  x.setRequiresGrad(true);
  std::vector<int> calls(4, 0);
  for (int e = 0; e < 4; ++e)
    moe.expert(size_t(e)).addForwardPreHook(
        [&calls, e](nn::Module&, const std::vector<Tensor>&) { ++calls[size_t(e)]; });
  Tensor y = moe.apply(x);
  REQUIRE(moe.stats().tokensPerExpert == std::vector<int64_t>{2, 2, 0, 0});
  REQUIRE(calls == std::vector<int>{1, 1, 1, 1});
  backward(sum(y * y));
  for (int e = 0; e < 4; ++e) {
    INFO("expert " << e);
    for (auto& [name, p] : moe.expert(size_t(e)).namedParameters()) {
      REQUIRE(p.grad().defined());
      std::vector<float> g = p.grad().toVector<float>();
      bool zero = std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; });
      // Experts with tokens learn; the idle ones' zero row teaches them nothing.
      if (name.find("weight") != std::string::npos) REQUIRE(zero == (e >= 2));
      if (e >= 2) REQUIRE(zero);
    }
  }
}

TEST_CASE("MoE equals a dense reference: each token through its chosen experts, weighted by the router",
          "[nn][moe]") {
  for (int64_t k : {1, 2}) {
    INFO("top-" << k);
    Generator gen(9);
    nn::MoE moe(smallMoE(3, k, 10.0), gen);  // no drops
    Tensor x = test::randomDouble({2, 5, 4}, 31).to(DType::F32);
    Tensor y = moe.apply(x);
    REQUIRE(moe.stats().dropped == 0);
    NoGradGuard noGrad;
    Tensor xf = x.reshape({10, 4});
    std::vector<float> probs = softmax(linear(xf, moe.router().weight), -1).toVector<float>();
    std::vector<float> got = y.reshape({10, 4}).toVector<float>();
    for (int64_t n = 0; n < 10; ++n) {
      std::vector<int64_t> order = {0, 1, 2};
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return probs[size_t(n * 3 + a)] > probs[size_t(n * 3 + b)];
      });
      double total = 0;
      for (int64_t j = 0; j < k; ++j) total += probs[size_t(n * 3 + order[size_t(j)])];
      std::vector<double> want(4, 0.0);
      for (int64_t j = 0; j < k; ++j) {
        int64_t e = order[size_t(j)];
        double w = probs[size_t(n * 3 + e)] / (k == 2 ? total : 1.0);
        std::vector<float> ye = moe.expert(size_t(e)).apply(xf.narrow(0, n, 1)).toVector<float>();
        for (int64_t c = 0; c < 4; ++c) want[size_t(c)] += w * double(ye[size_t(c)]);
      }
      for (int64_t c = 0; c < 4; ++c) REQUIRE(got[size_t(n * 4 + c)] == Approx(want[size_t(c)]).margin(1e-6));
    }
  }
}

TEST_CASE("MoE gradients through the router and the dispatch match finite differences", "[nn][moe][grad]") {
  for (int64_t k : {1, 2}) {
    INFO("top-" << k);
    Generator gen(13);
    nn::MoE moe(smallMoE(3, k, 10.0), gen);  // no drops: the routing is constant near the point
    moe.castParameters(DType::F64);
    Tensor x = test::randomDouble({6, 4}, 41);
    Tensor router = moe.router().weight;
    size_t busiest = 0;
    {
      NoGradGuard noGrad;
      moe.apply(x);
      const auto& load = moe.stats().tokensPerExpert;
      busiest = size_t(std::max_element(load.begin(), load.end()) - load.begin());
    }
    Tensor fc = moe.expert(busiest).namedParameters()[0].second;
    // The output and the weighted auxiliary losses, both differentiated.
    test::gradCheck(
        [&](const std::vector<Tensor>& in) {
          Tensor y = moe.apply(in[0]);
          return sum(y * y) + moe.auxLoss() * 10.0;
        },
        {x, router, fc}, 1e-6, 1e-6, 1e-4);
  }
}

TEST_CASE("MoE's load-balancing loss and z-loss", "[nn][moe]") {
  Generator gen(3);
  nn::MoE moe(smallMoE(4, 1, 4.0), gen);
  {
    // A zero router: uniform probabilities, so sum_e f_e P_e = 1 / E and the balance loss is 1 whatever
    // the first choices; the logits are 0, so logsumexp = log E.
    NoGradGuard noGrad;
    ops::fill(moe.router().weight, 0.0);
  }
  moe.apply(test::randomDouble({8, 4}, 3).to(DType::F32));
  REQUIRE(moe.stats().auxLossValue() == Approx(1.0).epsilon(1e-6));
  REQUIRE(moe.stats().zLossValue() == Approx(std::log(4.0) * std::log(4.0)).epsilon(1e-6));
  double weighted = moe.auxLoss().item();
  REQUIRE(weighted == Approx(0.01 * 1.0 + 0.001 * std::log(4.0) * std::log(4.0)).epsilon(1e-6));
  // Every token to expert 0 with certainty: f = (1, 0, 0, 0), P ~ (1, 0, 0, 0): the balance loss is E.
  identityRouter(moe, 200.0);
  moe.apply(tokensFor({0, 0, 0, 0}, 4, DType::F32));
  REQUIRE(moe.stats().auxLossValue() == Approx(4.0).epsilon(1e-3));
}
