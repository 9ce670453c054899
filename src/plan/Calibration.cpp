#include "strata/plan/Calibration.h"

#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>

#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "strata/core/Allocator.h"
#include "strata/core/Device.h"
#include "strata/core/Error.h"
#include "strata/core/Storage.h"
#include "strata/core/Stream.h"
#include "strata/core/Tensor.h"
#include "strata/ops/Ops.h"
#include "strata/plan/PlacementInputs.h"
#include "strata/zero/Store.h"

namespace strata::plan {

namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

template <typename T>
void put(Json& j, const char* key, const std::optional<T>& value) {
  if (value) j[key] = *value;
}

template <typename T>
void get(const Json& j, const char* key, std::optional<T>& value, const std::string& origin) {
  if (!j.contains(key) || j[key].is_null()) return;
  try {
    value = j[key].get<T>();
  } catch (const Json::exception&) {
    STRATA_USER_FAIL("{}: calibration field '{}' has the wrong type ({})", origin, key, j[key].dump());
  }
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

std::string Calibration::toJson() const {
  Json j;
  j["version"] = 1;
  j["date"] = date;
  j["host"] = host;
  put(j, "device_name", deviceName);
  put(j, "device_memory_bytes", deviceMemoryBytes);
  put(j, "h2d_gb_s", h2dGBs);
  put(j, "d2h_gb_s", d2hGBs);
  put(j, "gemm_bf16_tflops", gemmTflops);
  if (gemmTflops) j["gemm_shape"] = gemmShape;
  put(j, "peak_bf16_tflops", peakTflops);
  put(j, "device_memory_gb_s", deviceMemoryGBs);
  put(j, "nvlink_bus_gb_s", nvlinkBusGBs);
  put(j, "network_gb_s", networkGBs);
  if (gpusPerNode > 0) j["gpus_per_node"] = gpusPerNode;
  put(j, "host_memory_bytes", hostMemoryBytes);
  put(j, "host_available_bytes", hostAvailableBytes);
  put(j, "cpu_adamw_elems_per_s", cpuAdamwElemsPerS);
  j["cpu_threads"] = cpuThreads;
  put(j, "nvme_write_gb_s", nvmeWriteGBs);
  put(j, "nvme_read_gb_s", nvmeReadGBs);
  put(j, "nvme_free_bytes", nvmeFreeBytes);
  if (!nvmePath.empty()) {
    j["nvme_path"] = nvmePath;
    j["nvme_direct"] = nvmeDirect;
  }
  return j.dump(2) + "\n";
}

Calibration Calibration::fromJson(const std::string& text, const std::string& origin) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    STRATA_USER_FAIL("{} is not a calibration file ({}); rewrite it with `strata bench --calibrate`", origin,
                     e.what());
  }
  STRATA_USER_CHECK(j.is_object(), "{} is not a calibration file (expected a JSON object)", origin);
  Calibration c;
  std::optional<std::string> date, host, gemmShape, nvmePath;
  std::optional<int> threads, gpusPerNode;
  std::optional<bool> direct;
  get(j, "date", date, origin);
  get(j, "host", host, origin);
  get(j, "device_name", c.deviceName, origin);
  get(j, "device_memory_bytes", c.deviceMemoryBytes, origin);
  get(j, "h2d_gb_s", c.h2dGBs, origin);
  get(j, "d2h_gb_s", c.d2hGBs, origin);
  get(j, "gemm_bf16_tflops", c.gemmTflops, origin);
  get(j, "gemm_shape", gemmShape, origin);
  get(j, "peak_bf16_tflops", c.peakTflops, origin);
  get(j, "device_memory_gb_s", c.deviceMemoryGBs, origin);
  get(j, "nvlink_bus_gb_s", c.nvlinkBusGBs, origin);
  get(j, "network_gb_s", c.networkGBs, origin);
  get(j, "gpus_per_node", gpusPerNode, origin);
  get(j, "host_memory_bytes", c.hostMemoryBytes, origin);
  get(j, "host_available_bytes", c.hostAvailableBytes, origin);
  get(j, "cpu_adamw_elems_per_s", c.cpuAdamwElemsPerS, origin);
  get(j, "cpu_threads", threads, origin);
  get(j, "nvme_write_gb_s", c.nvmeWriteGBs, origin);
  get(j, "nvme_read_gb_s", c.nvmeReadGBs, origin);
  get(j, "nvme_free_bytes", c.nvmeFreeBytes, origin);
  get(j, "nvme_path", nvmePath, origin);
  get(j, "nvme_direct", direct, origin);
  c.date = date.value_or("");
  c.host = host.value_or("");
  c.gemmShape = gemmShape.value_or("");
  c.cpuThreads = threads.value_or(0);
  c.nvmePath = nvmePath.value_or("");
  c.nvmeDirect = direct.value_or(true);
  c.gpusPerNode = gpusPerNode.value_or(0);
  STRATA_USER_CHECK(c.gpusPerNode >= 0, "{}: calibration field 'gpus_per_node' is {}; it counts GPUs", origin,
                    c.gpusPerNode);
  // A rate of zero or less would divide a plan by zero: refuse it here, naming the field.
  for (auto [key, value] : {std::pair{"h2d_gb_s", c.h2dGBs},
                            {"d2h_gb_s", c.d2hGBs},
                            {"gemm_bf16_tflops", c.gemmTflops},
                            {"peak_bf16_tflops", c.peakTflops},
                            {"device_memory_gb_s", c.deviceMemoryGBs},
                            {"nvlink_bus_gb_s", c.nvlinkBusGBs},
                            {"network_gb_s", c.networkGBs},
                            {"cpu_adamw_elems_per_s", c.cpuAdamwElemsPerS},
                            {"nvme_write_gb_s", c.nvmeWriteGBs},
                            {"nvme_read_gb_s", c.nvmeReadGBs}})
    STRATA_USER_CHECK(!value || *value > 0, "{}: calibration field '{}' is {}; rates must be positive",
                      origin, key, *value);
  return c;
}

