#include "strata/zero/ParameterGatherer.h"

#include <algorithm>
#include <iterator>
#include <string>

#include <fmt/format.h>

#include "strata/autograd/Engine.h"
#include "strata/autograd/GradMode.h"
#include "strata/core/Allocator.h"
#include "strata/distributed/Communicator.h"
#include "strata/nn/Module.h"
#include "strata/ops/Ops.h"

namespace strata::zero {

ParameterGatherer::ParameterGatherer(ChunkManager& chunks, const ChunkGroups& groups,
                                     std::vector<Tensor> parameterShards, nn::Module& model, Device device,
                                     int64_t prefetchDepth, bool arena, std::vector<Tier> homes,
                                     bool acrossRanks, NvmeTier* nvme)
    : chunks_(chunks),
      groups_(groups),
      parameterShards_(std::move(parameterShards)),
      device_(device),
      prefetchDepth_(prefetchDepth),
      homes_(std::move(homes)),
      acrossRanks_(acrossRanks),
      nvme_(nvme) {
  size_t n = chunks_.numChunks();
  homes_.resize(n, Tier::Device);
  STRATA_CHECK(parameterShards_.size() == n, "ParameterGatherer: {} parameter homes for {} chunks",
               parameterShards_.size(), n);
  stagingOf_.assign(n, -1);
  for (size_t i = 0; i < n; ++i) {
    if (homes_[i] != Tier::Nvme) continue;
    int64_t own = acrossRanks_ ? groups_.shard(i).size() : chunks_.paddedElems(i);
    STRATA_CHECK(nvme_ != nullptr && nvme_->holdsParameters(i) &&
                     nvme_->fieldElems(i, NvmeTier::Parameters) == own &&
                     nvme_->fieldDType(i, NvmeTier::Parameters) == chunks_.dtype(),
                 "ParameterGatherer: chunk {}'s parameters are homed on the SSD, whose tier {} them ({} "
                 "elements of {})",
                 i, nvme_ ? "does not hold" : "is missing for", own, chunks_.dtype());
  }
  for (size_t i = 0; i < n; ++i) managed_.push_back(acrossRanks_ || homes_[i] != Tier::Device);
  slots_.resize(n);
  for (size_t i = 0; i < n; ++i) gathered_.push_back(std::make_unique<Event>(device_));
  prefetched_.assign(n, false);
  explainResidency();
  for (size_t i = 0; i < n; ++i)
    if (managed_[i]) chunks_.evict(i);
  if (auto* caching = dynamic_cast<CachingAllocator*>(&deviceAllocator(device_))) caching->emptyCache();
  arenaSlot_.assign(n, -1);
  if (arena) {
    // NOTE [Chunk arena] in zero/ChunkArena.h: one reservation per slot class (the chunks of the layout's
    // size, and the oversized ones), each of slots the size of its largest chunk; over the gathered chunks.
    std::vector<int64_t> used, padded;
    std::vector<size_t> gatheredChunks;
    for (size_t i = 0; i < n; ++i) {
      if (!managed_[i]) continue;
      gatheredChunks.push_back(i);
      used.push_back(chunks_.layout().chunks[i].used);
      padded.push_back(chunks_.paddedElems(i));
    }
    ChunkArenaPlan plan = planChunkArena(used, padded, chunks_.layout().chunkElems, prefetchDepth_);
    for (size_t k = 0; k < plan.slots.size(); ++k) {
      arenas_.push_back(std::make_unique<ChunkArena>(
          deviceAllocator(device_), size_t(plan.slotElems[k]) * dtypeSize(chunks_.dtype()), plan.slots[k]));
      arenas_.back()->recordStream(deviceStreams(device_).gather);
    }
    arenaClass_.assign(n, -1);
    for (size_t k = 0; k < gatheredChunks.size(); ++k) arenaClass_[gatheredChunks[k]] = plan.classOf[k];
  }
  hookModules(model);
}

ParameterGatherer::~ParameterGatherer() {
  // The tier's I/O thread may still be reading into a staging buffer.
  if (nvme_ != nullptr) nvme_->drain();
  for (Staging& s : staging_)
    if (s.copying) s.copied->synchronize();
}

std::vector<const ChunkArena*> ParameterGatherer::arenas() const {
  std::vector<const ChunkArena*> out;
  for (const auto& a : arenas_) out.push_back(a.get());
  return out;
}

void ParameterGatherer::explainResidency() {
  // A touch of a released chunk (the usual cause: a module reading a child's parameter outside the child's
  // call) names the parameter touched, from its bytes, and the two ways to read it.
  size_t esz = dtypeSize(chunks_.dtype());
  for (size_t c = 0; c < chunks_.numChunks(); ++c) {
    if (!managed_[c]) continue;
    struct Held {
      size_t begin, end;
      std::string name;
    };
    std::vector<Held> held;
    for (int64_t k : chunks_.layout().chunks[c].slots) {
      const ChunkSlot& slot = chunks_.layout().slots[size_t(k)];
      held.push_back({size_t(slot.offset) * esz, size_t(slot.offset + slot.numel) * esz, slot.name});
    }
    const Storage& storage = chunks_.paddedFlat(c).storage();
    std::string chunk = storage->label();
    size_t bytes = storage->bytes();
    storage->setNotResidentMessage([held, chunk, bytes](size_t begin, size_t end) {
      for (const Held& p : held) {
        if (begin < p.begin || end > p.end) continue;
        size_t dot = p.name.rfind('.');
        std::string module =
            dot == std::string::npos ? std::string("the model") : fmt::format("'{}'", p.name.substr(0, dot));
        return fmt::format(
            "parameter '{}' (in {}, {} bytes) is not resident: a parameter is resident under ZeRO-3 only "
            "during its module's own call. Go through the child's forward (a call of {}: forward() or an "
            "entry point such as Linear::apply), or declare the use by running the code that reads it as a "
            "call of that module: module.call(inputs, body), or nn::fusedCall(modules, inputs, body) for "
            "several (NOTE [Module calls] in strata/nn/Module.h)",
            p.name, chunk, bytes, module);
      }
      return fmt::format(
          "storage '{}' ({} bytes, parameters {} .. {}) is not resident: under ZeRO-3 a chunk is gathered "
          "only during the calls of the modules whose parameters it holds (NOTE [Parameter gathering] in "
          "strata/zero/ParameterGatherer.h)",
          chunk, bytes, held.empty() ? "none" : held.front().name, held.empty() ? "none" : held.back().name);
    });
  }
}

void ParameterGatherer::hookModules(nn::Module& model) {
  std::map<const TensorImpl*, size_t> chunkOf;
  for (size_t c = 0; c < chunks_.numChunks(); ++c)
    for (const Tensor& p : chunks_.parameters(c)) chunkOf[&p.impl()] = c;
  for (auto& [name, module] : model.namedModules()) {
    std::vector<size_t> own;
    for (const auto& [n, p] : module->namedParameters(/*recurse=*/false)) {
      size_t c = chunkOf.at(&p.impl());
      if (managed_[c] && std::find(own.begin(), own.end(), c) == own.end()) own.push_back(c);
    }
    if (own.empty()) {
      module->addForwardPreHook([this](nn::Module& m, const std::vector<Tensor>&) { active_.push_back(&m); });
    } else {
      module->addForwardPreHook([this, own](nn::Module& m, const std::vector<Tensor>&) {
        // In backward, recomputation must not release.
        if (!autograd::inBackwardPass()) releaseUnneeded(own);
        for (size_t c : own) gather(c);
        active_.push_back(&m);
      });
      module->addBackwardPreHook([this, own](nn::Module&) {
        for (size_t c : own) gather(c);
      });
    }
    moduleChunks_[module] = own;
    module->addForwardHook([this](nn::Module& m, const std::vector<Tensor>&, const std::vector<Tensor>&) {
      auto it = std::find(active_.rbegin(), active_.rend(), &m);
      if (it != active_.rend()) active_.erase(std::next(it).base());
    });
  }
  chunks_.onPassGradientsComplete([this](size_t chunk) { release(chunk); });
}

void ParameterGatherer::releaseUnneeded(const std::vector<size_t>& own) {
  std::vector<bool> keep(slots_.size(), false);
  for (size_t c : own) keep[c] = true;
  for (nn::Module* a : active_)
    for (size_t c : moduleChunks_[a]) keep[c] = true;
  for (size_t c = 0; c < slots_.size(); ++c)
    if (!keep[c]) release(c);
}

void ParameterGatherer::gather(size_t chunk) {
  // This chunk's gather first: the prefetches queue behind it on the gather stream.
  if (!slots_[chunk].defined()) startGather(chunk);
  prefetched_[chunk] = false;
  if (recording_)
    order_.push_back(chunk);
  else if (!order_.empty())
    prefetchAfter(chunk);
  // Use-time wait: compute waits for this chunk's gather only now.
  gathered_[chunk]->block(currentStream(device_));
}

void ParameterGatherer::prefetchAfter(size_t chunk) {
  // Where the recorded order has reached: the next use of this chunk from the cursor on (else from the
  // start: a pass that went otherwise, such as an evaluation).
  size_t n = order_.size();
  size_t at = n;
  for (size_t k = 0; k < n && at == n; ++k)
    if (order_[(cursor_ + k) % n] == chunk) at = (cursor_ + k) % n;
  if (at == n) return;
  if (at != cursor_ % n) {
    // The pass left the recorded order (an evaluation: forwards without backward), so what was prefetched
    // for the order's next steps is not coming: unmarked, the releases may take it, instead of it holding
    // memory (an arena slot) until the next backward ends.
    for (size_t c = 0; c < prefetched_.size(); ++c)
      if (c != chunk) prefetched_[c] = false;
  }
  cursor_ = at + 1;
  // The next prefetch_depth chunks in the order go ahead on the gather stream.
  for (size_t k = 0; k < size_t(prefetchDepth_) && cursor_ + k < n; ++k) {
    size_t next = order_[cursor_ + k];
    if (!slots_[next].defined()) {
      startGather(next);
      prefetched_[next] = true;
    }
  }
  // NOTE [Parameter homes]: the SSD chunks among the prefetch_depth chunks after those are read ahead.
  for (size_t k = size_t(prefetchDepth_); k < 2 * size_t(prefetchDepth_) && cursor_ + k < n; ++k) {
    size_t next = order_[cursor_ + k];
    if (homes_[next] == Tier::Nvme && !slots_[next].defined() && stagingOf_[next] < 0) {
      readAhead(next);
      ++ssdReadsAhead_;
    }
  }
}

size_t ParameterGatherer::freeStaging() {
  for (size_t k = 0; k < staging_.size(); ++k)
    if (staging_[k].chunk < 0 && !staging_[k].copying) return k;
  // Else a buffer a copy may still be reading: wait for that copy to end.
  for (size_t k = 0; k < staging_.size(); ++k)
    if (staging_[k].chunk < 0) {
      staging_[k].copied->synchronize();
      staging_[k].copying = false;
      return k;
    }
  // Every buffer holds a read not yet copied: one more (page-locked where a GPU copies from it), of the
  // largest SSD chunk's parameters.
  int64_t largest = 0;
  for (size_t c = 0; c < homes_.size(); ++c)
    if (homes_[c] == Tier::Nvme) largest = std::max(largest, nvme_->fieldElems(c, NvmeTier::Parameters));
  size_t bytes = size_t(largest) * dtypeSize(chunks_.dtype());
  auto storage = std::make_shared<StorageImpl>(bytes, hostStateAllocator(device_.isCuda()));
  Staging added;
  added.buffer = Tensor::fromStorage(std::move(storage), {largest}, {1}, 0, chunks_.dtype());
  added.copied = std::make_unique<Event>(device_);
  staging_.push_back(std::move(added));
  return staging_.size() - 1;
}

void ParameterGatherer::readAhead(size_t chunk) {
  size_t k = freeStaging();
  Staging& s = staging_[k];
  s.chunk = int64_t(chunk);
  s.ticket = nvme_->readAsync(chunk, {{NvmeTier::Parameters, s.buffer.data(), chunks_.dtype()}});
  stagingOf_[chunk] = int64_t(k);
  ++ssdReads_;
}

void ParameterGatherer::dropReadsAhead() {
  for (Staging& s : staging_) {
    if (s.chunk < 0) continue;
    stagingOf_[size_t(s.chunk)] = -1;
    s.chunk = -1;
    nvme_->wait(s.ticket);  // a failed read is thrown here, naming the file
  }
}

void ParameterGatherer::startGather(size_t chunk) {
  NoGradGuard noGrad;
  if (homes_[chunk] == Tier::Nvme) {
    // NOTE [Parameter homes]: the chunk's read (issued ahead, or now) ends before anything is taken for it;
    // a failed one is thrown here, naming the file.
    if (stagingOf_[chunk] < 0) readAhead(chunk);
    nvme_->wait(staging_[size_t(stagingOf_[chunk])].ticket);
  }
  // Allocated on the compute stream (or an arena slot), written on the gather stream once compute has
  // reached this point (the block may hold a chunk that compute read just before).
  Tensor slot;
  if (!arenas_.empty()) {
    ChunkArena& arena = *arenas_[size_t(arenaClass_[chunk])];
    arenaSlot_[chunk] = arena.acquire();
    slot = arena.view(arenaSlot_[chunk], chunks_.paddedElems(chunk), chunks_.dtype());
  } else {
    slot = Tensor::empty({chunks_.paddedElems(chunk)}, chunks_.dtype(), device_);
  }
  peakGathered_ = std::max(peakGathered_, ++gatheredNow_);
  const Stream& gatherStream = deviceStreams(device_).gather;
  streamWaits(gatherStream, currentStream(device_), device_);
  const Tensor& home = parameterShards_[chunk];
  bool overRanks = acrossRanks_ && groups_.communicates(chunk);
  if (homes_[chunk] == Tier::Nvme) {
    // The copy from the staging buffer (read above) into this rank's place in the slot; over several ranks,
    // the slot's all-gather in place.
    Staging& s = staging_[size_t(stagingOf_[chunk])];
    stagingOf_[chunk] = -1;
    s.chunk = -1;
    int64_t elems = nvme_->fieldElems(chunk, NvmeTier::Parameters);
    int64_t at = acrossRanks_ ? groups_.shard(chunk).begin : 0;
    Tensor own = slot.narrow(0, at, elems);
    size_t bytes = size_t(elems) * dtypeSize(chunks_.dtype());
    if (device_.isCpu() || isPageLocked(s.buffer.data(), bytes)) {
      copyAsync(own.data(), device_, s.buffer.data(), Device::cpu(), bytes, gatherStream);
    } else {
      StreamGuard onGather(gatherStream);
      copyBytes(own.data(), device_, s.buffer.data(), Device::cpu(), bytes);  // pageable: waits for the copy
    }
    s.copied->record(gatherStream);
    s.copying = true;
    if (overRanks) groups_.comm(chunk).allGather(slot, own);
    slot.storage()->recordStream(gatherStream);
  } else if (homes_[chunk] != Tier::Device) {
    // NOTE [Parameter homes]: the home (this rank's shard at stage 3) into its place in the slot, on the
    // gather stream; then, over several ranks, the slot's all-gather in place.
    int64_t at = acrossRanks_ ? groups_.shard(chunk).begin : 0;
    Tensor own = slot.narrow(0, at, home.numel());
    size_t bytes = size_t(home.nbytes());
    if (device_.isCpu() || isPageLocked(home.data(), bytes)) {
      copyAsync(own.data(), device_, home.data(), home.device(), bytes, gatherStream);
    } else {
      StreamGuard onGather(gatherStream);
      copyBytes(own.data(), device_, home.data(), home.device(), bytes);  // pageable: waits for the copy
    }
    if (overRanks) groups_.comm(chunk).allGather(slot, own);
    slot.storage()->recordStream(gatherStream);
  } else if (overRanks) {
    groups_.comm(chunk).allGather(slot, home);
  } else {
    StreamGuard onGather(gatherStream);
    ops::copy(slot, parameterShards_[chunk]);
    slot.storage()->recordStream(gatherStream);
  }
  gathered_[chunk]->record(gatherStream);
  chunks_.repoint(chunk, slot.data(), device_);
  slots_[chunk] = slot;
}

void ParameterGatherer::release(size_t chunk) {
  if (!slots_[chunk].defined() || prefetched_[chunk]) return;
  chunks_.evict(chunk);
  slots_[chunk] = Tensor();
  --gatheredNow_;
  if (!arenas_.empty()) {
    arenas_[size_t(arenaClass_[chunk])]->release(arenaSlot_[chunk]);
    arenaSlot_[chunk] = -1;
  }
}

void ParameterGatherer::releaseAll(bool prefetchedToo) {
  for (size_t c = 0; c < slots_.size(); ++c) {
    if (prefetchedToo) prefetched_[c] = false;
    release(c);
  }
  active_.clear();
}

void ParameterGatherer::homesWritable() {
  for (size_t c = 0; c < slots_.size(); ++c)
    if (homes_[c] != Tier::Device) gathered_[c]->synchronize();
  dropReadsAhead();
}

void ParameterGatherer::forwardDone() {
  releaseAll(/*prefetchedToo=*/false);
}

void ParameterGatherer::backwardDone() {
  releaseAll(/*prefetchedToo=*/true);
  // The first micro-batch's forward and backward recorded the order the later ones prefetch in.
  recording_ = false;
  cursor_ = 0;
}

}  // namespace strata::zero
