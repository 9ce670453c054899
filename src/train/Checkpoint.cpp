#include "strata/train/Checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "AtomicFile.h"
#include "strata/core/Checksum.h"
#include "strata/ops/Ops.h"

namespace strata::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kManifestVersion = 2;

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
  STRATA_USER_FAIL("{}: unsupported safetensors dtype {}", path, s);
}

// Index of the first NaN or infinity among `n` host values of a floating dtype, or -1. Looks at the exponent
// bits only, so it needs no conversion.
int64_t firstNonFinite(const void* data, DType dtype, size_t n) {
  auto scan = [&](auto word, auto mask) -> int64_t {
    using W = decltype(word);
    const W* p = static_cast<const W*>(data);
    for (size_t i = 0; i < n; ++i)
      if ((p[i] & mask) == mask) return int64_t(i);
    return -1;
  };
  switch (dtype) {
    case DType::F32:
      return scan(uint32_t(0), uint32_t(0x7F800000u));
    case DType::BF16:
      return scan(uint16_t(0), uint16_t(0x7F80u));
    case DType::F16:
      return scan(uint16_t(0), uint16_t(0x7C00u));
    case DType::F64:
      return scan(uint64_t(0), uint64_t(0x7FF0000000000000ull));
    default:
      return -1;
  }
}

// Writes `parts` to a new file and fsyncs it; returns its size and CRC32C.
FileDigest writeFileSynced(const std::string& path, const std::vector<const std::string*>& parts) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  STRATA_USER_CHECK(fd >= 0, "cannot create {}: {}", path, std::strerror(errno));
  FileDigest digest;
  auto fail = [&](const char* what) {
    int err = errno;
    ::close(fd);
    STRATA_USER_FAIL("{} of {} failed: {}", what, path, std::strerror(err));
  };
  for (const std::string* part : parts) {
    const char* p = part->data();
    size_t n = part->size();
    digest.crc32c = crc32c(p, n, digest.crc32c);
    digest.bytes += n;
    while (n > 0) {
      ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail("write");
      p += w;
      n -= size_t(w);
    }
  }
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) STRATA_USER_FAIL("closing {} failed: {}", path, std::strerror(errno));
  return digest;
}

void fsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

FileDigest writeTextSynced(const std::string& path, const std::string& text) {
  return writeFileSynced(path, {&text});
}

json readManifest(const std::string& dir) {
  fs::path path = fs::path(dir) / "manifest.json";
  std::ifstream in(path);
  STRATA_USER_CHECK(in.good(), "cannot read {}", path.string());
  json manifest;
  try {
    manifest = json::parse(in);
  } catch (const json::exception& e) {
    STRATA_USER_FAIL("{} is corrupted (not valid JSON: {})", path.string(), e.what());
  }
  for (const char* key : {"step", "optimizer_steps", "rng", "data_index", "shards", "config"})
    STRATA_USER_CHECK(manifest.is_object() && manifest.contains(key), "{} is corrupted: it has no '{}'",
                      path.string(), key);
  return manifest;
}

// Checks every file the manifest lists against its recorded size and CRC32C. Manifests written before
// checksums existed (format 1) list none and pass unchecked.
void verifyFiles(const std::string& dir, const json& manifest) {
  if (!manifest.contains("files")) return;
  for (auto& [name, info] : manifest["files"].items()) {
    fs::path path = fs::path(dir) / name;
    STRATA_USER_CHECK(fs::exists(path), "checkpoint {}: file {} is missing", dir, name);
    uint64_t bytes = info.at("bytes").get<uint64_t>();
    STRATA_USER_CHECK(fs::file_size(path) == bytes, "checkpoint file {} has {} bytes, its manifest says {}",
                      path.string(), fs::file_size(path), bytes);
    uint32_t expected = info.at("crc32c").get<uint32_t>(), actual = crc32cFile(path.string());
    auto hex = [](uint32_t v) {
      char buf[16];
      std::snprintf(buf, sizeof(buf), "%08x", v);
      return std::string(buf);
    };
    STRATA_USER_CHECK(actual == expected,
                      "checkpoint file {} is corrupted: its CRC32C is {}, the manifest recorded {}",
                      path.string(), hex(actual), hex(expected));
  }
}

