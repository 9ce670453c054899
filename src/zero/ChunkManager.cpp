#include "strata/zero/ChunkManager.h"

#include <set>

#include "strata/autograd/GradMode.h"
#include "strata/nn/Module.h"
#include "strata/ops/Ops.h"

namespace strata::zero {

ChunkManager::ChunkManager(const std::vector<std::pair<std::string, Tensor>>& parameters,
                           int64_t chunkBytes) {
  STRATA_CHECK(!parameters.empty(), "ChunkManager: no parameters");
  dtype_ = parameters.front().second.dtype();
  Device device = parameters.front().second.device();
  std::vector<std::pair<std::string, Shape>> shapes;
  std::vector<Tensor> tensors;
  std::set<std::string> seen;
  for (const auto& [name, p] : parameters) {
    STRATA_CHECK(p.dtype() == dtype_ && p.device() == device,
                 "ChunkManager: parameter '{}' is {} on {}, the first one {} on {}", name, p.dtype(),
                 toString(p.device()), dtype_, toString(device));
    STRATA_CHECK(p.isContiguous(), "ChunkManager: parameter '{}' is not contiguous", name);
    shapes.emplace_back(name, p.shape());
    if (seen.insert(name).second) tensors.push_back(p);
  }
  layout_ = planChunks(shapes, chunkBytes, dtype_);
  // Chunk by chunk: each parameter's old storage is released as soon as it moves, so the move needs one chunk
  // of extra memory, not a second copy of the model.
  NoGradGuard noGrad;
  for (size_t c = 0; c < layout_.chunks.size(); ++c) {
    Storage storage = makeStorage(size_t(layout_.chunks[c].used) * dtypeSize(dtype_), device);
    storage->setLabel("chunk " + std::to_string(c));
    for (int64_t k : layout_.chunks[c].slots) {
      const ChunkSlot& slot = layout_.slots[size_t(k)];
      const Tensor& p = tensors[size_t(k)];
      ops::copy(Tensor::fromStorage(storage, p.shape(), p.strides(), slot.offset, dtype_), p);
      TensorImpl& impl = p.impl();
      impl.storage = storage;
      impl.offset = slot.offset;
    }
    chunks_.push_back(std::move(storage));
  }
}

Tensor ChunkManager::flat(size_t i) const {
  int64_t n = layout_.chunks[i].used;
  return Tensor::fromStorage(chunks_[i], {n}, {1}, 0, dtype_);
}

size_t ChunkManager::bytes(size_t i) const {
  return size_t(layout_.chunks[i].used) * dtypeSize(dtype_);
}

void ChunkManager::evict(size_t i) {
  chunks_[i]->evict();
}

void ChunkManager::repoint(size_t i, void* data, Device device) {
  chunks_[i]->repoint(data, device);
}

std::vector<std::string> recordFirstUse(nn::Module& model, const std::function<void()>& forward) {
  std::vector<std::string> order;
  std::set<std::string> seen;
  auto modules = model.namedModules();
  for (auto& [prefix, module] : modules) {
    std::string base = prefix.empty() ? "" : prefix + ".";
    module->addForwardPreHook([&order, &seen, base](nn::Module& m, const std::vector<Tensor>&) {
      for (const auto& [name, t] : m.namedParameters(/*recurse=*/false))
        if (seen.insert(base + name).second) order.push_back(base + name);
    });
  }
  auto removeHooks = [&] {
    for (auto& [prefix, module] : modules) module->popForwardPreHook();
  };
  try {
    forward();
  } catch (...) {
    removeHooks();
    throw;
  }
  removeHooks();
  for (const auto& [name, t] : model.namedParameters())
    if (seen.insert(name).second) order.push_back(name);
  return order;
}

}  // namespace strata::zero
