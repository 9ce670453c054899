#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "strata/plan/Calibration.h"

using namespace strata;
namespace fs = std::filesystem;

TEST_CASE("a calibration file round-trips, and fields a machine lacks stay absent", "[train][calibration]") {
  fs::path dir = test::freshDir("strata-calibration");
  plan::Calibration c;
  c.date = "2026-12-02T10:00:00";
  c.host = "box";
  c.deviceName = "NVIDIA H200";
  c.deviceMemoryBytes = 150ull << 30;
  c.h2dGBs = 52.5;
  c.d2hGBs = 55.25;
  c.gemmTflops = 701.5;
  c.gemmShape = "layer GEMMs";
  c.hostMemoryBytes = 125ull << 30;
  c.hostAvailableBytes = 120ull << 30;
  c.cpuAdamwElemsPerS = 3.5e9;
  c.cpuThreads = 16;
  c.nvmeWriteGBs = 1.4;
  c.nvmeReadGBs = 1.5;
  c.nvmeFreeBytes = 64ull << 30;
  c.nvmePath = "/mnt/nvme";
  c.nvmeDirect = false;
  c.peakTflops = 989;
  c.deviceMemoryGBs = 3600;
  c.nvlinkBusGBs = 331;
  c.networkGBs = 50;
  c.gpusPerNode = 8;
  std::string path = (dir / "sub" / "calibration.json").string();
  plan::writeCalibration(c, path);
  std::optional<plan::Calibration> back = plan::readCalibration(path);
  REQUIRE(back.has_value());
  REQUIRE(back->toJson() == c.toJson());
  REQUIRE(*back->gemmTflops == 701.5);
  REQUIRE(*back->deviceMemoryBytes == (150ull << 30));
  REQUIRE(back->nvmeDirect == false);
  REQUIRE(*back->networkGBs == 50);
  REQUIRE(*back->nvlinkBusGBs == 331);
  REQUIRE(*back->peakTflops == 989);
  REQUIRE(back->gpusPerNode == 8);

  // Without a GPU the GPU fields are left out of the file and read back as absent.
  plan::Calibration cpuOnly;
  cpuOnly.cpuAdamwElemsPerS = 1e9;
  std::string json = cpuOnly.toJson();
  REQUIRE(json.find("h2d_gb_s") == std::string::npos);
  REQUIRE(json.find("gemm") == std::string::npos);
  plan::Calibration parsed = plan::Calibration::fromJson(json, "test");
  REQUIRE(!parsed.h2dGBs);
  REQUIRE(!parsed.deviceName);
  REQUIRE(*parsed.cpuAdamwElemsPerS == 1e9);

  REQUIRE(!plan::readCalibration((dir / "none.json").string()).has_value());
}

TEST_CASE("a malformed calibration file is an error naming it", "[train][calibration]") {
  fs::path dir = test::freshDir("strata-calibration-bad");
  std::string path = (dir / "bad.json").string();
  std::ofstream(path) << "{ not json";
  REQUIRE(test::errorOf([&] { plan::readCalibration(path); }).find(path) != std::string::npos);
  std::string wrongType =
      test::errorOf([] { plan::Calibration::fromJson(R"({"h2d_gb_s": "fast"})", "f.json"); });
  REQUIRE(wrongType.find("h2d_gb_s") != std::string::npos);
  REQUIRE(wrongType.find("f.json") != std::string::npos);
  REQUIRE(test::errorOf([] {
            plan::Calibration::fromJson(R"({"nvme_read_gb_s": 0})", "f.json");
          }).find("nvme_read_gb_s") != std::string::npos);
}

TEST_CASE("the built-in machines: the H200 nodes and the A100-40GB node with InfiniBand load",
          "[train][calibration]") {
  plan::MachineChoice h200 = plan::chooseMachine("h200x8-ib", "", "");
  CHECK(h200.calibration.gpusPerNode == 8);
  CHECK(*h200.calibration.networkGBs == 50);  // 8 x 400 Gb/s for 8 GPUs
  CHECK(*h200.calibration.nvlinkBusGBs == 331);
  CHECK(*h200.calibration.peakTflops == 989);
  CHECK(*h200.calibration.deviceMemoryBytes == plan::measuredH200x8().deviceMemoryBytes.value());
  CHECK(h200.source.find("h200x8-ib") != std::string::npos);
  plan::MachineChoice a100 = plan::chooseMachine("a100x8-ib", "", "");
  const plan::Calibration& a = a100.calibration;
  CHECK(a.gpusPerNode == 8);
  CHECK(*a.peakTflops == 312);
  CHECK(*a.networkGBs == 25);  // 8 x 200 Gb/s HDR for 8 GPUs
  CHECK(*a.hostMemoryBytes == (1ull << 40));
  CHECK(*a.deviceMemoryBytes > (39ull << 30));
  CHECK(*a.deviceMemoryBytes < (40ull << 30));
  CHECK(*a.gemmTflops < *a.peakTflops);
  CHECK(*a.h2dGBs == 25);
  CHECK(!a100.notes.empty());
  // It survives a calibration file's round trip.
  CHECK(plan::Calibration::fromJson(a.toJson(), "a100").toJson() == a.toJson());
  std::string unknown = test::errorOf([] { plan::chooseMachine("v100", "", ""); });
  CHECK(unknown.find("a100x8-ib") != std::string::npos);
}

TEST_CASE("the calibration path comes from STRATA_CALIBRATION, else the user's cache",
          "[train][calibration]") {
  const char* old = std::getenv("STRATA_CALIBRATION");
  std::string saved = old ? old : "";
  setenv("STRATA_CALIBRATION", "/some/where.json", 1);
  REQUIRE(plan::defaultCalibrationPath() == "/some/where.json");
  unsetenv("STRATA_CALIBRATION");
  std::string path = plan::defaultCalibrationPath();
  REQUIRE(path.find(".cache/strata/calibration.json") != std::string::npos);
  if (old) setenv("STRATA_CALIBRATION", saved.c_str(), 1);
}

TEST_CASE("the SSD and CPU AdamW measurements run on a small size", "[train][calibration]") {
  fs::path dir = test::freshDir("strata-calibration-ssd");
  plan::SsdRates rates = plan::measureSsd(dir.string(), 3ull << 20, 1ull << 20);
  REQUIRE(rates.writeGBs > 0);
  REQUIRE(rates.readGBs > 0);
  REQUIRE(fs::is_empty(dir));  // the probe file is gone
  REQUIRE(test::errorOf([&] { plan::measureSsd(dir.string(), 1 << 20, 1000); }).find("4 KiB") !=
          std::string::npos);
  REQUIRE(plan::measureCpuAdamw(1 << 16, 2) > 0);
}
