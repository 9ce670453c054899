#include "strata/zero/ChunkManager.h"

#include <set>

#include "strata/autograd/Engine.h"
#include "strata/autograd/GradMode.h"
#include "strata/autograd/Node.h"
#include "strata/core/Allocator.h"
#include "strata/nn/DeferredInit.h"
#include "strata/nn/Module.h"
#include "strata/ops/Ops.h"

namespace strata::zero {

ChunkManager::ChunkManager(const std::vector<std::pair<std::string, Tensor>>& parameters, int64_t chunkBytes,
                           std::optional<DType> compute, int shards, std::optional<Device> masterDevice,
                           const ChunkFamilies& families, uint64_t masterDeviceBytes,
                           const std::optional<ShardedLayout>& sharded)
    : shards_(shards) {
  STRATA_CHECK(shards >= 1, "ChunkManager: {} shards", shards);
  STRATA_CHECK(!parameters.empty(), "ChunkManager: no parameters");
  DType source = parameters.front().second.dtype();
  DType dtype = compute.value_or(source);
  Device device = parameters.front().second.device();
  std::vector<std::pair<std::string, Shape>> shapes;
  std::vector<Tensor> tensors;
  std::set<std::string> seen;
  std::vector<int> familyOf;
  for (const auto& [name, p] : parameters) {
    int family = families.of ? families.of(name) : 0;
    STRATA_CHECK(family == 0 || (family > 0 && size_t(family) < families.shards.size()),
                 "ChunkManager: parameter '{}' of family {}, with shard counts for {}", name, family,
                 families.shards.size());
    familyOf.push_back(family);
    STRATA_CHECK(p.dtype() == source && p.device() == device,
                 "ChunkManager: parameter '{}' is {} on {}, the first one {} on {}", name, p.dtype(),
                 toString(p.device()), source, toString(device));
    STRATA_CHECK((p.isContiguous() || nn::isDeferred(p)) && p.isLeaf(),
                 "ChunkManager: parameter '{}' is not a contiguous leaf", name);
    shapes.emplace_back(name, p.shape());
    if (seen.insert(name).second) tensors.push_back(p);
  }
  layout_ = planChunks(shapes, chunkBytes, dtype, familyOf);
  for (const auto& info : layout_.chunks) {
    int n = info.family == 0 ? shards : families.shards[size_t(info.family)];
    STRATA_CHECK(n >= 1, "ChunkManager: family {} has {} shards", info.family, n);
    chunkShards_.push_back(n);
  }
  // Gradients accumulate in fp32 for 16-bit parameters, else in the parameters' dtype.
  DType gradType = dtypeSize(dtype) < 4 ? DType::F32 : dtype;
  bool masters = dtype != source;
  STRATA_CHECK(!masters || source == DType::F32,
               "ChunkManager: {} parameters cannot become {} chunks with fp32 "
               "masters; build the model in fp32",
               source, dtype);
  // Chunk by chunk: each parameter's old storage is released as soon as it moves, so the move needs one chunk
  // of extra memory, not a second copy of the model.
  NoGradGuard noGrad;
  auto* caching = dynamic_cast<CachingAllocator*>(&deviceAllocator(device));
  if (caching) caching->emptyCache();
  grads_ = std::make_shared<Grads>();
  grads_->dtype = gradType;
  grads_->device = device;
  for (size_t c = 0; c < layout_.chunks.size(); ++c) grads_->elems.push_back(paddedElems(c));
  grads_->flat.resize(layout_.chunks.size());
  params_.resize(layout_.slots.size());
  chunkOf_.resize(layout_.slots.size());
  uint64_t onMasterDevice = 0;  // bytes of masters made on masterDevice so far
  if (sharded)
    STRATA_CHECK(sharded->familyRanks.size() >= std::max<size_t>(1, families.shards.size()),
                 "ChunkManager: a sharded layout with ranks for {} families, of {}",
                 sharded->familyRanks.size(), std::max<size_t>(1, families.shards.size()));
  bool resident = !(sharded && sharded->parameters);
  for (size_t c = 0; c < layout_.chunks.size(); ++c) {
    int64_t padded = paddedElems(c);
    size_t bytes = size_t(padded) * dtypeSize(dtype);
    // The elements this rank makes masters (and, not resident, parameters) of: its shard, or all of them.
    ShardRange own =
        sharded ? shard(c, sharded->familyRanks[size_t(layout_.chunks[c].family)]) : ShardRange{0, padded};
    Storage storage =
        resident ? makeStorage(bytes, device) : std::make_shared<StorageImpl>(nullptr, bytes, device);
    storage->setLabel("chunk " + std::to_string(c));
    uint64_t masterBytes = uint64_t(own.size()) * dtypeSize(source);
    bool there = masterDevice.has_value() && onMasterDevice + masterBytes <= masterDeviceBytes;
    if (there) onMasterDevice += masterBytes;
    Tensor master = masters ? Tensor::empty({own.size()}, source, there ? *masterDevice : device) : Tensor();
    Tensor shardValues = resident ? Tensor() : Tensor::empty({own.size()}, dtype, device);
    // Zeros wherever no parameter lies: the padding that makes equal shards (gathered, never read as a
    // parameter) and the alignment gaps between parameters, which checkpoints write with the chunk (and
    // refuse when non-finite) and the host tier's update rewrites as zeros. Left uninitialised, they held
    // whatever the allocator's last user wrote there.
    if (resident) ops::fill(Tensor::fromStorage(storage, {padded}, {1}, 0, dtype), 0.0);
    if (masters) ops::fill(master, 0.0);
    if (!resident) ops::fill(shardValues, 0.0);
    for (int64_t k : layout_.chunks[c].slots) {
      const ChunkSlot& slot = layout_.slots[size_t(k)];
      const Tensor& p = tensors[size_t(k)];
      // A deferred parameter's value is made here, one parameter at a time (NOTE [Deferred parameters] in
      // nn/DeferredInit.h).
      Shape strides = contiguousStrides(p.shape());
      ShardRange part{std::max(slot.offset, own.begin), std::min(slot.offset + p.numel(), own.end)};
      if (resident || part.size() > 0) {
        Tensor value = nn::deferredValue(p);
        if (resident) ops::copy(Tensor::fromStorage(storage, p.shape(), strides, slot.offset, dtype), value);
        if (part.size() > 0 && (masters || !resident)) {
          Tensor values = value.view({p.numel()}).narrow(0, part.begin - slot.offset, part.size());
          // The master; the 16-bit values are the master rounded (they are the value).
          if (masters) ops::copy(master.narrow(0, part.begin - own.begin, part.size()), values);
          if (!resident) ops::copy(shardValues.narrow(0, part.begin - own.begin, part.size()), values);
        }
      }
      TensorImpl& impl = p.impl();
      impl.storage = storage;
      impl.strides = strides;
      impl.offset = slot.offset;
      impl.dtype = dtype;
      params_[size_t(k)] = p;
      chunkOf_[size_t(k)] = int64_t(c);
      homeGradient(size_t(k));
    }
    chunks_.push_back(std::move(storage));
    if (masters) masters_.push_back(master);
    if (!resident) parameterShards_.push_back(shardValues);
    // The moved parameters' old blocks go back to the device now: the caching allocator would otherwise hand
    // them to the next chunks whenever they are at most twice the request, and long-lived model state would
    // sit in blocks up to twice its size (9 GiB at 6.7B).
    if (caching) caching->emptyCache();
  }
}

Tensor ChunkManager::Grads::get(size_t c) {
  if (!flat[c].defined()) flat[c] = Tensor::empty({elems[c]}, dtype, device);
  return flat[c];
}

const Tensor& ChunkManager::gradients(size_t i) const {
  return grads_->flat[i];
}

void ChunkManager::releaseGradients(size_t i) {
  for (const Tensor& p : parameters(i)) p.setGrad(Tensor());
  grads_->flat[i] = Tensor();
}

Tensor ChunkManager::ensureGradients(size_t i) {
  return grads_->get(i);
}

void ChunkManager::homeGradient(size_t k) {
  // The chunk's gradient buffer is made by the first gradient of a step that reaches it and released after
  // the update (releaseGradients).
  const Tensor& p = params_[k];
  std::weak_ptr<Grads> weak = grads_;
  Shape shape = p.shape(), strides = p.strides();
  int64_t offset = layout_.slots[k].offset;
  size_t c = size_t(chunkOf_[k]);
  DType dtype = grads_->dtype;
  autograd::setGradHome(p, dtype, [weak, c, shape, strides, offset, dtype] {
    auto grads = weak.lock();
    STRATA_CHECK(grads != nullptr, "the chunk manager of this parameter is gone");
    return Tensor::fromStorage(grads->get(c).storage(), shape, strides, offset, dtype);
  });
}

void ChunkManager::setGradientDType(DType dtype) {
  STRATA_CHECK(dtype == DType::F32 || dtype == layout_.dtype,
               "ChunkManager: gradients of {} chunks accumulate in fp32 or {}, not {}", layout_.dtype,
               layout_.dtype, dtype);
  for (const Tensor& f : grads_->flat)
    STRATA_CHECK(!f.defined(), "ChunkManager: the gradient dtype changes only while no gradient exists");
  if (dtype == grads_->dtype) return;
  grads_->dtype = dtype;
  for (size_t k = 0; k < params_.size(); ++k) homeGradient(k);
}

DType ChunkManager::gradientDType() const {
  return grads_->dtype;
}

void ChunkManager::releaseGradients() {
  for (const Tensor& p : params_) p.setGrad(Tensor());
  for (auto& f : grads_->flat) f = Tensor();
}

Tensor ChunkManager::flat(size_t i) const {
  int64_t n = layout_.chunks[i].used;
  return Tensor::fromStorage(chunks_[i], {n}, {1}, 0, layout_.dtype);
}

Tensor ChunkManager::paddedFlat(size_t i) const {
  return Tensor::fromStorage(chunks_[i], {paddedElems(i)}, {1}, 0, layout_.dtype);
}

int64_t ChunkManager::padTo(int64_t used, int shards) {
  return (used + shards - 1) / shards * shards;
}

int64_t ChunkManager::paddedElems(size_t i) const {
  return padTo(layout_.chunks[i].used, chunkShards_[i]);
}

ShardRange ChunkManager::shard(size_t i, int rank) const {
  int64_t size = paddedElems(i) / chunkShards_[i];
  return ShardRange{int64_t(rank) * size, int64_t(rank + 1) * size};
}

size_t ChunkManager::bytes(size_t i) const {
  return size_t(layout_.chunks[i].used) * dtypeSize(layout_.dtype);
}

std::vector<Tensor> ChunkManager::parameters(size_t i) const {
  std::vector<Tensor> out;
  for (int64_t k : layout_.chunks[i].slots) out.push_back(params_[size_t(k)]);
  return out;
}

std::vector<Tensor> ChunkManager::takeMasters() {
  return std::move(masters_);
}

std::vector<Tensor> ChunkManager::takeParameterShards() {
  return std::move(parameterShards_);
}

void ChunkManager::evict(size_t i) {
  chunks_[i]->evict();
}

void ChunkManager::repoint(size_t i, void* data, Device device) {
  chunks_[i]->repoint(data, device);
}

// NOTE [Chunk gradients complete]. Held by the manager and reached from the parameters' hooks through a weak
// pointer, so a model that outlives its manager never calls into a dead one.
struct ChunkManager::Notices {
  std::function<void(size_t)> callback;
  std::function<void(size_t)> passCallback;
  std::vector<int64_t> expected, heard;
  std::vector<bool> announced;
  bool lastMicroBatch = false;
  uint64_t pass = 0;
  bool flushQueued = false;

