#include "strata/zero/NvmeTier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "strata/core/Half.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

// The backends this build has: the thread pool always, io_uring where liburing was found.
std::vector<zero::NvmeBackend> backends() {
  std::vector<zero::NvmeBackend> out = {zero::NvmeBackend::Threads};
  if (zero::NvmeTier::uringBuilt()) out.push_back(zero::NvmeBackend::Uring);
  return out;
}

const char* nameOf(zero::NvmeBackend backend) {
  return backend == zero::NvmeBackend::Uring ? "io_uring" : "threads";
}

// Whether the tier runs the backend asked for (a kernel may refuse io_uring: the tier then uses threads).
bool runs(const zero::NvmeTier& tier, zero::NvmeBackend backend) {
  if (std::string(tier.backendName()) == nameOf(backend)) return true;
  WARN("the kernel refuses io_uring here: " << tier.backendName() << " ran instead");
  return false;
}

float storedAs(DType dt, float x) {
  return dt == DType::F32 ? x : dt == DType::BF16 ? float(BFloat16(x)) : float(Half(x));
}

}  // namespace

TEST_CASE("the SSD tier keeps each chunk's fields in its own file, fp32 exactly and m, v in half precision",
          "[zero][store][nvme]") {
  fs::path dir = test::freshDir("strata-nvme-tier");
  // Chunk 1 is not on the SSD; chunk 2 spans more than one 16 MiB piece.
  std::vector<int64_t> elems = {1000, 0, (int64_t(5) << 20) + 3};
  std::vector<float> values(static_cast<size_t>(elems[2]));
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i % 1000) * 0.37f - 100.0f + 1e-3f * float(i);
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtypeName(dt));
    zero::NvmeTier tier(dir.string(), 3, elems, dt);
    REQUIRE(fs::exists(tier.path()));
    REQUIRE(tier.path().find("rank3") != std::string::npos);
    REQUIRE(fs::file_size(tier.path()) == tier.fileBytes());  // reserved up front
    REQUIRE(tier.fileBytes() % 4096 == 0);
    uint64_t half = dtypeSize(dt);
    REQUIRE(tier.stateBytes() == uint64_t(elems[0] + elems[2]) * (4 + 2 * half));
    tier.write(0, zero::NvmeTier::Master, values.data());
    tier.write(2, zero::NvmeTier::Master, values.data());
    tier.write(2, zero::NvmeTier::SecondMoment, values.data());
    tier.write(0, zero::NvmeTier::FirstMoment, values.data() + 7);
    std::vector<float> back(values.size());
    tier.read(2, zero::NvmeTier::Master, back.data());
    REQUIRE(back == values);  // the master is always fp32
    tier.read(2, zero::NvmeTier::SecondMoment, back.data());
    for (size_t i = 0; i < values.size(); i += 4099) {
      float expected = dt == DType::F32 ? values[i] : float(BFloat16(values[i]));
      REQUIRE(back[i] == expected);
    }
    std::vector<float> small(static_cast<size_t>(elems[0]));
    tier.read(0, zero::NvmeTier::FirstMoment, small.data());
    REQUIRE(small[5] == (dt == DType::F32 ? values[12] : float(BFloat16(values[12]))));
    tier.read(0, zero::NvmeTier::Master, small.data());
    REQUIRE(std::equal(small.begin(), small.end(), values.begin()));
    REQUIRE(tier.bytesRead() > 0);
    REQUIRE(tier.bytesWritten() > 0);
  }
  // The file goes with the tier.
  REQUIRE(fs::is_empty(dir));
}

