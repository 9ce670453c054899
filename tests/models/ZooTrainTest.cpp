// bert-mini and t5-mini train on byte-level tiny Shakespeare through the stock trainer (`strata train
// configs/zoo/...`): the loss must fall clearly within a few dozen steps; validation, the end-of-run sample,
// checkpoints and resume work for them as for GPT.
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "TestUtil.h"
#include "models/Zoo.h"
#include "strata/config/Config.h"
#include "strata/data/MaskedLmObjective.h"
#include "strata/data/SpanCorruptionObjective.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Trainer.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

// The zoo config `name` on tiny Shakespeare (the config's own data path), on the CPU, with `sets` on top.
config::Config zooConfig(const std::string& name, const fs::path& out, std::vector<std::string> sets) {
  std::vector<std::string> all = {"train.device=cpu", "train.out_dir=" + out.string(), "train.log_interval=1",
                                  "checkpoint.save="};
  all.insert(all.end(), sets.begin(), sets.end());
  return config::loadConfig(std::string(STRATA_SOURCE_DIR) + "/configs/zoo/" + name + ".yaml", all);
}

struct Curves {
  std::vector<double> losses, valLosses;
};

Curves curves(const fs::path& out) {
  Curves c;
  std::ifstream in(out / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) c.valLosses.push_back(j["val_loss"].get<double>());
    if (j.contains("loss")) c.losses.push_back(j["loss"].get<double>());
  }
  return c;
}

double mean(const std::vector<double>& v, size_t from, size_t count) {
  double s = 0;
  for (size_t i = from; i < from + count; ++i) s += v[i];
  return s / double(count);
}

// 40 steps of 8 sequences at a constant 1e-3 without clipping: the hand-written loops these tests replaced.
const std::vector<std::string> kShortRun = {"model.seq_length=64",        "train.micro_batch_size=8",
                                            "train.train_iters=40",       "train.eval_interval=40",
                                            "train.eval_iters=2",         "lr_schedule.style=constant",
                                            "lr_schedule.warmup_iters=0", "optimizer.clip_grad=0"};

// A tiny model of the architecture, for the checkpoint tests.
std::vector<std::string> tinyShape() {
  return {"model.num_layers=1",        "model.hidden_size=32",       "model.num_attention_heads=2",
          "model.ffn_hidden_size=64",  "model.seq_length=32",        "train.micro_batch_size=2",
          "train.global_batch_size=4", "train.eval_interval=3",      "train.eval_iters=2",
          "train.sample_length=0",     "lr_schedule.warmup_iters=1", "optimizer.lr=3e-3"};
}

}  // namespace

TEST_CASE("bert-mini learns masked bytes of tiny Shakespeare through the trainer", "[models][bert][train]") {
  fs::path out = test::freshDir("strata-zoo-bert-mini");
  std::vector<std::string> sets = kShortRun;
  sets.push_back("train.sample_prompt=to be or not to b[MASK]");
  train::Trainer trainer(zooConfig("bert-mini", out, sets));
  REQUIRE(dynamic_cast<data::MaskedLmObjective*>(&trainer.objective()) != nullptr);
  REQUIRE(trainer.objective().windowLength() == 62);  // [CLS] 62 bytes [SEP]
  REQUIRE(trainer.objective().dataVocabSize() == 256);
  train::TrainResult r = trainer.run();
  Curves c = curves(out);
  REQUIRE(c.losses.size() == 40);
  // Measured through the trainer (2026-12-01, CPU, f32): the first 5 steps average 4.72 (ln 260 = 5.56), the
  // last 5 average 3.40, validation 3.41 (the hand-written loop this replaced: 4.73 and 3.35).
  double first = mean(c.losses, 0, 5), last = mean(c.losses, 35, 5);
  INFO("first " << first << ", last " << last << ", val " << r.valLoss);
  REQUIRE(first > 4.5);
  REQUIRE(last < first - 1.0);
  REQUIRE(last < 3.8);
  REQUIRE(c.valLosses.size() == 1);
  REQUIRE(r.valLoss < first - 0.8);
  // The end-of-run sample fills the prompt's [MASK].
  INFO(r.sample);
  REQUIRE(r.sample.rfind("to be or not to b", 0) == 0);
  REQUIRE(r.sample.find("\n[MASK] 1: '") != std::string::npos);
  // Without a [MASK] there is nothing to fill.
  REQUIRE(trainer.sample("to be", 10).empty());
}

