#include "strata/train/Data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "strata/core/Philox.h"

namespace strata::train {

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
  int fd = ::open(path.c_str(), O_RDONLY);
  STRATA_CHECK(fd >= 0, "cannot open data file {}: {}", path, std::strerror(errno));
  struct stat st {};
  fstat(fd, &st);
  bytes = size_t(st.st_size);
  STRATA_CHECK(bytes > 0, "data file {} is empty", path);
  addr = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  STRATA_CHECK(addr != MAP_FAILED, "cannot map data file {}: {}", path, std::strerror(errno));
}

// The token width of a Megatron .idx file (MMIDIDX header, version 1).
int megatronElementBytes(const std::string& idxPath) {
  std::ifstream in(idxPath, std::ios::binary);
  STRATA_CHECK(in.good(), "Megatron index {} not found (expected next to the .bin)", idxPath);
  char magic[9] = {};
  in.read(magic, 9);
  STRATA_CHECK(std::memcmp(magic, "MMIDIDX\x00\x00", 9) == 0, "{} is not a Megatron MMIDIDX index", idxPath);
  uint64_t version = 0;
  in.read(reinterpret_cast<char*>(&version), 8);
  STRATA_CHECK(version == 1, "{}: unsupported Megatron index version {}", idxPath, version);
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
      STRATA_FAIL("{}: token dtype code {} is not supported (uint16 or int32 expected)", idxPath, int(code));
  }
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
  STRATA_CHECK(format == "megatron" || fs::exists(path), "data file {} does not exist", path);
  std::string binPath = path;
  int width = 2;
  if (format == "text") {
    // Tokenize once; reuse the cache while it is newer than the text.
    fs::create_directories(cacheDir);
    binPath = (fs::path(cacheDir) / (fs::path(path).stem().string() + ".tokens.bin")).string();
    if (!fs::exists(binPath) || fs::last_write_time(binPath) < fs::last_write_time(path)) {
      std::ifstream in(path, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      std::vector<int32_t> ids = tokenizer.encode(ss.str());
      STRATA_CHECK(tokenizer.vocabSize() <= 65536, "text cache stores uint16 tokens; vocab {} is too large",
                   tokenizer.vocabSize());
      std::vector<uint16_t> packed(ids.begin(), ids.end());
      std::string tmp = binPath + ".tmp";
      std::ofstream out(tmp, std::ios::binary);
      out.write(reinterpret_cast<const char*>(packed.data()), std::streamsize(packed.size() * 2));
      out.close();
      STRATA_CHECK(out.good(), "cannot write token cache {}", tmp);
      fs::rename(tmp, binPath);
    }
  } else if (format == "megatron") {
    std::string base =
        path.size() > 4 && path.substr(path.size() - 4) == ".bin" ? path.substr(0, path.size() - 4) : path;
    binPath = base + ".bin";
    width = megatronElementBytes(base + ".idx");
  } else {
    STRATA_CHECK(format == "nanogpt", "unknown data.format '{}' (text, nanogpt, megatron)", format);
  }
  TokenDataset d;
  d.mapping_ = std::make_shared<Mapping>();
  mapFile(binPath, d.mapping_->addr, d.mapping_->bytes);
  STRATA_CHECK(d.mapping_->bytes % size_t(width) == 0, "{}: size {} is not a whole number of {}-byte tokens",
               binPath, d.mapping_->bytes, width);
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

}  // namespace strata::train
