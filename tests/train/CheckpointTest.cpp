// Checkpoint integrity: checksums, non-finite refusal, tensor matching, pruning and leftover cleanup.
#include <barrier>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "TestUtil.h"
#include "strata/core/Checksum.h"
#include "strata/train/Checkpoint.h"

using namespace strata;
namespace fs = std::filesystem;

using strata::test::errorOf;
using strata::test::freshDir;

namespace {

train::NamedTensors smallModel(float base) {
  return {{"a.weight", Tensor::fromVector<float>({base, base + 1, base + 2, base + 3}, {2, 2})},
          {"a.bias", Tensor::fromVector<float>({base * 2, base * 3}, {2})}};
}

train::CheckpointState stateAt(int64_t step) {
  train::CheckpointState st;
  st.step = step;
  st.config = {{"model.num_layers", "2"}};
  st.model = {{"model.num_layers", "2"}};
  return st;
}

}  // namespace

TEST_CASE("a corrupted checkpoint file is found by its checksum and named", "[train][checkpoint]") {
  fs::path save = fs::temp_directory_path() / "strata-ckpt-crc";
  fs::remove_all(save);
  auto model = smallModel(1);
  train::NamedTensors optim = {{"m.a.weight", ops::zerosLike(model[0].second)}};
  std::string dir = train::saveCheckpoint(save.string(), model, optim, stateAt(4));
  auto manifest = nlohmann::json::parse(std::ifstream(fs::path(dir) / "manifest.json"));
  REQUIRE(manifest["files"].contains("model-rank0.safetensors"));
  REQUIRE(manifest["files"]["model-rank0.safetensors"]["crc32c"].get<uint32_t>() ==
          crc32cFile((fs::path(dir) / "model-rank0.safetensors").string()));
  auto into = smallModel(0);
  train::loadCheckpoint(save.string(), into, optim);  // intact: loads
  REQUIRE(into[0].second.toVector<float>() == model[0].second.toVector<float>());
  // Overwrite tensor bytes in place (same size): only the checksum can tell.
  fs::path file = fs::path(dir) / "model-rank0.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-4, std::ios::end);
    f.write("\x7f\x7f\x7f\x7f", 4);
  }
  std::string e = errorOf([&] { train::loadCheckpoint(save.string(), into, optim); });
  REQUIRE(e.find("model-rank0.safetensors") != std::string::npos);
  REQUIRE(e.find("corrupted") != std::string::npos);
  REQUIRE(errorOf([&] { train::loadModelShards(save.string()); }).find("corrupted") != std::string::npos);
  // A truncated file is named by its size.
  fs::resize_file(file, fs::file_size(file) - 8);
  REQUIRE(errorOf([&] { train::loadModelShards(dir); }).find("bytes") != std::string::npos);
  // A corrupted manifest is named too.
  { std::ofstream(fs::path(dir) / "manifest.json") << "{\"step\": 4, \"rng\": "; }
  e = errorOf([&] { train::loadModelShards(dir); });
  REQUIRE(e.find("manifest.json") != std::string::npos);
}

TEST_CASE("a corrupted safetensors header is an error naming the file", "[train][checkpoint]") {
  fs::path p = fs::temp_directory_path() / "strata-bad-header.safetensors";
  train::writeSafetensors(p.string(), smallModel(1));
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(9);
    f.write("!!!!", 4);
  }
  std::string e = errorOf([&] { train::readSafetensors(p.string()); });
  REQUIRE(e.find(p.string()) != std::string::npos);
  REQUIRE(e.find("header") != std::string::npos);
  { std::ofstream(p, std::ios::binary) << "tiny"; }
  REQUIRE(errorOf([&] { train::readSafetensors(p.string()); }).find(p.string()) != std::string::npos);
}

TEST_CASE("no checkpoint is written from a non-finite state", "[train][checkpoint]") {
  fs::path save = fs::temp_directory_path() / "strata-ckpt-nan";
  fs::remove_all(save);
  auto good = smallModel(1);
  train::saveCheckpoint(save.string(), good, {}, stateAt(2));
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    auto bad = smallModel(1);
    bad[1].second = Tensor::fromVector<float>({1.0f, NAN}, {2}).to(dt);
    std::string e = errorOf([&] { train::saveCheckpoint(save.string(), bad, {}, stateAt(3)); });
    INFO(e);
    REQUIRE(e.find("'a.bias'") != std::string::npos);
    REQUIRE(e.find("non-finite") != std::string::npos);
    // Nothing of the failed save remains, and `latest` still names the good one.
    REQUIRE(!fs::exists(save / "step-3"));
    REQUIRE(!fs::exists(save / "step-3.tmp"));
    REQUIRE(train::resolveCheckpoint(save.string()) == (save / "step-2").string());
  }
  auto inf = smallModel(1);
  inf[0].second = Tensor::fromVector<float>({1, 2, INFINITY, 4}, {2, 2});
  REQUIRE(errorOf([&] { train::saveCheckpoint(save.string(), inf, {}, stateAt(3)); }).find("a.weight") !=
          std::string::npos);
}

