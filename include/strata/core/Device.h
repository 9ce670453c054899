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
// Bytes of the device free now: a GPU's free memory as the driver reports it (other processes' contexts and
// libraries' own buffers, such as NCCL's, already taken off), or the host's MemAvailable for the CPU; 0 when
// it cannot be read.
uint64_t deviceFreeBytes(Device d);

// A GPU's identity across processes, whatever CUDA_VISIBLE_DEVICES each one sees: its UUID in hex; "" for the
// CPU or when it cannot be read.
std::string deviceUuid(Device d);
// This machine's identity: its host name and boot id, so that ranks can tell which of them share a host.
std::string hostIdentity();

// NOTE [Process device]
// A process that computes on one GPU makes it the current CUDA device of every thread that touches CUDA, not
// only of the thread that chose it. CUDA's current device is per thread and starts at 0, and a runtime call
// on a thread with none set (or a guard that restores 0 when it ends) opens a context on GPU 0: each rank of
// another GPU would then hold memory on GPU 0, and a library handle made on such a thread (cuDNN's) would
// belong to the wrong GPU. setProcessDevice records the GPU and makes it current on the calling thread;
// bindThreadToProcessDevice makes it current on the calling thread once (a thread-local flag): Strata's
// device guards, streams and events call it, and so does every thread Strata starts that uses CUDA.
void setProcessDevice(Device d);
// The process's GPU index, or -1 when none was set (a CPU run, or a process that drives several GPUs).
int processDeviceIndex();
void bindThreadToProcessDevice();

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
