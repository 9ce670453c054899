#include "strata/train/Checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "core/AtomicFile.h"
#include "strata/core/Checksum.h"
#include "strata/core/FileError.h"
#include "strata/ops/Ops.h"

namespace strata::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kManifestVersion = 3;  // 3: chunk pieces (NOTE [Sharded chunk checkpoints])

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

// Writes `text` to a new file and fsyncs it; returns its size and CRC32C.
FileDigest writeTextSynced(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  STRATA_USER_CHECK(fd >= 0, "cannot create {}: {}", path, std::strerror(errno));
  auto fail = [&](const char* what) {
    int err = errno;
    ::close(fd);
    STRATA_USER_FAIL("{} of {} failed: {}", what, path, fileErrorText(err));
  };
  const char* p = text.data();
  size_t n = text.size();
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write");
    p += w;
    n -= size_t(w);
  }
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) STRATA_USER_FAIL("closing {} failed: {}", path, std::strerror(errno));
  return FileDigest{text.size(), crc32c(text.data(), text.size())};
}

void fsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
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

// Checks one checkpoint file against the size and CRC32C its manifest recorded.
// (The size alone with `crc` false: cheap, and enough to trust a file's header.)
void verifyFile(const std::string& dir, const std::string& name, const FileDigest& expected,
                bool crc = true) {
  fs::path path = fs::path(dir) / name;
  STRATA_USER_CHECK(fs::exists(path), "checkpoint {}: file {} is missing", dir, name);
  STRATA_USER_CHECK(fs::file_size(path) == expected.bytes,
                    "checkpoint file {} has {} bytes, its manifest says {}", path.string(),
                    fs::file_size(path), expected.bytes);
  if (!crc) return;
  uint32_t actual = crc32cFile(path.string());
  auto hex = [](uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%08x", v);
    return std::string(buf);
  };
  STRATA_USER_CHECK(actual == expected.crc32c,
                    "checkpoint file {} is corrupted: its CRC32C is {}, the manifest recorded {}",
                    path.string(), hex(actual), hex(expected.crc32c));
}

// The sizes and CRC32Cs the manifest lists, by file name (none in manifests written before checksums).
std::map<std::string, FileDigest> digestsOf(const json& manifest) {
  std::map<std::string, FileDigest> out;
  if (manifest.contains("files"))
    for (auto& [name, info] : manifest["files"].items())
      out[name] = FileDigest{info.at("bytes").get<uint64_t>(), info.at("crc32c").get<uint32_t>()};
  return out;
}

