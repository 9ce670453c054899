#include "strata/data/Data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/AtomicFile.h"
#include "strata/core/Checksum.h"
#include "strata/core/Philox.h"
#include "strata/data/Tokenize.h"

namespace strata::data {

namespace fs = std::filesystem;

std::vector<int32_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = int32_t(static_cast<unsigned char>(text[i]));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  s.reserve(ids.size());
  for (int32_t id : ids) s.push_back(char(uint8_t(std::clamp(id, 0, 255))));
  return s;
}

struct TokenDataset::Mapping {
  void* addr = nullptr;
  size_t bytes = 0;
  std::vector<uint16_t> owned;
  ~Mapping() {
    if (addr) munmap(addr, bytes);
  }
};

namespace {

// Maps a file read-only; returns the mapping.
void mapFile(const std::string& path, void*& addr, size_t& bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_USER_CHECK(fd >= 0, "cannot open data file {}: {}", path, std::strerror(errno));
  struct stat st {};
  fstat(fd, &st);
  bytes = size_t(st.st_size);
  if (bytes == 0) ::close(fd);
  STRATA_USER_CHECK(bytes > 0, "data file {} is empty", path);
  addr = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int mapErrno = errno;
  ::close(fd);
  STRATA_USER_CHECK(addr != MAP_FAILED, "cannot map data file {}: {}", path, std::strerror(mapErrno));
}

// The token width of a Megatron .idx file (MMIDIDX header, version 1).
int megatronElementBytes(const std::string& idxPath) {
  std::ifstream in(idxPath, std::ios::binary);
  STRATA_USER_CHECK(in.good(), "Megatron index {} not found (expected next to the .bin)", idxPath);
  char magic[9] = {};
  in.read(magic, 9);
  STRATA_USER_CHECK(std::memcmp(magic, "MMIDIDX\x00\x00", 9) == 0, "{} is not a Megatron MMIDIDX index",
                    idxPath);
  uint64_t version = 0;
  in.read(reinterpret_cast<char*>(&version), 8);
  STRATA_USER_CHECK(version == 1, "{}: unsupported Megatron index version {}", idxPath, version);
  uint8_t code = 0;
  in.read(reinterpret_cast<char*>(&code), 1);
  // Megatron dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.
  switch (code) {
    case 8:
      return 2;
    case 4:
      return 4;
    case 3:
      return 2;
    default:
      STRATA_USER_FAIL("{}: token dtype code {} is not supported (uint16 or int32 expected)", idxPath,
                       int(code));
  }
}

// NOTE [Token cache]
// A text corpus is tokenized once into <cacheDir>/<stem>-<hash>.tokens.bin (nanoGPT format), next to a
// sidecar <stem>-<hash>.tokens.json that records its key and token count. The key is what the tokens depend
// on: the text's canonical path, size, mtime in ns and CRC32C, and the tokenizer's identity. A cache serves
// only when every field of its sidecar equals the key of the text as it is now. The mtime must be equal,
// not older: tar x and cp -p give new contents old times; the CRC catches a change that keeps size and
// mtime. The name's hash covers the whole key, so two texts (two input.txt in two folders) never share a
// name, and two runs that write one name write the same bytes. Both files are written atomically
// (AtomicFileWriter), the sidecar last, so a crash or a concurrent run never leaves a sidecar vouching for a
// partial .bin. Once a new cache is written, the caches of older contents of the same path under the same
// tokenizer are removed: a run that maps one keeps its mapping, and a run that finds one gone tokenizes.

constexpr int kTokenCacheFormat = 1;

nlohmann::json tokenCacheKey(const std::string& path, const Tokenizer& tokenizer) {
  struct stat st {};
  STRATA_USER_CHECK(::stat(path.c_str(), &st) == 0, "cannot read data file {}: {}", path,
                    std::strerror(errno));
  STRATA_USER_CHECK(S_ISREG(st.st_mode), "data file {} is not a regular file", path);
  STRATA_USER_CHECK(st.st_size > 0, "data file {} is empty", path);
  return {{"format", kTokenCacheFormat},
          {"path", fs::canonical(path).string()},
          {"size", int64_t(st.st_size)},
          {"mtime_ns", int64_t(st.st_mtim.tv_sec) * 1000000000 + int64_t(st.st_mtim.tv_nsec)},
          {"crc32c", crc32cFile(path)},
          {"tokenizer", tokenizer.identity()}};
}

// 16 hex digits of FNV-1a over the key's JSON (objects dump with sorted keys, so the text is canonical).
std::string tokenCacheHash(const nlohmann::json& key) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : key.dump()) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// Maps the cached tokens when the sidecar records exactly `key` and the .bin holds its token count.
bool mapCachedTokens(const std::string& binPath, const std::string& sidecarPath, const nlohmann::json& key,
                     void*& addr, size_t& bytes) {
  std::ifstream in(sidecarPath);
  if (!in.good()) return false;
  nlohmann::json recorded = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!recorded.is_object() || !recorded.contains("tokens") || !recorded["tokens"].is_number_integer())
    return false;
  auto tokens = recorded["tokens"].get<int64_t>();
  recorded.erase("tokens");
  if (recorded != key || tokens <= 0) return false;
  int fd = ::open(binPath.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool whole = ::fstat(fd, &st) == 0 && int64_t(st.st_size) == tokens * 2;
  void* mapped = whole ? mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (mapped == MAP_FAILED) return false;
  addr = mapped;
  bytes = size_t(st.st_size);
  return true;
}