std::string defaultCalibrationPath() {
  if (const char* env = std::getenv("STRATA_CALIBRATION"); env && *env) return env;
  if (const char* home = std::getenv("HOME"); home && *home)
    return (std::filesystem::path(home) / ".cache" / "strata" / "calibration.json").string();
  return "calibration.json";
}

void writeCalibration(const Calibration& calibration, const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file(path);
  std::error_code ec;
  if (!file.parent_path().empty()) fs::create_directories(file.parent_path(), ec);
  STRATA_USER_CHECK(!ec, "cannot create the directory of {}: {}", path, ec.message());
  // Written beside, then renamed: a reader never sees half a file.
  fs::path temporary = file;
  temporary += ".tmp";
  {
    std::ofstream out(temporary);
    out << calibration.toJson();
    STRATA_USER_CHECK(out.good(), "cannot write {}", temporary.string());
  }
  fs::rename(temporary, file, ec);
  STRATA_USER_CHECK(!ec, "cannot write {}: {}", path, ec.message());
}

std::optional<Calibration> readCalibration(const std::string& path) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  std::ifstream in(path);
  STRATA_USER_CHECK(in.good(), "cannot read the calibration file {}", path);
  std::stringstream text;
  text << in.rdbuf();
  return Calibration::fromJson(text.str(), path);
}

Calibration measuredH200() {
  Calibration c;
  c.date = "2026-11-29";
  c.host = "reference H200";
  c.deviceName = "NVIDIA H200 (reference)";
  c.deviceMemoryBytes = 139ull << 30;
  c.h2dGBs = 52;
  c.d2hGBs = 55;
  c.gemmTflops = 799;  // bf16 8192^3 through PyTorch
  c.gemmShape = "8192^3 (PyTorch)";
  c.peakTflops = 989;  // NVIDIA's H200 SXM datasheet: 1,979 TFLOP/s bf16 with 2:4 sparsity, half of it dense
  c.nvlinkBusGBs = 331;  // NCCL all_reduce of 1 GiB between 2 GPUs of an H200 machine (kCollectiveBusGBs)
  c.gpusPerNode = 1;
  c.hostMemoryBytes = 125ull << 30;
  // No figure for Strata's own kernel yet: PyTorch's fused CPU AdamW, 16 threads (4.44 and 5.47 Gparam/s in
  // two runs), where a plain `omp simd` loop with a bf16 write measured 2.25. That loop was ops::adamw before
  // the fused AVX-512/AVX2 kernel; plan with it until tools/bench_cpu_adam.py has measured the kernel there.
  c.cpuAdamwElemsPerS = 2.25e9;
  c.cpuThreads = 16;
  c.nvmeWriteGBs = 1.4;
  c.nvmeReadGBs = 1.4;
  c.nvmeFreeBytes = 64ull << 30;
  c.nvmePath = "(the device's disk)";
  return c;
}

