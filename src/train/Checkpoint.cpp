#include "strata/train/Checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/ops/Ops.h"

namespace strata::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* safetensorsType(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::F64:
      return "F64";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::U8:
      return "U8";
  }
  return "?";
}

DType fromSafetensorsType(const std::string& s, const std::string& path) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32, DType::I64, DType::U8})
    if (s == safetensorsType(t)) return t;
  STRATA_FAIL("{}: unsupported safetensors dtype {}", path, s);
}

void writeFileSynced(const std::string& path, const std::string& header,
                     const std::vector<std::vector<char>>& blobs) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  STRATA_CHECK(fd >= 0, "cannot create {}: {}", path, std::strerror(errno));
  auto writeAll = [&](const char* p, size_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd, p, n);
      STRATA_CHECK(w > 0, "write to {} failed: {}", path, std::strerror(errno));
      p += w;
      n -= size_t(w);
    }
  };
  writeAll(header.data(), header.size());
  for (const auto& b : blobs) writeAll(b.data(), b.size());
  STRATA_CHECK(::fsync(fd) == 0, "fsync of {} failed: {}", path, std::strerror(errno));
  ::close(fd);
}

void fsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void writeTextSynced(const std::string& path, const std::string& text) {
  writeFileSynced(path, text, {});
}

}  // namespace

void writeSafetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  std::vector<std::vector<char>> blobs;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    std::vector<char> bytes(t.nbytes());
    t.copyToHost(bytes.data(), t.dtype());
    header[name] = {{"dtype", safetensorsType(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + bytes.size()}}};
    offset += bytes.size();
    blobs.push_back(std::move(bytes));
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  uint64_t len = text.size();
  std::string prefix(8, '\0');
  std::memcpy(prefix.data(), &len, 8);
  writeFileSynced(path, prefix + text, blobs);
}

std::map<std::string, Tensor> readSafetensors(const std::string& path, Device device,
                                              std::map<std::string, std::string>* metadata) {
  std::ifstream in(path, std::ios::binary);
  STRATA_CHECK(in.good(), "cannot open {}", path);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  STRATA_CHECK(in.good() && len < (1ull << 30), "{} is not a safetensors file", path);
  std::string text(len, '\0');
  in.read(text.data(), std::streamsize(len));
  json header = json::parse(text);
  std::map<std::string, Tensor> out;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (metadata)
        for (auto& [k, v] : info.items()) (*metadata)[k] = v.get<std::string>();
      continue;
    }
    DType dt = fromSafetensorsType(info["dtype"].get<std::string>(), path);
    Shape shape = info["shape"].get<Shape>();
    auto offsets = info["data_offsets"].get<std::vector<uint64_t>>();
    size_t bytes = offsets[1] - offsets[0];
    STRATA_CHECK(bytes == size_t(numelOf(shape)) * dtypeSize(dt), "{}: tensor '{}' has inconsistent size",
                 path, name);
    std::vector<char> buf(bytes);
    in.seekg(std::streamoff(8 + len + offsets[0]));
    in.read(buf.data(), std::streamsize(bytes));
    STRATA_CHECK(in.good(), "{}: truncated data for '{}'", path, name);
    out[name] = Tensor::fromHost(buf.data(), dt, size_t(numelOf(shape)), shape, device);
  }
  return out;
}

std::string resolveCheckpoint(const std::string& path) {
  STRATA_CHECK(fs::exists(path), "checkpoint {} does not exist", path);
  if (fs::exists(fs::path(path) / "manifest.json")) return path;
  fs::path latest = fs::path(path) / "latest";
  STRATA_CHECK(fs::exists(latest),
               "{} is neither a checkpoint (no manifest.json) nor a save directory (no latest)", path);
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  fs::path dir = fs::path(path) / name;
  STRATA_CHECK(fs::exists(dir / "manifest.json"), "{} names {}, which has no manifest.json", latest.string(),
               dir.string());
  return dir.string();
}