// Checks every file the manifest lists.
void verifyFiles(const std::string& dir, const json& manifest) {
  for (const auto& [name, digest] : digestsOf(manifest)) verifyFile(dir, name, digest);
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

std::string chunkLayoutText(const zero::ChunkLayout& layout) {
  return layoutToJson(layout).dump();
}

zero::ChunkLayout chunkLayoutFromText(const std::string& text, const std::string& where) {
  return layoutFromJson(json::parse(text), where);
}

SaveTensors toSave(const NamedTensors& tensors) {
  SaveTensors out;
  for (const auto& [name, t] : tensors)
    out.push_back(SaveTensor{name, t.shape(), t.dtype(), [t = t] { return t; }});
  return out;
}

FileDigest writeSafetensors(const std::string& path, const NamedTensors& tensors,
                            const std::map<std::string, std::string>& metadata, bool requireFinite) {
  return writeSafetensors(path, toSave(tensors), metadata, requireFinite);
}

FileDigest writeSafetensors(const std::string& path, const SaveTensors& tensors,
                            const std::map<std::string, std::string>& metadata, bool requireFinite) {
  // The header first, from the shapes; then one tensor at a time through a reused host buffer, so a shard
  // of any size is written with one tensor's worth of host memory. A refused tensor leaves no file.
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t bytes = uint64_t(numelOf(t.shape)) * dtypeSize(t.dtype);
    header[t.name] = {
        {"dtype", safetensorsType(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  uint64_t len = text.size();
  FileDigest digest;
  AtomicFileWriter out(path);
  auto put = [&](const void* p, size_t n) {
    digest.crc32c = crc32c(p, n, digest.crc32c);
    digest.bytes += n;
    out.write(p, n);
  };
  put(&len, 8);
  put(text.data(), text.size());
  std::vector<char> buffer;
  for (const auto& entry : tensors) {
    const std::string& name = entry.name;
    Tensor t = entry.value();
    STRATA_CHECK(t.shape() == entry.shape && t.dtype() == entry.dtype, "writeSafetensors: '{}' changed shape",
                 name);
    buffer.resize(t.nbytes());
    t.copyToHost(buffer.data(), t.dtype());
    if (requireFinite) {
      int64_t bad = firstNonFinite(buffer.data(), t.dtype(), size_t(t.numel()));
      STRATA_USER_CHECK(bad < 0, "refusing to write {}: tensor '{}' holds a non-finite value (element {})",
                        path, name, bad);
    }
    put(buffer.data(), buffer.size());
  }
  out.commit();
  return digest;
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
  return saveCheckpoint(saveDir, toSave(model), toSave(optimizer), state, group);
}

std::string saveCheckpoint(const std::string& saveDir, const SaveTensors& model, const SaveTensors& optimizer,
                           const CheckpointState& state, const CheckpointGroup& group) {
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
                    {"chunked", state.chunked},
                    {"shards", shards},
                    {"files", files},
                    {"model", state.model},
                    {"layout", state.layout.slots.empty() ? json(nullptr) : layoutToJson(state.layout)},
                    {"config", state.config}};
      if (!state.runId.empty()) manifest["run_id"] = state.runId;
      if (!state.effective.empty()) manifest["effective_config"] = state.effective;
      if (!state.tensorSlices.empty()) {
        json slices = json::object();
        for (const auto& [name, how] : state.tensorSlices)
          slices[name] = {{"dim", how.dim}, {"groups", how.groups}};
        manifest["tensor_slices"] = slices;
      }
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
    state.chunked = manifest.value("chunked", false);
    state.config = manifest["config"].get<std::map<std::string, std::string>>();
    if (manifest.contains("model")) state.model = manifest["model"].get<std::map<std::string, std::string>>();
    state.runId = manifest.value("run_id", std::string());
    if (manifest.contains("effective_config"))
      state.effective = manifest["effective_config"].get<std::map<std::string, std::string>>();
    if (manifest.contains("layout") && manifest["layout"].is_object())
      state.layout = layoutFromJson(manifest["layout"], dir + "/manifest.json");
    if (manifest.contains("tensor_slices"))
      for (const auto& [name, how] : manifest["tensor_slices"].items())
        state.tensorSlices[name] =
            nn::TensorSlice{how.at("dim").get<int64_t>(), how.at("groups").get<int64_t>()};
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

std::string chunkPieceName(const std::string& kind, int64_t chunk, int64_t begin) {
  return kind + "." + std::to_string(chunk) + "@" + std::to_string(begin);
}

namespace {

// Parses a chunk piece's name: "<kind>.<chunk>@<begin>", or the older whole-chunk moments "exp_avg.<chunk>"
// and "exp_avg_sq.<chunk>" (begin 0). Parameter names never match: their kinds are not these.
bool parsePiece(const std::string& name, std::string* kind, int64_t* chunk, int64_t* begin) {
  size_t dot = name.find('.');
  if (dot == std::string::npos) return false;
  std::string k = name.substr(0, dot);
  if (k != "param" && k != "exp_avg" && k != "exp_avg_sq" && k != "adafactor_v" && k != "delayed_param" &&
      k != "powersgd" && k != "fp8")
    return false;
  size_t at = name.find('@', dot);
  auto digits = [](const std::string& t) {
    return !t.empty() && std::all_of(t.begin(), t.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  };
  std::string c = name.substr(dot + 1, at == std::string::npos ? std::string::npos : at - dot - 1);
  std::string b = at == std::string::npos ? "0" : name.substr(at + 1);
  if (!digits(c) || !digits(b) || (at == std::string::npos && k == "param")) return false;
  *kind = k;
  *chunk = std::stoll(c);
  *begin = std::stoll(b);
  return true;
}

}  // namespace

ChunkCheckpointReader::ChunkCheckpointReader(const std::string& path) : dir_(resolveCheckpoint(path)) {
  json manifest = readManifest(dir_);
  state_ = stateFromManifest(manifest, dir_);
  chunked_ = state_.chunked;
  digests_ = digestsOf(manifest);
  STRATA_USER_CHECK(manifest["shards"].is_array() && !manifest["shards"].empty(),
                    "{}/manifest.json is corrupted: no shards", dir_);
  STRATA_USER_CHECK(!chunked_ || !state_.layout.slots.empty(),
                    "{}/manifest.json is corrupted: its tensors are chunk pieces but it has no layout", dir_);
  for (const auto& shard : manifest["shards"]) {
    for (const char* key : {"model", "optimizer"}) {
      if (!shard.contains(key)) continue;
      std::string name = shard[key].get<std::string>(), filePath = (fs::path(dir_) / name).string();
      if (digests_.count(name)) verifyFile(dir_, name, digests_.at(name), /*crc=*/false);
      size_t f = files_.size();
      files_.push_back(name);
      int fd = ::open(filePath.c_str(), O_RDONLY | O_CLOEXEC);
      STRATA_USER_CHECK(fd >= 0, "checkpoint {}: cannot open {}: {}", dir_, name, std::strerror(errno));
      fds_.push_back(fd);
      verified_.push_back(!digests_.count(name));
      std::vector<SafetensorsEntry> entries;
      try {
        entries = readSafetensorsHeader(filePath);
      } catch (const Error&) {
        // A header that does not parse is most likely damage the checksum names.
        if (digests_.count(name)) verifyFile(dir_, name, digests_.at(name));
        throw;
      }
      for (auto& e : entries) {
        std::string kind;
        int64_t chunk = 0, begin = 0;
        if (parsePiece(e.name, &kind, &chunk, &begin)) {
          STRATA_USER_CHECK(e.dtype == DType::F32 && e.shape.size() == 1,
                            "{} is corrupted: chunk piece '{}' is not a flat fp32 tensor", filePath, e.name);
          pieces_[kind][chunk].push_back(Piece{begin, begin + e.shape[0], f, e.begin});
        } else if (std::string(key) == "model") {
          STRATA_USER_CHECK(!wholeParams_.count(e.name), "checkpoint {}: tensor '{}' appears in two shards",
                            dir_, e.name);
          params_[e.name] = Parameter{e.shape, e.dtype};
          wholeParams_[e.name] = {f, e};
        }
      }
    }
  }
  for (auto& [kind, chunks] : pieces_)
    for (auto& [chunk, list] : chunks) {
      std::sort(list.begin(), list.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
      // (An optimizer's own layout, PowerSGD's and FP8's state are not one value per element: their pieces
      // may be longer than a shard.)
      if (kind == "adafactor_v" || kind == "powersgd" || kind == "fp8") continue;
      for (size_t i = 1; i < list.size(); ++i)
        STRATA_USER_CHECK(list[i - 1].end <= list[i].begin,
                          "checkpoint {} is corrupted: two ranks hold element {} of {} chunk {}", dir_,
                          list[i].begin, kind, chunk);
    }
  if (chunked_)
    for (const auto& slot : state_.layout.slots) params_[slot.name] = Parameter{slot.shape, DType::F32};
}

ChunkCheckpointReader::~ChunkCheckpointReader() {
  for (int fd : fds_) ::close(fd);
}

bool ChunkCheckpointReader::hasOptimizer() const {
  return pieces_.count("exp_avg") && pieces_.count("exp_avg_sq");
}

bool ChunkCheckpointReader::hasKind(const std::string& kind) const {
  return pieces_.count(kind) > 0;
}

bool ChunkCheckpointReader::readChunkPiece(const std::string& kind, int64_t chunk, int64_t begin, int64_t n,
                                           float* dst) {
  auto kindIt = pieces_.find(kind);
  if (kindIt == pieces_.end()) return false;
  auto chunkIt = kindIt->second.find(chunk);
  if (chunkIt == kindIt->second.end()) return false;
  for (const Piece& piece : chunkIt->second)
    if (piece.begin == begin && piece.end - piece.begin == n) {
      readBytes(piece.file, piece.offset, size_t(n) * 4, dst);
      return true;
    }
  return false;
}

void ChunkCheckpointReader::readBytes(size_t file, uint64_t offset, size_t bytes, void* dst) {
  if (!verified_[file]) {
    verifyFile(dir_, files_[file], digests_.at(files_[file]));
    verified_[file] = true;
  }
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    ssize_t got = ::pread(fds_[file], p, std::min<size_t>(bytes, size_t(1) << 30), off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    STRATA_USER_CHECK(got > 0, "checkpoint {}: reading {} failed: {}", dir_, files_[file],
                      got < 0 ? std::strerror(errno) : "the file is truncated");
    p += got;
    offset += uint64_t(got);
    bytes -= size_t(got);
  }
}

int64_t ChunkCheckpointReader::readParameterRange(const std::string& kind, const std::string& name,
                                                  int64_t begin, int64_t end, float* dst, bool whole) {
  if (kind == "param" && !chunked_) {
    auto it = wholeParams_.find(name);
    STRATA_USER_CHECK(it != wholeParams_.end(), "checkpoint {} has no parameter '{}'", dir_, name);
    const SafetensorsEntry& e = it->second.second;
    STRATA_USER_CHECK(e.dtype == DType::F32, "checkpoint {}: parameter '{}' is saved as {}, not fp32", dir_,
                      name, dtypeName(e.dtype));
    readBytes(it->second.first, e.begin + uint64_t(begin) * 4, size_t(end - begin) * 4, dst);
    return end - begin;
  }
  auto slot = std::find_if(state_.layout.slots.begin(), state_.layout.slots.end(),
                           [&](const zero::ChunkSlot& s) { return s.name == name; });
  STRATA_USER_CHECK(slot != state_.layout.slots.end(), "checkpoint {} has no parameter '{}'", dir_, name);
  int64_t a = slot->offset + begin, b = slot->offset + end, covered = 0;
  auto kindIt = pieces_.find(kind);
  if (kindIt == pieces_.end() && !whole) return 0;
  STRATA_USER_CHECK(kindIt != pieces_.end(), "checkpoint {} holds no {} state", dir_, kind);
  auto chunkIt = kindIt->second.find(slot->chunk);
  if (chunkIt != kindIt->second.end())
    for (const Piece& piece : chunkIt->second) {
      int64_t lo = std::max(a, piece.begin), hi = std::min(b, piece.end);
      if (lo >= hi) continue;
      readBytes(piece.file, piece.offset + uint64_t(lo - piece.begin) * 4, size_t(hi - lo) * 4,
                dst + (lo - a));
      covered += hi - lo;
    }
  STRATA_USER_CHECK(covered == b - a || !whole,
                    "checkpoint {} is incomplete: its shards hold {} of the {} elements of '{}' ({} state)",
                    dir_, covered, b - a, name, kind);
  return covered;
}

void ChunkCheckpointReader::readParameter(const std::string& name, void* dst) {
  auto it = params_.find(name);
  STRATA_USER_CHECK(it != params_.end(), "checkpoint {} has no parameter '{}'", dir_, name);
  if (!chunked_) {
    const auto& [file, e] = wholeParams_.at(name);
    readBytes(file, e.begin, size_t(e.end - e.begin), dst);
    return;
  }
  readParameterRange("param", name, 0, numelOf(it->second.shape), static_cast<float*>(dst));
}

void ChunkCheckpointReader::readChunkRange(const zero::ChunkLayout& layout, const std::string& kind,
                                           int64_t chunk, int64_t begin, int64_t end, float* dst) {
  std::fill(dst, dst + (end - begin), 0.0f);
  for (int64_t k : layout.chunks[size_t(chunk)].slots) {
    const zero::ChunkSlot& s = layout.slots[size_t(k)];
    int64_t lo = std::max(s.offset, begin), hi = std::min(s.offset + s.numel, end);
    if (lo < hi) readParameterRange(kind, s.name, lo - s.offset, hi - s.offset, dst + (lo - begin));
  }
}

int64_t ChunkCheckpointReader::readSavedChunkRange(const zero::ChunkLayout& layout, const std::string& kind,
                                                   int64_t chunk, int64_t begin, int64_t end, float* dst) {
  int64_t read = 0;
  for (int64_t k : layout.chunks[size_t(chunk)].slots) {
    const zero::ChunkSlot& s = layout.slots[size_t(k)];
    int64_t lo = std::max(s.offset, begin), hi = std::min(s.offset + s.numel, end);
    if (lo < hi)
      read += readParameterRange(kind, s.name, lo - s.offset, hi - s.offset, dst + (lo - begin), false);
  }
  return read;
}

void ChunkCheckpointReader::checkParameters(const zero::ChunkLayout& layout) const {
  std::vector<std::string> missing, mismatched, unused;
  std::set<std::string> mine;
  for (const auto& slot : layout.slots) {
    mine.insert(slot.name);
    auto it = params_.find(slot.name);
    if (it == params_.end())
      missing.push_back(slot.name);
    else if (it->second.shape != slot.shape)
      mismatched.push_back(detail::format("'{}' is {} there and {} here", slot.name,
                                          toString(it->second.shape), toString(slot.shape)));
  }
  for (const auto& [name, p] : params_)
    if (!mine.count(name)) unused.push_back(name);
  STRATA_USER_CHECK(mismatched.empty(), "checkpoint {} does not fit this model: {}", dir_,
                    joinNames(mismatched, 4));
  STRATA_USER_CHECK(missing.empty(), "checkpoint {} lacks {} parameters of this model: {}", dir_,
                    missing.size(), joinNames(missing));
  STRATA_USER_CHECK(unused.empty(), "checkpoint {} holds {} parameters this model does not have: {}", dir_,
                    unused.size(), joinNames(unused));
}

namespace {

// NOTE [Tensor-parallel checkpoints] in train/CheckpointPieces.h: a whole parameter of a checkpoint, from the
// pieces saved under `saved`: one, or a tensor-parallel run's slices joined as `how` says.
struct WholeParameter {
  std::vector<std::string> saved;
  std::optional<nn::TensorSlice> how;
  Shape shape;
  DType dtype = DType::F32;
};

// Every whole parameter of the checkpoint, by name: its own parameters, or a tensor-parallel run's under
// their names without the tp<rank>/ prefix.
std::map<std::string, WholeParameter> wholeParameters(const ChunkCheckpointReader& reader) {
  std::map<std::string, WholeParameter> out;
  auto it = reader.state().effective.find("parallel.tensor");
  int64_t tensor = it == reader.state().effective.end() ? 1 : std::stoll(it->second);
  if (tensor == 1) {
    for (const auto& [name, p] : reader.parameters())
      out[name] = WholeParameter{{name}, {}, p.shape, p.dtype};
    return out;
  }
  const auto& slices = reader.state().tensorSlices;
  STRATA_USER_CHECK(
      !slices.empty(),
      "checkpoint {} holds the slices of a tensor-parallel run (parallel.tensor: {}) without the "
      "record of how they were cut; resume it with parallel.tensor: {}",
      reader.directory(), tensor, tensor);
  const std::string first = "tp0/";
  for (const auto& [name, p] : reader.parameters()) {
    if (name.rfind(first, 0) != 0) continue;
    std::string whole = name.substr(first.size());
    WholeParameter w{{name}, {}, p.shape, p.dtype};
    if (auto s = slices.find(whole); s != slices.end()) {
      w.how = s->second;
      for (int64_t t = 1; t < tensor; ++t) {
        std::string piece = "tp" + std::to_string(t) + "/" + whole;
        STRATA_USER_CHECK(reader.parameters().count(piece), "checkpoint {} lacks {}, tensor rank {}'s slice",
                          reader.directory(), piece, t);
        w.saved.push_back(piece);
      }
      w.shape[size_t(w.how->dim)] *= tensor;
    }
    out[whole] = std::move(w);
  }
  return out;
}

Tensor readWhole(ChunkCheckpointReader& reader, const WholeParameter& w) {
  std::vector<Tensor> pieces;
  for (const std::string& name : w.saved) {
    const auto& p = reader.parameters().at(name);
    Tensor t = Tensor::empty(p.shape, p.dtype, Device::cpu());
    reader.readParameter(name, t.data());
    pieces.push_back(t);
  }
  return w.how ? nn::joinSlices(pieces, *w.how) : pieces[0];
}

}  // namespace

std::map<std::string, Tensor> loadModelShards(const std::string& path) {
  ChunkCheckpointReader reader(path);
  std::map<std::string, Tensor> out;
  for (const auto& [name, whole] : wholeParameters(reader)) out[name] = readWhole(reader, whole);
  return out;
}

MergeStats mergeModelShards(const std::string& path, const std::string& output,
                            const std::function<std::string(const std::string&)>& rename,
                            const std::map<std::string, std::string>& metadata) {
  ChunkCheckpointReader reader(path);
  std::map<std::string, WholeParameter> wholes = wholeParameters(reader);
  std::map<std::string, std::string> sources;  // output name -> whole parameter, in output-name order
  for (const auto& [name, w] : wholes) {
    std::string renamed = rename ? rename(name) : name;
    STRATA_USER_CHECK(!sources.count(renamed), "checkpoint {}: '{}' and '{}' are both renamed '{}'",
                      reader.directory(), sources[renamed], name, renamed);
    sources[renamed] = name;
  }
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, whole] : sources) {
    const WholeParameter& w = wholes.at(whole);
    uint64_t bytes = uint64_t(numelOf(w.shape)) * dtypeSize(w.dtype);
    header[name] = {
        {"dtype", safetensorsType(w.dtype)}, {"shape", w.shape}, {"data_offsets", {offset, offset + bytes}}};
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
  for (const auto& [name, whole] : sources) {
    const WholeParameter& w = wholes.at(whole);
    uint64_t bytes = uint64_t(numelOf(w.shape)) * dtypeSize(w.dtype);
    // The slices and the joined tensor are in memory together.
    stats.peakBufferBytes = std::max<uint64_t>(stats.peakBufferBytes, w.how ? 2 * bytes : bytes);
    Tensor t = readWhole(reader, w).contiguous();
    out.write(t.data(), bytes);
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

std::vector<std::string> pruneCheckpoints(const std::string& saveDir, int64_t keep,
                                          const std::string& runId) {
  std::vector<std::string> removed;
  if (keep <= 0 || !fs::is_directory(saveDir)) return removed;
  std::string latest;
  if (fs::exists(fs::path(saveDir) / "latest"))
    std::getline(std::ifstream(fs::path(saveDir) / "latest"), latest);
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const auto& entry : fs::directory_iterator(saveDir)) {
    std::string name = entry.path().filename().string();
    if (!entry.is_directory() || stepOf(name) < 0) continue;
    // Only this run's: a directory without a readable manifest, or of another run, is not ours to delete.
    std::string owner;
    try {
      json manifest = json::parse(std::ifstream(entry.path() / "manifest.json"));
      if (!manifest.is_object()) continue;
      owner = manifest.value("run_id", std::string());
    } catch (const std::exception&) {
      continue;
    }
    if (owner == runId) steps.emplace_back(stepOf(name), name);
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