Calibration measuredH200x8() {
  Calibration c = measuredH200();
  c.host = "reference 8-GPU H200";
  c.deviceName = "NVIDIA H200 (reference, 8 on one machine)";
  c.hostMemoryBytes = 560ull << 30;
  c.nvmeFreeBytes = 235ull << 30;
  c.cpuThreads = 128;
  c.gpusPerNode = 8;
  return c;
}

Calibration h200x8Cluster() {
  Calibration c = measuredH200x8();
  c.host = "H200 cluster node (8 GPUs, InfiniBand)";
  c.deviceName = "NVIDIA H200 (reference, 8 a node)";
  // 8 x 400 Gb/s NDR InfiniBand a node, one NIC a GPU (the DGX H200's eight ConnectX-7 ports): 50 GB/s a GPU.
  // Published line rate, not a measurement: NCCL reaches somewhat less across nodes.
  c.networkGBs = 400.0 / 8;
  return c;
}

Calibration a100x8Cluster() {
  // Published specifications, none measured here.
  Calibration c;
  c.date = "published specifications";
  c.host = "A100-40GB cluster node (8 GPUs, 1 TB host memory, InfiniBand)";
  c.deviceName = "NVIDIA A100-SXM4-40GB (published figures)";
  // NVIDIA A100 datasheet: 40 GB of HBM2; the device reports 40,536 MiB of it.
  c.deviceMemoryBytes = 40536ull << 20;
  // NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense (624 with sparsity).
  c.peakTflops = 312;
  // No A100 GEMM measured here: the peak at the share the reference H200's training-shaped GEMMs reach of
  // its own (799 of 989 TFLOP/s).
  c.gemmTflops = 312.0 * 799.0 / 989.0;
  c.gemmShape = "312 TFLOP/s peak (datasheet) x 0.81, the reference H200's GEMM share of its peak";
  // NVIDIA A100 datasheet: 1,555 GB/s of HBM2 bandwidth (40 GB); at the share the H200's fused AdamW reaches
  // of its 4.8 TB/s (3.6 TB/s, kDeviceUpdateGBs).
  c.deviceMemoryGBs = 1555.0 * 3600.0 / 4800.0;
  // Third-generation NVLink, 600 GB/s a GPU, both directions (A100 datasheet): 300 each way, at the share
  // the H200's measured bus bandwidth has of its 450 each way (331 / 450).
  c.nvlinkBusGBs = 300.0 * 331.0 / 450.0;
  // PCIe gen4 x16: 32 GB/s a direction on the wire, about 25 achieved with pinned memory.
  c.h2dGBs = 25;
  c.d2hGBs = 25;
  // 8 x 200 Gb/s HDR InfiniBand a node (the DGX A100's eight ConnectX-6 compute ports): 25 GB/s a GPU.
  c.networkGBs = 200.0 / 8;
  c.hostMemoryBytes = 1ull << 40;  // 1 TB (the DGX A100's 1 TB configuration)
  c.cpuThreads = 128;              // 2 x AMD EPYC 7742, 64 cores each (DGX A100)
  // No CPU AdamW figure for that CPU: the reference H200 machine's (stated in the plan's notes).
  c.gpusPerNode = 8;
  return c;
}

