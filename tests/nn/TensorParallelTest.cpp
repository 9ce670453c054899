// Tensor parallelism (nn/TensorParallel.h) in one process: the ranks of a group are threads, and the group's
// collectives meet in memory. A GPT split over two of them computes the one-rank model's loss, and each
// rank's gradients are its slices of the one-rank gradients.
#include <barrier>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "TestUtil.h"
#include "strata/nn/TensorParallel.h"

using namespace strata;

namespace {

// The collectives of `size` threads: each rank puts its tensor in its slot, all wait, each reads all slots
// in rank order, all wait again (so no slot is overwritten while another rank reads it).
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), sync_(size), slots_(size_t(size)) {}

  nn::TensorParallel member(int rank) {
    nn::TensorParallel tp;
    tp.size = size_;
    tp.rank = rank;
    tp.allReduceSum = [this, rank](const Tensor& t) { reduce(rank, t, false); };
    tp.allReduceMax = [this, rank](const Tensor& t) { reduce(rank, t, true); };
    tp.allGather = [this, rank](const Tensor& out, const Tensor& in) {
      std::vector<Tensor> all = exchange(rank, in);
      ops::copy(out, ops::cat(all, 0).view(out.shape()));
      sync_.arrive_and_wait();
    };
    tp.reduceScatter = [this, rank](const Tensor& out, const Tensor& in) {
      std::vector<Tensor> all = exchange(rank, in);
      Tensor acc = all[0];
      for (int r = 1; r < size_; ++r) acc = ops::add(acc, all[size_t(r)]);
      sync_.arrive_and_wait();
      ops::copy(out, acc.narrow(0, out.numel() * rank, out.numel()).view(out.shape()));
    };
    return tp;
  }

 private:
  std::vector<Tensor> exchange(int rank, const Tensor& t) {
    slots_[size_t(rank)] = t.clone().view({t.numel()});
    sync_.arrive_and_wait();
    return slots_;
  }
  void reduce(int rank, const Tensor& t, bool max) {
    std::vector<Tensor> all = exchange(rank, t);
    Tensor acc = all[0];
    for (int r = 1; r < size_; ++r)
      acc = max ? ops::maximum(acc, all[size_t(r)]) : ops::add(acc, all[size_t(r)]);
    sync_.arrive_and_wait();
    ops::copy(t, acc.view(t.shape()));
  }

  int size_;
  std::barrier<> sync_;
  std::vector<Tensor> slots_;
};

models::ModelSpec tinyGpt() {
  models::ModelSpec s = test::tinyZooSpec("gpt", 64, 0);
  s.numLayers = 2;
  return s;
}

}  // namespace