TEST_CASE(
    "the SSD tier's fields each have their own length and dtype; values in the stored dtype move as "
    "they are",
    "[zero][store][nvme]") {
  // Adafactor's extents (NOTE [Adafactor SSD chunks] in optim/Adafactor.h): an fp32 master, a bf16 first
  // moment kept bf16 in memory too, and a second moment of its own (short) length; a chunk without a first
  // moment; a chunk not on the SSD.
  fs::path dir = test::freshDir("strata-nvme-fields");
  std::vector<zero::NvmeTier::ChunkFields> chunks(3);
  chunks[0] = {{5000, 5000, 130}, {DType::F32, DType::BF16, DType::F32}};
  chunks[2] = {{3000, 0, 3000}, {DType::F32, DType::F16, DType::F32}};
  std::vector<float> values(5000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i) * 0.013f - 20.0f;
  for (zero::NvmeBackend backend : backends()) {
    INFO(nameOf(backend));
    zero::NvmeTier tier(dir.string(), 0, DType::F16, chunks, zero::NvmeIoConfig{4096, 3, backend});
    if (!runs(tier, backend)) continue;
    REQUIRE(tier.holds(0));
    REQUIRE(!tier.holds(1));
    REQUIRE(tier.fieldElems(0, zero::NvmeTier::SecondMoment) == 130);
    REQUIRE(tier.fieldDType(0, zero::NvmeTier::FirstMoment) == DType::BF16);
    REQUIRE(tier.chunkStateBytes(0) == 5000 * 4 + 5000 * 2 + 130 * 4);
    REQUIRE(tier.chunkStateBytes(2) == 3000 * 4 + 3000 * 4);
    REQUIRE(tier.stateBytes() == tier.chunkStateBytes(0) + tier.chunkStateBytes(2));
    REQUIRE(chunks[0].bytes() == tier.chunkStateBytes(0));
    // Each field 4 KiB-aligned: the master's 20000 bytes take 20480, the moment's 10000 take 12288.
    REQUIRE(tier.fileBytes() == 20480 + 12288 + 4096 + 12288 + 12288);
    std::vector<uint16_t> moment(5000);
    for (size_t i = 0; i < moment.size(); ++i) moment[i] = BFloat16(values[i] * 3.0f).bits;
    std::vector<uint16_t> momentBack(5000);
    std::vector<float> back(5000);
    tier.wait(tier.writeAsync(0, {{zero::NvmeTier::Master, values.data()},
                                  {zero::NvmeTier::FirstMoment, moment.data(), DType::BF16},
                                  {zero::NvmeTier::SecondMoment, values.data() + 9}}));
    tier.wait(tier.writeAsync(
        2, {{zero::NvmeTier::Master, values.data() + 1}, {zero::NvmeTier::SecondMoment, values.data() + 2}}));
    tier.wait(tier.readAsync(0, {{zero::NvmeTier::FirstMoment, momentBack.data(), DType::BF16}}));
    REQUIRE(momentBack == moment);                           // the bits, unconverted
    tier.read(0, zero::NvmeTier::FirstMoment, back.data());  // widened to fp32
    for (size_t i = 0; i < back.size(); i += 97) REQUIRE(back[i] == float(BFloat16(values[i] * 3.0f)));
    tier.read(0, zero::NvmeTier::SecondMoment, back.data());
    REQUIRE(std::equal(back.begin(), back.begin() + 130, values.begin() + 9));
    tier.read(2, zero::NvmeTier::Master, back.data());
    REQUIRE(std::equal(back.begin(), back.begin() + 3000, values.begin() + 1));
    tier.read(2, zero::NvmeTier::SecondMoment, back.data());
    REQUIRE(std::equal(back.begin(), back.begin() + 3000, values.begin() + 2));  // fp32, not fp16
    tier.read(0, zero::NvmeTier::Master, back.data());
    REQUIRE(back == values);
    // fp16 values cannot go into a bf16 field.
    REQUIRE(test::errorOf([&] {
              tier.wait(tier.readAsync(0, {{zero::NvmeTier::FirstMoment, momentBack.data(), DType::F16}}));
            }).find("stored dtype") != std::string::npos);
    tier.release(0);
    REQUIRE(tier.stateBytes() == tier.chunkStateBytes(2));
  }
}

TEST_CASE("a tier file changed underneath the run fails its checksum, naming the file and the offset",
          "[zero][store][nvme]") {
  fs::path dir = test::freshDir("strata-nvme-corrupt");
  std::vector<float> values(20000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i) * 0.5f;
  for (zero::NvmeBackend backend : backends()) {
    INFO(nameOf(backend));
    // Pieces of 16 KiB: the master's 80000 bytes in five, the last one short.
    zero::NvmeTier tier(dir.string(), 0, {int64_t(values.size())}, DType::BF16,
                        zero::NvmeIoConfig{16384, 3, backend});
    if (!runs(tier, backend)) continue;
    std::vector<float> back(values.size());
    tier.read(0, zero::NvmeTier::FirstMoment, back.data());  // never written: nothing to check yet
    tier.write(0, zero::NvmeTier::Master, values.data());
    tier.write(0, zero::NvmeTier::FirstMoment, values.data());
    tier.read(0, zero::NvmeTier::Master, back.data());
    REQUIRE(back == values);
    // One byte of the master's third piece changed by another writer.
    {
      int fd = ::open(tier.path().c_str(), O_RDWR);
      REQUIRE(fd >= 0);
      char byte = 0;
      REQUIRE(::pread(fd, &byte, 1, 2 * 16384 + 100) == 1);
      byte = char(byte ^ 0x10);
      REQUIRE(::pwrite(fd, &byte, 1, 2 * 16384 + 100) == 1);
      ::close(fd);
    }
    tier.read(0, zero::NvmeTier::FirstMoment, back.data());  // the other field is intact
    std::string e = test::errorOf([&] { tier.read(0, zero::NvmeTier::Master, back.data()); });
    INFO(e);
    REQUIRE(e.find("the SSD tier's file " + tier.path() + " is corrupted") != std::string::npos);
    REQUIRE(e.find("at offset 32768") != std::string::npos);
    REQUIRE(e.find("resume from the last checkpoint") != std::string::npos);
  }
}

