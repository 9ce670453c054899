#include <map>
#include <set>

#include "TestUtil.h"
#include "strata/nn/Embedding.h"
#include "strata/nn/Linear.h"
#include "strata/nn/ModuleList.h"
#include "strata/nn/TransformerBlock.h"

using namespace strata;

namespace {
class Affine : public nn::Module {
 public:
  Affine(int64_t in, int64_t out, uint64_t seed) {
    Generator gen(seed);
    weight_ = registerParameter("weight", ops::randn({in, out}, gen, DType::F64));
    bias_ = registerParameter("bias", ops::zeros({out}, DType::F64));
  }
  Tensor weight_, bias_;

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& in) override {
    return {matmul(in[0], weight_) + bias_};
  }
};

class TwoLayer : public nn::Module {
 public:
  TwoLayer() {
    first = registerModule("first", std::make_shared<Affine>(4, 8, 1));
    second = registerModule("second", std::make_shared<Affine>(8, 2, 2));
  }
  std::shared_ptr<Affine> first, second;

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& in) override {
    Tensor h = tanh((*first)(in[0]));
    return {(*second)(h)};
  }
};
}  // namespace

TEST_CASE("modules name their parameters and switch train/eval", "[nn][module]") {
  TwoLayer net;
  auto named = net.namedParameters();
  REQUIRE(named.size() == 4);
  REQUIRE(named[0].first == "first.weight");
  REQUIRE(named[3].first == "second.bias");
  REQUIRE(net.numParameters() == 4 * 8 + 8 + 8 * 2 + 2);
  REQUIRE(named[0].second.requiresGrad());
  net.eval();
  REQUIRE(!net.second->isTraining());
  net.train();
  REQUIRE(net.first->isTraining());
  REQUIRE(net.namedModules().size() == 3);
  REQUIRE_THROWS_AS(net.first->registerParameter("weight", ops::zeros({1})), Error);
}

TEST_CASE("module hooks fire in forward and backward order", "[nn][module][hooks]") {
  TwoLayer net;
  std::vector<std::string> events;
  for (auto& [name, m] : net.namedModules()) {
    if (name.empty()) continue;
    std::string n = name;
    m->addForwardPreHook(
        [&events, n](nn::Module&, const std::vector<Tensor>&) { events.push_back("pre:" + n); });
    m->addForwardHook([&events, n](nn::Module&, const std::vector<Tensor>&, const std::vector<Tensor>&) {
      events.push_back("post:" + n);
    });
    m->addBackwardPreHook([&events, n](nn::Module&) { events.push_back("bwd-pre:" + n); });
    m->addBackwardHook([&events, n](nn::Module&) { events.push_back("bwd-post:" + n); });
  }
  Tensor x = test::randomDouble({3, 4}, 3);
  x.setRequiresGrad(true);
  Tensor loss = sum(net(x));
  REQUIRE(events == std::vector<std::string>{"pre:first", "post:first", "pre:second", "post:second"});
  events.clear();
  backward(loss);
  REQUIRE(events ==
          std::vector<std::string>{"bwd-pre:second", "bwd-post:second", "bwd-pre:first", "bwd-post:first"});
  for (auto& [name, p] : net.namedParameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
  }
}

TEST_CASE("hooked modules compute the same gradients as unhooked ones", "[nn][module][hooks]") {
  TwoLayer plain, hooked;
  hooked.first->addBackwardPreHook([](nn::Module&) {});
  hooked.second->addBackwardHook([](nn::Module&) {});
  Tensor x = test::randomDouble({3, 4}, 4);
  x.setRequiresGrad(true);
  backward(sum(plain(x)));
  Tensor gx = x.grad();
  x.setGrad(Tensor());
  backward(sum(hooked(x)));
  test::requireClose(x.grad(), gx, 1e-12, 1e-12);
  test::requireClose(hooked.first->weight_.grad(), plain.first->weight_.grad(), 1e-12, 1e-12);
}