std::string joinNames(const std::vector<std::string>& names, size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > limit) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

// The step number of a "step-<N>" directory name, or -1.
int64_t stepOf(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  return std::stoll(name.substr(5));
}

json layoutToJson(const zero::ChunkLayout& layout) {
  json params = json::object();
  for (const auto& slot : layout.slots)
    params[slot.name] = {
        {"chunk", slot.chunk}, {"offset", slot.offset}, {"numel", slot.numel}, {"shape", slot.shape}};
  json chunks = json::array();
  for (const auto& c : layout.chunks) chunks.push_back({{"capacity", c.capacity}, {"used", c.used}});
  return {{"dtype", safetensorsType(layout.dtype)},
          {"chunk_elems", layout.chunkElems},
          {"chunks", chunks},
          {"params", params}};
}

zero::ChunkLayout layoutFromJson(const json& j, const std::string& where) {
  zero::ChunkLayout layout;
  layout.dtype = fromSafetensorsType(j.at("dtype").get<std::string>(), where);
  layout.chunkElems = j.at("chunk_elems").get<int64_t>();
  for (const auto& c : j.at("chunks")) {
    zero::ChunkInfo info;
    info.capacity = c.at("capacity").get<int64_t>();
    info.used = c.at("used").get<int64_t>();
    layout.chunks.push_back(info);
  }
  for (const auto& [name, p] : j.at("params").items()) {
    zero::ChunkSlot slot{name, p.at("shape").get<Shape>(), p.at("chunk").get<int64_t>(),
                         p.at("offset").get<int64_t>(), p.at("numel").get<int64_t>()};
    STRATA_USER_CHECK(slot.chunk >= 0 && slot.chunk < int64_t(layout.chunks.size()) &&
                          slot.offset + slot.numel <= layout.chunks[size_t(slot.chunk)].capacity,
                      "{} is corrupted: parameter '{}' lies outside its chunk", where, name);
    layout.slots.push_back(std::move(slot));
  }
  // Slots back in chunk order (the JSON object is sorted by name).
  std::sort(layout.slots.begin(), layout.slots.end(), [](const auto& a, const auto& b) {
    return a.chunk != b.chunk ? a.chunk < b.chunk : a.offset < b.offset;
  });
  for (size_t k = 0; k < layout.slots.size(); ++k) {
    zero::ChunkInfo& c = layout.chunks[size_t(layout.slots[k].chunk)];
    c.slots.push_back(int64_t(k));
    c.payload += layout.slots[k].numel;
  }
  return layout;
}

}  // namespace

FileDigest writeSafetensors(const std::string& path, const NamedTensors& tensors,
                            const std::map<std::string, std::string>& metadata, bool requireFinite) {
  json header = json::object();
  std::vector<std::string> blobs;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    std::string bytes(t.nbytes(), '\0');
    t.copyToHost(bytes.data(), t.dtype());
    if (requireFinite) {
      int64_t bad = firstNonFinite(bytes.data(), t.dtype(), size_t(t.numel()));
      STRATA_USER_CHECK(bad < 0, "refusing to write {}: tensor '{}' holds a non-finite value (element {})",
                        path, name, bad);
    }
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
  prefix += text;
  std::vector<const std::string*> parts{&prefix};
  for (const auto& b : blobs) parts.push_back(&b);
  return writeFileSynced(path, parts);
}