// Removes the caches of other contents of `key`'s path under `key`'s tokenizer, except `keep`.
void removeSupersededCaches(const fs::path& dir, const std::string& prefix, const nlohmann::json& key,
                            const fs::path& keep) {
  std::vector<fs::path> superseded;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (entry.path() == keep || !name.starts_with(prefix) || !name.ends_with(".tokens.json")) continue;
    std::ifstream in(entry.path());
    nlohmann::json recorded = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (recorded.is_object() && recorded.value("path", "") == key.at("path").get<std::string>() &&
        recorded.value("tokenizer", "") == key.at("tokenizer").get<std::string>())
      superseded.push_back(entry.path());
  }
  for (const auto& sidecar : superseded) {
    fs::remove(sidecar, ec);  // the sidecar first: no sidecar is left vouching for a missing .bin
    fs::path bin = sidecar;
    fs::remove(bin.replace_extension(".bin"), ec);
  }
}

// Maps the tokens of the text file `path` from the cache, tokenizing it first when no cache matches.
// Returns the .bin's path. NOTE [Token cache].
std::string mapTokenCache(const std::string& path, const Tokenizer& tokenizer, const std::string& cacheDir,
                          void*& addr, size_t& bytes) {
  nlohmann::json key = tokenCacheKey(path, tokenizer);
  std::error_code ec;
  fs::create_directories(cacheDir, ec);
  STRATA_USER_CHECK(!ec, "cannot create the token cache directory {}: {}", cacheDir, ec.message());
  std::string prefix = fs::path(path).stem().string() + "-";
  std::string base = (fs::path(cacheDir) / (prefix + tokenCacheHash(key) + ".tokens")).string();
  std::string binPath = base + ".bin", sidecarPath = base + ".json";
  if (mapCachedTokens(binPath, sidecarPath, key, addr, bytes)) return binPath;
  TokenizeResult made = tokenizeFile(path, binPath, tokenizer);
  STRATA_USER_CHECK(made.inputCrc32c == key.at("crc32c").get<uint32_t>(),
                    "data file {} changed while it was being tokenized; run again", path);
  nlohmann::json sidecar = key;
  sidecar["tokens"] = made.tokens;
  writeFileAtomically(sidecarPath, sidecar.dump(2) + "\n");
  removeSupersededCaches(cacheDir, prefix, key, sidecarPath);
  STRATA_CHECK(mapCachedTokens(binPath, sidecarPath, key, addr, bytes),
               "token cache {} cannot be read back after writing it", binPath);
  return binPath;
}

}  // namespace

TokenDataset TokenDataset::fromTokens(std::vector<uint16_t> tokens, double valFraction) {
  TokenDataset d;
  d.mapping_ = std::make_shared<Mapping>();
  d.mapping_->owned = std::move(tokens);
  d.data_ = d.mapping_->owned.data();
  d.elementBytes_ = 2;
  d.numTokens_ = int64_t(d.mapping_->owned.size());
  d.trainTokens_ = d.numTokens_ - int64_t(double(d.numTokens_) * valFraction);
  return d;
}

