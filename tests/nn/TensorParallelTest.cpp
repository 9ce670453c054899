// Tensor parallelism (nn/TensorParallel.h) in one process: the ranks of a group are threads, and the group's
// collectives meet in memory. A GPT split over two of them computes the one-rank model's loss, and each
// rank's gradients are its slices of the one-rank gradients.
#include <atomic>
#include <barrier>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <tuple>

#include "TestUtil.h"
#include "models/bert/Bert.h"
#include "models/t5/T5.h"
#include "strata/nn/TensorParallel.h"
#include "strata/nn/TransformerBlock.h"

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

// A tensor-parallel member whose sum all-reduces are counted, and whose first one's input (the first
// row-parallel partial product of a forward) is kept.
struct Counted {
  std::shared_ptr<std::atomic<int>> sums = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<Tensor> firstSum = std::make_shared<Tensor>();
  nn::TensorParallel wrap(nn::TensorParallel tp) const {
    auto inner = tp.allReduceSum;
    auto count = sums;
    auto first = firstSum;
    tp.allReduceSum = [inner, count, first](const Tensor& t) {
      if ((*count)++ == 0) *first = t.clone();
      inner(t);
    };
    return tp;
  }
};

// Every parameter's gradient of the two ranks of a split model, against the one-rank model's: a slice's
// gradients join into the one-rank gradient, a whole parameter's gradient is the one-rank gradient on each
// rank; and so do the values.
void checkSplitGradients(nn::Module& reference,
                         const std::vector<std::map<std::string, std::pair<Tensor, Tensor>>>& grads,
                         const std::map<std::string, nn::TensorSlice>& slices) {
  for (auto& [name, p] : reference.namedParameters()) {
    INFO(name);
    REQUIRE(grads[0].count(name) == 1);
    auto how = slices.find(name);
    auto joined = [&](bool gradient) {
      auto pick = [&](int r) {
        const auto& vg = grads[size_t(r)].at(name);
        return gradient ? vg.second : vg.first;
      };
      return how == slices.end() ? pick(0) : nn::joinSlices({pick(0), pick(1)}, how->second);
    };
    CHECK(joined(false).toVector<float>() == p.toVector<float>());
    REQUIRE(p.grad().defined());
    test::requireClose(joined(true), p.grad(), 1e-6, 1e-4);
    if (how == slices.end()) test::requireClose(grads[1].at(name).second, p.grad(), 1e-6, 1e-4);
  }
}

models::ModelSpec tinyGpt() {
  models::ModelSpec s = test::tinyZooSpec("gpt", 64, 0);
  s.numLayers = 2;
  return s;
}

// What each of two tensor-parallel thread ranks computed with `spec` split over them: its loss, its logits,
// every parameter's value and gradient, and rank 0's slices.
struct SplitRuns {
  std::vector<double> losses = std::vector<double>(2);
  std::vector<Tensor> logits = std::vector<Tensor>(2);
  std::vector<std::map<std::string, std::pair<Tensor, Tensor>>> grads =
      std::vector<std::map<std::string, std::pair<Tensor, Tensor>>>(2);
  std::map<std::string, nn::TensorSlice> slices;
};
// Builds `spec` split over two thread ranks and runs `step` on each: it returns the loss (backward runs
// here) and, after the backward, `logits` (or an undefined tensor) on the model.
template <class M>
SplitRuns runSplit(const models::ModelSpec& spec, const std::function<Tensor(M&)>& step,
                   const std::function<Tensor(M&)>& logits) {
  ThreadGroup group(2);
  SplitRuns out;
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.emplace_back([&, rank] {
      models::ModelSpec split = spec;
      split.tensorParallel = group.member(rank);
      auto model = std::dynamic_pointer_cast<M>(models::buildModule(split));
      Tensor loss = step(*model);
      backward(loss);
      out.losses[size_t(rank)] = loss.item();
      for (auto& [name, p] : model->namedParameters()) out.grads[size_t(rank)][name] = {p, p.grad()};
      if (rank == 0) out.slices = nn::tensorParallelSlices(*model);
      out.logits[size_t(rank)] = logits(*model);
    });
  for (auto& t : ranks) t.join();
  return out;
}
// Each rank's loss (and logits, where computed) is the one-rank model's; so are the joined gradients.
void checkSplitRuns(const SplitRuns& runs, nn::Module& reference, double loss, const Tensor& logits) {
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK(runs.losses[size_t(rank)] == Approx(loss).epsilon(1e-6));
    if (logits.defined()) test::requireClose(runs.logits[size_t(rank)], logits);
  }
  checkSplitGradients(reference, runs.grads, runs.slices);
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