TEST_CASE("nn::Linear keeps its weight in x out, the transpose of PyTorch's, and computes x W + b", "[nn]") {
  Generator gen(9);
  nn::Linear lin(nn::LinearConfig{3, 2, true, 0.02, Device::cpu()}, gen);
  REQUIRE(lin.weight.shape() == Shape{3, 2});
  REQUIRE(lin.bias.shape() == Shape{2});
  // Row i holds input i's weights: W = [[1, 2], [3, 4], [5, 6]], b = [10, 20].
  ops::copy(lin.weight, Tensor::fromVector<float>({1, 2, 3, 4, 5, 6}, {3, 2}));
  ops::copy(lin.bias, Tensor::fromVector<float>({10, 20}, {2}));
  Tensor y = lin.apply(Tensor::fromVector<float>({1, 0, 1}, {1, 3}));
  REQUIRE(y.toVector<float>() == std::vector<float>{16, 28});
}

TEST_CASE("layers compute in their parameters' dtype; castParameters converts a model in place", "[nn]") {
  Generator gen(7);
  nn::Linear lin(nn::LinearConfig{16, 12, true, 0.02, Device::cpu()}, gen);
  Tensor x = ops::rand({3, 5, 16}, gen, DType::F32, Device::cpu(), -1, 1).to(DType::BF16);
  std::string error = test::errorOf([&] { lin.apply(x); });
  REQUIRE(error.find("castParameters") != std::string::npos);
  std::vector<double> before = lin.weight.toVector<double>();
  Tensor handle = lin.weight;  // the same tensor before and after
  lin.castParameters(DType::BF16);
  REQUIRE(handle.dtype() == DType::BF16);
  REQUIRE(lin.weight.dtype() == DType::BF16);
  REQUIRE(handle.toVector<double>() ==
          Tensor::fromVector<double>(before, {16, 12}).to(DType::BF16).toVector<double>());
  Tensor y = lin.apply(x);
  REQUIRE(y.dtype() == DType::BF16);
  backward(sum(y.to(DType::F32)));
  REQUIRE(lin.weight.grad().dtype() == DType::BF16);  // no gradient buffer: the parameter's own dtype
}

TEST_CASE("a block on a split residual stream equals the block on its sum", "[nn]") {
  // forward({x, pending}) leaves the adds to the norms; its two outputs must sum to block(x + pending), with
  // the same gradients.
  Generator gen(3);
  nn::TransformerBlockConfig cfg;
  cfg.attention = nn::AttentionConfig{16, 2, true, false, true, 0.0, 0.02, 0.02, Device::cpu()};
  cfg.mlp = nn::MlpConfig{16, 64, true, 0.0, 0.02, 0.02, Device::cpu()};
  nn::TransformerBlock block(cfg, gen);
  Tensor ys[2], gx[2], gp[2], gw[2];
  for (int path = 0; path < 2; ++path) {
    block.zeroGrad();
    Tensor x = test::randomDouble({2, 5, 16}, 70).to(DType::F32),
           p = test::randomDouble({2, 5, 16}, 71).to(DType::F32);
    x.setRequiresGrad(true);
    p.setRequiresGrad(true);
    Tensor y;
    if (path == 0) {
      y = block(x + p);
    } else {
      std::vector<Tensor> out = block(std::vector<Tensor>{x, p});
      REQUIRE(out.size() == 2);
      y = out[0] + out[1];
    }
    backward(sum(y * y));
    ys[path] = y.detach();
    gx[path] = x.grad();
    gp[path] = p.grad();
    gw[path] = block.namedParameters().front().second.grad().clone();
  }
  test::requireClose(ys[1], ys[0], 1e-6, 1e-5);
  test::requireClose(gx[1], gx[0], 1e-6, 1e-5);
  test::requireClose(gp[1], gp[0], 1e-6, 1e-5);
  test::requireClose(gw[1], gw[0], 1e-6, 1e-5);
}