TEST_CASE("a GPT split over two tensor-parallel ranks computes the one-rank loss and gradient slices",
          "[nn][tensor]") {
  // Without and with sequence parallelism (NOTE [Sequence parallelism]).
  bool sequenceParallel = GENERATE(false, true);
  INFO("sequence parallel " << sequenceParallel);
  std::vector<int64_t> a, b;
  for (int64_t i = 0; i < 32; ++i) {
    a.push_back((i * 37 + 5) % 64);
    b.push_back((i * 11 + 3) % 64);
  }
  Tensor ids = Tensor::fromVector<int64_t>(a, {2, 16}), targets = Tensor::fromVector<int64_t>(b, {2, 16});
  auto reference = models::buildModel(tinyGpt());
  Tensor referenceLoss = reference->loss(ids, targets, DType::F32);
  backward(referenceLoss);
  std::map<std::string, Tensor> full;
  for (auto& [name, p] : reference->namedParameters()) full[name] = p.grad();
  Tensor referenceLogits = reference->logits(ids, DType::F32);
  // A sequence that does not split evenly (sequence parallelism pads it).
  Tensor shortIds = ids.narrow(1, 0, 15).contiguous(), shortTargets = targets.narrow(1, 0, 15).contiguous();
  Tensor referenceShortLogits = reference->logits(shortIds, DType::F32);
  double referenceShortLoss = reference->loss(shortIds, shortTargets, DType::F32).item();

  const int size = 2;
  ThreadGroup group(size);
  std::vector<double> losses(size);
  std::vector<Tensor> logits(size), shortLogits(size);
  std::vector<double> shortLosses(size);
  std::vector<std::map<std::string, std::pair<Tensor, Tensor>>> grads(size);  // name -> (value, gradient)
  std::vector<std::map<std::string, nn::TensorSlice>> slices(size);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < size; ++rank)
    ranks.emplace_back([&, rank] {
      models::ModelSpec spec = tinyGpt();
      spec.tensorParallel = group.member(rank);
      spec.tensorParallel.sequenceParallel = sequenceParallel;
      auto model = models::buildModel(spec);
      Tensor loss = model->loss(ids, targets, DType::F32);
      backward(loss);
      losses[size_t(rank)] = loss.item();
      for (auto& [name, p] : model->namedParameters()) grads[size_t(rank)][name] = {p, p.grad()};
      slices[size_t(rank)] = nn::tensorParallelSlices(*model);
      logits[size_t(rank)] = model->logits(ids, DType::F32);
      shortLogits[size_t(rank)] = model->logits(shortIds, DType::F32);
      shortLosses[size_t(rank)] = model->loss(shortIds, shortTargets, DType::F32).item();
    });
  for (auto& t : ranks) t.join();

  // The ranks' slices join into the one-rank model's parameters (what a checkpoint's readers do).
  for (auto& [name, p] : reference->namedParameters()) {
    INFO(name);
    auto how = slices[0].find(name);
    Tensor joined = how == slices[0].end()
                        ? grads[0].at(name).first
                        : nn::joinSlices({grads[0].at(name).first, grads[1].at(name).first}, how->second);
    CHECK(joined.toVector<float>() == p.toVector<float>());
  }
  // The slices: the q/k/v, fc and proj weights, fc's and qkv's biases, and the token table.
  CHECK(slices[0].count("wte.weight") == 1);
  CHECK(slices[0].count("h.1.attn.qkv.bias") == 1);
  CHECK(slices[0].count("h.1.attn.proj.weight") == 1);
  CHECK(slices[0].count("h.1.attn.proj.bias") == 0);
  CHECK(slices[0].count("h.0.mlp.fc.weight") == 1);
  CHECK(slices[0].count("h.0.ln_1.weight") == 0);
  CHECK(slices[0].count("wpe.weight") == 0);
  for (int rank = 0; rank < size; ++rank) {
    INFO("rank " << rank);
    CHECK(losses[size_t(rank)] == Approx(referenceLoss.item()).epsilon(1e-6));
    test::requireClose(logits[size_t(rank)], referenceLogits);
    test::requireClose(shortLogits[size_t(rank)], referenceShortLogits);
    CHECK(shortLosses[size_t(rank)] == Approx(referenceShortLoss).epsilon(1e-6));
    for (auto& [name, valueGrad] : grads[size_t(rank)]) {
      INFO(name);
      const Tensor& g = valueGrad.second;
      Tensor expected = full.at(name);
      // The slice this rank holds of the one-rank gradient (NOTE [Tensor parallelism]).
      if (name == "wte.weight") {
        expected = expected.narrow(0, 32 * rank, 32);
      } else if (name.find("qkv") != std::string::npos) {
        expected = nn::columnSlice(expected, 3, size, rank);
      } else if (name.find("mlp.fc") != std::string::npos) {
        expected = nn::columnSlice(expected, 1, size, rank);
      } else if (name.find("proj.weight") != std::string::npos) {
        int64_t rows = expected.size(0) / size;
        expected = expected.narrow(0, rows * rank, rows);
      }
      test::requireClose(g, expected, 1e-6, 1e-4);
    }
  }
}