SsdRates measureSsd(const std::string& directory, uint64_t bytes, uint64_t blockBytes) {
  namespace fs = std::filesystem;
  STRATA_USER_CHECK(blockBytes >= 4096 && blockBytes % 4096 == 0,
                    "SSD calibration: the block size {} is not a multiple of 4 KiB", blockBytes);
  std::error_code ec;
  fs::create_directories(directory, ec);
  STRATA_USER_CHECK(fs::is_directory(directory), "SSD calibration: {} is not a directory", directory);
  uint64_t blocks = std::max<uint64_t>(1, (bytes + blockBytes - 1) / blockBytes);
  fs::path file = fs::path(directory) / ("strata-calibrate-" + std::to_string(::getpid()) + ".bin");
  std::unique_ptr<void, AlignedFree> buffer(std::aligned_alloc(4096, blockBytes));
  STRATA_CHECK(buffer != nullptr, "SSD calibration: cannot allocate a {}-byte aligned buffer", blockBytes);
  std::memset(buffer.get(), 0x5a, blockBytes);
  SsdRates rates;
  auto openFile = [&](int flags) {
    int fd = ::open(file.c_str(), flags | O_DIRECT, 0600);
    if (fd < 0 && errno == EINVAL) {
      // tmpfs and some overlay file systems refuse O_DIRECT.
      rates.direct = false;
      fd = ::open(file.c_str(), flags, 0600);
    } else if (fd >= 0 && !rates.direct) {
      ::close(fd);
      fd = ::open(file.c_str(), flags, 0600);
    }
    STRATA_USER_CHECK(fd >= 0, "SSD calibration: cannot open {}: {}", file.string(), std::strerror(errno));
    return fd;
  };
  struct Remove {
    fs::path path;
    ~Remove() {
      std::error_code ignored;
      fs::remove(path, ignored);
    }
  } remove{file};
  auto check = [&](ssize_t done, const char* what, uint64_t block) {
    STRATA_USER_CHECK(done == ssize_t(blockBytes), "SSD calibration: {} of block {} of {} failed: {}", what,
                      block, file.string(), done < 0 ? std::strerror(errno) : "short transfer");
  };
  int fd = openFile(O_CREAT | O_TRUNC | O_WRONLY);
  auto start = Clock::now();
  for (uint64_t b = 0; b < blocks; ++b) {
    ssize_t done = ::pwrite(fd, buffer.get(), blockBytes, off_t(b * blockBytes));
    if (done < 0) ::close(fd);
    check(done, "the write", b);
  }
  STRATA_USER_CHECK(::fdatasync(fd) == 0, "SSD calibration: fdatasync of {} failed: {}", file.string(),
                    std::strerror(errno));
  rates.writeGBs = double(blocks * blockBytes) / secondsSince(start) / 1e9;
  // Without O_DIRECT the reads would come from the page cache: drop the file's pages first.
  if (!rates.direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  fd = openFile(O_RDONLY);
  start = Clock::now();
  for (uint64_t b = 0; b < blocks; ++b) {
    ssize_t done = ::pread(fd, buffer.get(), blockBytes, off_t(b * blockBytes));
    if (done < 0) ::close(fd);
    check(done, "the read", b);
  }
  rates.readGBs = double(blocks * blockBytes) / secondsSince(start) / 1e9;
  ::close(fd);
  return rates;
}

double measureCpuAdamw(int64_t elements, int repeats) {
  STRATA_CHECK(elements > 0 && repeats > 0, "measureCpuAdamw: {} elements, {} repeats", elements, repeats);
  Device cpu = Device::cpu();
  Tensor param = ops::full({elements}, 0.1, DType::F32, cpu),
         grad = ops::full({elements}, 0.01, DType::F32, cpu);
  Tensor m = ops::full({elements}, 0.0, DType::F32, cpu), v = ops::full({elements}, 0.0, DType::F32, cpu);
  Tensor copy = Tensor::empty({elements}, DType::BF16, cpu);
  ops::AdamWHyper h;
  h.lr = 1e-4f;
  h.biasCorrection1 = 0.1f;
  h.biasCorrection2 = 0.001f;
  std::vector<ops::AdamWTensors> sets{ops::AdamWTensors{param, grad, m, v, 0.1f, copy}};
  ops::adamw(sets, h);  // first touch
  double best = 0;
  for (int i = 0; i < repeats; ++i) {
    auto start = Clock::now();
    ops::adamw(sets, h);
    best = std::max(best, double(elements) / secondsSince(start));
  }
  return best;
}

namespace {

// Pinned host memory <-> device, one 1 GiB copy each way, median of 5.
void measureTransfers(Calibration& c, Device gpu) {
  const int64_t bytes = int64_t(1) << 30, n = bytes / 4;
  PinnedHostPool pool(size_t(bytes) + (4u << 20));
  auto storage = std::make_shared<StorageImpl>(size_t(bytes), pool);
  Tensor host = Tensor::fromStorage(std::move(storage), {n}, {1}, 0, DType::F32);
  ops::fill(host, 1.0);
  Tensor device = Tensor::empty({n}, DType::F32, gpu);
  double h2d = medianEventMs(
      gpu, [&] { ops::copy(device, host); }, 1, 5);
  double d2h = medianEventMs(
      gpu, [&] { ops::copy(host, device); }, 1, 5);
  c.h2dGBs = double(bytes) / (h2d * 1e-3) / 1e9;
  c.d2hGBs = double(bytes) / (d2h * 1e-3) / 1e9;
}

// The four GEMMs of a GPT-6.7B layer's forward at 8192 tokens (B16 x seq 512): qkv, attention output, fc1,
// fc2; TFLOP/s over their summed medians.
void measureGemm(Calibration& c, Device gpu) {
  const int64_t tokens = 8192, h = 4096;
  const std::vector<std::pair<int64_t, int64_t>> kn = {{h, 3 * h}, {h, h}, {h, 4 * h}, {4 * h, h}};
  double flops = 0, ms = 0;
  for (auto [k, n] : kn) {
    Tensor a = ops::full({tokens, k}, 0.01, DType::BF16, gpu), b = ops::full({k, n}, 0.01, DType::BF16, gpu);
    Tensor out;
    ms += medianEventMs(
        gpu, [&] { out = ops::matmul(a, b); }, 1, 20);
    flops += 2.0 * double(tokens) * double(k) * double(n);
  }
  c.gemmTflops = flops / (ms * 1e-3) / 1e12;
  c.gemmShape = "GPT-6.7B layer GEMMs at 8192 tokens (qkv, proj, fc1, fc2)";
}

std::string isoNow() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", std::localtime(&now));
  return buf;
}

}  // namespace