TEST_CASE(
    "parameters homed on the SSD move as they are, with or without the chunk's state there, and stay "
    "when the state leaves",
    "[zero][store][nvme][homes]") {
  // Chunk 0: bf16 parameters and AdamW's state; chunk 1: parameters alone (their state in host memory);
  // chunk 2: state alone.
  fs::path dir = test::freshDir("strata-nvme-parameters");
  std::vector<zero::NvmeTier::ChunkFields> chunks = {
      zero::NvmeTier::ChunkFields::uniform(6000, DType::BF16).withParameters(6000, DType::BF16),
      zero::NvmeTier::ChunkFields{}.withParameters(9000, DType::BF16),
      zero::NvmeTier::ChunkFields::uniform(3000, DType::BF16)};
  std::vector<uint16_t> params(9000), other(9000), back(9000);
  for (size_t i = 0; i < params.size(); ++i) {
    params[i] = BFloat16(float(i) * 0.25f - 700.0f).bits;
    other[i] = BFloat16(float(i) * -0.5f + 3.0f).bits;
  }
  std::vector<float> master(6000, 1.5f), masterBack(6000);
  for (zero::NvmeBackend backend : backends()) {
    INFO(nameOf(backend));
    // Pieces of 4 KiB: each field in several.
    zero::NvmeTier tier(dir.string(), 0, DType::BF16, chunks, zero::NvmeIoConfig{4096, 3, backend});
    if (!runs(tier, backend)) continue;
    REQUIRE(tier.holds(0));
    REQUIRE(tier.holdsParameters(0));
    REQUIRE(!tier.holds(1));
    REQUIRE(tier.holdsParameters(1));
    REQUIRE(!tier.holdsParameters(2));
    // The optimizer state's bytes and the parameters' apart.
    REQUIRE(tier.stateBytes() == (6000 + 3000) * (4 + 2 + 2));
    REQUIRE(tier.chunkStateBytes(1) == 0);
    REQUIRE(tier.parameterBytes() == (6000 + 9000) * 2);
    // Each field 4 KiB-aligned: chunk 0's four (24576 + 3 x 12288), chunk 1's parameters (20480), chunk
    // 2's state (12288 + 2 x 8192).
    REQUIRE(tier.fileBytes() == 24576 + 3 * 12288 + 20480 + 12288 + 2 * 8192);
    tier.wait(tier.writeAsync(0, {{zero::NvmeTier::Master, master.data()},
                                  {zero::NvmeTier::Parameters, params.data(), DType::BF16}}));
    tier.wait(tier.writeAsync(1, {{zero::NvmeTier::Parameters, other.data(), DType::BF16}}));
    tier.wait(tier.readAsync(0, {{zero::NvmeTier::Parameters, back.data(), DType::BF16}}));
    REQUIRE(std::equal(back.begin(), back.begin() + 6000, params.begin()));  // the bits
    tier.wait(tier.readAsync(1, {{zero::NvmeTier::Parameters, back.data(), DType::BF16}}));
    REQUIRE(back == other);
    tier.read(0, zero::NvmeTier::Master, masterBack.data());
    REQUIRE(masterBack == master);
    // A chunk without parameters here, or without state, says so.
    REQUIRE(test::errorOf([&] {
              tier.wait(tier.readAsync(2, {{zero::NvmeTier::Parameters, back.data(), DType::BF16}}));
            }).find("chunk 2 has no parameters on the SSD tier") != std::string::npos);
    REQUIRE(test::errorOf([&] {
              tier.read(1, zero::NvmeTier::Master, masterBack.data());
            }).find("chunk 1 has no optimizer state on the SSD tier") != std::string::npos);
    // Chunk 0's state moves to the device; its parameters stay where they were.
    tier.release(0);
    REQUIRE(!tier.holds(0));
    REQUIRE(tier.holdsParameters(0));
    REQUIRE(tier.stateBytes() == 3000 * (4 + 2 + 2));
    REQUIRE(tier.parameterBytes() == (6000 + 9000) * 2);
    std::fill(back.begin(), back.end(), uint16_t(0));
    tier.wait(tier.readAsync(0, {{zero::NvmeTier::Parameters, back.data(), DType::BF16}}));
    REQUIRE(std::equal(back.begin(), back.begin() + 6000, params.begin()));
    // A changed byte of chunk 1's parameters (their second piece, past chunk 0's four fields) fails the
    // tier's checksum, naming the file.
    {
      int fd = ::open(tier.path().c_str(), O_RDWR);
      REQUIRE(fd >= 0);
      off_t at = 24576 + 3 * 12288 + 4096 + 10;
      char byte = 0;
      REQUIRE(::pread(fd, &byte, 1, at) == 1);
      byte = char(byte ^ 0x01);
      REQUIRE(::pwrite(fd, &byte, 1, at) == 1);
      ::close(fd);
    }
    std::string e = test::errorOf([&] {
      tier.wait(tier.readAsync(1, {{zero::NvmeTier::Parameters, back.data(), DType::BF16}}));
    });
    INFO(e);
    REQUIRE(e.find("the SSD tier's file " + tier.path() + " is corrupted") != std::string::npos);
    REQUIRE(e.find("at offset " + std::to_string(24576 + 3 * 12288 + 4096)) != std::string::npos);
  }
}