TEST_CASE("loading lists missing, unused and mismatched tensors", "[train][checkpoint]") {
  fs::path save = fs::temp_directory_path() / "strata-ckpt-names";
  fs::remove_all(save);
  auto saved = smallModel(1);
  saved.emplace_back("b.weight", Tensor::fromVector<float>({5}, {1}));
  train::saveCheckpoint(save.string(), saved, {}, stateAt(1));
  // The model lacks b.weight: the checkpoint holds a tensor it does not use.
  std::string e = errorOf([&] { train::loadCheckpoint(save.string(), smallModel(0), {}); });
  REQUIRE(e.find("does not have") != std::string::npos);
  REQUIRE(e.find("b.weight") != std::string::npos);
  // The model has c.weight the checkpoint lacks.
  auto bigger = smallModel(0);
  bigger.emplace_back("b.weight", Tensor::fromVector<float>({0}, {1}));
  bigger.emplace_back("c.weight", Tensor::fromVector<float>({0}, {1}));
  e = errorOf([&] { train::loadCheckpoint(save.string(), bigger, {}); });
  REQUIRE(e.find("lacks 1 tensors") != std::string::npos);
  REQUIRE(e.find("c.weight") != std::string::npos);
  // Another shape.
  auto reshaped = smallModel(0);
  reshaped[0].second = Tensor::fromVector<float>({0, 0, 0, 0}, {4, 1});
  reshaped.emplace_back("b.weight", Tensor::fromVector<float>({0}, {1}));
  e = errorOf([&] { train::loadCheckpoint(save.string(), reshaped, {}); });
  REQUIRE(e.find("'a.weight' is [2, 2] there and [4, 1] here") != std::string::npos);
}

TEST_CASE("old checkpoints are pruned to keep_last and failed saves' leftovers removed",
          "[train][checkpoint]") {
  fs::path save = fs::temp_directory_path() / "strata-ckpt-prune";
  fs::remove_all(save);
  // Another run's checkpoints (step-1, step-3) share the directory: pruning never touches them.
  for (int64_t step : {1, 3}) {
    train::CheckpointState other = stateAt(step);
    other.runId = "other";
    train::saveCheckpoint(save.string(), smallModel(1), {}, other);
  }
  for (int64_t step : {2, 4, 6, 8, 10}) {
    train::CheckpointState mine = stateAt(step);
    mine.runId = "mine";
    train::saveCheckpoint(save.string(), smallModel(1), {}, mine);
  }
  REQUIRE(train::readCheckpointState(save.string()).runId == "mine");
  auto removed = train::pruneCheckpoints(save.string(), 3, "mine");
  REQUIRE(removed == std::vector<std::string>{"step-2", "step-4"});
  REQUIRE(!fs::exists(save / "step-4"));
  REQUIRE(fs::exists(save / "step-1"));
  REQUIRE(fs::exists(save / "step-3"));
  REQUIRE(fs::exists(save / "step-6"));
  REQUIRE(fs::exists(save / "step-10"));
  REQUIRE(train::pruneCheckpoints(save.string(), 0, "mine").empty());  // 0 keeps all
  // The other run keeps its own newest one of two, and latest (step-10, mine) is never removed.
  REQUIRE(train::pruneCheckpoints(save.string(), 1, "other") == std::vector<std::string>{"step-1"});
  REQUIRE(fs::exists(save / "step-3"));
  fs::create_directories(save / "step-12.tmp");
  { std::ofstream(save / "latest.tmp") << "step-12\n"; }
  { std::ofstream(save / "notes.tmp") << "a user's file\n"; }
  auto stale = train::removeStaleTemporaries(save.string());
  std::sort(stale.begin(), stale.end());
  REQUIRE(stale == std::vector<std::string>{"latest.tmp", "step-12.tmp"});
  REQUIRE(!fs::exists(save / "step-12.tmp"));
  REQUIRE(fs::exists(save / "notes.tmp"));
  REQUIRE(fs::exists(save / "step-10"));
}

