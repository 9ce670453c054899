#include "strata/core/Device.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "strata/core/Error.h"

#if STRATA_CUDA
#include <cuda_runtime.h>
#endif

namespace strata {

const char* deviceTypeName(DeviceType t) {
  return t == DeviceType::CPU ? "cpu" : "cuda";
}

std::string toString(Device d) {
  if (d.isCpu()) return "cpu";
  return "cuda:" + std::to_string(d.index);
}

std::ostream& operator<<(std::ostream& os, Device d) {
  return os << toString(d);
}

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    try {
      return cuda(std::stoi(text.substr(5)));
    } catch (const std::exception&) {
    }
  }
  STRATA_USER_FAIL("unknown device '{}' (expected cpu, cuda or cuda:N)", text);
}

std::vector<int> cpusByPhysicalCore(int* physicalCores) {
  std::vector<int> cpus, siblings;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return cpus;
  std::set<std::pair<std::string, std::string>> seen;  // (package, core) pairs
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::string package, core;
    std::ifstream(base + "physical_package_id") >> package;
    std::ifstream(base + "core_id") >> core;
    // No topology (some containers): the CPU counts as a core.
    if (package.empty() || core.empty() || seen.emplace(package, core).second)
      cpus.push_back(cpu);
    else
      siblings.push_back(cpu);
  }
  if (physicalCores != nullptr) *physicalCores = int(cpus.size());
  cpus.insert(cpus.end(), siblings.begin(), siblings.end());
  return cpus;
}

int physicalCpuCores() {
  static const int cores = [] {
    int n = 0;
    cpusByPhysicalCore(&n);
    return std::max(1, n);
  }();
  return cores;
}

bool builtWithCuda() {
  return STRATA_CUDA != 0;
}

std::string deviceName(Device d) {
  if (d.isCpu()) return "cpu";
#if STRATA_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, d.index) == cudaSuccess) return prop.name;
  cudaGetLastError();
#endif
  return toString(d);
}

namespace {
// A /proc/meminfo field in bytes (0 when unreadable).
uint64_t meminfoBytes(const char* field) {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == field) return kb * 1024;
  return 0;
}
}  // namespace

uint64_t deviceMemoryBytes(Device d) {
  if (d.isCpu()) return meminfoBytes("MemTotal:");
#if STRATA_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, d.index) == cudaSuccess) return uint64_t(prop.totalGlobalMem);
  cudaGetLastError();
#endif
  return 0;
}

uint64_t deviceFreeBytes(Device d) {
  if (d.isCpu()) return meminfoBytes("MemAvailable:");
#if STRATA_CUDA
  bindThreadToProcessDevice();
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return 0;
  size_t freeBytes = 0, totalBytes = 0;
  bool ok = cudaSetDevice(d.index) == cudaSuccess && cudaMemGetInfo(&freeBytes, &totalBytes) == cudaSuccess;
  cudaSetDevice(previous);
  if (ok) return uint64_t(freeBytes);
  cudaGetLastError();
#endif
  return 0;
}

std::string deviceUuid(Device d) {
  if (d.isCpu()) return "";
#if STRATA_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, d.index) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  std::string hex;
  for (char byte : prop.uuid.bytes) hex += fmt::format("{:02x}", uint8_t(byte));
  return hex;
#else
  return "";
#endif
}

std::string hostIdentity() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) name[0] = '\0';
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return std::string(name) + "/" + boot;
}

namespace {
std::atomic<int> processDevice{-1};
}  // namespace

void setProcessDevice(Device d) {
  STRATA_CHECK(d.isCuda(), "setProcessDevice: {} is not a GPU", toString(d));
#if STRATA_CUDA
  int count = cudaDeviceCount();
  STRATA_CHECK(d.index >= 0 && d.index < count,
               "setProcessDevice: cuda:{} requested but {} CUDA device(s) are visible", d.index, count);
  processDevice.store(d.index);
  cudaError_t rc = cudaSetDevice(d.index);
  STRATA_CHECK(rc == cudaSuccess, "cudaSetDevice({}) failed: {}", d.index, cudaGetErrorString(rc));
#else
  STRATA_FAIL("setProcessDevice({}): this build of Strata has no CUDA support", toString(d));
#endif
}

int processDeviceIndex() {
  return processDevice.load();
}

void bindThreadToProcessDevice() {
#if STRATA_CUDA
  thread_local int bound = -1;
  int device = processDevice.load(std::memory_order_relaxed);
  if (device < 0 || bound == device) return;
  if (cudaSetDevice(device) == cudaSuccess) bound = device;
#endif
}

int cudaDeviceCount() {
#if STRATA_CUDA
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device" error
      return 0;
    }
    return n;
  }();
  return count;
#else
  return 0;
#endif
}

}  // namespace strata
