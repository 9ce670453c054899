// Where a tensor's bytes live.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace strata {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };
constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return Device{DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return Device{DeviceType::CUDA, index}; }
  static Device parse(const std::string& text);  // "cpu", "cuda", "cuda:1"

  bool isCpu() const { return type == DeviceType::CPU; }
  bool isCuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device& o) const {
    return type == o.type && (type == DeviceType::CPU || index == o.index);
  }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

std::string toString(Device d);
std::ostream& operator<<(std::ostream& os, Device d);
const char* deviceTypeName(DeviceType t);

// Number of usable CUDA devices: 0 in a CPU-only build or on a machine without a GPU.
int cudaDeviceCount();
inline bool cudaAvailable() {
  return cudaDeviceCount() > 0;
}
// The device's marketing name ("NVIDIA H200", or "cpu").
std::string deviceName(Device d);
// Total memory of the device in bytes: a GPU's global memory (0 when it cannot be queried), or the host's
// MemTotal for the CPU (0 when /proc/meminfo is unreadable).
uint64_t deviceMemoryBytes(Device d);
// True when this build was compiled with CUDA support.
bool builtWithCuda();
// Physical CPU cores among the CPUs this process may run on (its affinity mask), counting each hyperthread
// sibling pair once; at least 1. OpenMP's default (every logical CPU) oversubscribes the cores and collapses
// when another process is busy on them.
int physicalCpuCores();
// The CPUs this process may run on, one per physical core first (the lowest of each core's hyperthreads, in
// CPU order), then the remaining hyperthreads; a CPU whose topology cannot be read counts as a core.
// `physicalCores`, when given, receives how many of them come first (one per core).
std::vector<int> cpusByPhysicalCore(int* physicalCores = nullptr);

}  // namespace strata
