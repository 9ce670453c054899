#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "TestUtil.h"
#include "models/Zoo.h"
#include "models/custom_example/BigramMlp.h"
#include "strata/nn/DeferredInit.h"
#include "strata/train/StepEngine.h"
#include "strata/train/Trainer.h"
#include "strata/zero/ChunkManager.h"

using namespace strata;
namespace fs = std::filesystem;

using test::tinyGptSpec;

namespace {
// A small repetitive corpus in `dir`.
fs::path writeCorpus(const fs::path& dir) {
  fs::path corpus = dir / "corpus.txt";
  std::ofstream text(corpus);
  for (int i = 0; i < 300; ++i) text << "to be or not to be, that is the question " << i % 5 << "\n";
  return corpus;
}

// The losses of a run's metrics.jsonl in order: training records' loss, evaluations' val_loss.
std::vector<double> recordedLosses(const fs::path& outDir) {
  std::vector<double> l;
  std::ifstream in(outDir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    l.push_back(j.contains("loss") ? j["loss"].get<double>() : j["val_loss"].get<double>());
  }
  return l;
}
}  // namespace

TEST_CASE("parameters become views into chunks with their values, and the module sees the chunk's bytes",
          "[zero][chunks]") {
  auto model = models::buildModel(tinyGptSpec());
  auto named = model->namedParameters();
  std::vector<std::vector<float>> before;
  for (auto& [n, p] : named) before.push_back(p.toVector<float>());
  Tensor ids = ops::arange(0, 16, 1, DType::I64, Device::cpu()).view({1, 16});
  Tensor reference = model->logits(ids, DType::F32);
  zero::ChunkManager chunks(named, 16 << 10);  // 16 KiB chunks: several
  REQUIRE(chunks.numChunks() > 2);
  for (size_t k = 0; k < named.size(); ++k) {
    const Tensor& p = named[k].second;
    INFO(named[k].first);
    const zero::ChunkSlot& slot = chunks.layout().slot(named[k].first);
    REQUIRE(p.storage() == chunks.storage(size_t(slot.chunk)));
    REQUIRE(p.offset() == slot.offset);
    REQUIRE(p.toVector<float>() == before[k]);
  }
  // The same forward, bit for bit, reading the chunks.
  REQUIRE(model->logits(ids, DType::F32).toVector<float>() == reference.toVector<float>());
  // A write into a chunk is a write into its parameters.
  const zero::ChunkSlot& wpe = chunks.layout().slot("wpe.weight");
  chunks.flat(size_t(wpe.chunk)).data<float>()[wpe.offset] = 42.0f;
  REQUIRE(model->namedParameters()[1].second.toVector<float>()[0] == 42.0f);
}

TEST_CASE("a chunk evicted after forward and re-pointed before backward trains as if it never moved",
          "[zero][chunks]") {
  auto run = [](bool move) {
    auto model = models::buildModel(tinyGptSpec());
    zero::ChunkManager chunks(model->namedParameters(), 8 << 10);
    Tensor ids = ops::arange(0, 16, 1, DType::I64, Device::cpu()).view({1, 16});
    Tensor targets = ops::arange(1, 17, 1, DType::I64, Device::cpu()).view({1, 16});
    Tensor loss = model->loss(ids, targets, DType::F32);
    std::vector<std::vector<char>> moved;
    if (move) {
      // ZeRO-3's release and re-gather: copy each chunk out, drop it, point it at the copy.
      for (size_t i = 0; i < chunks.numChunks(); ++i) {
        moved.emplace_back(chunks.bytes(i));
        std::memcpy(moved.back().data(), chunks.storage(i)->data(), chunks.bytes(i));
        chunks.evict(i);
      }
      REQUIRE(test::errorOf([&] { model->namedParameters()[0].second.toVector<float>(); }).find("chunk 0") !=
              std::string::npos);
      for (size_t i = 0; i < chunks.numChunks(); ++i) chunks.repoint(i, moved[i].data(), Device::cpu());
    }
    backward(loss);
    std::vector<std::vector<float>> grads;
    for (auto& [n, p] : model->namedParameters()) grads.push_back(p.grad().toVector<float>());
    return grads;
  };
  REQUIRE(run(true) == run(false));
}