TokenDataset TokenDataset::random(int64_t vocabSize, int64_t numTokens, uint64_t seed, double valFraction) {
  STRATA_CHECK(vocabSize > 0 && vocabSize <= 65536,
               "random tokens are stored as uint16; vocab {} is out of range", vocabSize);
  STRATA_CHECK(numTokens > 0, "random tokens: count must be positive, got {}", numTokens);
  std::vector<uint16_t> tokens(static_cast<size_t>(numTokens));
#pragma omp parallel for
  for (int64_t i = 0; i < numTokens; ++i) {
    auto id = int64_t(double(philoxUniform(seed, uint64_t(i))) * double(vocabSize));
    tokens[size_t(i)] = uint16_t(std::min<int64_t>(id, vocabSize - 1));
  }
  return fromTokens(std::move(tokens), valFraction);
}

TokenDataset TokenDataset::open(const std::string& path, const std::string& format,
                                const Tokenizer& tokenizer, const std::string& cacheDir, double valFraction) {
  STRATA_USER_CHECK(format == "megatron" || fs::exists(path), "data file {} does not exist", path);
  TokenDataset d;
  d.mapping_ = std::make_shared<Mapping>();
  std::string binPath = path;
  int width = 2;
  if (format == "text") {
    binPath = mapTokenCache(path, tokenizer, cacheDir, d.mapping_->addr, d.mapping_->bytes);
  } else if (format == "megatron") {
    std::string base =
        path.size() > 4 && path.substr(path.size() - 4) == ".bin" ? path.substr(0, path.size() - 4) : path;
    binPath = base + ".bin";
    width = megatronElementBytes(base + ".idx");
    mapFile(binPath, d.mapping_->addr, d.mapping_->bytes);
  } else {
    STRATA_USER_CHECK(format == "nanogpt", "unknown data.format '{}' (text, nanogpt, megatron)", format);
    mapFile(binPath, d.mapping_->addr, d.mapping_->bytes);
  }
  STRATA_USER_CHECK(d.mapping_->bytes % size_t(width) == 0,
                    "{}: size {} is not a whole number of {}-byte tokens", binPath, d.mapping_->bytes, width);
  d.data_ = d.mapping_->addr;
  d.elementBytes_ = width;
  d.numTokens_ = int64_t(d.mapping_->bytes / size_t(width));
  d.trainTokens_ = d.numTokens_ - int64_t(double(d.numTokens_) * valFraction);
  return d;
}

int64_t TokenDataset::splitSize(Split s) const {
  return s == Split::Train ? trainTokens_ : numTokens_ - trainTokens_;
}

int64_t TokenDataset::token(int64_t i) const {
  if (elementBytes_ == 2) return static_cast<const uint16_t*>(data_)[i];
  return static_cast<const int32_t*>(data_)[i];
}

int64_t TokenDataset::maxToken() const {
  // One pass over the mapped tokens on every core, typed per width: a multi-GB corpus is checked at memory
  // speed instead of one branchy element at a time.
  auto scan = [&](const auto* p) {
    int64_t mx = 0;
#pragma omp parallel for reduction(max : mx) schedule(static)
    for (int64_t i = 0; i < numTokens_; ++i) mx = std::max(mx, int64_t(p[i]));
    return mx;
  };
  if (elementBytes_ == 2) return scan(static_cast<const uint16_t*>(data_));
  return scan(static_cast<const int32_t*>(data_));
}

std::pair<Tensor, Tensor> TokenDataset::batch(Split split, int64_t index, int64_t B, int64_t T, uint64_t seed,
                                              Device device) const {
  int64_t begin = split == Split::Train ? 0 : trainTokens_;
  int64_t len = splitSize(split);
  STRATA_CHECK(len > T + 1, "the {} split has {} tokens, too few for windows of {}",
               split == Split::Train ? "train" : "validation", len, T + 1);
  // Distinct Philox streams for the two splits.
  uint64_t stream = seed * 2 + (split == Split::Train ? 0 : 1);
  std::vector<int64_t> x(size_t(B * T)), y(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    uint64_t counter = uint64_t(index) * uint64_t(B) + uint64_t(b);
    PhiloxOut r = philox4x32(counter, stream);
    uint64_t draw = (uint64_t(r.x[0]) << 32) | r.x[1];
    int64_t start = begin + int64_t(draw % uint64_t(len - T - 1));
    for (int64_t t = 0; t < T; ++t) {
      x[size_t(b * T + t)] = token(start + t);
      y[size_t(b * T + t)] = token(start + t + 1);
    }
  }
  return {Tensor::fromVector(x, {B, T}, device), Tensor::fromVector(y, {B, T}, device)};
}

}  // namespace strata::data