TEST_CASE("convert streams a checkpoint's tensors one at a time", "[train][checkpoint]") {
  fs::path save = freshDir("strata-ckpt-merge");
  train::NamedTensors model;
  for (int i = 0; i < 20; ++i)
    model.emplace_back("layer." + std::to_string(i) + ".weight",
                       ops::full({64, 64}, double(i), DType::F32, Device::cpu()));
  std::string dir = train::saveCheckpoint(save.string(), model, {}, stateAt(1));
  fs::path out = save / "merged.safetensors";
  auto stats = train::mergeModelShards(dir, out.string(), [](const std::string& n) { return "m." + n; },
                                       {{"format", "pt"}});
  REQUIRE(stats.tensors == 20);
  REQUIRE(stats.bytes == 20u * 64 * 64 * 4);
  // One tensor's bytes at a time: a twentieth of the model.
  REQUIRE(stats.peakBufferBytes == 64u * 64 * 4);
  std::map<std::string, std::string> meta;
  auto merged = train::readSafetensors(out.string(), Device::cpu(), &meta);
  REQUIRE(meta.at("format") == "pt");
  REQUIRE(merged.size() == 20);
  REQUIRE(merged.at("m.layer.7.weight").toVector<float>() == std::vector<float>(64 * 64, 7.0f));
  // A corrupted shard is refused before anything is written.
  fs::path shard = fs::path(dir) / "model-rank0.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-4, std::ios::end);
    f.write("\x01\x02\x03\x04", 4);
  }
  fs::remove(out);
  REQUIRE(errorOf([&] { train::mergeModelShards(dir, out.string()); }).find("corrupted") !=
          std::string::npos);
  REQUIRE(!fs::exists(out));
}

namespace {

// Ranks as threads of one process: a barrier and an all-gather through shared slots.
struct ThreadRanks {
  explicit ThreadRanks(int n) : size(n), sync(n), slots(size_t(n)) {}
  train::CheckpointGroup group(int rank) {
    train::CheckpointGroup g;
    g.rank = rank;
    g.worldSize = size;
    g.barrier = [this] { sync.arrive_and_wait(); };
    g.allGather = [this, rank](const std::string& text) {
      slots[size_t(rank)] = text;
      sync.arrive_and_wait();
      std::vector<std::string> all = slots;
      sync.arrive_and_wait();
      return all;
    };
    return g;
  }
  // Runs `save` on every rank at once; returns each rank's result or error.
  std::vector<std::string> run(const std::function<std::string(int)>& save) {
    std::vector<std::string> outcomes(static_cast<size_t>(size));
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r)
      threads.emplace_back([&, r] {
        try {
          outcomes[size_t(r)] = save(r);
        } catch (const Error& e) {
          outcomes[size_t(r)] = std::string("error: ") + e.what();
        }
      });
    for (auto& t : threads) t.join();
    return outcomes;
  }
  int size;
  std::barrier<> sync;
  std::vector<std::string> slots;
};

train::NamedTensors shardOf(int rank, float value) {
  return {{"shard" + std::to_string(rank) + ".weight", ops::full({4, 4}, value, DType::F32, Device::cpu())}};
}

}  // namespace

TEST_CASE("ranks save one checkpoint together: rank 0 owns the manifest, each rank its shard",
          "[train][checkpoint]") {
  fs::path save = freshDir("strata-ckpt-ranks");
  ThreadRanks ranks(3);
  auto dirs = ranks.run([&](int r) {
    return train::saveCheckpoint(save.string(), shardOf(r, float(r + 1)), {{"m.x", ops::zeros({2})}},
                                 stateAt(5), ranks.group(r));
  });
  for (const auto& d : dirs) REQUIRE(d == (save / "step-5").string());
  auto manifest = nlohmann::json::parse(std::ifstream(save / "step-5" / "manifest.json"));
  REQUIRE(manifest["world_size"] == 3);
  REQUIRE(manifest["shards"].size() == 3);
  REQUIRE(manifest["files"].size() == 6);
  REQUIRE(manifest["shards"][2]["model"] == "model-rank2.safetensors");
  // Merged for convert, and loaded back shard by shard at the same world size.
  auto merged = train::loadModelShards(save.string());
  REQUIRE(merged.size() == 3);
  REQUIRE(merged.at("shard2.weight").toVector<float>() == std::vector<float>(16, 3.0f));
  auto into = shardOf(1, 0);
  train::loadCheckpoint(save.string(), into, {{"m.x", ops::zeros({2})}}, true, 1);
  REQUIRE(into[0].second.toVector<float>() == std::vector<float>(16, 2.0f));
  REQUIRE(errorOf([&] { train::loadCheckpoint(save.string(), into, {}, false, 3); }).find("3 rank(s)") !=
          std::string::npos);
  // A non-finite tensor on rank 2 fails the save on every rank; step-5 stays `latest`.
  auto failed = ranks.run([&](int r) {
    return train::saveCheckpoint(save.string(), shardOf(r, r == 2 ? NAN : 1.0f), {}, stateAt(6),
                                 ranks.group(r));
  });
  for (const auto& f : failed) {
    INFO(f);
    REQUIRE(f.find("error: rank 2: ") == 0);
    REQUIRE(f.find("non-finite") != std::string::npos);
  }
  REQUIRE(!fs::exists(save / "step-6"));
  REQUIRE(!fs::exists(save / "step-6.tmp"));
  REQUIRE(train::resolveCheckpoint(save.string()) == (save / "step-5").string());
}
