#include "strata/ops/Registry.h"

#include "Kernels.h"

namespace strata::ops {

Registry& Registry::instance() {
  // Built once, then only read: backends register explicitly here rather than through static initialisers,
  // which a static library's linker would drop.
  static Registry registry = [] {
    Registry r;
    registerCpuKernels(r);
#if STRATA_CUDA
    registerCudaKernels(r);
#endif
    return r;
  }();
  return registry;
}

const Registry::Entry* Registry::lookup(std::string_view op, DeviceType device) const {
  auto it = table_.find(std::string(op));
  if (it == table_.end()) return nullptr;
  const Entry& e = it->second[size_t(device)];
  return e.fn ? &e : nullptr;
}

}  // namespace strata::ops
