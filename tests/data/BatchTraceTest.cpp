// The Strata side of the HF parity check (tools/hf_parity_zoo.py, bench/zoo_parity): what an objective
// reports feeding its model is what its loss is computed from, the logits give that loss, the gradients come
// out under HF names cut as the layout says, and the micro-batches Trainer::batch hands out are the ones
// `strata train` trains on.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "TestUtil.h"
#include "models/ZooHf.h"
#include "strata/config/Config.h"
#include "strata/data/BatchTrace.h"
#include "strata/train/Trainer.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

config::Config tinyZoo(const std::string& name, const fs::path& out, std::vector<std::string> sets = {}) {
  std::vector<std::string> all = {"train.device=cpu",
                                  "train.out_dir=" + out.string(),
                                  "train.log_interval=1",
                                  "checkpoint.save=",
                                  "model.num_layers=2",
                                  "model.hidden_size=32",
                                  "model.num_attention_heads=2",
                                  "model.ffn_hidden_size=48",
                                  "model.seq_length=32",
                                  "train.micro_batch_size=3",
                                  "train.eval_interval=0",
                                  "train.sample_length=0"};
  if (name == "t5-mini") {
    all.push_back("model.kv_channels=16");
    all.push_back("model.decoder_seq_length=12");
  }
  all.insert(all.end(), sets.begin(), sets.end());
  return config::loadConfig(std::string(STRATA_SOURCE_DIR) + "/configs/zoo/" + name + ".yaml", all);
}

const Tensor& named(const std::vector<std::pair<std::string, Tensor>>& list, const std::string& name) {
  for (const auto& [n, t] : list)
    if (n == name) return t;
  FAIL("no tensor named " << name);
  static Tensor none;
  return none;
}

// Mean cross-entropy of fp32 logits [..., V] against labels (-100: no loss), by hand.
double crossEntropyByHand(const Tensor& logits, const Tensor& labels) {
  int64_t V = logits.size(-1);
  std::vector<float> l = logits.contiguous().toVector<float>();
  std::vector<int64_t> y = labels.contiguous().toVector<int64_t>();
  REQUIRE(int64_t(l.size()) == int64_t(y.size()) * V);
  double sum = 0;
  int64_t count = 0;
  for (size_t r = 0; r < y.size(); ++r) {
    if (y[r] == -100) continue;
    const float* row = l.data() + r * size_t(V);
    double mx = *std::max_element(row, row + V), z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
    sum += mx + std::log(z) - double(row[y[r]]);
    ++count;
  }
  return sum / double(count);
}

}  // namespace

TEST_CASE("traceBatch: inputs, logits, loss and HF-named gradients of bert and t5", "[train][parity]") {
  for (std::string name : {"bert-mini", "t5-mini"}) {
    INFO(name);
    fs::path out = test::freshDir("strata-trace-" + name);
    train::Trainer trainer(tinyZoo(name, out));
    data::TokenBatch batch = trainer.batch(data::Split::Train, 2);
    models::ModelSpec spec = config::modelSpecFrom(trainer.config(), trainer.device());
    models::HfLayout layout = models::hfLayout(spec);
    data::BatchTrace trace = data::traceBatch(trainer.objective(), batch, DType::F32, layout);

    // The inputs: BertForMaskedLM's / T5ForConditionalGeneration's arguments, a pure function of the batch.
    REQUIRE(trace.inputs.size() == 2);
    REQUIRE(trace.inputs[0].first == "input_ids");
    REQUIRE(trace.inputs[1].first == "labels");
    auto again = trainer.objective().modelInputs(trainer.batch(data::Split::Train, 2));
    for (size_t i = 0; i < 2; ++i)
      REQUIRE(again[i].second.toVector<int64_t>() == trace.inputs[i].second.toVector<int64_t>());
    // Another batch corrupts differently.
    auto other = trainer.objective().modelInputs(trainer.batch(data::Split::Train, 3));
    REQUIRE(other[0].second.toVector<int64_t>() != trace.inputs[0].second.toVector<int64_t>());
    const Tensor& labels = named(trace.inputs, "labels");
    REQUIRE(labels.size(0) == 3);
    if (name == "bert-mini") REQUIRE(named(trace.inputs, "input_ids").size(1) == 32);

    // The logits: one row per label, over the vocabulary; the loss the objective trains on is theirs.
    const Tensor& logits = named(trace.outputs, "logits");
    REQUIRE(logits.dim() == 3);
    REQUIRE(logits.size(0) == labels.size(0));
    REQUIRE(logits.size(1) == labels.size(1));
    REQUIRE(logits.size(2) == spec.vocabSize);
    double byHand = crossEntropyByHand(logits, labels);
    INFO("loss " << trace.loss.item() << ", from the logits " << byHand);
    REQUIRE(std::abs(trace.loss.item() - byHand) < 1e-5);

    // Every HF tensor of the layout has a gradient, cut from the parameter's as the layout says.
    REQUIRE(trace.gradients.size() == layout.size());
    std::map<std::string, Tensor> params;
    for (auto& [n, p] : trainer.model().namedParameters()) params.emplace(n, p);
    for (size_t i = 0; i < layout.size(); ++i) {
      const models::HfTensor& t = layout[i];
      REQUIRE(trace.gradients[i].first == "grad." + t.hfName);
      Tensor g = params.at(t.param).grad();
      int64_t full = g.size(g.dim() - 1);
      Tensor expected = g.narrow(g.dim() - 1, t.offset, t.length > 0 ? t.length : full - t.offset);
      if (t.transpose) expected = expected.transpose(0, 1);
      test::requireClose(trace.gradients[i].second, expected.contiguous(), 0, 0);
    }
    // A split projection: HF's key weight is the middle third of qkv's columns, transposed.
    if (name == "bert-mini") {
      const Tensor& key = named(trace.gradients, "grad.bert.encoder.layer.1.attention.self.key.weight");
      REQUIRE(key.shape() == Shape{32, 32});
      Tensor qkv = params.at("layer.1.attn.qkv.weight").grad();
      test::requireClose(key, qkv.narrow(1, 32, 32).transpose(0, 1).contiguous(), 0, 0);
      std::vector<float> values = key.toVector<float>();
      REQUIRE(std::any_of(values.begin(), values.end(), [](float v) { return v != 0.0f; }));
    }
    // A second trace needs fresh gradients.
    REQUIRE(
        !test::errorOf([&] { data::traceBatch(trainer.objective(), batch, DType::F32, layout); }).empty());
  }
}

