#include "strata/zero/NvmeTier.h"

#include <sys/resource.h>

#include <csignal>
#include <filesystem>

#include "TestUtil.h"
#include "strata/core/Half.h"

using namespace strata;
namespace fs = std::filesystem;

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

TEST_CASE("an SSD tier that cannot get its space says so, naming the file", "[zero][store][nvme]") {
  fs::path dir = test::freshDir("strata-nvme-full");
  // A file-size limit stands in for a full disk: the reservation fails before any training.
  struct rlimit before {};
  getrlimit(RLIMIT_FSIZE, &before);
  auto previous = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = before;
  small.rlim_cur = 1 << 20;
  setrlimit(RLIMIT_FSIZE, &small);
  std::string e = test::errorOf([&] { zero::NvmeTier(dir.string(), 0, {int64_t(1) << 20}, DType::F32); });
  setrlimit(RLIMIT_FSIZE, &before);
  std::signal(SIGXFSZ, previous);
  REQUIRE(e.find("cannot reserve") != std::string::npos);
  REQUIRE(e.find(dir.string()) != std::string::npos);
  REQUIRE(fs::is_empty(dir));  // nothing left behind
  // No directory: the key to set is named.
  REQUIRE(test::errorOf([] {
            zero::NvmeTier("", 0, {16}, DType::F32);
          }).find("zero_optimization.nvme_path") != std::string::npos);
}