namespace {
// Counts each module's hook firings by kind ("pre", "post", "bwd-pre", "bwd-post").
struct HookCounter {
  std::map<std::string, int> counts;
  void attach(nn::Module& root) {
    for (auto& [name, m] : root.namedModules()) {
      std::string n = name.empty() ? "root" : name;
      m->addForwardPreHook([this, n](nn::Module&, const std::vector<Tensor>&) { counts["pre:" + n]++; });
      m->addForwardHook([this, n](nn::Module&, const std::vector<Tensor>&, const std::vector<Tensor>&) {
        counts["post:" + n]++;
      });
      m->addBackwardPreHook([this, n](nn::Module&) { counts["bwd-pre:" + n]++; });
    }
  }
  int operator()(const std::string& key) const {
    auto it = counts.find(key);
    return it == counts.end() ? 0 : it->second;
  }
};

// Every node reachable from t, by name.
std::multiset<std::string> graphNodes(const Tensor& t) {
  std::multiset<std::string> names;
  std::set<autograd::Node*> seen;
  std::vector<autograd::Node*> stack{t.gradFn().get()};
  while (!stack.empty()) {
    autograd::Node* n = stack.back();
    stack.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    names.insert(n->name());
    for (auto& e : n->nextEdges())
      if (e.valid()) stack.push_back(e.node.get());
  }
  return names;
}

nn::TransformerBlockConfig smallBlock() {
  nn::TransformerBlockConfig cfg;
  cfg.attention = nn::AttentionConfig{16, 2, true, false, true, 0.0, 0.02, 0.02, Device::cpu()};
  cfg.mlp = nn::MlpConfig{16, 64, true, 0.0, 0.02, 0.02, Device::cpu()};
  return cfg;
}

// A module whose implementation calls its own entry point.
class SelfCalling : public nn::Module {
 public:
  SelfCalling() { weight = registerParameter("weight", ops::ones({3}, DType::F64)); }
  Tensor twice(const Tensor& x) {
    return call({x}, [this](const std::vector<Tensor>& in) { return forward({in[0] * 2.0}); })[0];
  }
  Tensor weight;

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& in) override { return {in[0] * weight}; }
};
}  // namespace

TEST_CASE("every entry point of a layer is a call that runs its hooks", "[nn][module][hooks]") {
  Generator gen(5);
  Tensor x = ops::rand({2, 3, 16}, gen, DType::F32, Device::cpu(), -1, 1);

  nn::Linear linear(nn::LinearConfig{16, 8, true, 0.02, Device::cpu()}, gen);
  HookCounter lin;
  lin.attach(linear);
  linear.apply(x);
  linear(x);
  linear.forward({x});
  REQUIRE(lin("pre:root") == 3);
  REQUIRE(lin("post:root") == 3);

  nn::LayerNorm norm(nn::NormConfig{16, 1e-5, true, Device::cpu()});
  HookCounter ln;
  ln.attach(norm);
  norm.apply(x);
  norm.applyResidual(x, x);
  REQUIRE(ln("pre:root") == 2);

  nn::Embedding table(nn::EmbeddingConfig{10, 16, 0.02, Device::cpu()}, gen);
  HookCounter emb;
  emb.attach(table);
  Tensor ids = Tensor::fromVector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  table.apply(ids, DType::F32);
  table.unembed(x, DType::F32);
  table.unembedCrossEntropy(x.reshape({-1, 16}), ids.reshape({-1}));
  REQUIRE(emb("pre:root") == 3);
  REQUIRE(emb("post:root") == 3);

  // The block's submodules, the MLP's fused fc and proj included, fire on every entry point.
  nn::TransformerBlock block(smallBlock(), gen);
  HookCounter blk;
  blk.attach(block);
  block.apply(x);
  block.applyStream(x, x);
  block(x);
  for (const char* m :
       {"root", "ln_1", "attn", "attn.qkv", "attn.proj", "ln_2", "mlp", "mlp.fc", "mlp.proj"}) {
    INFO(m);
    REQUIRE(blk(std::string("pre:") + m) == 3);
    REQUIRE(blk(std::string("post:") + m) == 3);
  }
  Tensor loss = sum(block.apply(x));
  backward(loss);
  for (const char* m :
       {"root", "ln_1", "attn", "attn.qkv", "attn.proj", "ln_2", "mlp", "mlp.fc", "mlp.proj"}) {
    INFO(m);
    REQUIRE(blk(std::string("bwd-pre:") + m) == 1);
  }
}

TEST_CASE("a call nested in a call of the same module runs its hooks once", "[nn][module][hooks]") {
  SelfCalling m;
  HookCounter c;
  c.attach(m);
  Tensor y = m.twice(Tensor::fromVector<double>({1, 2, 3}, {3}));
  REQUIRE(c("pre:root") == 1);
  REQUIRE(c("post:root") == 1);
  REQUIRE(y.toVector<double>() == std::vector<double>{2, 4, 6});
  backward(sum(y));
  REQUIRE(c("bwd-pre:root") == 1);
  // After the call, the module is called afresh.
  m.forward({Tensor::fromVector<double>({1, 2, 3}, {3})});
  REQUIRE(c("pre:root") == 2);
}