TEST_CASE("first-use order comes from the module calls of one forward", "[zero][chunks]") {
  auto model = models::buildModel(tinyGptSpec());
  Tensor ids = ops::arange(0, 16, 1, DType::I64, Device::cpu()).view({1, 16});
  auto order = zero::recordFirstUse(*model, [&] {
    NoGradGuard noGrad;
    model->logits(ids, DType::F32);
  });
  auto named = model->namedParameters();
  REQUIRE(order.size() == named.size());
  auto at = [&](const std::string& name) {
    auto it = std::find(order.begin(), order.end(), name);
    REQUIRE(it != order.end());
    return it - order.begin();
  };
  // The embeddings (in whichever order the compiler evaluates their sum), then block 0, block 1, ln_f; inside
  // a block the order of the calls.
  REQUIRE(std::max(at("wte.weight"), at("wpe.weight")) < at("h.0.ln_1.weight"));
  REQUIRE(at("h.0.ln_1.weight") < at("h.0.attn.qkv.weight"));
  REQUIRE(at("h.0.attn.proj.bias") < at("h.0.ln_2.weight"));
  REQUIRE(at("h.0.mlp.fc.weight") < at("h.0.mlp.proj.weight"));
  REQUIRE(at("h.0.mlp.proj.bias") < at("h.1.ln_1.weight"));
  REQUIRE(at("h.1.mlp.proj.bias") < at("ln_f.weight"));
  // The temporary hooks are gone: a second forward records nothing.
  REQUIRE(zero::recordFirstUse(*model, [] {}).size() == named.size());
}

TEST_CASE("training numbers do not depend on the chunk layout", "[zero][chunks][train]") {
  // gpt-nano's model (4 layers, hidden 128: 3.4 MB of fp32 parameters), 20 CPU steps with dropout and two
  // micro-batches, at chunk sizes of 1, 4 and 64 MiB: 4, 1 and 1 chunks.
  std::vector<std::vector<double>> losses;
  std::vector<size_t> chunkCounts;
  for (const char* mb : {"1", "4", "64"}) {
    fs::path out = test::freshDir(std::string("strata-chunk-layout-") + mb);
    fs::path corpus = writeCorpus(out);
    auto config = config::parseConfig(
        "", "test",
        {"data.path=" + corpus.string(), "train.out_dir=" + out.string(), "train.device=cpu",
         "model.num_layers=4", "model.dropout=0.1", "train.micro_batch_size=4", "train.global_batch_size=8",
         "train.train_iters=20", "train.log_interval=1", "train.eval_interval=0", "train.sample_length=0",
         "lr_schedule.warmup_iters=2", std::string("zero_optimization.chunk_size_mb=") + mb,
         "checkpoint.save=" + (out / "ckpt").string()});
    train::TrainResult r = train::Trainer(config).run();
    chunkCounts.push_back(r.chunks);
    // The checkpoint's manifest maps every parameter to its chunk, offset and shape, as the run laid them
    // out.
    train::CheckpointState saved = train::readCheckpointState((out / "ckpt").string());
    REQUIRE(saved.layout.chunks.size() == r.chunks);
    REQUIRE(saved.layout.slots.size() == 52);
    auto model = models::buildModel(config::modelSpecFrom(config, Device::cpu()));
    for (const auto& [name, p] : model->namedParameters()) {
      const zero::ChunkSlot& slot = saved.layout.slot(name);
      REQUIRE(slot.shape == p.shape());
      REQUIRE(slot.numel == p.numel());
    }
    std::vector<double> l = recordedLosses(out);  // eval_interval 0: training records only
    REQUIRE(l.size() == 20);
    losses.push_back(l);
  }
  REQUIRE(chunkCounts[0] > 1);
  REQUIRE(losses[0] == losses[1]);
  REQUIRE(losses[0] == losses[2]);
}