  void announce(size_t chunk) {
    if (announced[chunk]) return;
    announced[chunk] = true;
    callback(chunk);
  }
  void flush() {
    for (size_t c = 0; c < announced.size(); ++c) announce(c);
    lastMicroBatch = false;
  }
  void heardFrom(size_t chunk, const std::shared_ptr<Notices>& self) {
    uint64_t now = autograd::outermostBackwardPass();
    if (now != pass) {
      // A new backward pass: counts start over.
      pass = now;
      std::fill(heard.begin(), heard.end(), 0);
      std::fill(announced.begin(), announced.end(), false);
      flushQueued = false;
    }
    ++heard[chunk];
    if (heard[chunk] == expected[chunk] && passCallback) passCallback(chunk);
    if (!lastMicroBatch) return;
    if (!flushQueued && autograd::inBackwardPass()) {
      flushQueued = true;
      // Queued again from phase 3, so it runs after the callbacks queued during the pass (the module calls'
      // completion of parameters the graph did not reach).
      std::weak_ptr<Notices> weak = self;
      autograd::queueEndOfBackwardCallback(
          [weak] {
            autograd::queueEndOfBackwardCallback([weak] {
              if (auto n = weak.lock()) n->flush();
            });
          },
          /*outermost=*/true);
    }
    if (heard[chunk] == expected[chunk]) announce(chunk);
  }
};

void ChunkManager::onGradientsComplete(std::function<void(size_t)> callback) {
  listen();
  notices_->callback = std::move(callback);
}

void ChunkManager::onPassGradientsComplete(std::function<void(size_t)> callback) {
  listen();
  notices_->passCallback = std::move(callback);
}

void ChunkManager::listen() {
  if (notices_) return;
  notices_ = std::make_shared<Notices>();
  notices_->callback = [](size_t) {};
  for (const auto& info : layout_.chunks) notices_->expected.push_back(int64_t(info.slots.size()));
  notices_->heard.assign(chunks_.size(), 0);
  notices_->announced.assign(chunks_.size(), false);
  std::weak_ptr<Notices> weak = notices_;
  for (size_t k = 0; k < params_.size(); ++k) {
    size_t chunk = size_t(chunkOf_[k]);
    params_[k].registerGradCompleteHook([weak, chunk](Tensor&) {
      if (auto n = weak.lock()) n->heardFrom(chunk, n);
    });
  }
}

void ChunkManager::beginBackward(bool lastMicroBatch) {
  if (notices_) notices_->lastMicroBatch = lastMicroBatch;
}

void ChunkManager::announceGradientsComplete() {
  STRATA_CHECK(!autograd::inBackwardPass(), "ChunkManager::announceGradientsComplete inside a backward pass");
  listen();
  notices_->flush();
}

ChunkManager::~ChunkManager() = default;

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
