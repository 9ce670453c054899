#include "strata/core/Device.h"

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
  STRATA_FAIL("unknown device '{}' (expected cpu, cuda or cuda:N)", text);
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