namespace {
// Two micro-batches through `model` with its parameters in small chunks: gradients accumulate in the chunks'
// flat buffers, and each chunk is announced complete exactly once, in the last micro-batch's backward, after
// every one of its parameters has heard.
void requireChunksCompleteOnce(nn::CausalLM& model, int64_t vocab, int64_t seq, int64_t chunkBytes) {
  zero::ChunkManager chunks(model.namedParameters(), chunkBytes);
  REQUIRE(chunks.numChunks() > 1);
  std::vector<std::string> events;
  std::map<const TensorImpl*, size_t> chunkOf;
  for (size_t c = 0; c < chunks.numChunks(); ++c)
    for (const Tensor& p : chunks.parameters(c)) {
      chunkOf[&p.impl()] = c;
      p.registerGradCompleteHook([&events, c](Tensor&) { events.push_back("param " + std::to_string(c)); });
    }
  chunks.onGradientsComplete([&events](size_t c) { events.push_back("chunk " + std::to_string(c)); });
  Generator gen(5);
  for (int micro = 0; micro < 2; ++micro) {
    Tensor ids = ops::rand({2, seq}, gen, DType::F32, Device::cpu(), 0, double(vocab) - 0.5).to(DType::I64);
    Tensor loss = model.loss(ids, ids, DType::F32);
    chunks.beginBackward(micro == 1);
    events.push_back("backward");
    backward(loss);
    // In place: every gradient is a view into its chunk's buffer.
    for (const Tensor& p : chunks.parameters())
      if (p.grad().defined()) REQUIRE(p.grad().storage() == chunks.gradients(chunkOf[&p.impl()]).storage());
  }
  auto second = std::find(events.begin() + 1, events.end(), "backward");
  // The first micro-batch announces nothing.
  REQUIRE(std::count_if(events.begin(), second,
                        [](const std::string& e) { return e.rfind("chunk", 0) == 0; }) == 0);
  for (size_t c = 0; c < chunks.numChunks(); ++c) {
    std::string name = "chunk " + std::to_string(c), param = "param " + std::to_string(c);
    INFO(name);
    REQUIRE(std::count(second, events.end(), name) == 1);
    auto at = std::find(second, events.end(), name);
    // Announced after all of its parameters heard, none after.
    REQUIRE(std::count(second, at, param) == int64_t(chunks.parameters(c).size()));
    REQUIRE(std::count(at, events.end(), param) == 0);
  }
}
}  // namespace

TEST_CASE("each chunk's gradients complete exactly once per step, after the last micro-batch",
          "[zero][chunks][hooks]") {
  SECTION("GPT") {
    auto model = models::buildModel(tinyGptSpec());
    requireChunksCompleteOnce(*model, tinyGptSpec().vocabSize, 16, 8 << 10);
  }
  SECTION("the custom example") {
    example::BigramMlp model(32, 8, 16, Device::cpu());
    requireChunksCompleteOnce(model, 32, 16, 1 << 10);
  }
}

TEST_CASE("one rank trains the same numbers at ZeRO stages 0 to 3", "[zero][chunks][train]") {
  // Stage 3 on one rank still gathers each chunk into a slot around its modules (a copy here) and prefetches
  // in the recorded order, with two micro-batches per step: the losses must not move by a bit.
  std::vector<std::vector<double>> losses;
  for (int stage = 0; stage <= 3; ++stage) {
    fs::path out = test::freshDir("strata-one-rank-stage" + std::to_string(stage));
    fs::path corpus = writeCorpus(out);
    auto config = config::parseConfig(
        "", "test",
        {"data.path=" + corpus.string(), "train.out_dir=" + out.string(), "train.device=cpu",
         "model.num_layers=2", "model.hidden_size=32", "model.num_attention_heads=2", "model.seq_length=32",
         "model.dropout=0.1", "train.micro_batch_size=2", "train.global_batch_size=4", "train.train_iters=8",
         "train.log_interval=1", "train.eval_interval=4", "train.eval_iters=2", "train.sample_length=0",
         "zero_optimization.chunk_size_mb=0.02", "zero_optimization.stage=" + std::to_string(stage)});
    train::Trainer(config).run();
    std::vector<double> l = recordedLosses(out);
    REQUIRE(l.size() == 10);  // 8 steps and 2 evaluations
    losses.push_back(l);
  }
  for (int stage = 1; stage <= 3; ++stage) {
    INFO("stage " << stage);
    REQUIRE(losses[size_t(stage)] == losses[0]);
  }
}

