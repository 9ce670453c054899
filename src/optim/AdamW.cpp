#include "strata/optim/AdamW.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <exception>
#include <future>

#include "strata/autograd/GradMode.h"
#include "strata/core/Profiler.h"
#include "strata/core/Storage.h"
#include "strata/core/Stream.h"
#include "strata/ops/Ops.h"

namespace strata::optim {

namespace {
double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

float decayFor(const Tensor& p, double weightDecay) {
  return p.dim() >= 2 ? float(weightDecay) : 0.0f;
}

void checkMomentsDType(const AdamWConfig& config) {
  STRATA_CHECK(config.momentsDType == DType::F32 || config.momentsDType == DType::BF16,
               "AdamW keeps m and v in fp32 or bf16 (optimizer.moments_dtype), not {}", config.momentsDType);
}
}  // namespace

AdamW::AdamW(std::vector<std::pair<std::string, Tensor>> namedParameters, const AdamWConfig& config)
    : config_(config) {
  checkMomentsDType(config_);
  for (auto& [name, p] : namedParameters) {
    STRATA_CHECK(p.dtype() == DType::F32, "AdamW keeps fp32 master weights; parameter '{}' is {}", name,
                 p.dtype());
    STRATA_CHECK(p.isContiguous(), "AdamW: parameter '{}' must be contiguous", name);
    slots_.push_back(Slot{name, p, p, ops::zeros(p.shape(), config.momentsDType, p.device()),
                          ops::zeros(p.shape(), config.momentsDType, p.device()),
                          decayFor(p, config.weightDecay), 0, 0, p.numel(), p.shape(), p.strides()});
  }
}

AdamW::AdamW(const zero::ChunkManager& chunks, std::vector<Tensor> masters, const AdamWConfig& config,
             std::vector<zero::ShardRange> shards, std::vector<Tensor> parameterShards,
             std::vector<zero::Tier> homes, zero::NvmeTier* nvme)
    : config_(config),
      masters_(std::move(masters)),
      ranges_(std::move(shards)),
      homes_(std::move(homes)),
      nvme_(nvme),
      ssdBuffers_({DType::F32, config.momentsDType, config.momentsDType}) {
  checkMomentsDType(config_);
  const DType momentsDType = config_.momentsDType;
  const zero::ChunkLayout& layout = chunks.layout();
  STRATA_CHECK(masters_.empty() ? chunks.dtype() == DType::F32 : masters_.size() == chunks.numChunks(),
               "AdamW: {} chunks need {} fp32 masters, got {}", chunks.dtype(), chunks.numChunks(),
               masters_.size());
  masters_.resize(chunks.numChunks());
  homes_.resize(chunks.numChunks(), zero::Tier::Device);
  bool whole = ranges_.empty();
  if (whole)
    for (size_t c = 0; c < chunks.numChunks(); ++c) ranges_.push_back({0, chunks.paddedElems(c)});
  STRATA_CHECK(ranges_.size() == chunks.numChunks(), "AdamW: {} shard ranges for {} chunks", ranges_.size(),
               chunks.numChunks());
  slotsOf_.resize(chunks.numChunks());
  m_.resize(chunks.numChunks());
  v_.resize(chunks.numChunks());
  bool sharded = !parameterShards.empty();
  // Where each range's parameter values live: the chunk, or the parameter shard that replaces it.
  for (size_t c = 0; c < chunks.numChunks(); ++c) {
    zero::ShardRange r = ranges_[c];
    Tensor paramBase = sharded ? parameterShards[c] : chunks.paddedFlat(c);
    paramFlats_.push_back(paramBase.narrow(0, r.begin - (sharded ? r.begin : 0), r.size()));
  }
  // The SSD chunks first: their state is written out (one chunk's worth of host memory at a time) and their
  // masters, which a large model makes in host memory (layOutModelChunks' hostMasterBytes), freed before the
  // host tier's state is allocated. In chunk order the host chunks come first, and the SSD chunks' masters
  // would then sit in host memory beside the whole host tier.
  for (size_t c = 0; c < chunks.numChunks(); ++c) {
    if (homes_[c] != zero::Tier::Nvme) continue;
    STRATA_CHECK(nvme_ != nullptr, "AdamW: chunk {} is placed on the SSD tier, which is missing", c);
    // NOTE [AdamW moments dtype]: bf16 moments move to and from the SSD as they are.
    for (auto f : {zero::NvmeTier::FirstMoment, zero::NvmeTier::SecondMoment})
      STRATA_CHECK(momentsDType == DType::F32 || nvme_->fieldDType(c, f) == momentsDType,
                   "AdamW: chunk {}'s moments are {} but the SSD tier stores them as {}", c, momentsDType,
                   nvme_->fieldDType(c, f));
    zero::ShardRange r = ranges_[c];
    const Tensor& values = masters_[c].defined() ? masters_[c] : paramFlats_[c];
    STRATA_CHECK(values.numel() == r.size(), "AdamW: chunk {}'s master has {} elements, its range {}", c,
                 values.numel(), r.size());
    Tensor master = values.device().isCpu() && values.dtype() == DType::F32 && values.isContiguous()
                        ? values
                        : ops::to(values, Device::cpu(), DType::F32);
    Tensor zeros = ops::zeros({r.size()}, DType::F32, Device::cpu());
    nvme_->wait(nvme_->writeAsync(c, {{zero::NvmeTier::Master, master.data<float>()},
                                      {zero::NvmeTier::FirstMoment, zeros.data<float>()},
                                      {zero::NvmeTier::SecondMoment, zeros.data<float>()}}));
    masters_[c] = Tensor();
  }
  for (size_t c = 0; c < chunks.numChunks(); ++c) {
    zero::ShardRange r = ranges_[c];
    Tensor paramBase = sharded ? parameterShards[c] : chunks.paddedFlat(c);
    int64_t paramOffset = sharded ? r.begin : 0;
    zero::Tier home = homes_[c];
    if (home == zero::Tier::Host) {
      // State in host memory (NOTE [Store placement] in zero/Store.h): the master moves to the host, or an
      // fp32 chunk's parameters are copied there to be its master. It comes from the host state allocator
      // (NOTE [Host state memory] in core/Allocator.h): page-locked where a GPU may stream it.
      bool pin = config_.pinHostState && chunks.storage(c)->device().isCuda();
      Tensor master = hostStateTensor(r.size(), DType::F32, pin);
      ops::copy(master, masters_[c].defined() ? masters_[c] : paramFlats_[c]);
      masters_[c] = master;
      m_[c] = hostStateTensor(r.size(), momentsDType, pin);
      v_[c] = hostStateTensor(r.size(), momentsDType, pin);
      ops::fill(m_[c], 0.0);
      ops::fill(v_[c], 0.0);
    }
    bool own = !masters_[c].defined() && home == zero::Tier::Device;
    // The range's fp32 values: the masters (sized to the range), or the fp32 parameters themselves.
    Tensor base = own ? paramBase : masters_[c];
    int64_t baseOffset = own ? paramOffset : r.begin;
    STRATA_CHECK(own || !masters_[c].defined() || masters_[c].numel() == r.size(),
                 "AdamW: chunk {}'s master has {} elements, its range {}", c, masters_[c].numel(), r.size());
    if (home == zero::Tier::Device) {
      m_[c] = ops::zeros({r.size()}, momentsDType, base.device());
      v_[c] = ops::zeros({r.size()}, momentsDType, base.device());
    }
    std::vector<Tensor> params = chunks.parameters(c);
    for (size_t j = 0; j < params.size(); ++j) {
      const zero::ChunkSlot& slot = layout.slots[size_t(layout.chunks[c].slots[j])];
      const Tensor& p = params[j];
      int64_t a = std::max(slot.offset, r.begin), b = std::min(slot.offset + slot.numel, r.end);
      if (a >= b) continue;
      // A whole parameter keeps its shape (checkpoints name it); a piece of one is flat.
      bool full = a == slot.offset && b == slot.offset + slot.numel;
      Shape shape = full ? p.shape() : Shape{b - a}, strides = full ? p.strides() : Shape{1};
      auto view = [&](const Tensor& buffer, int64_t offset, DType dt) {
        return buffer.defined()
                   ? Tensor::fromStorage(buffer.storage(), shape, strides, buffer.offset() + offset, dt)
                   : Tensor();
      };
      Tensor piece = full && !sharded ? p : view(paramBase, a - paramOffset, p.dtype());
      slotsOf_[c].push_back(slots_.size());
      slots_.push_back(Slot{slot.name, piece, own ? piece : view(base, a - baseOffset, DType::F32),
                            view(m_[c], a - r.begin, momentsDType), view(v_[c], a - r.begin, momentsDType),
                            decayFor(p, config.weightDecay), c, a, b, shape, strides});
    }
  }
}

// NOTE [Pipelined update] in AdamW.h: what the two lanes keep between steps.
struct AdamW::Lanes {
  // The CPU lane's staging slots (AdamWConfig::stagingSlots, zero_optimization.buffer_count): enough that
  // its parameters' copies to the device, which queue behind the GPU lane's larger ones on the link, rarely
  // hold it up; at least two (the next piece's gradients are requested before this one is updated).
  struct Slot {
    Tensor master, m, v;    // GPU lane: device scratch for a piece's state (m, v in momentsDType)
    Storage grads, params;  // CPU lane: pinned staging for a piece's gradients and new parameters
    Event arrived, done;    // CPU lane: gradients on the host, parameters sent; GPU lane: state in, back
  };
  Device device;
  DeviceStreams gpu;  // the GPU lane's own streams (h2d, compute, d2h)
  std::vector<std::unique_ptr<Slot>> cpu, gpuSlots;
  int64_t pieceElems;
  DType momentsDType;
  bool pinned = false;  // the CPU lane's staging is page-locked
  Lanes(Device d, int64_t elems, int slots, DType moments)
      : device(d), gpu(DeviceStreams::create(d)), pieceElems(elems), momentsDType(moments) {
    for (int i = 0; i < std::max(2, slots); ++i) {
      auto slot = std::make_unique<Slot>(Slot{{}, {}, {}, {}, {}, Event(d), Event(d)});
      for (Storage* st : {&slot->grads, &slot->params})
        *st = std::make_shared<StorageImpl>(size_t(pieceElems) * 4, hostStateAllocator(true));
      pinned = (i == 0 || pinned) && isPageLocked(slot->grads->data(), slot->grads->bytes()) &&
               isPageLocked(slot->params->data(), slot->params->bytes());
      cpu.push_back(std::move(slot));
    }
  }
  Slot& gpuSlot(size_t i) {
    while (gpuSlots.size() <= i) {
      StreamGuard onLane(gpu.compute);
      auto slot = std::make_unique<Slot>(Slot{Tensor::empty({pieceElems}, DType::F32, device),
                                              Tensor::empty({pieceElems}, momentsDType, device),
                                              Tensor::empty({pieceElems}, momentsDType, device),
                                              {},
                                              {},
                                              Event(device),
                                              Event(device)});
      for (Tensor* t : {&slot->master, &slot->m, &slot->v}) {
        t->storage()->recordStream(gpu.h2d);
        t->storage()->recordStream(gpu.d2h);
      }
      gpuSlots.push_back(std::move(slot));
    }
    return *gpuSlots[i];
  }
};

// NOTE [Delayed SSD update] in AdamW.h: the update running behind the next step.
struct AdamW::Delayed {
  std::future<void> job;
  std::vector<size_t> chunks;         // the SSD chunks the running update updates, in order
  std::vector<Tensor> grads, params;  // per chunk over its range: step t's gradients, the new parameters
  std::vector<bool> pending;          // per chunk: params[c] is still to be written into the chunk
};

AdamW::~AdamW() {
  // The worker uses this optimizer's buffers and SSD tier: it ends before they go.
  if (delayed_ && delayed_->job.valid()) delayed_->job.wait();
}

void AdamW::waitDelayed() {
  if (delayed_ && delayed_->job.valid()) delayed_->job.get();  // rethrows the worker's error
}

void AdamW::finishDelayed() {
  if (!delayed_) return;
  NoGradGuard noGrad;
  waitDelayed();
  for (size_t c = 0; c < delayed_->pending.size(); ++c)
    if (delayed_->pending[c]) {
      ops::copy(paramFlats_[c], delayed_->params[c]);
      delayed_->pending[c] = false;
    }
}

Tensor AdamW::pendingParameters(size_t c) {
  waitDelayed();
  return delayed_ && c < delayed_->pending.size() && delayed_->pending[c] ? delayed_->params[c] : Tensor();
}

bool AdamW::deferParameters(size_t c, const Tensor& values) {
  STRATA_CHECK(c < paramFlats_.size() && values.numel() == paramFlats_[c].numel() &&
                   values.dtype() == paramFlats_[c].dtype(),
               "AdamW::deferParameters: chunk {}'s pending parameters need {} {} values, got {} {}", c,
               c < paramFlats_.size() ? paramFlats_[c].numel() : 0,
               c < paramFlats_.size() ? paramFlats_[c].dtype() : values.dtype(), values.numel(),
               values.dtype());
  waitDelayed();
  if (!delayed_) delayed_ = std::make_unique<Delayed>();
  Delayed& d = *delayed_;
  d.grads.resize(homes_.size());
  d.params.resize(homes_.size());
  d.pending.resize(homes_.size(), false);
  d.params[c] = ops::to(values, Device::cpu(), values.dtype()).clone();
  d.grads[c] = Tensor();  // startDelayed makes the buffers again
  d.pending[c] = true;
  return true;
}

void AdamW::startDelayed(const ops::AdamWHyper& h, const std::vector<Tensor>& gradients,
                         const Tensor& hostScale) {
  if (!delayed_) delayed_ = std::make_unique<Delayed>();
  Delayed& d = *delayed_;
  d.chunks.clear();
  d.grads.resize(homes_.size());
  d.params.resize(homes_.size());
  d.pending.resize(homes_.size(), false);
  for (size_t c = 0; c < homes_.size(); ++c) {
    if (homes_[c] != zero::Tier::Nvme) continue;
    const zero::ShardRange& r = ranges_[c];
    const Tensor& g = gradients[c];
    if (!d.grads[c].defined() || d.grads[c].dtype() != g.dtype()) {
      d.grads[c] = Tensor::empty({r.size()}, g.dtype(), Device::cpu());  // 16-bit buffers stay 16-bit
      d.params[c] = Tensor::empty({r.size()}, paramFlats_[c].dtype(), Device::cpu());
    }
    ops::copy(d.grads[c], g.numel() == r.size() ? g : g.narrow(0, r.begin, r.size()));
    d.chunks.push_back(c);
    d.pending[c] = true;  // read only after the worker is waited for
  }
  Tensor scale = hostScale.defined() ? hostScale.clone() : Tensor();
  d.job = std::async(std::launch::async, [this, h, scale] {
    NoGradGuard noGrad;
    Delayed& d = *delayed_;
    // Two buffer sets: chunk k + 1 is read while chunk k is updated (NOTE [SSD tier]).
    SsdStateStream ssd(nvme_, ssdBuffers_, d.chunks, readAhead_);
    ssd.start();
    for (size_t k = 0; k < ssd.size(); ++k) {
      size_t c = ssd.chunk(k);
      const zero::ShardRange& r = ranges_[c];
      HostState st = ssd.acquire(k);
      Piece whole{c, r.begin, r.end};
      zeroPieceGaps(whole, d.params[c]);
      ops::adamw(pieceSets(whole, st, false, d.grads[c], true, d.params[c]), h, scale);
      ssd.release(k, st);
    }
    ssd.finish();
  });
}

void AdamW::step(double lr, const Tensor& gradScale) {
  NoGradGuard noGrad;
  ++step_;
  ops::AdamWHyper h = hyper(lr);
  // One fused call per device.
  std::vector<std::vector<ops::AdamWTensors>> byDevice;
  std::vector<Device> devices;
  for (auto& s : slots_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    if (!g.isContiguous()) g = ops::contiguous(g);
    if (g.dtype() != DType::F32 && g.dtype() != DType::BF16 && g.dtype() != DType::F16)
      g = ops::to(g, g.device(), DType::F32);
    size_t d = 0;
    while (d < devices.size() && devices[d] != s.param.device()) ++d;
    if (d == devices.size()) {
      devices.push_back(s.param.device());
      byDevice.emplace_back();
    }
    // A 16-bit parameter receives its new master, rounded, from the same kernel.
    Tensor copy = s.master.impl().storage == s.param.impl().storage ? Tensor() : s.param;
    byDevice[d].push_back(ops::AdamWTensors{s.master, g, s.m, s.v, s.weightDecay, copy});
  }
  for (size_t d = 0; d < devices.size(); ++d) {
    Tensor scale = gradScale.defined() ? ops::to(gradScale, devices[d], DType::F32) : Tensor();
    ops::adamw(byDevice[d], h, scale);
  }
}

std::vector<Tensor> AdamW::gradientPieces(const std::vector<Tensor>& gradients) const {
  STRATA_CHECK(gradients.size() == ranges_.size(), "AdamW: {} gradient buffers for {} chunks",
               gradients.size(), ranges_.size());
  std::vector<Tensor> pieces;
  for (const auto& s : slots_) {
    const Tensor& g = gradients[s.chunk];
    const zero::ShardRange& r = ranges_[s.chunk];
    int64_t offset = g.numel() == r.size() ? s.begin - r.begin : s.begin;
    // fp32, or 16-bit buffers (precision.grad_accum_dtype), which the kernels widen as they read them.
    bool dtypeOk = g.dtype() == DType::F32 || g.dtype() == DType::BF16 || g.dtype() == DType::F16;
    STRATA_CHECK(dtypeOk && g.isContiguous() && offset + (s.end - s.begin) <= g.numel(),
                 "AdamW: chunk {}'s gradients ({} {}) do not cover [{}, {})", s.chunk, toString(g.shape()),
                 g.dtype(), s.begin, s.end);
    pieces.push_back(Tensor::fromStorage(g.storage(), s.shape, s.strides, g.offset() + offset, g.dtype()));
  }
  return pieces;
}

void AdamW::stepChunks(double lr, const std::vector<Tensor>& gradients, const Tensor& gradScale) {
  NoGradGuard noGrad;
  STRATA_CHECK(!m_.empty(), "AdamW::stepChunks needs the chunked form");
  // One profile bucket for the whole update: its ops are not synchronised one by one (the lanes overlap).
  profiler::Hold hold;
  finishDelayed();  // the last step's SSD update, when delayed (NOTE [Delayed SSD update])
  ++step_;
  ops::AdamWHyper h = hyper(lr);
  std::vector<Tensor> grads = gradientPieces(gradients);
  bool delaySsd = delaysSsd();
  // NOTE [SSD tier] in zero/NvmeTier.h: the SSD chunks' state is read ahead in use order, into two buffer
  // sets that take turns, and written back behind the update. The first read starts before the device's
  // update; any transfer left in flight by an error ends before the buffers can go.
  std::vector<size_t> ssdOrder;
  for (size_t c = 0; c < homes_.size(); ++c)
    if (homes_[c] == zero::Tier::Nvme && !delaySsd) ssdOrder.push_back(c);
  SsdStateStream ssd(nvme_, ssdBuffers_, ssdOrder, readAhead_);
  ssd.start();
  std::vector<ops::AdamWTensors> deviceSets;
  bool anyOffDevice = false;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (homes_[s.chunk] != zero::Tier::Device) {
      anyOffDevice = true;
      continue;
    }
    Tensor copy = s.master.impl().storage == s.param.impl().storage ? Tensor() : s.param;
    deviceSets.push_back(ops::AdamWTensors{s.master, grads[i], s.m, s.v, s.weightDecay, copy});
  }
  if (!deviceSets.empty()) {
    Device dev = deviceSets.front().param.device();
    ops::adamw(deviceSets, h, gradScale.defined() ? ops::to(gradScale, dev, DType::F32) : Tensor());
  }
  offDeviceSeconds_ = 0;
  phases_ = OffloadPhases{};
  if (!anyOffDevice) return;
  auto start = std::chrono::steady_clock::now();
  Tensor hostScale = gradScale.defined() ? ops::to(gradScale, Device::cpu(), DType::F32) : Tensor();
  // The k-th SSD chunk's state, once read (the next read goes behind the write of the chunk that last used
  // its set: issue order, NOTE [SSD tier]); and its write behind.
  auto ssdAcquire = [&](size_t k) { return ssd.acquire(k); };
  auto ssdRelease = [&](size_t k, const HostState& st) { ssd.release(k, st); };
  if (!config_.pipeline ||
      !stepOffDevicePipelined(h, gradients, gradScale, hostScale, ssdAcquire, ssdRelease)) {
    size_t k = 0;  // the SSD chunks updated so far
    for (size_t c = 0; c < homes_.size(); ++c) {
      if (homes_[c] == zero::Tier::Host) stepHostChunk(c, h, gradients, hostScale, hostState(c));
      if (homes_[c] != zero::Tier::Nvme || delaySsd) continue;
      HostState st = ssdAcquire(k);
      stepHostChunk(c, h, gradients, hostScale, st);
      ssdRelease(k++, st);
    }
  }
  ssd.finish();
  phases_.ssdWait += ssd.waitSeconds();
  if (delaySsd) startDelayed(h, gradients, hostScale);
  offDeviceSeconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<ops::AdamWTensors> AdamW::pieceSets(const Piece& p, const HostState& st, bool statePiece,
                                                const Tensor& grads, bool gradsPiece,
                                                const Tensor& copy) const {
  const zero::ShardRange& r = ranges_[p.chunk];
  int64_t stateOrigin = statePiece ? p.begin : r.begin;
  int64_t gradOrigin = gradsPiece ? p.begin : grads.numel() == r.size() ? r.begin : 0;
  std::vector<ops::AdamWTensors> sets;
  for (size_t i : slotsOf_[p.chunk]) {
    const Slot& s = slots_[i];
    int64_t a = std::max(s.begin, p.begin), b = std::min(s.end, p.end);
    if (a >= b) continue;
    auto at = [&](const Tensor& t, int64_t origin) { return t.narrow(0, a - origin, b - a); };
    sets.push_back(ops::AdamWTensors{at(st.master, stateOrigin), at(grads, gradOrigin), at(st.m, stateOrigin),
                                     at(st.v, stateOrigin), s.weightDecay,
                                     copy.defined() ? at(copy, p.begin) : Tensor()});
  }
  return sets;
}

void AdamW::zeroPieceGaps(const Piece& p, const Tensor& params) const {
  std::vector<std::pair<int64_t, int64_t>> covered;
  for (size_t i : slotsOf_[p.chunk]) {
    int64_t a = std::max(slots_[i].begin, p.begin), b = std::min(slots_[i].end, p.end);
    if (a < b) covered.emplace_back(a, b);
  }
  std::sort(covered.begin(), covered.end());
  int64_t from = p.begin;
  for (auto [a, b] : covered) {
    if (a > from) ops::fill(params.narrow(0, from - p.begin, a - from), 0.0);
    from = std::max(from, b);
  }
  if (from < p.end) ops::fill(params.narrow(0, from - p.begin, p.end - from), 0.0);
}

bool AdamW::stepOffDevicePipelined(const ops::AdamWHyper& h, const std::vector<Tensor>& gradients,
                                   const Tensor& gradScale, const Tensor& hostScale,
                                   const std::function<HostState(size_t)>& ssdAcquire,
                                   const std::function<void(size_t, const HostState&)>& ssdRelease) {
  // Parameters homed on the SSD are written into their extents chunk by chunk: the plain update does that.
  for (size_t c = 0; c < homes_.size(); ++c)
    if (nvme_ != nullptr && nvme_->holdsParameters(c)) return false;
  // The pieces: the SSD chunks' first (only the CPU lane takes them), then the host chunks'.
  std::vector<Piece> pieces;
  size_t hostBegin = 0;
  Device device = Device::cpu();
  for (zero::Tier tier : {zero::Tier::Nvme, zero::Tier::Host}) {
    if (tier == zero::Tier::Host) hostBegin = pieces.size();
    if (tier == zero::Tier::Nvme && delaysSsd()) continue;  // the delayed update takes them
    for (size_t c = 0; c < homes_.size(); ++c) {
      if (homes_[c] != tier) continue;
      // The step's device: where the gradients or the parameters are (a chunk's parameters may be homed in
      // host memory, NOTE [Parameter homes] in zero/ParameterGatherer.h, and its gradients too, NOTE
      // [Gradient homes] in zero/GradientReducer.h).
      for (Device d : {gradients[c].device(), paramFlats_[c].device()})
        if (!d.isCpu()) device = d;
      STRATA_CHECK(ranges_[c].size() > 0, "AdamW: chunk {} has an empty range", c);
      for (int64_t a = ranges_[c].begin; a < ranges_[c].end; a += config_.pieceElems)
        pieces.push_back(Piece{c, a, std::min(a + config_.pieceElems, ranges_[c].end)});
    }
  }
  bool cuda = device.isCuda();
  if (cuda && !lanes_) {
    lanes_ = std::make_unique<Lanes>(device, config_.pieceElems, config_.stagingSlots, config_.momentsDType);
    hostPinned_ = true;
    for (size_t c = 0; c < homes_.size(); ++c)
      if (homes_[c] == zero::Tier::Host)
        for (const Tensor* t : {&masters_[c], &m_[c], &v_[c]})
          hostPinned_ = hostPinned_ && isPageLocked(t->data(), t->nbytes());
  }
  // No page-locked staging (the driver refused it): the caller runs the plain update, which stages through
  // its own pool.
  if (cuda && !lanes_->pinned) return false;
  // The GPU lane reads the gradients and writes the new parameters on the device: not for parameters or
  // gradients homed in host memory.
  bool hostHomes = false;
  for (size_t c = 0; c < homes_.size(); ++c)
    hostHomes = hostHomes || (homes_[c] != zero::Tier::Device &&
                              (paramFlats_[c].device().isCpu() || gradients[c].device().isCpu()));
  bool gpuLane = cuda && hostPinned_ && !hostHomes;
  Stream compute = cuda ? currentStream(device) : Stream();
  const DeviceStreams* copies = cuda ? &deviceStreams(device) : nullptr;
  if (cuda) {
    // The gradients (and the clipping coefficient) were written on the compute stream.
    streamWaits(copies->d2h, compute, device);
    for (const Stream* s : {&lanes_->gpu.h2d, &lanes_->gpu.compute}) streamWaits(*s, compute, device);
  }
  auto since = [](std::chrono::steady_clock::time_point t) { return secondsSince(t); };
  // ---- GPU lane
  std::deque<std::pair<size_t, size_t>> inflight;  // (slot, piece)
  std::vector<size_t> freeSlots;
  for (size_t i = 0; i < size_t(kGpuLaneDepth); ++i) freeSlots.push_back(size_t(kGpuLaneDepth) - 1 - i);
  int64_t gpuElems = 0, allElems = 0;
  for (const Piece& p : pieces) allElems += p.end - p.begin;
  size_t lo = 0, hi = pieces.size();  // the CPU lane takes pieces[lo], the GPU lane pieces[hi - 1]
  auto gpuIssue = [&](size_t slotIndex, const Piece& p) {
    Lanes::Slot& slot = lanes_->gpuSlot(slotIndex);
    size_t c = p.chunk;
    int64_t n = p.end - p.begin, at = p.begin - ranges_[c].begin;
    const DeviceStreams& lane = lanes_->gpu;
    // The slot's scratch is free once its last state went back.
    slot.done.block(lane.h2d);
    // Each field at its own width (NOTE [AdamW moments dtype]).
    for (auto [dst, src] : {std::pair{&slot.master, &masters_[c]}, {&slot.m, &m_[c]}, {&slot.v, &v_[c]}}) {
      size_t width = dtypeSize(src->dtype());
      copyAsync(dst->data(), device, static_cast<const char*>(src->data()) + size_t(at) * width,
                Device::cpu(), size_t(n) * width, lane.h2d);
    }
    slot.arrived.record(lane.h2d);
    slot.arrived.block(lane.compute);
    {
      StreamGuard onLane(lane.compute);
      HostState scratch{slot.master.narrow(0, 0, n), slot.m.narrow(0, 0, n), slot.v.narrow(0, 0, n)};
      Tensor params = paramFlats_[c].narrow(0, at, n);
      ops::adamw(pieceSets(p, scratch, true, gradients[c], false, params), h, gradScale);
    }
    streamWaits(lane.d2h, lane.compute, device);
    for (auto [dst, src] : {std::pair{&masters_[c], &slot.master}, {&m_[c], &slot.m}, {&v_[c], &slot.v}}) {
      size_t width = dtypeSize(dst->dtype());
      copyAsync(static_cast<char*>(dst->data()) + size_t(at) * width, Device::cpu(), src->data(), device,
                size_t(n) * width, lane.d2h);
    }
    slot.done.record(lane.d2h);
    gpuElems += n;
  };
  auto gpuPump = [&] {
    if (!gpuLane) return;
    while (!inflight.empty() && lanes_->gpuSlot(inflight.front().first).done.query()) {
      freeSlots.push_back(inflight.front().first);
      inflight.pop_front();
    }
    while (!freeSlots.empty() && hi > std::max(lo, hostBegin)) {
      size_t slot = freeSlots.back();
      freeSlots.pop_back();
      gpuIssue(slot, pieces[--hi]);
      inflight.emplace_back(slot, hi);
    }
  };
  // ---- CPU lane
  auto claim = [&]() -> std::ptrdiff_t {
    gpuPump();
    return lo < hi ? std::ptrdiff_t(lo++) : -1;
  };
  // Piece p's gradients into CPU slot `slot`'s staging, on the d2h stream.
  auto fetch = [&](size_t slotIndex, const Piece& p) {
    const Tensor& g = gradients[p.chunk];
    if (!cuda || g.device().isCpu()) return;  // gradients homed in host memory are read where they are
    Lanes::Slot& slot = *lanes_->cpu[slotIndex];
    int64_t origin = g.numel() == ranges_[p.chunk].size() ? ranges_[p.chunk].begin : 0;
    size_t width = dtypeSize(g.dtype());  // 16-bit buffers cross the link at half the bytes
    copyAsync(slot.grads->data(), Device::cpu(),
              static_cast<const char*>(g.data()) + size_t(p.begin - origin) * width, device,
              size_t(p.end - p.begin) * width, copies->d2h);
    slot.arrived.record(copies->d2h);
  };
  size_t ssdK = 0;
  size_t ssdChunk = SIZE_MAX;
  HostState ssdState;
  size_t slotIndex = 0;
  std::ptrdiff_t next = claim();
  if (next >= 0) fetch(slotIndex, pieces[size_t(next)]);
  while (next >= 0) {
    size_t pi = size_t(next);
    const Piece& p = pieces[pi];
    size_t c = p.chunk;
    int64_t n = p.end - p.begin;
    HostState st{masters_[c], m_[c], v_[c]};
    if (pi < hostBegin) {
      if (c != ssdChunk) {
        ssdState = ssdAcquire(ssdK);
        ssdChunk = c;
      }
      st = ssdState;
    }
    next = claim();
    size_t nextSlot = cuda ? (slotIndex + 1) % lanes_->cpu.size() : 0;
    if (next >= 0) fetch(nextSlot, pieces[size_t(next)]);
    if (cuda) {
      Lanes::Slot& slot = *lanes_->cpu[slotIndex];
      const Tensor& g = gradients[c];
      bool hostGrads = g.device().isCpu();
      auto t = std::chrono::steady_clock::now();
      if (!hostGrads) slot.arrived.synchronize();
      phases_.gradientsOut += since(t);
      t = std::chrono::steady_clock::now();
      slot.done.synchronize();  // the staging's last parameters have left
      phases_.parametersIn += since(t);
      t = std::chrono::steady_clock::now();
      DType dt = paramFlats_[c].dtype();
      int64_t origin = g.numel() == ranges_[c].size() ? ranges_[c].begin : 0;
      Tensor grads = hostGrads ? g.narrow(0, p.begin - origin, n)
                               : Tensor::fromStorage(slot.grads, {n}, {1}, 0, g.dtype());
      if (paramFlats_[c].device().isCpu()) {
        // Parameters homed in host memory take their new values there, in place.
        Tensor params = paramFlats_[c].narrow(0, p.begin - ranges_[c].begin, n);
        zeroPieceGaps(p, params);
        ops::adamw(pieceSets(p, st, false, grads, true, params), h, hostScale);
        phases_.cpuUpdate += since(t);
      } else {
        Tensor params = Tensor::fromStorage(slot.params, {n}, {1}, 0, dt);
        zeroPieceGaps(p, params);
        ops::adamw(pieceSets(p, st, false, grads, true, params), h, hostScale);
        phases_.cpuUpdate += since(t);
        size_t bytes = size_t(n) * dtypeSize(dt);
        copyAsync(
            static_cast<char*>(paramFlats_[c].data()) + size_t(p.begin - ranges_[c].begin) * dtypeSize(dt),
            device, params.data(), Device::cpu(), bytes, copies->h2d);
      }
      slot.done.record(copies->h2d);
    } else {
      auto t = std::chrono::steady_clock::now();
      Tensor params = paramFlats_[c].narrow(0, p.begin - ranges_[c].begin, n);
      ops::adamw(pieceSets(p, st, false, gradients[c], false, params), h, hostScale);
      phases_.cpuUpdate += since(t);
    }
    if (pi < hostBegin && (pi + 1 == hostBegin || pieces[pi + 1].chunk != c)) ssdRelease(ssdK++, ssdState);
    slotIndex = nextSlot;
    gpuPump();
  }
  // The CPU lane is out of pieces: the GPU lane's last ones.
  auto t = std::chrono::steady_clock::now();
  for (auto [slot, piece] : inflight) lanes_->gpuSlot(slot).done.synchronize();
  phases_.gpuLaneWait += since(t);
  phases_.gpuLaneShare = allElems > 0 ? double(gpuElems) / double(allElems) : 0.0;
  if (cuda) {
    // The next step's kernels see the parameters of both lanes.
    streamWaits(compute, copies->h2d, device);
    streamWaits(compute, lanes_->gpu.compute, device);
  }
  return true;
}

void AdamW::moveToDevice(size_t c, Device device) {
  NoGradGuard noGrad;
  // NOTE [Delayed SSD update]: the state is final once the worker is done; the chunk's parameters take their
  // pending values now, as the device's own update would have written them. The other chunks' stay pending.
  waitDelayed();
  if (delayed_ && c < delayed_->pending.size() && delayed_->pending[c]) {
    ops::copy(paramFlats_[c], delayed_->params[c]);
    delayed_->pending[c] = false;
  }
  if (homes_[c] == zero::Tier::Device) return;
  HostState st = hostState(c);
  const zero::ShardRange& r = ranges_[c];
  bool own = paramFlats_[c].dtype() == DType::F32;
  if (own) ops::copy(paramFlats_[c], st.master);  // already equal: the parameters were written from it
  // SSD state was read into the shared work buffers: on a CPU "device" ops::to would hand those back, so the
  // chunk takes copies of its own.
  auto take = [&](const Tensor& t) {
    Tensor moved = ops::to(t, device, t.dtype());  // m and v keep their dtype (NOTE [AdamW moments dtype])
    return homes_[c] == zero::Tier::Nvme && moved.storage() == t.storage() ? moved.clone() : moved;
  };
  masters_[c] = own ? Tensor() : take(st.master);
  m_[c] = take(st.m);
  v_[c] = take(st.v);
  homes_[c] = zero::Tier::Device;
  for (size_t i : slotsOf_[c]) {
    Slot& s = slots_[i];
    auto at = [&](const Tensor& flat) {
      return Tensor::fromStorage(flat.storage(), s.shape, s.strides, flat.offset() + (s.begin - r.begin),
                                 flat.dtype());
    };
    s.master = own ? s.param : at(masters_[c]);
    s.m = at(m_[c]);
    s.v = at(v_[c]);
  }
}

AdamW::HostState AdamW::hostState(size_t c) {
  if (homes_[c] == zero::Tier::Host) return HostState{masters_[c], m_[c], v_[c]};
  // SSD, outside a step (nothing in flight): read into the first buffer set.
  return ssdBuffers_.readNow(*nvme_, c);
}

void AdamW::stepHostChunk(size_t c, const ops::AdamWHyper& h, const std::vector<Tensor>& gradients,
                          const Tensor& hostScale, const HostState& st) {
  // A plain CPU update: the range's gradients come to the host, the CPU kernel updates the master and
  // moments in place (host memory, or an SSD buffer set that the caller reads and writes back) and rounds
  // the new values into a host copy of the range's parameters, which goes back to the device in one copy.
  // (The pipelined optimizer overlaps this with backward and with the device's update: optim's next step.)
  const zero::ShardRange& r = ranges_[c];
  const Tensor& g = gradients[c];
  Tensor range = g.numel() == r.size() ? g : g.narrow(0, r.begin, r.size());
  const Tensor& params = paramFlats_[c];
  if (!staging_) {
    // One range's gradients and parameters at a time: the largest off-device chunk's, plus alignment slack.
    size_t need = 0;
    for (size_t k = 0; k < homes_.size(); ++k)
      if (homes_[k] != zero::Tier::Device)
        need = std::max(need, size_t(ranges_[k].size()) * (4 + dtypeSize(params.dtype())));
    staging_ = std::make_unique<PinnedHostPool>(need + (4u << 20));
  }
  auto start = std::chrono::steady_clock::now();
  // Gradients homed in host memory (NOTE [Gradient homes] in zero/GradientReducer.h) are read in place.
  Tensor hostGrads = range;
  if (!range.device().isCpu()) {
    hostGrads = staged({r.size()}, g.dtype());
    ops::copy(hostGrads, range);
  }
  phases_.gradientsOut += secondsSince(start);
  start = std::chrono::steady_clock::now();
  // The kernel writes every parameter's elements; only the gaps between them need their zeros (the chunk
  // holds zeros there). Zeroing the whole range first would be one more pass over it.
  Tensor hostParams = staged({r.size()}, params.dtype());
  int64_t zeroFrom = 0;  // the end of the last slot
  bool ordered = true;   // the slots come in chunk order (else: zero the whole range)
  for (size_t i : slotsOf_[c]) {
    int64_t begin = slots_[i].begin - r.begin;
    ordered = ordered && begin >= zeroFrom;
    if (!ordered) break;
    if (begin > zeroFrom) ops::fill(hostParams.narrow(0, zeroFrom, begin - zeroFrom), 0.0);
    zeroFrom = slots_[i].end - r.begin;
  }
  if (!ordered) zeroFrom = 0;
  if (zeroFrom < r.size()) ops::fill(hostParams.narrow(0, zeroFrom, r.size() - zeroFrom), 0.0);
  std::vector<ops::AdamWTensors> sets;
  for (size_t i : slotsOf_[c]) {
    const Slot& s = slots_[i];
    auto at = [&](const Tensor& flat) {
      return Tensor::fromStorage(flat.storage(), s.shape, s.strides, flat.offset() + (s.begin - r.begin),
                                 flat.dtype());
    };
    sets.push_back(
        ops::AdamWTensors{at(st.master), at(hostGrads), at(st.m), at(st.v), s.weightDecay, at(hostParams)});
  }
  if (!sets.empty()) ops::adamw(sets, h, hostScale);
  phases_.cpuUpdate += secondsSince(start);
  start = std::chrono::steady_clock::now();
  if (nvme_ != nullptr && nvme_->holdsParameters(c)) {
    // NOTE [Parameter homes] in zero/ParameterGatherer.h: parameters homed on the SSD go into their extent
    // (the staging is the next chunk's: the write ends first).
    nvme_->wait(nvme_->writeAsync(c, {{zero::NvmeTier::Parameters, hostParams.data(), hostParams.dtype()}}));
  } else {
    ops::copy(params, hostParams);
  }
  phases_.parametersIn += secondsSince(start);
}

Tensor AdamW::staged(const Shape& shape, DType dtype) {
  auto storage = std::make_shared<StorageImpl>(size_t(numelOf(shape)) * dtypeSize(dtype), *staging_);
  return Tensor::fromStorage(std::move(storage), shape, contiguousStrides(shape), 0, dtype);
}

ops::AdamWHyper AdamW::hyper(double lr) const {
  ops::AdamWHyper h;
  h.lr = float(lr);
  h.beta1 = float(config_.beta1);
  h.beta2 = float(config_.beta2);
  h.eps = float(config_.eps);
  h.biasCorrection1 = float(1.0 - std::pow(config_.beta1, double(step_)));
  h.biasCorrection2 = float(1.0 - std::pow(config_.beta2, double(step_)));
  return h;
}

void AdamW::zeroGrad() {
  for (auto& s : slots_) s.param.setGrad(Tensor());
}

std::vector<std::pair<std::string, Tensor>> AdamW::namedState() const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (!m_.empty()) {
    for (size_t c = 0; c < m_.size(); ++c) {
      out.emplace_back("exp_avg." + std::to_string(c), m_[c]);
      out.emplace_back("exp_avg_sq." + std::to_string(c), v_[c]);
    }
    return out;
  }
  for (const auto& s : slots_) {
    out.emplace_back("m." + s.name, s.m);
    out.emplace_back("v." + s.name, s.v);
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> AdamW::namedMasters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& s : slots_) out.emplace_back(s.name, s.master);
  return out;
}

