#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "TestUtil.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Metrics.h"
#include "strata/train/Trainer.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

fs::path corpus() {
  fs::path p = fs::temp_directory_path() / "strata-trainer-corpus.txt";
  if (!fs::exists(p)) {
    std::ofstream out(p);
    for (int i = 0; i < 400; ++i) out << "the quick brown fox jumps over the lazy dog " << i % 7 << "\n";
  }
  return p;
}

train::Config tinyConfig(const fs::path& outDir, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"data.path=" + corpus().string(),
                                "train.out_dir=" + outDir.string(),
                                "train.device=cpu",
                                "model.num_layers=2",
                                "model.hidden_size=32",
                                "model.num_attention_heads=2",
                                "model.seq_length=32",
                                "model.dropout=0.1",
                                "train.micro_batch_size=4",
                                "train.global_batch_size=8",
                                "train.train_iters=20",
                                "train.log_interval=1",
                                "train.eval_interval=10",
                                "train.eval_iters=2",
                                "train.sample_length=0",
                                "lr_schedule.warmup_iters=2",
                                "optimizer.lr=0.003"};
  o.insert(o.end(), extra.begin(), extra.end());
  return train::parseConfig("", "test", o);
}

std::vector<nlohmann::json> records(const fs::path& outDir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(outDir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST_CASE("training lowers the loss and writes metrics and TensorBoard events", "[train][trainer]") {
  fs::path out = fs::temp_directory_path() / "strata-trainer-basic";
  fs::remove_all(out);
  train::Trainer trainer(tinyConfig(out, {"train.train_iters=40", "train.eval_interval=40"}));
  train::TrainResult r = trainer.run();
  REQUIRE(r.steps == 40);
  auto recs = records(out);
  REQUIRE(recs.size() == 41);  // 40 train records and one eval
  double first = recs.front()["loss"].get<double>();
  REQUIRE(first == Approx(std::log(256.0)).margin(0.5));
  REQUIRE(r.trainLoss < first - 1.0);
  REQUIRE(recs.back().contains("val_loss"));
  REQUIRE(recs[5].contains("tokens_per_s"));
  REQUIRE(recs[5]["grad_norm"].get<double>() > 0);
  bool events = false;
  for (auto& e : fs::directory_iterator(out))
    events = events || e.path().filename().string().rfind("events.out.tfevents", 0) == 0;
  REQUIRE(events);
  std::string text = trainer.sample("the ", 20, 0.8, 10, 3);
  REQUIRE(text.size() == 20);
}

TEST_CASE("resume continues the loss curve exactly", "[train][trainer][checkpoint]") {
  fs::path straight = fs::temp_directory_path() / "strata-resume-straight";
  fs::path split = fs::temp_directory_path() / "strata-resume-split";
  fs::remove_all(straight);
  fs::remove_all(split);
  train::Trainer(tinyConfig(straight)).run();
  fs::path ckpt = split / "ckpt";
  train::Trainer(tinyConfig(split, {"train.exit_interval=10", "checkpoint.save=" + ckpt.string()})).run();
  REQUIRE(fs::exists(ckpt / "latest"));
  REQUIRE(fs::exists(ckpt / "step-10" / "manifest.json"));
  REQUIRE(fs::exists(ckpt / "step-10" / "model-rank0.safetensors"));
  auto shards = train::loadModelShards(ckpt.string());
  REQUIRE(shards.count("wte.weight") == 1);
  REQUIRE(shards.count("h.1.mlp.proj.bias") == 1);
  train::Trainer(tinyConfig(split, {"checkpoint.load=" + ckpt.string()})).run();
  auto a = records(straight), b = records(split);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("record " << i);
    REQUIRE(a[i]["step"] == b[i]["step"]);
    if (a[i].contains("loss")) REQUIRE(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());
    if (a[i].contains("val_loss")) REQUIRE(a[i]["val_loss"].get<double>() == b[i]["val_loss"].get<double>());
  }
}

TEST_CASE("fp16 training skips overflowing steps and lowers the loss scale", "[train][trainer][fp16]") {
  fs::path out = fs::temp_directory_path() / "strata-trainer-fp16";
  fs::remove_all(out);
  // 1e8 overflows fp16 gradients at first: steps are skipped until the scale comes down into range.
  train::Trainer trainer(
      tinyConfig(out, {"precision.dtype=fp16", "precision.initial_loss_scale=1e8", "train.train_iters=40",
                       "train.eval_interval=40", "model.dropout=0"}));
  REQUIRE(trainer.computeDType() == DType::F16);
  train::TrainResult r = trainer.run();
  auto recs = records(out);
  double firstScale = recs.front()["loss_scale"].get<double>();
  double lastScale = recs[39]["loss_scale"].get<double>();
  REQUIRE(firstScale < 1e8);  // halved on the first, overflowing step
  // Kept halving until the fp16 gradients fit. How many halvings that takes depends on which gradients are
  // fp16: activation gradients are, while parameter gradients (Linear, LayerNorm, embeddings) are formed in
  // fp32 straight from fp16 operands, so only a bound is asserted (5 halvings after the first here).
  REQUIRE(lastScale <= firstScale / 16);
  REQUIRE(recs[39]["grad_norm"].get<double>() > 0);  // finite again: steps are being applied
  REQUIRE(r.trainLoss < recs.front()["loss"].get<double>() - 0.5);
}

TEST_CASE("16-bit weight copies kept by the optimizer train number for number like per-forward casts",
          "[train][trainer][fp16]") {
  // fp16 runs as fp16 on the CPU, so the copies AdamW rewrites are exercised here; they must equal the casts.
  std::vector<nlohmann::json> runs[2];
  for (int keep = 0; keep < 2; ++keep) {
    fs::path out = fs::temp_directory_path() / ("strata-trainer-copies-" + std::to_string(keep));
    fs::remove_all(out);
    train::Trainer trainer(tinyConfig(
        out, {"precision.dtype=fp16", "train.train_iters=12", "train.eval_interval=12", "model.dropout=0",
              std::string("precision.weight_copies=") + (keep ? "true" : "false")}));
    trainer.run();
    runs[keep] = records(out);
    // The knob took effect: every GEMM weight holds a copy in step with it, or none does (wpe only feeds an
    // embedding gather, which reads fp32 rows, so it never gets one).
    for (auto& [name, p] : trainer.model().namedParameters()) {
      if (p.dim() < 2 || name == "wpe.weight") continue;
      INFO(name);
      const auto& cache = p.impl().castCache;
      REQUIRE(bool(cache && cache->fresh(p.storage()->version())) == bool(keep));
    }
  }
  REQUIRE(runs[0].size() == runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) {
    INFO("record " << i);
    if (runs[0][i].contains("loss"))
      REQUIRE(runs[0][i]["loss"].get<double>() == runs[1][i]["loss"].get<double>());
  }
}

TEST_CASE("safetensors round-trips tensors and metadata", "[train][checkpoint]") {
  fs::path p = fs::temp_directory_path() / "strata-roundtrip.safetensors";
  Tensor a = ops::arange(0, 6).view({2, 3});
  Tensor b = Tensor::fromVector<float>({1.5f, -2.25f}, {2}).to(DType::BF16);
  Tensor c = Tensor::fromVector<int64_t>({7, 8, 9}, {3});
  train::writeSafetensors(p.string(), {{"a", a}, {"b", b}, {"c", c}}, {{"format", "pt"}});
  std::map<std::string, std::string> meta;
  auto loaded = train::readSafetensors(p.string(), Device::cpu(), &meta);
  REQUIRE(meta.at("format") == "pt");
  REQUIRE(loaded.at("a").shape() == Shape{2, 3});
  REQUIRE(loaded.at("a").toVector<float>() == a.toVector<float>());
  REQUIRE(loaded.at("b").dtype() == DType::BF16);
  REQUIRE(loaded.at("b").toVector<float>() == std::vector<float>{1.5f, -2.25f});
  REQUIRE(loaded.at("c").toVector<int64_t>() == std::vector<int64_t>{7, 8, 9});
  // The header is 8-byte aligned JSON after a little-endian length, as the format requires.
  std::ifstream in(p, std::ios::binary);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  REQUIRE((len + 8) % 8 == 0);
  REQUIRE_THROWS_AS(train::resolveCheckpoint("/nonexistent/ckpt"), Error);
}


TEST_CASE("data.format random trains without a data file (strata bench's source)", "[train][trainer]") {
  fs::path out = fs::temp_directory_path() / "strata-trainer-random";
  fs::remove_all(out);
  train::Trainer trainer(
      tinyConfig(out, {"data.format=random", "data.path=/nonexistent/corpus.bin", "train.train_iters=6",
                       "train.log_interval=3", "train.eval_interval=0"}));
  train::TrainResult r = trainer.run();
  REQUIRE(r.steps == 6);
  // Uniform ids over 256: the loss stays near log(256), and the last interval's speed is reported.
  REQUIRE(r.trainLoss == Approx(std::log(256.0)).margin(0.5));
  REQUIRE(r.last.step == 6);
  REQUIRE(r.last.tokensPerSec > 0);
  REQUIRE(r.last.msPerIter > 0);
}