std::vector<SafetensorsEntry> readSafetensorsHeader(const std::string& path,
                                                    std::map<std::string, std::string>* metadata) {
  std::ifstream in(path, std::ios::binary);
  STRATA_USER_CHECK(in.good(), "cannot open {}", path);
  uint64_t fileBytes = fs::file_size(path);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  STRATA_USER_CHECK(in.good() && len <= fileBytes - 8 && len < (1ull << 30),
                    "{} is not a safetensors file (bad header length)", path);
  std::string text(len, '\0');
  in.read(text.data(), std::streamsize(len));
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    STRATA_USER_FAIL("{} is corrupted: its safetensors header is not valid JSON ({})", path, e.what());
  }
  STRATA_USER_CHECK(header.is_object(), "{} is corrupted: its safetensors header is not a JSON object", path);
  std::vector<SafetensorsEntry> entries;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (metadata)
        for (auto& [k, v] : info.items())
          if (v.is_string()) (*metadata)[k] = v.get<std::string>();
      continue;
    }
    SafetensorsEntry e;
    e.name = name;
    std::vector<uint64_t> offsets;
    try {
      e.dtype = fromSafetensorsType(info.at("dtype").get<std::string>(), path);
      e.shape = info.at("shape").get<Shape>();
      offsets = info.at("data_offsets").get<std::vector<uint64_t>>();
    } catch (const json::exception& ex) {
      STRATA_USER_FAIL("{} is corrupted: bad header entry for '{}' ({})", path, name, ex.what());
    }
    STRATA_USER_CHECK(offsets.size() == 2 && offsets[0] <= offsets[1] && 8 + len + offsets[1] <= fileBytes,
                      "{} is corrupted: tensor '{}' lies outside the file", path, name);
    e.begin = 8 + len + offsets[0];
    e.end = 8 + len + offsets[1];
    STRATA_USER_CHECK(e.end - e.begin == uint64_t(numelOf(e.shape)) * dtypeSize(e.dtype),
                      "{}: tensor '{}' has inconsistent size", path, name);
    entries.push_back(std::move(e));
  }
  return entries;
}

std::map<std::string, Tensor> readSafetensors(const std::string& path, Device device,
                                              std::map<std::string, std::string>* metadata) {
  std::map<std::string, Tensor> out;
  std::ifstream in(path, std::ios::binary);
  for (const auto& e : readSafetensorsHeader(path, metadata)) {
    std::vector<char> buf(e.end - e.begin);
    in.seekg(std::streamoff(e.begin));
    in.read(buf.data(), std::streamsize(buf.size()));
    STRATA_USER_CHECK(in.good(), "{}: truncated data for '{}'", path, e.name);
    out[e.name] = Tensor::fromHost(buf.data(), e.dtype, size_t(numelOf(e.shape)), e.shape, device);
  }
  return out;
}

std::string resolveCheckpoint(const std::string& path) {
  STRATA_USER_CHECK(fs::exists(path), "checkpoint {} does not exist", path);
  if (fs::exists(fs::path(path) / "manifest.json")) return path;
  fs::path latest = fs::path(path) / "latest";
  STRATA_USER_CHECK(fs::exists(latest),
                    "{} is neither a checkpoint (no manifest.json) nor a save directory (no latest)", path);
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  fs::path dir = fs::path(path) / name;
  STRATA_USER_CHECK(!name.empty() && fs::exists(dir / "manifest.json"),
                    "{} names '{}', which has no manifest.json", latest.string(), name);
  return dir.string();
}

CheckpointGroup CheckpointGroup::single() {
  CheckpointGroup g;
  g.barrier = [] {};
  g.allGather = [](const std::string& text) { return std::vector<std::string>{text}; };
  return g;
}