Tensor hostStateTensor(int64_t numel, DType dtype, bool pinned) {
  auto storage = std::make_shared<StorageImpl>(size_t(numel) * dtypeSize(dtype), hostStateAllocator(pinned));
  return Tensor::fromStorage(std::move(storage), {numel}, {1}, 0, dtype);
}

std::vector<ChunkStateField> AdamW::chunkState(size_t c) const {
  // Undefined values on the SSD.
  return {{"exp_avg", m_.at(c), true, zero::NvmeTier::FirstMoment},
          {"exp_avg_sq", v_.at(c), true, zero::NvmeTier::SecondMoment}};
}

uint64_t chunkStateBytes(const Tensor& master, const Tensor& m, const Tensor& v) {
  uint64_t bytes = 0;
  for (const Tensor* t : {&master, &m, &v})
    if (t->defined()) bytes += uint64_t(t->nbytes());
  return bytes;
}

uint64_t AdamW::stateBytes(size_t c) const {
  return chunkStateBytes(masters_.at(c), m_.at(c), v_.at(c));
}

uint64_t AdamW::deviceStateBytes(size_t c) const {
  // On the device an fp32 chunk's parameters are their own master; m and v in their dtype.
  bool own = paramFlats_.at(c).dtype() == DType::F32;
  return uint64_t(ranges_.at(c).size()) * ((own ? 0 : 4) + 2 * dtypeSize(config_.momentsDType));
}