TEST_CASE("an SSD tier that cannot get its space says so, naming the file", "[zero][store][nvme]") {
  fs::path dir = test::freshDir("strata-nvme-full");
  // A file-size limit stands in for a full disk: the reservation fails before any training.
  struct rlimit before {};
  getrlimit(RLIMIT_FSIZE, &before);
  auto previous = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = before;
  small.rlim_cur = 1 << 20;
  setrlimit(RLIMIT_FSIZE, &small);
  std::vector<std::string> errors;
  for (zero::NvmeBackend backend : backends())
    errors.push_back(test::errorOf([&] {
      zero::NvmeTier(dir.string(), 0, {int64_t(1) << 20}, DType::F32, zero::NvmeIoConfig{4096, 4, backend});
    }));
  setrlimit(RLIMIT_FSIZE, &before);
  std::signal(SIGXFSZ, previous);
  for (const std::string& e : errors) {
    REQUIRE(e.find("cannot reserve") != std::string::npos);
    REQUIRE(e.find(dir.string()) != std::string::npos);
  }
  REQUIRE(fs::is_empty(dir));  // nothing left behind
  // No directory: the key to set is named.
  REQUIRE(test::errorOf([] {
            zero::NvmeTier("", 0, {16}, DType::F32);
          }).find("zero_optimization.nvme_path") != std::string::npos);
}