std::string thisHostName() {
  char hostname[256] = {0};
  return ::gethostname(hostname, sizeof(hostname) - 1) == 0 ? std::string(hostname) : std::string();
}

Calibration probeMachine(const std::string& nvmePath) {
  Calibration c;
  c.date = isoNow();
  c.host = thisHostName();
  if (uint64_t total = deviceMemoryBytes(Device::cpu()); total > 0) c.hostMemoryBytes = total;
  if (uint64_t available = zero::availableHostBytes(); available != zero::kUnlimited)
    c.hostAvailableBytes = available;
  if (const char* gb = std::getenv("STRATA_HOST_MEMORY_GB")) {
    // A smaller machine, for tests: its memory, all of it available.
    c.hostMemoryBytes = zero::parseBudgetGb(gb, 0, "STRATA_HOST_MEMORY_GB");
    c.hostAvailableBytes = c.hostMemoryBytes;
  }
  c.cpuThreads = physicalCpuCores();
  if (cudaAvailable()) {
    Device gpu = Device::cuda(0);
    c.deviceName = deviceName(gpu);
    if (uint64_t total = deviceMemoryBytes(gpu); total > 0) c.deviceMemoryBytes = total;
  }
  if (!nvmePath.empty()) {
    c.nvmePath = std::filesystem::absolute(nvmePath).string();
    if (uint64_t free = freeDiskBytes(nvmePath); free > 0) c.nvmeFreeBytes = free;
  }
  return c;
}