std::string saveCheckpoint(const std::string& saveDir, const NamedTensors& model,
                           const NamedTensors& optimizer, const CheckpointState& state,
                           const CheckpointGroup& group) {
  STRATA_CHECK(group.rank >= 0 && group.rank < group.worldSize && group.barrier && group.allGather,
               "saveCheckpoint: rank {} of {} with {} barrier / all-gather", group.rank, group.worldSize,
               group.barrier && group.allGather ? "a" : "no");
  bool leader = group.rank == 0;
  std::string name = "step-" + std::to_string(state.step);
  fs::path finalDir = fs::path(saveDir) / name;
  fs::path tmpDir = fs::path(saveDir) / (name + ".tmp");
  // 1. Rank 0 lays out the temporary directory; the others wait for it.
  std::string setupError;
  if (leader) {
    try {
      fs::create_directories(saveDir);
      fs::remove_all(tmpDir);
      fs::create_directories(tmpDir);
    } catch (const std::exception& e) {
      setupError = e.what();
    }
  }
  std::vector<std::string> setup = group.allGather(setupError);
  STRATA_USER_CHECK(setup[0].empty(), "cannot prepare checkpoint directory {}: {}", tmpDir.string(),
                    setup[0]);
  // 2. Every rank writes its own shard files, and reports their digests or its error to all.
  std::string rank = "rank" + std::to_string(group.rank);
  std::string modelFile = "model-" + rank + ".safetensors", optimFile = "optimizer-" + rank + ".safetensors";
  json report{
      {"rank", group.rank}, {"model", modelFile}, {"optimizer", optimFile}, {"files", json::object()}};
  try {
    for (auto [file, tensors, meta] :
         {std::tuple{modelFile, &model, std::map<std::string, std::string>{{"format", "pt"}}},
          std::tuple{optimFile, &optimizer, std::map<std::string, std::string>{}}}) {
      FileDigest d = writeSafetensors((tmpDir / file).string(), *tensors, meta, /*requireFinite=*/true);
      report["files"][file] = {{"bytes", d.bytes}, {"crc32c", d.crc32c}};
    }
  } catch (const std::exception& e) {
    report["error"] = e.what();
  }
  std::vector<std::string> reports = group.allGather(report.dump());
  // 3. A failure anywhere fails the save everywhere, with the same message; the previous checkpoint stays.
  json shards = json::array(), files = json::object();
  for (const auto& text : reports) {
    json r = json::parse(text);
    if (r.contains("error")) {
      if (leader) fs::remove_all(tmpDir);
      group.barrier();
      STRATA_USER_FAIL("{}{}",
                       group.worldSize > 1 ? "rank " + std::to_string(r["rank"].get<int>()) + ": " : "",
                       r["error"].get<std::string>());
    }
    shards.push_back({{"rank", r["rank"]}, {"model", r["model"]}, {"optimizer", r["optimizer"]}});
    for (auto& [file, digest] : r["files"].items()) files[file] = digest;
  }
  // 4. Rank 0 writes the manifest, renames the directory into place and updates `latest`; the others wait, so
  // every rank returns with the checkpoint complete.
  std::string commitError;
  if (leader) {
    try {
      json manifest{{"format_version", kManifestVersion},
                    {"step", state.step},
                    {"optimizer_steps", state.optimizerSteps},
                    {"rng", {{"seed", state.rng.seed}, {"offset", state.rng.offset}}},
                    {"data_index", state.dataIndex},
                    {"loss_scale", {{"scale", state.lossScale}, {"good_steps", state.lossScaleGoodSteps}}},
                    {"world_size", group.worldSize},
                    {"shards", shards},
                    {"files", files},
                    {"model", state.model},
                    {"layout", state.layout.slots.empty() ? json(nullptr) : layoutToJson(state.layout)},
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
    } catch (const std::exception& e) {
      commitError = e.what();
    }
  }
  std::vector<std::string> committed = group.allGather(commitError);
  STRATA_USER_CHECK(committed[0].empty(), "saving checkpoint {} failed: {}", finalDir.string(), committed[0]);
  return finalDir.string();
}

namespace {

// The saved state a parsed manifest of `dir` holds.
CheckpointState stateFromManifest(const json& manifest, const std::string& dir) {
  CheckpointState state;
  try {
    state.step = manifest["step"].get<int64_t>();
    state.optimizerSteps = manifest["optimizer_steps"].get<int64_t>();
    state.rng.seed = manifest["rng"]["seed"].get<uint64_t>();
    state.rng.offset = manifest["rng"]["offset"].get<uint64_t>();
    state.dataIndex = manifest["data_index"].get<int64_t>();
    if (manifest.contains("loss_scale")) {
      state.lossScale = manifest["loss_scale"].at("scale").get<double>();
      state.lossScaleGoodSteps = manifest["loss_scale"].at("good_steps").get<int64_t>();
    }
    state.worldSize = manifest.value("world_size", 1);
    state.config = manifest["config"].get<std::map<std::string, std::string>>();
    if (manifest.contains("model")) state.model = manifest["model"].get<std::map<std::string, std::string>>();
    if (manifest.contains("layout") && manifest["layout"].is_object())
      state.layout = layoutFromJson(manifest["layout"], dir + "/manifest.json");
  } catch (const json::exception& e) {
    STRATA_USER_FAIL("{}/manifest.json is corrupted: {}", dir, e.what());
  }
  return state;
}

}  // namespace

CheckpointState readCheckpointState(const std::string& path) {
  std::string dir = resolveCheckpoint(path);
  return stateFromManifest(readManifest(dir), dir);
}

std::map<std::string, Tensor> loadModelShards(const std::string& path) {
  std::string dir = resolveCheckpoint(path);
  json manifest = readManifest(dir);
  verifyFiles(dir, manifest);
  std::map<std::string, Tensor> merged;
  for (const auto& shard : manifest["shards"]) {
    for (auto& [name, t] : readSafetensors((fs::path(dir) / shard["model"].get<std::string>()).string())) {
      STRATA_USER_CHECK(!merged.count(name), "checkpoint {}: tensor '{}' appears in two shards", dir, name);
      merged[name] = t;
    }
  }
  return merged;
}

MergeStats mergeModelShards(const std::string& path, const std::string& output,
                            const std::function<std::string(const std::string&)>& rename,
                            const std::map<std::string, std::string>& metadata) {
  std::string dir = resolveCheckpoint(path);
  json manifest = readManifest(dir);
  verifyFiles(dir, manifest);
  struct Source {
    std::string file;
    SafetensorsEntry entry;
  };
  std::map<std::string, Source> tensors;  // output name -> where its bytes are
  for (const auto& shard : manifest["shards"]) {
    std::string file = (fs::path(dir) / shard["model"].get<std::string>()).string();
    for (auto& e : readSafetensorsHeader(file)) {
      std::string name = rename ? rename(e.name) : e.name;
      STRATA_USER_CHECK(!tensors.count(name), "checkpoint {}: tensor '{}' appears in two shards", dir, name);
      tensors[name] = Source{file, std::move(e)};
    }
  }
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, src] : tensors) {
    uint64_t bytes = src.entry.end - src.entry.begin;
    header[name] = {{"dtype", safetensorsType(src.entry.dtype)},
                    {"shape", src.entry.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  uint64_t len = text.size();
  AtomicFileWriter out(output);
  out.write(&len, 8);
  out.write(text.data(), text.size());
  MergeStats stats;
  std::vector<char> buffer;
  for (const auto& [name, src] : tensors) {
    uint64_t bytes = src.entry.end - src.entry.begin;
    buffer.resize(bytes);
    buffer.shrink_to_fit();
    stats.peakBufferBytes = std::max<uint64_t>(stats.peakBufferBytes, bytes);
    std::ifstream in(src.file, std::ios::binary);
    in.seekg(std::streamoff(src.entry.begin));
    in.read(buffer.data(), std::streamsize(bytes));
    STRATA_USER_CHECK(in.good(), "{}: truncated data for '{}'", src.file, src.entry.name);
    out.write(buffer.data(), bytes);
    stats.bytes += bytes;
    ++stats.tensors;
  }
  out.commit();
  return stats;
}

CheckpointState loadCheckpoint(const std::string& path, const NamedTensors& model,
                               const NamedTensors& optimizer, bool loadOptimizer, int rank) {
  std::string dir = resolveCheckpoint(path);
  json manifest = readManifest(dir);
  CheckpointState state = stateFromManifest(manifest, dir);
  verifyFiles(dir, manifest);
  STRATA_USER_CHECK(manifest["shards"].is_array() && !manifest["shards"].empty(),
                    "{}/manifest.json is corrupted: no shards", dir);
  const int numShards = static_cast<int>(manifest["shards"].size());
  STRATA_USER_CHECK(rank >= 0 && rank < numShards,
                    "checkpoint {} was written by {} rank(s); rank {} has no shard in it", dir, numShards,
                    rank);
  const auto& shard = manifest["shards"][size_t(rank)];
  STRATA_USER_CHECK(shard.value("rank", -1) == rank, "{}/manifest.json is corrupted: shard {} names rank {}",
                    dir, rank, shard.value("rank", -1));
  auto restore = [&](const std::string& file, const NamedTensors& into, const char* what) {
    std::string filePath = (fs::path(dir) / file).string();
    auto loaded = readSafetensors(filePath);
    std::vector<std::string> missing, mismatched;
    for (const auto& [name, t] : into) {
      auto it = loaded.find(name);
      if (it == loaded.end()) {
        missing.push_back(name);
        continue;
      }
      if (it->second.shape() != t.shape()) {
        mismatched.push_back(detail::format("'{}' is {} there and {} here", name,
                                            toString(it->second.shape()), toString(t.shape())));
        loaded.erase(it);
        continue;
      }
      ops::copy(t, it->second);
      loaded.erase(it);
    }
    std::vector<std::string> unused;
    for (const auto& [name, t] : loaded) unused.push_back(name);
    STRATA_USER_CHECK(mismatched.empty(), "checkpoint {} does not fit this {}: {}", filePath, what,
                      joinNames(mismatched, 4));
    STRATA_USER_CHECK(missing.empty(), "checkpoint {} lacks {} tensors of this {}: {}", filePath,
                      missing.size(), what, joinNames(missing));
    STRATA_USER_CHECK(unused.empty(), "checkpoint {} holds {} tensors this {} does not have: {}", filePath,
                      unused.size(), what, joinNames(unused));
  };
  restore(shard["model"].get<std::string>(), model, "model");
  if (loadOptimizer) restore(shard["optimizer"].get<std::string>(), optimizer, "optimizer");
  return state;
}

std::vector<std::string> removeStaleTemporaries(const std::string& saveDir) {
  std::vector<std::string> removed;
  if (!fs::is_directory(saveDir)) return removed;
  for (const auto& entry : fs::directory_iterator(saveDir)) {
    std::string name = entry.path().filename().string();
    bool stepTmp = name.size() > 4 && name.substr(name.size() - 4) == ".tmp" &&
                   stepOf(name.substr(0, name.size() - 4)) >= 0;
    if (stepTmp || name == "latest.tmp") removed.push_back(name);
  }
  for (const auto& name : removed) fs::remove_all(fs::path(saveDir) / name);
  return removed;
}

std::vector<std::string> pruneCheckpoints(const std::string& saveDir, int64_t keep) {
  std::vector<std::string> removed;
  if (keep <= 0 || !fs::is_directory(saveDir)) return removed;
  std::string latest;
  if (fs::exists(fs::path(saveDir) / "latest"))
    std::getline(std::ifstream(fs::path(saveDir) / "latest"), latest);
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const auto& entry : fs::directory_iterator(saveDir)) {
    std::string name = entry.path().filename().string();
    if (entry.is_directory() && stepOf(name) >= 0) steps.emplace_back(stepOf(name), name);
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + size_t(keep) < steps.size(); ++i) {
    if (steps[i].second == latest) continue;
    fs::remove_all(fs::path(saveDir) / steps[i].second);
    removed.push_back(steps[i].second);
  }
  return removed;
}

}  // namespace strata::train