TEST_CASE("[cuda] 16-bit chunks' masters go to the master device within its bytes, the rest stay on the GPU",
          "[cuda][zero][chunks]") {
  STRATA_REQUIRE_CUDA();
  // A model whose masters outgrow the host's memory (layOutModelChunks' hostMasterBytes): the first chunks'
  // masters are made in host memory, the later ones on the parameters' device, each with the fp32 values.
  models::ModelSpec spec = tinyGptSpec();
  spec.device = Device::cuda(0);
  auto model = models::buildModel(spec);
  auto named = model->namedParameters();
  std::vector<std::vector<float>> before;
  for (auto& [n, p] : named) before.push_back(p.toVector<float>());
  zero::ChunkManager probe(models::buildModel(spec)->namedParameters(), 16 << 10, DType::BF16);
  uint64_t firstTwo = 0;
  for (size_t c = 0; c < 2; ++c) firstTwo += uint64_t(probe.paddedElems(c)) * 4;
  zero::ChunkManager chunks(named, 16 << 10, DType::BF16, 1, Device::cpu(), {}, firstTwo);
  REQUIRE(chunks.numChunks() > 3);
  std::vector<Tensor> masters = chunks.takeMasters();
  REQUIRE(masters.size() == chunks.numChunks());
  for (size_t c = 0; c < masters.size(); ++c) {
    INFO("chunk " << c);
    REQUIRE(masters[c].dtype() == DType::F32);
    REQUIRE(masters[c].device() == (c < 2 ? Device::cpu() : Device::cuda(0)));
  }
  for (size_t k = 0; k < named.size(); ++k) {
    INFO(named[k].first);
    const zero::ChunkSlot& slot = chunks.layout().slot(named[k].first);
    Tensor master = masters[size_t(slot.chunk)].narrow(0, slot.offset, int64_t(before[k].size()));
    REQUIRE(master.to(Device::cpu()).toVector<float>() == before[k]);
  }
}

TEST_CASE(
    "a sharded layout of a deferred model makes each rank's masters and stage-3 shards of the whole layout",
    "[zero][chunks][deferred]") {
  // NOTE [Sharded layout] in zero/ChunkManager.h.
  models::ModelSpec spec = tinyGptSpec();
  const int ranks = 3;
  zero::ChunkManager whole(models::buildModel(spec)->namedParameters(), 16 << 10, DType::BF16, ranks);
  std::vector<Tensor> wholeMasters = whole.takeMasters();
  REQUIRE(whole.numChunks() > 3);
  for (bool parameters : {false, true}) {
    for (int rank = 0; rank < ranks; ++rank) {
      INFO((parameters ? "parameters and masters" : "masters") << ", rank " << rank);
      std::shared_ptr<nn::CausalLM> model;
      {
        nn::DeferParameters defer;
        model = models::buildModel(spec);
      }
      zero::ChunkManager chunks(model->namedParameters(), 16 << 10, DType::BF16, ranks, std::nullopt, {},
                                UINT64_MAX, zero::ShardedLayout{{rank}, parameters});
      REQUIRE(chunks.numChunks() == whole.numChunks());
      CHECK(!nn::hasDeferredParameters(*model));
      std::vector<Tensor> masters = chunks.takeMasters();
      std::vector<Tensor> shards = chunks.takeParameterShards();
      REQUIRE(masters.size() == chunks.numChunks());
      REQUIRE(shards.size() == (parameters ? chunks.numChunks() : 0));
      for (size_t c = 0; c < chunks.numChunks(); ++c) {
        INFO("chunk " << c);
        zero::ShardRange own = chunks.shard(c, rank);
        CHECK(masters[c].toVector<float>() ==
              wholeMasters[c].narrow(0, own.begin, own.size()).toVector<float>());
        CHECK(chunks.storage(c)->resident() == !parameters);
        Tensor values = parameters ? shards[c] : chunks.paddedFlat(c).narrow(0, own.begin, own.size());
        CHECK(values.dtype() == DType::BF16);
        CHECK(values.toVector<float>() ==
              whole.paddedFlat(c).narrow(0, own.begin, own.size()).toVector<float>());
        if (!parameters)
          CHECK(chunks.paddedFlat(c).toVector<float>() == whole.paddedFlat(c).toVector<float>());
      }
    }
  }
}
