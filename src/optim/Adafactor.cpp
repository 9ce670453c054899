#include "strata/optim/Adafactor.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "strata/autograd/GradMode.h"
#include "strata/ops/Ops.h"

namespace strata::optim {

namespace {

// How piece [a, b) of a parameter of `shape` starting at `offset` is factored: R rows of C columns, or
// rows 0 (a full v). Factored: rank >= 2 and whole rows of the [numel / C, C] matrix.
struct PieceFactors {
  int64_t rows = 0, cols = 0;
  bool factored() const { return rows > 0; }
  int64_t secondMomentElems(int64_t numel) const { return factored() ? rows + cols : numel; }
};

PieceFactors factorsOf(const Shape& shape, int64_t offset, int64_t a, int64_t b) {
  if (shape.size() < 2 || b <= a) return {};
  int64_t cols = shape.back();
  if (cols <= 0 || (a - offset) % cols != 0 || (b - a) % cols != 0) return {};
  return {(b - a) / cols, cols};
}

float decayFor(const Shape& parameterShape, double weightDecay) {
  return parameterShape.size() >= 2 ? float(weightDecay) : 0.0f;
}

void checkConfig(const AdafactorConfig& c) {
  STRATA_USER_CHECK(!(c.relativeStep && c.lr > 0),
                    "Adafactor: an explicit lr ({}) and the relative step exclude each other; turn the "
                    "relative step off to use the lr",
                    c.lr);
  STRATA_USER_CHECK(c.beta1 < 1, "Adafactor: beta1 must be below 1 (negative: no first moment), got {}",
                    c.beta1);
  STRATA_USER_CHECK(c.decayRate < 0,
                    "Adafactor: the decay rate must be negative (beta2_t = 1 - t^rate), got {}", c.decayRate);
  STRATA_USER_CHECK(c.eps1 > 0 && c.eps2 >= 0, "Adafactor: eps1 must be positive and eps2 not negative");
}

Tensor viewOf(const Tensor& buffer, int64_t offset, const Shape& shape, const Shape& strides, DType dt) {
  return Tensor::fromStorage(buffer.storage(), shape, strides, buffer.offset() + offset, dt);
}

}  // namespace

uint64_t adafactorStateBytes(const std::vector<Shape>& shapes, const AdafactorConfig& config) {
  uint64_t bytes = 0;
  for (const Shape& shape : shapes) {
    int64_t n = numelOf(shape);
    PieceFactors f = factorsOf(shape, 0, 0, n);
    bytes += uint64_t(f.secondMomentElems(n)) * 4;
    if (config.hasFirstMoment()) bytes += uint64_t(n) * (config.firstMomentBf16 ? 2 : 4);
  }
  return bytes;
}

namespace {
// The second moment's elements of elements `range` of chunk `chunk`, cut into pieces as the chunked form
// cuts them.
int64_t secondMomentElems(const zero::ChunkLayout& layout, size_t chunk, zero::ShardRange range) {
  int64_t elems = 0;
  for (int64_t index : layout.chunks[chunk].slots) {
    const zero::ChunkSlot& slot = layout.slots[size_t(index)];
    int64_t a = std::max(slot.offset, range.begin), b = std::min(slot.offset + slot.numel, range.end);
    if (a < b) elems += factorsOf(slot.shape, slot.offset, a, b).secondMomentElems(b - a);
  }
  return elems;
}
}  // namespace

uint64_t adafactorStateBytes(const zero::ChunkLayout& layout, size_t chunk, zero::ShardRange range,
                             const AdafactorConfig& config) {
  uint64_t bytes = 0;
  if (config.hasFirstMoment()) bytes += uint64_t(range.size()) * (config.firstMomentBf16 ? 2 : 4);
  return bytes + uint64_t(secondMomentElems(layout, chunk, range)) * 4;
}

zero::NvmeTier::ChunkFields adafactorTierFields(const zero::ChunkLayout& layout, size_t chunk,
                                                zero::ShardRange range, const AdafactorConfig& config,
                                                DType stateDType) {
  zero::NvmeTier::ChunkFields fields;
  fields.elems = {range.size(), config.hasFirstMoment() ? range.size() : 0,
                  secondMomentElems(layout, chunk, range)};
  fields.dtypes = {DType::F32, config.firstMomentBf16 ? DType::BF16 : stateDType, DType::F32};
  return fields;
}

Adafactor::Adafactor(std::vector<std::pair<std::string, Tensor>> namedParameters,
                     const AdafactorConfig& config)
    : config_(config) {
  checkConfig(config_);
  for (auto& [name, p] : namedParameters) {
    STRATA_CHECK(p.dtype() == DType::F32, "Adafactor keeps fp32 master weights; parameter '{}' is {}", name,
                 p.dtype());
    STRATA_CHECK(p.isContiguous(), "Adafactor: parameter '{}' must be contiguous", name);
    Slot s;
    s.name = name;
    s.param = s.master = p;
    s.weightDecay = decayFor(p.shape(), config_.weightDecay);
    s.end = p.numel();
    s.shape = p.shape();
    s.strides = p.strides();
    PieceFactors f = factorsOf(p.shape(), 0, 0, p.numel());
    s.rows = f.rows;
    s.cols = f.cols;
    if (f.factored()) {
      s.row = ops::zeros({f.rows}, DType::F32, p.device());
      s.col = ops::zeros({f.cols}, DType::F32, p.device());
    } else {
      s.v = ops::zeros({p.numel()}, DType::F32, p.device());
    }
    if (config_.hasFirstMoment())
      s.m = ops::zeros(p.shape(), config_.firstMomentBf16 ? DType::BF16 : DType::F32, p.device());
    slots_.push_back(std::move(s));
  }
}

Adafactor::Adafactor(const zero::ChunkManager& chunks, std::vector<Tensor> masters,
                     const AdafactorConfig& config, std::vector<zero::ShardRange> shards,
                     std::vector<Tensor> parameterShards, std::vector<zero::Tier> homes, zero::NvmeTier* nvme)
    : config_(config),
      masters_(std::move(masters)),
      ranges_(std::move(shards)),
      homes_(std::move(homes)),
      nvme_(nvme) {
  checkConfig(config_);
  const zero::ChunkLayout& layout = chunks.layout();
  size_t n = chunks.numChunks();
  STRATA_CHECK(masters_.empty() ? chunks.dtype() == DType::F32 : masters_.size() == n,
               "Adafactor: {} chunks need {} fp32 masters, got {}", chunks.dtype(), n, masters_.size());
  masters_.resize(n);
  if (ranges_.empty())
    for (size_t c = 0; c < n; ++c) ranges_.push_back({0, chunks.paddedElems(c)});
  STRATA_CHECK(ranges_.size() == n, "Adafactor: {} shard ranges for {} chunks", ranges_.size(), n);
  bool sharded = !parameterShards.empty();
  homes_.resize(n, zero::Tier::Device);
  m_.resize(n);
  v_.resize(n);
  slotsOf_.resize(n);
  secondElems_.resize(n, 0);
  DType mDType = config_.firstMomentBf16 ? DType::BF16 : DType::F32;
  bool cuda = false;
  // The pieces: each parameter piece inside the range, and where its second moment sits in the chunk's
  // flat buffer (per piece its rows then columns, or its full v).
  for (size_t c = 0; c < n; ++c) {
    zero::ShardRange r = ranges_[c];
    Tensor paramBase = sharded ? parameterShards[c] : chunks.paddedFlat(c);
    int64_t paramOffset = sharded ? r.begin : 0;
    paramFlats_.push_back(paramBase.narrow(0, r.begin - paramOffset, r.size()));
    // The compute device: parameters homed off it (NOTE [Parameter homes] in zero/ParameterGatherer.h) are
    // not there.
    device_ = chunks.storage(c)->device();
    cuda = cuda || device_.isCuda();
    std::vector<Tensor> params = chunks.parameters(c);
    for (size_t j = 0; j < params.size(); ++j) {
      const zero::ChunkSlot& slot = layout.slots[size_t(layout.chunks[c].slots[j])];
      const Tensor& p = params[j];
      int64_t a = std::max(slot.offset, r.begin), b = std::min(slot.offset + slot.numel, r.end);
      if (a >= b) continue;
      PieceFactors f = factorsOf(slot.shape, slot.offset, a, b);
      // A whole parameter keeps its shape (checkpoints name it); a piece of one is flat.
      bool full = a == slot.offset && b == slot.offset + slot.numel;
      Shape shape = full ? p.shape() : Shape{b - a}, strides = full ? p.strides() : Shape{1};
      Slot s;
      s.name = slot.name;
      s.param = full && !sharded ? p : viewOf(paramBase, a - paramOffset, shape, strides, p.dtype());
      s.weightDecay = decayFor(slot.shape, config_.weightDecay);
      s.chunk = c;
      s.begin = a;
      s.end = b;
      s.shape = shape;
      s.strides = strides;
      s.rows = f.rows;
      s.cols = f.cols;
      s.vAt = secondElems_[c];
      secondElems_[c] += f.secondMomentElems(b - a);
      slotsOf_[c].push_back(slots_.size());
      slots_.push_back(std::move(s));
    }
  }
  // NOTE [Adafactor SSD chunks]: the SSD chunks' state is written out first (one chunk's worth of host
  // memory at a time) and their masters freed before the host tier's state is made, as AdamW's are.
  for (size_t c = 0; c < n; ++c) {
    if (homes_[c] != zero::Tier::Nvme) continue;
    zero::ShardRange r = ranges_[c];
    STRATA_CHECK(nvme_ != nullptr, "Adafactor: chunk {} is placed on the SSD tier, which is missing", c);
    zero::NvmeTier::ChunkFields want = adafactorTierFields(layout, c, r, config_, nvme_->stateDType());
    bool fits = nvme_->holds(c);
    for (int f = 0; f < zero::NvmeTier::kStateFields && fits; ++f)
      fits = nvme_->fieldElems(c, zero::NvmeTier::Field(f)) == want.elems[size_t(f)] &&
             (want.elems[size_t(f)] == 0 ||
              nvme_->fieldDType(c, zero::NvmeTier::Field(f)) == want.dtypes[size_t(f)]);
    STRATA_CHECK(fits,
                 "Adafactor: chunk {}'s extent on the SSD tier is not its state's (adafactorTierFields)", c);
    const Tensor& values = masters_[c].defined() ? masters_[c] : paramFlats_[c];
    STRATA_CHECK(values.numel() == r.size(), "Adafactor: chunk {}'s master has {} elements, its range {}", c,
                 values.numel(), r.size());
    Tensor master = values.device().isCpu() && values.dtype() == DType::F32 && values.isContiguous()
                        ? values
                        : ops::to(values, Device::cpu(), DType::F32);
    Tensor zeros =
        ops::zeros({std::max<int64_t>(1, std::max(r.size(), secondElems_[c]))}, DType::F32, Device::cpu());
    StateTensors st{master, config_.hasFirstMoment() ? zeros.narrow(0, 0, r.size()) : Tensor(),
                    zeros.narrow(0, 0, secondElems_[c])};
    nvme_->wait(nvme_->writeAsync(c, SsdBuffers::fields(st)));
    masters_[c] = Tensor();
  }
  for (size_t c = 0; c < n; ++c) {
    zero::ShardRange r = ranges_[c];
    if (homes_[c] != zero::Tier::Nvme) {
      // NOTE [Adafactor host chunks]: the master moves to host memory (an fp32 chunk's parameters are
      // copied there to be its master), and m and the statistics are made there.
      bool onHost = homes_[c] == zero::Tier::Host;
      bool pin = onHost && config_.pinHostState && device_.isCuda();
      if (onHost) {
        Tensor master = hostStateTensor(r.size(), DType::F32, pin);
        ops::copy(master, masters_[c].defined() ? masters_[c] : paramFlats_[c]);
        masters_[c] = master;
      }
      STRATA_CHECK(!masters_[c].defined() || masters_[c].numel() == r.size(),
                   "Adafactor: chunk {}'s master has {} elements, its range {}", c, masters_[c].numel(),
                   r.size());
      Device device = masters_[c].defined() ? masters_[c].device() : device_;
      auto stateTensor = [&](int64_t elems, DType dt) {
        Tensor t = onHost ? hostStateTensor(elems, dt, pin) : Tensor::empty({elems}, dt, device);
        ops::fill(t, 0.0);
        return t;
      };
      if (config_.hasFirstMoment()) m_[c] = stateTensor(r.size(), mDType);
      v_[c] = stateTensor(secondElems_[c], DType::F32);
    }
    bindSlots(c);
  }
  // Page-locked where a GPU copies them to its scratch (NOTE [Adafactor host chunks]).
  ssdBuffers_ = SsdBuffers({DType::F32, mDType, DType::F32}, config_.pinHostState && cuda);
}

void Adafactor::bindSlots(size_t c) {
  const zero::ShardRange& r = ranges_[c];
  bool own = !masters_[c].defined() && homes_[c] == zero::Tier::Device;
  for (size_t i : slotsOf_[c]) {
    Slot& s = slots_[i];
    s.master = own ? s.param
               : masters_[c].defined()
                   ? viewOf(masters_[c], s.begin - r.begin, s.shape, s.strides, DType::F32)
                   : Tensor();
    s.m = m_[c].defined() ? viewOf(m_[c], s.begin - r.begin, s.shape, s.strides, m_[c].dtype()) : Tensor();
    s.v = s.row = s.col = Tensor();
    if (!v_[c].defined()) continue;  // on the SSD
    if (s.rows > 0) {
      s.row = viewOf(v_[c], s.vAt, {s.rows}, {1}, DType::F32);
      s.col = viewOf(v_[c], s.vAt + s.rows, {s.cols}, {1}, DType::F32);
    } else {
      s.v = viewOf(v_[c], s.vAt, {s.end - s.begin}, {1}, DType::F32);
    }
  }
}

std::vector<ops::AdafactorTensors> Adafactor::offDeviceSets(size_t c, const StateTensors& state,
                                                            const std::vector<Tensor>& grads,
                                                            bool copyParameters,
                                                            const Tensor& parametersOut) const {
  const zero::ShardRange& r = ranges_[c];
  std::vector<ops::AdafactorTensors> sets;
  for (size_t i : slotsOf_[c]) {
    const Slot& s = slots_[i];
    ops::AdafactorTensors t;
    t.param = viewOf(state.master, s.begin - r.begin, s.shape, s.strides, DType::F32);
    t.grad = grads[i];
    if (state.m.defined()) t.m = viewOf(state.m, s.begin - r.begin, s.shape, s.strides, state.m.dtype());
    if (s.rows > 0) {
      t.row = viewOf(state.v, s.vAt, {s.rows}, {1}, DType::F32);
      t.col = viewOf(state.v, s.vAt + s.rows, {s.cols}, {1}, DType::F32);
    } else {
      t.v = viewOf(state.v, s.vAt, {s.end - s.begin}, {1}, DType::F32);
    }
    t.weightDecay = s.weightDecay;
    // The master off the device is never the parameter: the kernel rounds it into the parameter.
    if (copyParameters)
      t.copy = parametersOut.defined()
                   ? viewOf(parametersOut, s.begin - r.begin, s.shape, s.strides, parametersOut.dtype())
                   : s.param;
    sets.push_back(t);
  }
  return sets;
}

ops::AdafactorTensors Adafactor::tensorsOf(const Slot& s, const Tensor& grad) const {
  ops::AdafactorTensors t;
  t.param = s.master;
  t.grad = grad;
  t.m = s.m;
  t.v = s.v;
  t.row = s.row;
  t.col = s.col;
  t.weightDecay = s.weightDecay;
  // A 16-bit parameter receives its new master, rounded, from the same kernel.
  if (s.master.impl().storage != s.param.impl().storage) t.copy = s.param;
  return t;
}

void Adafactor::step(double lr, const Tensor& gradScale) {
  NoGradGuard noGrad;
  ++step_;
  ops::AdafactorHyper h = hyper(lr);
  std::vector<std::vector<ops::AdafactorTensors>> byDevice;
  std::vector<Device> devices;
  for (auto& s : slots_) {
    Tensor g = s.param.grad();
    if (!g.defined()) continue;
    if (g.dtype() != DType::F32 || !g.isContiguous()) g = ops::to(ops::contiguous(g), g.device(), DType::F32);
    size_t d = 0;
    while (d < devices.size() && devices[d] != s.param.device()) ++d;
    if (d == devices.size()) {
      devices.push_back(s.param.device());
      byDevice.emplace_back();
    }
    byDevice[d].push_back(tensorsOf(s, g));
  }
  for (size_t d = 0; d < devices.size(); ++d) {
    Tensor scale = gradScale.defined() ? ops::to(gradScale, devices[d], DType::F32) : Tensor();
    ops::adafactor(byDevice[d], h, scale);
  }
}

std::vector<Tensor> Adafactor::gradientPieces(const std::vector<Tensor>& gradients) const {
  STRATA_CHECK(gradients.size() == ranges_.size(), "Adafactor: {} gradient buffers for {} chunks",
               gradients.size(), ranges_.size());
  std::vector<Tensor> pieces;
  for (const auto& s : slots_) {
    const Tensor& g = gradients[s.chunk];
    if (!g.defined()) {  // a chunk the caller updates otherwise
      pieces.emplace_back();
      continue;
    }
    const zero::ShardRange& r = ranges_[s.chunk];
    int64_t offset = g.numel() == r.size() ? s.begin - r.begin : s.begin;
    STRATA_CHECK(g.dtype() == DType::F32 && g.isContiguous() && offset + (s.end - s.begin) <= g.numel(),
                 "Adafactor: chunk {}'s gradients ({} {}) do not cover [{}, {})", s.chunk,
                 toString(g.shape()), g.dtype(), s.begin, s.end);
    pieces.push_back(viewOf(g, offset, s.shape, s.strides, DType::F32));
  }
  return pieces;
}

void Adafactor::stepChunks(double lr, const std::vector<Tensor>& gradients, const Tensor& gradScale) {
  NoGradGuard noGrad;
  STRATA_CHECK(!v_.empty(), "Adafactor::stepChunks needs the chunked form");
  STRATA_CHECK(gradients.size() == ranges_.size(), "Adafactor: {} gradient buffers for {} chunks",
               gradients.size(), ranges_.size());
  ++step_;
  ops::AdafactorHyper h = hyper(lr);
  // NOTE [Adafactor SSD chunks]: the first SSD chunk's read starts before everything else.
  std::vector<size_t> ssdOrder;
  for (size_t c = 0; c < homes_.size(); ++c)
    if (homes_[c] == zero::Tier::Nvme) ssdOrder.push_back(c);
  SsdStateStream ssd(nvme_, ssdBuffers_, ssdOrder, readAhead_);
  ssd.start();
  // Device-resident chunks with fp32 gradients in one launch; the others (16-bit gradients, host state) one
  // chunk at a time, the SSD chunks last. Each set is updated alone, so the grouping does not change a bit.
  std::vector<ops::AdafactorTensors> sets;
  std::vector<size_t> others;
  std::vector<Tensor> fp32(gradients.size());
  for (size_t c = 0; c < gradients.size(); ++c) {
    if (homes_[c] == zero::Tier::Nvme) continue;
    if (homes_[c] != zero::Tier::Device || gradients[c].dtype() != DType::F32) {
      others.push_back(c);
      continue;
    }
    fp32[c] = gradients[c];
  }
  if (others.size() + ssdOrder.size() < gradients.size()) {
    std::vector<Tensor> grads = gradientPieces(fp32);
    for (size_t i = 0; i < slots_.size(); ++i)
      if (grads[i].defined()) sets.push_back(tensorsOf(slots_[i], grads[i]));
  }
  if (!sets.empty()) {
    Device dev = sets.front().param.device();
    ops::adafactor(sets, h, gradScale.defined() ? ops::to(gradScale, dev, DType::F32) : Tensor());
  }
  auto start = std::chrono::steady_clock::now();
  for (size_t c : others) stepChunk(c, h, gradients[c], gradScale, StateTensors{masters_[c], m_[c], v_[c]});
  for (size_t k = 0; k < ssd.size(); ++k) {
    StateTensors st = ssd.acquire(k);
    stepChunk(ssd.chunk(k), h, gradients[ssd.chunk(k)], gradScale, st);
    ssd.release(k, st);
  }
  ssd.finish();
  phases_ = OffloadPhases{};
  phases_.ssdWait = ssd.waitSeconds();
  bool offDevice =
      std::count(homes_.begin(), homes_.end(), zero::Tier::Device) < std::ptrdiff_t(homes_.size());
  offDeviceSeconds_ =
      offDevice ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() : 0.0;
}

namespace {

// The first n elements of `buffer`, (re)made as `dtype` on `device` to hold at least n.
Tensor scratch(Tensor& buffer, int64_t n, DType dtype, Device device) {
  if (!buffer.defined() || buffer.numel() < n || buffer.dtype() != dtype || buffer.device() != device)
    buffer = Tensor::empty({n}, dtype, device);
  return buffer.narrow(0, 0, n);
}

}  // namespace

void Adafactor::stepChunk(size_t c, const ops::AdafactorHyper& h, const Tensor& gradients,
                          const Tensor& gradScale, const StateTensors& state) {
  const zero::ShardRange& r = ranges_[c];
  Device device = device_;
  // The range's gradients in fp32 on the compute device (a 16-bit buffer is widened here, one chunk at a
  // time; gradients homed in host memory come in with the state: NOTE [Adafactor host chunks]).
  Tensor g = gradients.numel() == r.size() ? gradients : gradients.narrow(0, r.begin, r.size());
  if (g.dtype() != DType::F32 || g.device() != device) g = ops::to(g, device, DType::F32);
  std::vector<Tensor> rangeGrads(ranges_.size());
  rangeGrads[c] = g;
  std::vector<Tensor> grads = gradientPieces(rangeGrads);
  Tensor scale = gradScale.defined() ? ops::to(gradScale, device, DType::F32) : Tensor();
  std::vector<ops::AdafactorTensors> sets;
  if (homes_[c] == zero::Tier::Device) {
    for (size_t i : slotsOf_[c]) sets.push_back(tensorsOf(slots_[i], grads[i]));
    ops::adafactor(sets, h, scale);
    return;
  }
  bool stream = device.isCuda();
  const Tensor& params = paramFlats_[c];
  bool fp32Params = params.dtype() == DType::F32;
  // NOTE [Adafactor host chunks]: parameters homed off the device (NOTE [Parameter homes] in
  // zero/ParameterGatherer.h) take their new values in their home; those homed on the SSD are rounded into
  // the host buffer parameterShards[c] views, then written into the chunk's extent.
  bool ssdParams = nvme_ != nullptr && nvme_->holdsParameters(c);
  bool homedParams = ssdParams || params.device() != device;
  // The kernel writes each parameter's elements only: the gaps between them (zeros in the chunk) are
  // zeroed first where the values do not stay in place (the SSD's staging, the device's scratch).
  Tensor out;  // where the new parameters are rounded: the parameters themselves, or the device's scratch
  if (!stream) {
    if (ssdParams) ops::fill(params, 0.0);
  } else if (homedParams && !fp32Params) {
    out = scratch(scratch_[3], r.size(), params.dtype(), device);
    ops::fill(out, 0.0);
  }
  // NOTE [Adafactor host chunks]: the state comes to device scratch, and goes back after the kernel.
  StateTensors work = state;
  if (stream) {
    work.master = scratch(scratch_[0], r.size(), DType::F32, device);
    ops::copy(work.master, state.master);
    if (state.m.defined()) {
      work.m = scratch(scratch_[1], r.size(), state.m.dtype(), device);
      ops::copy(work.m, state.m);
    }
    work.v = scratch(scratch_[2], state.v.numel(), DType::F32, device);
    ops::copy(work.v, state.v);
  }
  // The GPU kernel writes 16-bit copies only: fp32 parameters are copied whole from the master below.
  bool copyParameters = !(stream && fp32Params);
  ops::adafactor(offDeviceSets(c, work, grads, copyParameters, out), h, scale);
  if (stream) {
    // fp32 parameters are the master's values; 16-bit ones homed off the device come from the scratch.
    if (fp32Params) ops::copy(params, work.master);
    if (out.defined()) ops::copy(params, out);
    ops::copy(state.master, work.master);
    if (state.m.defined()) ops::copy(state.m, work.m);
    ops::copy(state.v,
              work.v);  // the copies to the host return once the data is there: nothing is left pending
  }
  // The staging is the next SSD chunk's too: the write ends first.
  if (ssdParams)
    nvme_->wait(nvme_->writeAsync(c, {{zero::NvmeTier::Parameters, params.data(), params.dtype()}}));
}

void Adafactor::moveToDevice(size_t c, Device device) {
  NoGradGuard noGrad;
  if (homes_[c] == zero::Tier::Device) return;
  bool ssd = homes_[c] == zero::Tier::Nvme;
  StateTensors st = ssd ? ssdBuffers_.readNow(*nvme_, c) : StateTensors{masters_[c], m_[c], v_[c]};
  // SSD state was read into the shared buffers: on a CPU "device" ops::to would hand those back, so the
  // chunk takes copies of its own.
  auto take = [&](const Tensor& t) {
    if (!t.defined()) return Tensor();
    Tensor moved = ops::to(t, device, t.dtype());
    return ssd && moved.storage() == t.storage() ? moved.clone() : moved;
  };
  bool own = paramFlats_[c].dtype() == DType::F32;
  if (own) ops::copy(paramFlats_[c], st.master);  // already equal: the parameters were written from it
  masters_[c] = own ? Tensor() : take(st.master);
  m_[c] = take(st.m);
  v_[c] = take(st.v);
  homes_[c] = zero::Tier::Device;
  bindSlots(c);
  // The last chunk off the device gone: its device scratch is not needed again.
  if (std::count(homes_.begin(), homes_.end(), zero::Tier::Device) == std::ptrdiff_t(homes_.size()))
    for (Tensor& t : scratch_) t = Tensor();
}

std::vector<ChunkStateField> Adafactor::chunkState(size_t c) const {
  std::vector<ChunkStateField> out;
  if (config_.hasFirstMoment()) out.push_back({"exp_avg", m_.at(c), true, zero::NvmeTier::FirstMoment});
  out.push_back({"adafactor_v", v_.at(c), false, zero::NvmeTier::SecondMoment});
  return out;
}

uint64_t Adafactor::stateBytes(size_t c) const {
  return chunkStateBytes(masters_.at(c), m_.at(c), v_.at(c));
}

uint64_t Adafactor::deviceStateBytes(size_t c) const {
  // On the device an fp32 chunk's parameters are their own master.
  bool own = paramFlats_.at(c).dtype() == DType::F32;
  uint64_t elems = uint64_t(ranges_.at(c).size());
  uint64_t bytes = uint64_t(secondElems_.at(c)) * 4 +
                   (config_.hasFirstMoment() ? elems * (config_.firstMomentBf16 ? 2 : 4) : 0);
  return bytes + (own ? 0 : elems * 4);
}

double Adafactor::stepSize(double lr, int64_t t) const {
  if (!config_.usesRelativeStep()) return lr;
  double least = config_.warmupInit ? 1e-6 * double(t) : 1e-2;
  return std::min(least, 1.0 / std::sqrt(double(t)));
}

ops::AdafactorHyper Adafactor::hyper(double lr) const {
  ops::AdafactorHyper h;
  h.lr = float(stepSize(lr, step_));
  h.beta1 = float(std::max(0.0, config_.beta1));
  h.beta2 = float(1.0 - std::pow(double(step_), config_.decayRate));
  h.eps1 = float(config_.eps1);
  h.eps2 = float(config_.eps2);
  h.clipThreshold = float(config_.clipThreshold);
  h.scaleParameter = config_.scaleParameter;
  return h;
}

void Adafactor::zeroGrad() {
  for (auto& s : slots_) s.param.setGrad(Tensor());
}

std::vector<std::pair<std::string, Tensor>> Adafactor::namedState() const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (!v_.empty()) {
    for (size_t c = 0; c < v_.size(); ++c) {
      if (!v_[c].defined()) continue;  // on the SSD
      if (m_[c].defined()) out.emplace_back("exp_avg." + std::to_string(c), m_[c]);
      out.emplace_back("exp_avg_sq." + std::to_string(c), v_[c]);
    }
    return out;
  }
  for (const auto& s : slots_) {
    if (s.m.defined()) out.emplace_back("m." + s.name, s.m);
    if (s.row.defined()) {
      out.emplace_back("v_row." + s.name, s.row);
      out.emplace_back("v_col." + s.name, s.col);
    } else {
      out.emplace_back("v." + s.name, s.v);
    }
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> Adafactor::namedMasters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& s : slots_) out.emplace_back(s.name, s.master);
  return out;
}

void Adafactor::writeParameters() {
  NoGradGuard noGrad;
  for (const auto& s : slots_)
    if (s.master.defined() && s.master.impl().storage != s.param.impl().storage) ops::copy(s.param, s.master);
  for (size_t c = 0; c < homes_.size(); ++c) {
    if (homes_[c] != zero::Tier::Nvme) continue;
    StateTensors st = ssdBuffers_.readNow(*nvme_, c);
    for (size_t i : slotsOf_[c]) {
      const Slot& s = slots_[i];
      ops::copy(s.param, viewOf(st.master, s.begin - ranges_[c].begin, s.shape, s.strides, DType::F32));
    }
  }
}

}  // namespace strata::optim