TEST_CASE("gpt-moe-nano learns tiny Shakespeare through the trainer, as dense gpt-nano does",
          "[models][moe][train]") {
  // 120 steps of each at a constant 2e-3 (the configs' peak), 8 sequences a step (half the configs' batch, to
  // keep the test short): the MoE model (8 experts in every other block, top-1) and the dense one do the same
  // FLOPs per token.
  std::map<std::string, train::TrainResult> results;
  std::map<std::string, Curves> runs;
  for (const char* name : {"gpt-moe-nano", "gpt-nano"}) {
    fs::path out = test::freshDir(std::string("strata-zoo-") + name);
    std::vector<std::string> sets = {
        "train.train_iters=120", "train.eval_interval=120",    "train.eval_iters=10",
        "train.sample_length=0", "lr_schedule.style=constant", "lr_schedule.warmup_iters=0",
        "checkpoint.save=",      "train.micro_batch_size=8",   "train.global_batch_size=8"};
    std::string config = std::string(name) == "gpt-nano" ? "../gpt-nano" : name;
    results[name] = train::Trainer(zooConfig(config, out, sets)).run();
    runs[name] = curves(out);
  }
  const train::TrainResult& moe = results["gpt-moe-nano"];
  INFO("gpt-moe-nano val " << moe.valLoss << ", gpt-nano val " << results["gpt-nano"].valLoss);
  REQUIRE(runs["gpt-moe-nano"].losses.size() == 120);
  // Measured (CPU, f32, `strata train` with these settings): val 2.5429 for gpt-moe-nano, 2.5615 for
  // gpt-nano. Over the configs' whole 1500 steps (H200, bf16; BENCHMARKS.md) gpt-moe-nano ends below
  // gpt-nano, 1.7612 against 1.7643.
  REQUIRE(moe.valLoss < 2.6);
  REQUIRE(std::abs(moe.valLoss - results["gpt-nano"].valLoss) < 0.15);
  // The routing metrics are in the records: 2 MoE layers of 8 experts.
  REQUIRE(moe.last.moe.size() == 2);
  REQUIRE(moe.last.moe[0].tokensPerExpert.size() == 8);
}

TEST_CASE("t5-mini learns span corruption of tiny Shakespeare through the trainer", "[models][t5][train]") {
  fs::path out = test::freshDir("strata-zoo-t5-mini");
  std::vector<std::string> sets = kShortRun;
  sets.push_back("optimizer.weight_decay=0");
  sets.push_back("train.sample_length=12");
  sets.push_back("train.sample_prompt=To be, or not to be, <extra_id_0> is the question.");
  train::Trainer trainer(zooConfig("t5-mini", out, sets));
  auto* objective = dynamic_cast<data::SpanCorruptionObjective*>(&trainer.objective());
  REQUIRE(objective != nullptr);
  // 70 bytes -> 60 kept, 3 sentinels and EOS = 64 inputs; 10 noise bytes, 3 sentinels and EOS = 14 targets.
  REQUIRE(objective->windowLength() == 70);
  REQUIRE(objective->dataVocabSize() == 384 - 3 - 3);
  train::TrainResult r = trainer.run();
  Curves c = curves(out);
  REQUIRE(c.losses.size() == 40);
  // Measured through the trainer (2026-12-01, CPU, f32): the first 5 steps average 4.68 (ln 384 = 5.95), the
  // last 5 average 2.79, validation 2.68 (the hand-written loop this replaced: 4.75 and 2.74).
  double first = mean(c.losses, 0, 5), last = mean(c.losses, 35, 5);
  INFO("first " << first << ", last " << last << ", val " << r.valLoss);
  REQUIRE(last < first - 1.5);
  REQUIRE(last < 3.3);
  REQUIRE(c.valLosses.size() == 1);
  REQUIRE(r.valLoss < first - 1.0);
  // Greedy decoding from the prompt: at most 12 tokens (sentinels print as <extra_id_N>).
  INFO(r.sample);
  REQUIRE(!r.sample.empty());
  REQUIRE(r.sample.size() <= 12 * std::string("<extra_id_99>").size());
}