TEST_CASE("the vocabulary-parallel cross-entropy on one rank is the cross-entropy", "[nn][tensor]") {
  Tensor target = Tensor::fromVector<int64_t>({1, 9, -100, 0, 4, 4}, {6});
  Tensor a = test::randomDouble({6, 10}, 7, -3, 3), b = a.clone();
  a.setRequiresGrad(true);
  b.setRequiresGrad(true);
  Tensor loss = nn::vocabParallelCrossEntropy(a, target, nn::TensorParallel{});
  Tensor reference = crossEntropy(b, target);
  backward(loss * 0.5);
  backward(reference * 0.5);
  CHECK(loss.item() == Approx(reference.item()).epsilon(1e-12));
  test::requireClose(a.grad(), b.grad(), 1e-12, 1e-10);
  test::gradCheck(
      [target](const std::vector<Tensor>& x) {
        return nn::vocabParallelCrossEntropy(x[0], target, nn::TensorParallel{});
      },
      {test::randomDouble({6, 10}, 9, -2, 2)});
}

TEST_CASE(
    "a tensor-parallel rank draws its own random numbers inside TensorParallelRandom and the shared ones "
    "outside",
    "[nn][tensor]") {
  auto draws = [](int rank, bool own) {
    Generator gen(5);
    nn::TensorParallel tp;
    tp.size = 2;
    tp.rank = rank;
    std::vector<float> inside;
    {
      nn::TensorParallelRandom stream(tp, own, gen);
      inside = ops::rand({8}, gen).toVector<float>();
    }
    std::vector<float> after = ops::rand({8}, gen).toVector<float>();
    return std::make_tuple(inside, after, gen.state().seed, gen.state().offset);
  };
  auto [own0, after0, seed0, offset0] = draws(0, true);
  auto [own1, after1, seed1, offset1] = draws(1, true);
  auto [shared, plainAfter, plainSeed, plainOffset] = draws(1, false);
  // Inside: each rank its own numbers, neither the shared ones.
  CHECK(own0 != own1);
  CHECK(own0 != shared);
  CHECK(own1 != shared);
  // After: the shared stream, at the same offset on every rank.
  CHECK(after0 == plainAfter);
  CHECK(after1 == plainAfter);
  CHECK((seed0 == 5 && seed1 == 5 && plainSeed == 5));
  CHECK((offset0 == plainOffset && offset1 == plainOffset));
}

TEST_CASE("with dropout the ranks of a tensor-parallel group keep the whole parameters' gradients equal",
          "[nn][tensor]") {
  // The residual stream's dropout must draw one mask on every rank, the heads' their own (NOTE
  // [Tensor-parallel random streams]): the whole parameters' gradients then agree bit for bit.
  bool sequenceParallel = GENERATE(false, true);
  INFO("sequence parallel " << sequenceParallel);
  std::vector<int64_t> a;
  for (int64_t i = 0; i < 32; ++i) a.push_back((i * 37 + 5) % 64);
  Tensor ids = Tensor::fromVector<int64_t>(a, {2, 16});
  ThreadGroup group(2);
  std::vector<std::map<std::string, Tensor>> grads(2);
  std::vector<std::map<std::string, nn::TensorSlice>> slices(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.emplace_back([&, rank] {
      defaultGenerator().manualSeed(11);
      models::ModelSpec spec = tinyGpt();
      spec.dropout = 0.2;
      spec.tensorParallel = group.member(rank);
      spec.tensorParallel.sequenceParallel = sequenceParallel;
      auto model = models::buildModel(spec);
      backward(model->loss(ids, ids, DType::F32));
      for (auto& [name, p] : model->namedParameters()) grads[size_t(rank)][name] = p.grad();
      slices[size_t(rank)] = nn::tensorParallelSlices(*model);
    });
  for (auto& t : ranks) t.join();
  for (auto& [name, g] : grads[0]) {
    if (slices[0].count(name)) continue;
    INFO(name);
    CHECK(g.toVector<float>() == grads[1].at(name).toVector<float>());
  }
}