TEST_CASE("both SSD backends read back exactly what they wrote, in every state dtype, many pieces in flight",
          "[zero][store][nvme]") {
  fs::path dir = test::freshDir("strata-nvme-backends");
  // 64 KiB blocks: chunk 2 is dozens of pieces per field, more than the queue depth of 4; chunk 3 is one
  // element (a piece mostly padding).
  std::vector<int64_t> elems = {5000, 0, 300001, 1};
  std::vector<std::vector<float>> values(elems.size());
  for (size_t c = 0; c < elems.size(); ++c)
    for (int64_t i = 0; i < elems[c]; ++i)
      values[c].push_back(std::sin(float(i) * 0.01f + float(c)) * 3.0f + 1e-4f * float(i % 97));
  for (zero::NvmeBackend backend : backends()) {
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      INFO(nameOf(backend) << " " << dtypeName(dt));
      zero::NvmeTier tier(dir.string(), 0, elems, dt, zero::NvmeIoConfig{64 << 10, 4, backend});
      if (!runs(tier, backend)) continue;
      // Each chunk's master, m (values + 1) and v (values * values) written behind one another, no wait.
      std::vector<std::vector<float>> m(elems.size()), v(elems.size());
      zero::NvmeTier::Ticket last = 0;
      for (size_t c = 0; c < elems.size(); ++c) {
        if (elems[c] == 0) continue;
        for (float x : values[c]) {
          m[c].push_back(x + 1.0f);
          v[c].push_back(x * x);
        }
        last = tier.writeAsync(c, {{zero::NvmeTier::Master, values[c].data()},
                                   {zero::NvmeTier::FirstMoment, m[c].data()},
                                   {zero::NvmeTier::SecondMoment, v[c].data()}});
      }
      // Reads issued before the writes ended see them: one I/O thread, issue order.
      std::vector<std::vector<float>> master(elems.size()), m2(elems.size()), v2(elems.size());
      std::vector<zero::NvmeTier::Ticket> reads(elems.size(), 0);
      for (size_t c = 0; c < elems.size(); ++c) {
        if (elems[c] == 0) continue;
        for (auto* f : {&master[c], &m2[c], &v2[c]}) f->assign(size_t(elems[c]), -1.0f);
        reads[c] = tier.readAsync(c, {{zero::NvmeTier::Master, master[c].data()},
                                      {zero::NvmeTier::FirstMoment, m2[c].data()},
                                      {zero::NvmeTier::SecondMoment, v2[c].data()}});
      }
      REQUIRE(reads.back() > last);
      for (size_t c = 0; c < elems.size(); ++c) {
        if (elems[c] == 0) continue;
        tier.wait(reads[c]);
        REQUIRE(master[c] == values[c]);  // the master is always fp32
        for (size_t i = 0; i < values[c].size(); ++i) {
          if (m2[c][i] != storedAs(dt, m[c][i]) || v2[c][i] != storedAs(dt, v[c][i])) {
            INFO("chunk " << c << " element " << i);
            REQUIRE(m2[c][i] == storedAs(dt, m[c][i]));
            REQUIRE(v2[c][i] == storedAs(dt, v[c][i]));
          }
        }
      }
      // The synchronous calls go the same way.
      std::vector<float> back(values[2].size());
      tier.write(2, zero::NvmeTier::FirstMoment, values[2].data());
      tier.read(2, zero::NvmeTier::FirstMoment, back.data());
      for (size_t i = 0; i < back.size(); ++i)
        if (back[i] != storedAs(dt, values[2][i])) REQUIRE(back[i] == storedAs(dt, values[2][i]));
      uint64_t payload = 0;
      for (int64_t n : elems) payload += uint64_t(n) * (4 + 2 * dtypeSize(dt));
      REQUIRE(tier.bytesWritten() >= payload);
      REQUIRE(tier.bytesRead() >= payload);
    }
  }
  REQUIRE(fs::is_empty(dir));
}

TEST_CASE(
    "a failed SSD write or read stops with an error naming the file and the operation, on both backends",
    "[zero][store][nvme]") {
  fs::path dir = test::freshDir("strata-nvme-errors");
  std::vector<int64_t> elems = {int64_t(1) << 18, int64_t(1) << 18};  // 1 MiB per fp32 field
  std::vector<float> values(size_t(elems[0]), 0.5f);
  for (zero::NvmeBackend backend : backends()) {
    INFO(nameOf(backend));
    zero::NvmeTier tier(dir.string(), 0, elems, DType::F32, zero::NvmeIoConfig{256 << 10, 4, backend});
    if (!runs(tier, backend)) continue;
    tier.write(0, zero::NvmeTier::Master, values.data());
    // A file-size limit below the second field makes its write fail as a full disk would (EFBIG here).
    struct rlimit before {};
    getrlimit(RLIMIT_FSIZE, &before);
    auto previous = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = before;
    small.rlim_cur = 1 << 20;
    setrlimit(RLIMIT_FSIZE, &small);
    zero::NvmeTier::Ticket failing = tier.writeAsync(1, {{zero::NvmeTier::FirstMoment, values.data()}});
    std::string e = test::errorOf([&] { tier.wait(failing); });
    setrlimit(RLIMIT_FSIZE, &before);
    std::signal(SIGXFSZ, previous);
    INFO(e);
    REQUIRE(e.find("the SSD tier's write of") != std::string::npos);
    REQUIRE(e.find(tier.path()) != std::string::npos);
    // Training stops: every later transfer fails with the same error.
    std::vector<float> back(values.size());
    REQUIRE(test::errorOf([&] { tier.read(0, zero::NvmeTier::Master, back.data()); }) == e);
  }
  for (zero::NvmeBackend backend : backends()) {
    INFO(nameOf(backend));
    zero::NvmeTier tier(dir.string(), 0, elems, DType::BF16, zero::NvmeIoConfig{256 << 10, 4, backend});
    if (!runs(tier, backend)) continue;
    // A file cut short (as a failing disk may leave it): the read meets its end.
    fs::resize_file(tier.path(), 4096);
    std::vector<float> back(values.size());
    std::string e = test::errorOf([&] { tier.read(1, zero::NvmeTier::SecondMoment, back.data()); });
    INFO(e);
    REQUIRE(e.find("the SSD tier's read of") != std::string::npos);
    REQUIRE(e.find(tier.path()) != std::string::npos);
    REQUIRE(e.find("end of file") != std::string::npos);
  }
  REQUIRE(fs::is_empty(dir));
}