TEST_CASE("switch-mini (T5 with experts) learns span corruption through the trainer, at ZeRO stages 0 and 3",
          "[models][t5][moe][train]") {
  std::map<std::string, Curves> runs;
  for (const char* stage : {"0", "3"}) {
    fs::path out = test::freshDir(std::string("strata-zoo-switch-mini-") + stage);
    std::vector<std::string> sets = kShortRun;
    sets.push_back("optimizer.weight_decay=0");
    sets.push_back(std::string("zero_optimization.stage=") + stage);
    sets.push_back("zero_optimization.chunk_size_mb=1");
    // Stage 3 for 8 steps (the schedule is constant, so they are the first 8 of the 40).
    if (std::string(stage) == "3") sets.insert(sets.end(), {"train.train_iters=8", "train.eval_interval=0"});
    train::Trainer(zooConfig("switch-mini", out, sets)).run();
    runs[stage] = curves(out);
  }
  Curves& c = runs["0"];
  REQUIRE(c.losses.size() == 40);
  double first = mean(c.losses, 0, 5), last = mean(c.losses, 35, 5);
  INFO("first " << first << ", last " << last);
  REQUIRE(last < first - 1.5);
  // Stage 3 gathers every expert whatever the routing: the same numbers.
  REQUIRE(runs["3"].losses.size() == 8);
  REQUIRE(runs["3"].losses == std::vector<double>(c.losses.begin(), c.losses.begin() + 8));
}

TEST_CASE("bert and t5 resume exactly from the trainer's checkpoints", "[models][train][checkpoint]") {
  for (std::string name : {"bert-mini", "t5-mini"}) {
    INFO(name);
    fs::path straight = test::freshDir("strata-zoo-resume-straight-" + name);
    fs::path again = test::freshDir("strata-zoo-resume-again-" + name);
    std::vector<std::string> sets = tinyShape();
    sets.push_back("train.train_iters=6");
    if (name == "bert-mini") sets.push_back("model.bert_binary_head=true");  // NSP pairs too
    std::vector<std::string> saving = sets, resuming = sets;
    saving.push_back("checkpoint.save_interval=3");
    saving.push_back("checkpoint.save=" + (straight / "ckpt").string());
    resuming.push_back("checkpoint.load=" + (straight / "ckpt" / "step-3").string());
    train::TrainResult full = train::Trainer(zooConfig(name, straight, saving)).run();
    REQUIRE(full.steps == 6);
    train::TrainResult tail = train::Trainer(zooConfig(name, again, resuming)).run();
    REQUIRE(tail.steps == 6);
    Curves a = curves(straight), b = curves(again);
    REQUIRE(a.losses.size() == 6);
    REQUIRE(b.losses.size() == 3);
    REQUIRE(std::vector<double>(a.losses.begin() + 3, a.losses.end()) == b.losses);
    REQUIRE(a.valLosses.size() == 2);
    REQUIRE(b.valLosses.size() == 1);
    REQUIRE(a.valLosses.back() == b.valLosses.back());
    // The checkpoint holds the architecture's parameters by their own names.
    auto weights = train::loadModelShards((straight / "ckpt" / "step-6").string());
    REQUIRE(weights.count(name == "bert-mini" ? "cls.transform.weight" : "decoder.block.0.cross.q.weight") ==
            1);
  }
}

TEST_CASE("modelSpecFrom carries the encoder architectures' keys", "[models][train]") {
  config::Config c =
      config::loadConfig(std::string(STRATA_SOURCE_DIR) + "/configs/zoo/t5-mini.yaml", {}, false);
  models::ModelSpec s = config::modelSpecFrom(c, Device::cpu());
  REQUIRE(s.kvChannels == 64);
  REQUIRE(s.decoderNumLayers == 4);
  REQUIRE(s.decoderSeqLength == 32);
  REQUIRE(s.activation == "gated_gelu");
  REQUIRE(s.untieEmbeddingsAndOutputWeights);
  REQUIRE(s.scaleDecoderOutputs == "default");
  REQUIRE(!models::t5Config(s).scaleDecoderOutputs);  // v1.1: untied and unscaled
  config::Config tied = config::loadConfig(
      std::string(STRATA_SOURCE_DIR) + "/configs/zoo/t5-mini.yaml",
      {"model.untie_embeddings_and_output_weights=false", "model.scale_decoder_outputs=false"}, false);
  REQUIRE(config::modelSpecFrom(tied, Device::cpu()).scaleDecoderOutputs == "false");
  config::Config bert =
      config::loadConfig(std::string(STRATA_SOURCE_DIR) + "/configs/zoo/bert-mini.yaml",
                         {"model.max_position_embeddings=512", "model.pad_token_id=0"}, false);
  models::ModelSpec bs = config::modelSpecFrom(bert, Device::cpu());
  REQUIRE(bs.maxPositionEmbeddings == 512);
  REQUIRE(bs.padTokenId == 0);
  config::Config b =
      config::loadConfig(std::string(STRATA_SOURCE_DIR) + "/configs/zoo/bert-base.yaml", {}, false);
  REQUIRE(config::modelSpecFrom(b, Device::cpu()).bertBinaryHead);
  // The trainer counts what the zoo's formulas count.
  auto t5 = models::buildModule(s);
  REQUIRE(t5->numParameters() == models::numParameters(s));
}