std::string saveCheckpoint(const std::string& saveDir, const NamedTensors& model,
                           const NamedTensors& optimizer, const CheckpointState& state) {
  fs::create_directories(saveDir);
  std::string name = "step-" + std::to_string(state.step);
  fs::path finalDir = fs::path(saveDir) / name;
  fs::path tmpDir = fs::path(saveDir) / (name + ".tmp");
  fs::remove_all(tmpDir);
  fs::create_directories(tmpDir);
  std::string rank = "rank" + std::to_string(state.rank);
  std::string modelFile = "model-" + rank + ".safetensors", optimFile = "optimizer-" + rank + ".safetensors";
  writeSafetensors((tmpDir / modelFile).string(), model, {{"format", "pt"}});
  writeSafetensors((tmpDir / optimFile).string(), optimizer);
  json manifest{{"step", state.step},
                {"optimizer_steps", state.optimizerSteps},
                {"rng", {{"seed", state.rng.seed}, {"offset", state.rng.offset}}},
                {"data_index", state.dataIndex},
                {"world_size", state.worldSize},
                {"shards", {{{"rank", state.rank}, {"model", modelFile}, {"optimizer", optimFile}}}},
                {"config", state.config}};
  writeTextSynced((tmpDir / "manifest.json").string(), manifest.dump(2));
  fsyncDir(tmpDir.string());
  fs::remove_all(finalDir);
  fs::rename(tmpDir, finalDir);
  fsyncDir(saveDir);
  // `latest` last, by rename, so readers see the old or the new name, never a partial one.
  fs::path latestTmp = fs::path(saveDir) / "latest.tmp";
  writeTextSynced(latestTmp.string(), name + "\n");
  fs::rename(latestTmp, fs::path(saveDir) / "latest");
  fsyncDir(saveDir);
  return finalDir.string();
}

std::map<std::string, Tensor> loadModelShards(const std::string& path) {
  std::string dir = resolveCheckpoint(path);
  std::ifstream in(fs::path(dir) / "manifest.json");
  json manifest = json::parse(in);
  std::map<std::string, Tensor> merged;
  for (const auto& shard : manifest["shards"]) {
    for (auto& [name, t] : readSafetensors((fs::path(dir) / shard["model"].get<std::string>()).string())) {
      STRATA_CHECK(!merged.count(name), "checkpoint {}: tensor '{}' appears in two shards", dir, name);
      merged[name] = t;
    }
  }
  return merged;
}

CheckpointState loadCheckpoint(const std::string& path, const NamedTensors& model,
                               const NamedTensors& optimizer) {
  std::string dir = resolveCheckpoint(path);
  std::ifstream in(fs::path(dir) / "manifest.json");
  json manifest = json::parse(in);
  CheckpointState state;
  state.step = manifest["step"].get<int64_t>();
  state.optimizerSteps = manifest["optimizer_steps"].get<int64_t>();
  state.rng.seed = manifest["rng"]["seed"].get<uint64_t>();
  state.rng.offset = manifest["rng"]["offset"].get<uint64_t>();
  state.dataIndex = manifest["data_index"].get<int64_t>();
  state.config = manifest["config"].get<std::map<std::string, std::string>>();
  const auto& shard = manifest["shards"][0];
  auto restore = [&](const std::string& file, const NamedTensors& into) {
    auto loaded = readSafetensors((fs::path(dir) / file).string());
    for (const auto& [name, t] : into) {
      auto it = loaded.find(name);
      STRATA_CHECK(it != loaded.end(), "checkpoint {} has no tensor '{}'", dir, name);
      STRATA_CHECK(it->second.shape() == t.shape(), "checkpoint {}: '{}' has shape {}, the model has {}", dir,
                   name, toString(it->second.shape()), toString(t.shape()));
      ops::copy(t, it->second);
    }
  };
  restore(shard["model"].get<std::string>(), model);
  restore(shard["optimizer"].get<std::string>(), optimizer);
  return state;
}

}  // namespace strata::train
