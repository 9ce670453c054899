// The op registry: kernels keyed by (op name, device type).
//
// Each op family declares a kernel signature (a plain function type). Backends register one function per op
// from their family files (src/ops/cpu/*, src/ops/cuda/*). Front ends look the kernel up and call it. Looking
// up a kernel that no backend registered throws an error naming the op and the device; looking one up with
// the wrong signature throws too, so a mismatch can never call through a wrongly typed pointer.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <typeinfo>
#include <unordered_map>

#include "strata/core/Device.h"
#include "strata/core/Error.h"

namespace strata::ops {

class Registry {
 public:
  // The registry, with every built-in backend registered on first use.
  static Registry& instance();

  template <class Fn>
  void add(std::string_view op, DeviceType device, Fn* fn) {
    Entry& e = table_[std::string(op)][size_t(device)];
    e.fn = reinterpret_cast<void (*)()>(fn);
    e.signature = &typeid(Fn);
  }

  template <class Fn>
  Fn* find(std::string_view op, DeviceType device) const {
    const Entry* e = lookup(op, device);
    STRATA_CHECK(e != nullptr, "no kernel registered for op '{}' on device type '{}'", op,
                 deviceTypeName(device));
    STRATA_CHECK(*e->signature == typeid(Fn), "op '{}' on '{}' was looked up with the wrong kernel signature",
                 op, deviceTypeName(device));
    return reinterpret_cast<Fn*>(e->fn);
  }

  bool has(std::string_view op, DeviceType device) const { return lookup(op, device) != nullptr; }

 private:
  struct Entry {
    void (*fn)() = nullptr;
    const std::type_info* signature = nullptr;
  };
  const Entry* lookup(std::string_view op, DeviceType device) const;

  std::unordered_map<std::string, std::array<Entry, kNumDeviceTypes>> table_;
};

template <class Fn>
Fn* kernel(std::string_view op, Device device) {
  return Registry::instance().find<Fn>(op, device.type);
}

}  // namespace strata::ops