TEST_CASE("train.recompute selective and full give bert and t5 the losses of none",
          "[models][train][recompute]") {
  for (std::string name : {"bert-mini", "t5-mini"}) {
    std::map<std::string, Curves> runs;
    for (std::string mode : {"none", "selective", "full"}) {
      INFO(name << " " << mode);
      fs::path out = test::freshDir("strata-zoo-recompute-" + name + "-" + mode);
      std::vector<std::string> sets = tinyShape();
      sets.push_back("train.train_iters=4");
      sets.push_back("train.recompute=" + mode);
      train::Trainer(zooConfig(name, out, sets)).run();
      runs[mode] = curves(out);
    }
    INFO(name);
    REQUIRE(runs["none"].losses.size() == 4);
    REQUIRE(runs["selective"].losses == runs["none"].losses);
    REQUIRE(runs["full"].losses == runs["none"].losses);
    REQUIRE(runs["full"].valLosses == runs["none"].valLosses);
  }
}

TEST_CASE(
    "a checkpoint's position table is model.max_position_embeddings: fine-tuning at a shorter "
    "seq_length loads it, and a checkpoint from before the key is seq_length's table",
    "[models][train][checkpoint]") {
  fs::path base = test::freshDir("strata-zoo-positions");
  std::vector<std::string> sets = tinyShape();  // seq_length 32
  sets.push_back("train.train_iters=2");
  sets.push_back("checkpoint.save=" + (base / "ckpt").string());
  train::Trainer(zooConfig("bert-mini", base / "run", sets)).run();
  std::string ckpt = (base / "ckpt" / "step-2").string();
  auto tune = [&](const std::string& name, std::vector<std::string> more) {
    std::vector<std::string> s = tinyShape();
    s.push_back("checkpoint.load=" + ckpt);
    s.push_back("checkpoint.load_model_only=true");
    s.insert(s.end(), more.begin(), more.end());
    return zooConfig("bert-mini", base / name, s);
  };
  REQUIRE(train::Trainer(tune("short", {"model.seq_length=16", "model.max_position_embeddings=32"}))
              .model()
              .numParameters() == train::Trainer(tune("same", {})).model().numParameters());
  std::string e = test::errorOf([&] { train::Trainer(tune("shorter-table", {"model.seq_length=16"})); });
  REQUIRE(e.find("model.max_position_embeddings: 32 in the checkpoint, 16 in this config") !=
          std::string::npos);
  REQUIRE(e.find("set it to the checkpoint's to train at another length") != std::string::npos);
  // A manifest without the keys HF interop added reads as the model it was: a table of seq_length rows.
  fs::path manifest = fs::path(ckpt) / "manifest.json";
  nlohmann::json j;
  std::ifstream(manifest) >> j;
  REQUIRE(j.contains("model"));
  for (const char* key :
       {"model.max_position_embeddings", "model.pad_token_id", "model.scale_decoder_outputs"})
    REQUIRE(j["model"].erase(key) == 1);
  std::ofstream(manifest) << j.dump(2);
  REQUIRE(test::errorOf([&] { train::Trainer(tune("old", {})); }).empty());
  e = test::errorOf([&] { train::Trainer(tune("old-shorter", {"model.seq_length=16"})); });
  REQUIRE(e.find("model.max_position_embeddings: 32 in the checkpoint, 16 in this config") !=
          std::string::npos);
}