TEST_CASE(
    "the vocabulary-parallel cross-entropy over two ranks is the one-rank cross-entropy, ignored and "
    "out-of-range targets too",
    "[nn][tensor]") {
  // -100 is ignored (not counted, no gradient); -1 and 10 lie outside the vocabulary of 10: counted, no loss
  // of their own, their rows' gradient the softmax alone, as ops::crossEntropy has it. Rank 0 holds ids 0-4,
  // rank 1 ids 5-9.
  Tensor target = Tensor::fromVector<int64_t>({1, 9, -100, 0, -1, 4, 10, 5}, {8});
  for (int64_t ignore : {int64_t(-100), int64_t(4)}) {
    INFO("ignore index " << ignore);
    Tensor logits = test::randomDouble({8, 10}, 3, -3, 3), whole = logits.clone();
    whole.setRequiresGrad(true);
    Tensor reference = crossEntropy(whole, target, ignore);
    backward(reference * 0.5);
    ThreadGroup group(2);
    std::vector<double> losses(2);
    std::vector<Tensor> grads(2);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank)
      ranks.emplace_back([&, rank] {
        Tensor mine = logits.narrow(1, 5 * rank, 5).contiguous();
        mine.setRequiresGrad(true);
        Tensor loss = nn::vocabParallelCrossEntropy(mine, target, group.member(rank), ignore);
        backward(loss * 0.5);
        losses[size_t(rank)] = loss.item();
        grads[size_t(rank)] = mine.grad();
      });
    for (auto& t : ranks) t.join();
    for (int rank = 0; rank < 2; ++rank) {
      INFO("rank " << rank);
      CHECK(losses[size_t(rank)] == Approx(reference.item()).epsilon(1e-12));
      test::requireClose(grads[size_t(rank)], whole.grad().narrow(1, 5 * rank, 5).contiguous(), 1e-12, 1e-10);
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

TEST_CASE(
    "a BERT split over two tensor-parallel ranks computes the one-rank MLM and NSP losses and gradients",
    "[nn][tensor]") {
  // Padding (the attention mask and [PAD] ids, whose word row takes no gradient on the rank holding it),
  // ignored labels, and the MLM head on chosen positions as training runs it.
  models::ModelSpec spec = test::tinyZooSpec("bert", 64, 0);
  spec.numLayers = 2;
  spec.bertBinaryHead = true;
  spec.dropout = 0;
  int64_t pad = 60;  // vocab - 4
  std::vector<int64_t> a, labels, mask;
  for (int64_t i = 0; i < 32; ++i) {
    bool padded = i % 16 >= 13;
    a.push_back(padded ? pad : (i * 37 + 5) % 64);
    mask.push_back(padded ? 0 : 1);
    labels.push_back(i % 3 == 0 && !padded ? (i * 11 + 3) % 64 : -100);
  }
  Tensor ids = Tensor::fromVector<int64_t>(a, {2, 16}),
         attention = Tensor::fromVector<int64_t>(mask, {2, 16});
  Tensor types = ops::zeros({2, 16}, DType::I64, Device::cpu());
  Tensor nsp = Tensor::fromVector<int64_t>({0, 1}, {2});
  Tensor positions = Tensor::fromVector<int64_t>({0, 3, 6, 9, 17, 20}, {6});
  Tensor chosen = Tensor::fromVector<int64_t>({7, -100, 12, 63, 1, 30}, {6});
  auto lossOf = [&](models::Bert& bert) {
    return bert.mlmLoss(ids, types, attention, Tensor::fromVector<int64_t>(labels, {2, 16}), DType::F32) +
           bert.pretrainingLoss(ids, types, attention, chosen, nsp, DType::F32, positions);
  };
  auto reference = std::dynamic_pointer_cast<models::Bert>(models::buildModule(spec));
  Tensor referenceLoss = lossOf(*reference);
  backward(referenceLoss);
  Tensor referenceLogits = reference->mlmLogits(ids, types, attention, DType::F32);

  SplitRuns runs = runSplit<models::Bert>(
      spec, lossOf, [&](models::Bert& bert) { return bert.mlmLogits(ids, types, attention, DType::F32); });
  const auto& slices = runs.slices;
  // The slices: the word table and the MLM bias (vocabulary), q/k/v and fc columns, the projections' rows.
  CHECK(slices.count("embeddings.word.weight") == 1);
  CHECK(slices.count("cls.bias") == 1);
  CHECK(slices.count("layer.1.attn.qkv.bias") == 1);
  CHECK(slices.count("layer.0.mlp.proj.weight") == 1);
  CHECK(slices.count("embeddings.position.weight") == 0);
  CHECK(slices.count("cls.transform.weight") == 0);
  CHECK(slices.count("pooler.weight") == 0);
  checkSplitRuns(runs, *reference, referenceLoss.item(), referenceLogits);
}

TEST_CASE("a T5 split over two tensor-parallel ranks computes the one-rank loss and gradients",
          "[nn][tensor]") {
  // v1.0 (ReLU, tied, scaled), v1.1 (gated GELU, untied head) and Switch (ReLU experts): self- and
  // cross-attention and the relative position bias split by heads.
  std::string variant = GENERATE("v1.0", "v1.1", "switch");
  INFO(variant);
  models::ModelSpec spec = test::tinyZooSpec("t5", 64, 8);
  spec.numLayers = 2;
  spec.dropout = 0;
  if (variant == "v1.1") {
    spec.activation = "gated_gelu";
    spec.untieEmbeddingsAndOutputWeights = true;
  }
  if (variant == "switch") {
    spec.moeNumExperts = 2;
    spec.moeEvery = 1;
    spec.moeCapacityFactor = 4;
  }
  std::vector<int64_t> a, labels, mask;
  for (int64_t i = 0; i < 32; ++i) {
    a.push_back((i * 37 + 5) % 64);
    mask.push_back(i % 16 < 14 ? 1 : 0);
  }
  for (int64_t i = 0; i < 16; ++i) labels.push_back(i % 8 == 7 ? -100 : (i * 13 + 2) % 64);
  Tensor ids = Tensor::fromVector<int64_t>(a, {2, 16}),
         attention = Tensor::fromVector<int64_t>(mask, {2, 16});
  Tensor target = Tensor::fromVector<int64_t>(labels, {2, 8});
  auto reference = std::dynamic_pointer_cast<models::T5>(models::buildModule(spec));
  Tensor referenceLoss = reference->loss(ids, attention, Tensor(), target, DType::F32);
  backward(referenceLoss);
  Tensor referenceLogits = reference->logits(ids, attention, models::t5ShiftRight(target), DType::F32);

  SplitRuns runs = runSplit<models::T5>(
      spec, [&](models::T5& t5) { return t5.loss(ids, attention, Tensor(), target, DType::F32); },
      [&](models::T5& t5) { return t5.logits(ids, attention, models::t5ShiftRight(target), DType::F32); });
  const auto& slices = runs.slices;
  CHECK(slices.count("shared.weight") == 1);
  CHECK(slices.count("encoder.relative_bias.weight") == 1);
  CHECK(slices.count("decoder.block.0.cross.kv.weight") == 1);
  CHECK(slices.count("decoder.block.0.cross.q.weight") == 1);
  CHECK(slices.count("decoder.block.1.cross_norm.weight") == 0);
  if (variant == "switch") {
    CHECK(slices.count("encoder.block.1.ff.experts.1.fc.weight") == 1);
    CHECK(slices.count("encoder.block.1.ff.router.weight") == 0);
  }
  checkSplitRuns(runs, *reference, referenceLoss.item(), referenceLogits);
}

TEST_CASE("a vocabulary-parallel embedding's padding row takes no gradient on the rank that holds it",
          "[nn][tensor]") {
  // Rows 0-7 on rank 0, 8-15 on rank 1; the padding id 10 is rank 1's row 2.
  Tensor ids = Tensor::fromVector<int64_t>({3, 10, 12, 10, 0, 15, 3}, {7});
  Tensor weights = test::randomDouble({7, 4}, 8, -1, 1).to(DType::F32);
  Generator referenceGen(2);
  nn::Embedding reference(nn::EmbeddingConfig{16, 4, 0.02, Device::cpu(), 10}, referenceGen);
  backward(sum(reference.apply(ids, DType::F32) * weights));
  ThreadGroup group(2);
  std::vector<Tensor> grads(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.emplace_back([&, rank] {
      nn::EmbeddingConfig config{16, 4, 0.02, Device::cpu(), 10};
      config.tensorParallel = group.member(rank);
      Generator gen(2);
      nn::Embedding table(config, gen);
      backward(sum(table.apply(ids, DType::F32) * weights));
      grads[size_t(rank)] = table.weight.grad();
    });
  for (auto& t : ranks) t.join();
  for (float g : grads[1].narrow(0, 2, 1).contiguous().toVector<float>()) CHECK(g == 0.0f);
  CHECK(ops::sumOfSquares({grads[1].narrow(0, 4, 1).contiguous()}).item() > 0);  // id 12 is not padding
  for (int rank = 0; rank < 2; ++rank)
    test::requireClose(grads[size_t(rank)], reference.weight.grad().narrow(0, 8 * rank, 8).contiguous(), 1e-7,
                       1e-6);
}

TEST_CASE("a GPT-MoE whose experts split over two tensor-parallel ranks computes the one-rank loss",
          "[nn][tensor][moe]") {
  // NOTE [Experts under tensor parallelism]: the router whole, each expert's fc and proj split; top-2 at a
  // capacity no token overflows, and the auxiliary losses in the loss (training mode).
  models::ModelSpec spec = tinyGpt();
  spec.moeNumExperts = 4;
  spec.moeTopK = 2;
  spec.moeEvery = 1;
  spec.moeCapacityFactor = 2;
  std::vector<int64_t> a, b;
  for (int64_t i = 0; i < 32; ++i) {
    a.push_back((i * 37 + 5) % 64);
    b.push_back((i * 11 + 3) % 64);
  }
  Tensor ids = Tensor::fromVector<int64_t>(a, {2, 16}), targets = Tensor::fromVector<int64_t>(b, {2, 16});
  auto reference = models::buildModel(spec);
  Tensor referenceLoss = reference->loss(ids, targets, DType::F32);
  backward(referenceLoss);
  SplitRuns runs = runSplit<nn::CausalLM>(
      spec, [&](nn::CausalLM& model) { return model.loss(ids, targets, DType::F32); },
      [](nn::CausalLM&) { return Tensor(); });
  const auto& slices = runs.slices;
  CHECK(slices.count("h.0.mlp.experts.3.fc.weight") == 1);
  CHECK(slices.count("h.0.mlp.experts.3.proj.weight") == 1);
  CHECK(slices.count("h.0.mlp.router.weight") == 0);
  checkSplitRuns(runs, *reference, referenceLoss.item(), Tensor());
  // Sequence parallelism is refused: the ranks would route different tokens.
  models::ModelSpec sequence = spec;
  sequence.tensorParallel.size = 2;
  sequence.tensorParallel.sequenceParallel = true;
  std::string refused = "no error";
  try {
    models::buildModel(sequence);
  } catch (const Error& e) {
    refused = e.what();
  }
  INFO(refused);
  CHECK(refused.find("parallel.sequence_parallel does not compose") != std::string::npos);
}

TEST_CASE("a recomputed tensor-parallel MLP all-reduces once forward and once backward", "[nn][tensor]") {
  // The non-fused MLP (ReLU, gated GELU) under selective recomputation: the recomputed tail repeats the
  // projection's partial product, not its all-reduce.
  bool gated = GENERATE(false, true);
  bool recompute = GENERATE(false, true);
  INFO("gated " << gated << ", recompute " << recompute);
  Tensor x = test::randomDouble({2, 4, 16}, 5, -1, 1).to(DType::F32);
  nn::MlpConfig config{16,   32,   true,          0.0,
                       0.02, 0.02, Device::cpu(), gated ? nn::Activation::GeluTanh : nn::Activation::Relu,
                       gated};
  Generator referenceGen(3);
  nn::Mlp reference(config, referenceGen);
  Tensor xr = x.clone();
  xr.setRequiresGrad(true);
  backward(sum(reference.apply(xr)));
  ThreadGroup group(2);
  std::vector<int> counts(2);
  std::vector<Tensor> inputGrads(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.emplace_back([&, rank] {
      Counted counted;
      nn::MlpConfig split = config;
      split.tensorParallel = counted.wrap(group.member(rank));
      Generator gen(3);
      nn::Mlp mlp(split, gen);
      mlp.setRecomputeActivation(recompute);
      Tensor xi = x.clone();
      xi.setRequiresGrad(true);
      backward(sum(mlp.apply(xi)));
      counts[size_t(rank)] = counted.sums->load();
      inputGrads[size_t(rank)] = xi.grad();
    });
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    CHECK(counts[size_t(rank)] == 2);
    test::requireClose(inputGrads[size_t(rank)], xr.grad(), 1e-6, 1e-4);
  }
}

TEST_CASE(
    "under tensor parallelism dropout masks differ across the ranks in the split regions and agree in the "
    "whole ones",
    "[nn][tensor]") {
  // NOTE [Tensor-parallel random streams]. An attention layer of 2 heads over 2 ranks, each rank's head
  // given the same weights: the ranks' partial products before the all-reduce are equal without dropout;
  // with dropout on the attention probabilities (each rank's own heads: its own stream) they differ. The
  // output's dropout after the all-reduce (the whole residual stream: the shared stream) draws one mask on
  // both ranks, so their outputs agree bit for bit. Under sequence parallelism that dropout is on each
  // rank's own part of the sequence: with every position alike, the ranks' parts differ only by their masks,
  // and must differ.
  bool sequenceParallel = GENERATE(false, true);
  INFO("sequence parallel " << sequenceParallel);
  Tensor row = test::randomDouble({1, 1, 16}, 4, -1, 1).to(DType::F32);
  Tensor x = ops::contiguous(ops::mul(ops::ones({2, 8, 16}, DType::F32, Device::cpu()), row));
  auto runRanks = [&](double p) {
    ThreadGroup group(2);
    std::vector<Tensor> partial(2), out(2);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank)
      ranks.emplace_back([&, rank] {
        defaultGenerator().manualSeed(11);
        Counted counted;
        nn::AttentionConfig config{16, 2, false, false, false, p, 0.02, 0.02, Device::cpu()};
        config.tensorParallel = counted.wrap(group.member(rank));
        config.tensorParallel.sequenceParallel = sequenceParallel;
        Generator gen(3);
        nn::Attention attention(config, gen);
        // The same head on both ranks.
        Generator same(9);
        for (auto& [name, w] : attention.namedParameters())
          ops::copy(w, ops::randn(w.shape(), same, DType::F32, Device::cpu(), 0, 0.5));
        Tensor in = sequenceParallel ? x.narrow(1, 4 * rank, 4).contiguous() : x;
        out[size_t(rank)] = attention.apply(in);
        partial[size_t(rank)] = *counted.firstSum;
      });
    for (auto& t : ranks) t.join();
    return std::make_pair(partial, out);
  };
  auto [plainPartial, plainOut] = runRanks(0.0);
  auto [partial, out] = runRanks(0.5);
  if (!sequenceParallel) {
    // The split region: equal without dropout, different masks with it.
    REQUIRE(plainPartial[0].defined());
    CHECK(plainPartial[0].toVector<float>() == plainPartial[1].toVector<float>());
    CHECK(partial[0].toVector<float>() != partial[1].toVector<float>());
    // The whole region: one mask, and it dropped something.
    CHECK(out[0].toVector<float>() == out[1].toVector<float>());
    CHECK(out[0].toVector<float>() != plainOut[0].toVector<float>());
  } else {
    // Each rank's part of the sequence: equal without dropout, its own mask with it.
    CHECK(plainOut[0].toVector<float>() == plainOut[1].toVector<float>());
    CHECK(out[0].toVector<float>() != out[1].toVector<float>());
  }
  int64_t zeros = 0;
  for (float v : out[0].toVector<float>()) zeros += v == 0.0f;
  CHECK(zeros > 0);
}