void AdamW::writeParameters() {
  NoGradGuard noGrad;
  finishDelayed();
  for (size_t c = 0; c < slotsOf_.size(); ++c) {
    HostState st;
    if (homes_[c] == zero::Tier::Nvme) st = hostState(c);
    for (size_t i : slotsOf_[c]) {
      const Slot& s = slots_[i];
      Tensor master = s.master.defined() ? s.master
                                         : Tensor::fromStorage(
                                               st.master.storage(), s.shape, s.strides,
                                               st.master.offset() + (s.begin - ranges_[c].begin), DType::F32);
      if (master.impl().storage != s.param.impl().storage) ops::copy(s.param, master);
    }
  }
}

Tensor gradNorm(const std::vector<Tensor>& parameters, Device device) {
  NoGradGuard noGrad;
  Tensor total = ops::zeros({}, DType::F32, device);
  // fp32 contiguous gradients on `device` (the usual case) go through one multi-tensor launch.
  std::vector<Tensor> fused;
  for (const auto& p : parameters) {
    Tensor g = p.grad();
    if (g.defined() && g.dtype() == DType::F32 && g.isContiguous() && g.device() == device)
      fused.push_back(g);
  }
  if (!fused.empty()) total = ops::sumOfSquares(fused);
  for (const auto& p : parameters) {
    Tensor g = p.grad();
    if (!g.defined() || (g.dtype() == DType::F32 && g.isContiguous() && g.device() == device)) continue;
    Tensor g32 = g.dtype() == DType::F32 ? g : ops::to(g, g.device(), DType::F32);
    Tensor sq = ops::sum(ops::mul(g32, g32));
    total = ops::add(total, ops::to(sq, device, DType::F32));
  }
  return ops::sqrt(total);
}

Tensor clipCoefficient(const Tensor& norm, double maxNorm) {
  Tensor denom = ops::affine(norm, 1.0, 1e-6);
  Tensor coef = ops::div(ops::full({}, maxNorm, DType::F32, norm.device()), denom);
  // min(1, coef) = -max(-1, -coef)
  return ops::neg(ops::maximum(ops::neg(coef), ops::full({}, -1.0, DType::F32, norm.device())));
}

}  // namespace strata::optim