TEST_CASE("module calls add graph nodes only for backward hooks", "[nn][module][hooks]") {
  Generator gen(6);
  Tensor x = ops::rand({2, 3, 16}, gen, DType::F32, Device::cpu(), -1, 1);
  nn::TransformerBlock block(smallBlock(), gen);
  std::multiset<std::string> plain = graphNodes(block.apply(x));
  REQUIRE(plain.count("BackwardHook") == 0);
  // Forward hooks only: the same graph.
  for (auto& [name, m] : block.namedModules())
    m->addForwardPreHook([](nn::Module&, const std::vector<Tensor>&) {});
  REQUIRE(graphNodes(block.apply(x)) == plain);
  // A backward pre-hook on the MLP: one identity node, for the MLP's call.
  for (auto& [name, m] : block.namedModules())
    if (name == "mlp") m->addBackwardPreHook([](nn::Module&) {});
  std::multiset<std::string> hooked = graphNodes(block.apply(x));
  REQUIRE(hooked.count("BackwardHook") == 1);
  REQUIRE(hooked.size() == plain.size() + 1);
}

TEST_CASE("every parameter of a called module hears once per backward pass, used or not",
          "[nn][module][hooks]") {
  TwoLayer net;
  Tensor& spare = net.second->registerParameter("spare", ops::zeros({5}, DType::F64));
  std::map<std::string, std::vector<uint64_t>> heard;  // parameter -> passes it was notified in
  for (auto& [name, p] : net.namedParameters()) {
    std::string n = name;
    p.registerGradCompleteHook([&heard, n](Tensor&) { heard[n].push_back(autograd::currentBackwardPass()); });
  }
  Tensor x = test::randomDouble({3, 4}, 8);
  for (int micro = 0; micro < 2; ++micro) backward(sum(net(x)));
  // Two calls in one graph: still one notice each.
  backward(sum(net(x)) + sum(net(x)));
  for (auto& [name, p] : net.namedParameters()) {
    INFO(name);
    REQUIRE(heard[name].size() == 3);
    REQUIRE(heard[name][0] < heard[name][1]);
    REQUIRE(heard[name][1] < heard[name][2]);
  }
  REQUIRE(!spare.grad().defined());
  // Without grad recording nothing is queued, and nothing fires.
  {
    NoGradGuard noGrad;
    net(x);
  }
  REQUIRE(heard["second.spare"].size() == 3);
}

TEST_CASE("recomputation: a block keeps only its inputs, runs again in backward and gives the same gradients",
          "[nn][module][recompute]") {
  auto make = [&] {
    Generator g(11);
    auto list = std::make_shared<nn::ModuleList>();
    for (int i = 0; i < 2; ++i) list->append(std::make_shared<nn::TransformerBlock>(smallBlock(), g));
    return list;
  };
  Tensor x = test::randomDouble({2, 3, 16}, 72).to(DType::F32);
  std::map<std::string, std::vector<float>> grads[3];
  for (int mode = 0; mode < 3; ++mode) {
    auto list = make();
    nn::applyRecompute(*list, mode == 0   ? nn::Recompute::None
                              : mode == 1 ? nn::Recompute::Selective
                                          : nn::Recompute::Full);
    HookCounter counter;
    counter.attach(*list);
    Tensor out = (*list)(std::vector<Tensor>{x})[0];
    // Full: each block is one recomputation node in the graph (its own ops are recorded only in backward).
    REQUIRE(graphNodes(out).count("CheckpointBackward") == (mode == 2 ? 2u : 0u));
    backward(sum(out));
    // In backward the recomputed blocks' submodules are called again (their forward hooks fire twice).
    INFO("mode " << mode);
    REQUIRE(counter("pre:0.mlp") == (mode == 2 ? 2 : 1));
    for (auto& [name, p] : list->namedParameters()) grads[mode][name] = p.grad().toVector<float>();
  }
  REQUIRE(grads[1] == grads[0]);
  REQUIRE(grads[2] == grads[0]);
}