MachineChoice chooseMachine(const std::string& machine, const std::string& calibrationPath,
                            const std::string& nvmePath) {
  MachineChoice out;
  if (machine == "h200") {
    out.calibration = measuredH200();
    out.source = "the reference H200, measured (--machine h200)";
    return out;
  }
  if (machine == "h200x8") {
    out.calibration = measuredH200x8();
    out.source = "the reference 8-GPU H200 machine (--machine h200x8)";
    out.notes.push_back(
        "the 8-GPU machine's memory, disk and cores are its own; its rates (GEMM, PCIe, CPU AdamW per "
        "machine, "
        "SSD) are the one-GPU H200's, not measured there");
    return out;
  }
  if (machine == "h200x8-ib") {
    out.calibration = h200x8Cluster();
    out.source = "a node of 8 H200 with 8 x 400 Gb/s InfiniBand (--machine h200x8-ib)";
    out.notes.push_back(
        "the H200 cluster node: the 8-GPU machine's sizes, the one-GPU H200's rates, and the network's "
        "published line rate (50 GB/s a GPU), not measured");
    return out;
  }
  if (machine == "a100x8-ib") {
    out.calibration = a100x8Cluster();
    out.source =
        "a node of 8 A100-40GB with 1 TB host memory and 8 x 200 Gb/s InfiniBand (--machine a100x8-ib)";
    out.notes.push_back(
        "the A100 node's figures are published specifications (plan/Calibration.cpp names each), with the "
        "GEMM, HBM and NVLink rates at the shares of peak the reference H200 measured; nothing measured on "
        "an A100");
    return out;
  }
  STRATA_USER_CHECK(machine == "here",
                    "--machine is '{}': use here (this machine), h200, h200x8, h200x8-ib or a100x8-ib",
                    machine);
  if (!calibrationPath.empty()) {
    std::optional<Calibration> file = readCalibration(calibrationPath);
    STRATA_USER_CHECK(file.has_value(), "no calibration file {}", calibrationPath);
    out.calibration = *file;
    out.source = calibrationPath;
    return out;
  }
  Calibration here = probeMachine(nvmePath);
  std::string path = defaultCalibrationPath();
  std::optional<Calibration> file = readCalibration(path);
  if (file && file->host == here.host) {
    // The file's rates; what this machine has now where the file says nothing.
    Calibration c = *file;
    if (!c.deviceMemoryBytes && here.deviceMemoryBytes) {
      c.deviceName = here.deviceName;
      c.deviceMemoryBytes = here.deviceMemoryBytes;
    }
    if (!c.hostMemoryBytes) c.hostMemoryBytes = here.hostMemoryBytes;
    if (!c.hostAvailableBytes) c.hostAvailableBytes = here.hostAvailableBytes;
    if (c.cpuThreads == 0) c.cpuThreads = here.cpuThreads;
    if (!here.nvmePath.empty() && (c.nvmePath != here.nvmePath || !c.nvmeFreeBytes))
      c.nvmeFreeBytes = here.nvmeFreeBytes;
    out.calibration = c;
    out.source = path;
    return out;
  }
  out.calibration = here;
  out.source = "this machine";
  if (file)
    out.notes.push_back(
        fmt::format("{} describes host '{}', not this one ('{}'): not used", path, file->host, here.host));
  out.notes.push_back(
      "no calibration of this machine: its memory, cores and disk are read now, its rates (GEMM, PCIe, CPU "
      "AdamW, SSD) are the reference H200's; `strata bench --calibrate` measures them");
  return out;
}

Calibration calibrate(const std::string& nvmePath, uint64_t nvmeBytes) {
  Calibration c = probeMachine(nvmePath);
  omp_set_num_threads(physicalCpuCores());
  c.cpuThreads = omp_get_max_threads();
  auto step = [](const char* what) {
    std::printf("calibrating: %s...\n", what);
    std::fflush(stdout);
  };
  if (cudaAvailable()) {
    Device gpu = Device::cuda(0);
    step("PCIe, pinned host memory <-> device");
    measureTransfers(c, gpu);
    step("bf16 GEMM");
    measureGemm(c, gpu);
  }
  step("CPU AdamW");
  c.cpuAdamwElemsPerS = measureCpuAdamw(int64_t(64) << 20, 5);
  // Leave the disk most of its room: at most half of what is free.
  uint64_t bytes = std::min<uint64_t>(nvmeBytes, c.nvmeFreeBytes.value_or(nvmeBytes) / 2);
  if (bytes >= (16ull << 20)) {
    step("SSD, O_DIRECT 16 MiB blocks");
    SsdRates ssd = measureSsd(nvmePath, bytes);
    c.nvmeWriteGBs = ssd.writeGBs;
    c.nvmeReadGBs = ssd.readGBs;
    c.nvmeDirect = ssd.direct;
  }
  return c;
}

}  // namespace strata::plan