TEST_CASE("STRATA_NVME_BACKEND picks the SSD tier's backend", "[zero][store][nvme]") {
  fs::path dir = test::freshDir("strata-nvme-env");
  const char* before = std::getenv("STRATA_NVME_BACKEND");
  std::string saved = before ? before : "";
  ::setenv("STRATA_NVME_BACKEND", "threads", 1);
  std::string threads = zero::NvmeTier(dir.string(), 0, {16}, DType::F32).backendName();
  ::setenv("STRATA_NVME_BACKEND", "disk", 1);
  std::string bad = test::errorOf([&] { zero::NvmeTier(dir.string(), 0, {16}, DType::F32); });
  ::setenv("STRATA_NVME_BACKEND", "uring", 1);
  std::string uring;
  std::string uringError =
      test::errorOf([&] { uring = zero::NvmeTier(dir.string(), 0, {16}, DType::F32).backendName(); });
  if (before)
    ::setenv("STRATA_NVME_BACKEND", saved.c_str(), 1);
  else
    ::unsetenv("STRATA_NVME_BACKEND");
  REQUIRE(threads == "threads");
  REQUIRE(bad.find("STRATA_NVME_BACKEND") != std::string::npos);
  if (zero::NvmeTier::uringBuilt()) {
    REQUIRE(uringError.empty());
    REQUIRE((uring == "io_uring" || uring == "threads"));  // threads where the kernel refuses io_uring
  } else {
    REQUIRE(uringError.find("no liburing") != std::string::npos);
  }
  // The default: io_uring where built.
  std::string byDefault = zero::NvmeTier(dir.string(), 0, {16}, DType::F32, {}).backendName();
  if (!before && !zero::NvmeTier::uringBuilt()) REQUIRE(byDefault == "threads");
  REQUIRE(fs::is_empty(dir));
}

TEST_CASE("a tier file left by a process that died is removed; live, locked and other files are not",
          "[zero][store][nvme]") {
  fs::path dir = test::freshDir("strata-nvme-stale");
  zero::NvmeTier live(dir.string(), 1, {1000}, DType::F32);
  // This host's name, as the live tier's file carries it: strata-state-rank1-<host>-<pid>.bin.
  std::string own = fs::path(live.path()).filename().string();
  std::string host = own.substr(std::strlen("strata-state-rank1-"));
  host = host.substr(0, host.rfind('-'));
  // PIDs no process has: above the kernel's pid_max (at most 2^22).
  fs::path stale = dir / ("strata-state-rank0-" + host + "-99999999.bin");
  fs::path locked = dir / ("strata-state-rank2-" + host + "-99999998.bin");
  fs::path elsewhere = dir / "strata-state-rank0-some-other-host-99999999.bin";
  fs::path init = dir / ("strata-state-rank0-" + host + "-1.bin");  // PID 1 lives
  fs::path other = dir / "notes.bin";
  for (const fs::path& p : {stale, locked, elsewhere, init, other}) {
    std::ofstream out(p, std::ios::binary);
    out << std::string(8192, 'x');
  }
  // A tier on another machine that shares the directory holds its file's lock.
  int fd = ::open(locked.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_SH) == 0);
  REQUIRE(zero::removeStaleTierFiles(dir.string()) == 8192);
  ::close(fd);
  REQUIRE(!fs::exists(stale));
  for (const fs::path& p : {locked, elsewhere, init, other}) REQUIRE(fs::exists(p));
  REQUIRE(fs::exists(live.path()));                           // this process's own
  REQUIRE(zero::removeStaleTierFiles(dir.string()) == 8192);  // the lock is gone now
  REQUIRE(!fs::exists(locked));
  REQUIRE(zero::removeStaleTierFiles((dir / "missing").string()) == 0);
}