TEST_CASE("traceBatch of BERT with the NSP head: BertForPreTraining's inputs and outputs, MLM + NSP loss",
          "[train][parity]") {
  fs::path out = test::freshDir("strata-trace-bert-nsp");
  train::Trainer trainer(tinyZoo("bert-mini", out, {"model.bert_binary_head=true"}));
  models::ModelSpec spec = config::modelSpecFrom(trainer.config(), trainer.device());
  data::BatchTrace trace = data::traceBatch(trainer.objective(), trainer.batch(data::Split::Train, 1),
                                            DType::F32, models::hfLayout(spec));
  // The names tools/hf_parity_zoo.py reads: BertForPreTraining's arguments and outputs, no "logits".
  std::vector<std::string> inputs, outputs;
  for (auto& [name, t] : trace.inputs) inputs.push_back(name);
  for (auto& [name, t] : trace.outputs) outputs.push_back(name);
  REQUIRE(inputs == std::vector<std::string>{"input_ids", "token_type_ids", "labels", "next_sentence_label"});
  REQUIRE(outputs == std::vector<std::string>{"prediction_logits", "seq_relationship_logits"});
  const Tensor& nsp = named(trace.outputs, "seq_relationship_logits");
  REQUIRE(nsp.shape() == Shape{3, 2});
  // The loss is the MLM cross-entropy plus the next-sentence one.
  double mlm = crossEntropyByHand(named(trace.outputs, "prediction_logits"), named(trace.inputs, "labels"));
  double next = crossEntropyByHand(nsp, named(trace.inputs, "next_sentence_label"));
  INFO("loss " << trace.loss.item() << ", MLM " << mlm << " + NSP " << next);
  REQUIRE(std::abs(trace.loss.item() - (mlm + next)) < 1e-5);
  REQUIRE(named(trace.gradients, "grad.cls.seq_relationship.weight").shape() == Shape{2, 32});
}

TEST_CASE("Trainer::batch hands out the micro-batches strata train trains on", "[train][parity]") {
  for (std::string name : {"bert-mini", "t5-mini"}) {
    INFO(name);
    // At lr 0 the weights never move, so step i's loss is micro-batch i - 1's at the initial weights.
    std::vector<std::string> sets = {"train.train_iters=3", "optimizer.lr=0", "optimizer.min_lr=0",
                                     "lr_schedule.style=constant", "lr_schedule.warmup_iters=0"};
    fs::path out = test::freshDir("strata-trace-run-" + name);
    train::Trainer trained(tinyZoo(name, out, sets));
    trained.run();
    std::vector<double> logged;
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) logged.push_back(j["loss"].get<double>());
    }
    REQUIRE(logged.size() == 3);
    train::Trainer fresh(tinyZoo(name, test::freshDir("strata-trace-fresh-" + name), sets));
    for (int64_t i = 0; i < 3; ++i) {
      double loss = fresh.objective().loss(fresh.batch(data::Split::Train, i), DType::F32).item();
      INFO("step " << i + 1 << ": logged " << logged[size_t(i)] << ", micro-batch " << i << " " << loss);
      REQUIRE(std::abs(loss - logged[size_t(i)]) < 1e-5 * std::abs(loss));
    }
    REQUIRE(std::abs(logged[0] - logged[1]) > 1e-4);  // different batches, so a shifted index would show
  }
}
