#include "strata/optim/Adafactor.h"

#include <algorithm>
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

uint64_t adafactorStateBytes(const zero::ChunkLayout& layout, size_t chunk, zero::ShardRange range,
                             const AdafactorConfig& config) {
  uint64_t bytes = 0;
  if (config.hasFirstMoment()) bytes += uint64_t(range.size()) * (config.firstMomentBf16 ? 2 : 4);
  for (int64_t index : layout.chunks[chunk].slots) {
    const zero::ChunkSlot& slot = layout.slots[size_t(index)];
    int64_t a = std::max(slot.offset, range.begin), b = std::min(slot.offset + slot.numel, range.end);
    if (a >= b) continue;
    bytes += uint64_t(factorsOf(slot.shape, slot.offset, a, b).secondMomentElems(b - a)) * 4;
  }
  return bytes;
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
                     std::vector<Tensor> parameterShards, std::vector<zero::Tier> homes)
    : config_(config), masters_(std::move(masters)), ranges_(std::move(shards)), homes_(std::move(homes)) {
  checkConfig(config_);
  const zero::ChunkLayout& layout = chunks.layout();
  STRATA_CHECK(masters_.empty() ? chunks.dtype() == DType::F32 : masters_.size() == chunks.numChunks(),
               "Adafactor: {} chunks need {} fp32 masters, got {}", chunks.dtype(), chunks.numChunks(),
               masters_.size());
  masters_.resize(chunks.numChunks());
  if (ranges_.empty())
    for (size_t c = 0; c < chunks.numChunks(); ++c) ranges_.push_back({0, chunks.paddedElems(c)});
  STRATA_CHECK(ranges_.size() == chunks.numChunks(), "Adafactor: {} shard ranges for {} chunks",
               ranges_.size(), chunks.numChunks());
  bool sharded = !parameterShards.empty();
  homes_.resize(chunks.numChunks(), zero::Tier::Device);
  m_.resize(chunks.numChunks());
  v_.resize(chunks.numChunks());
  slotsOf_.resize(chunks.numChunks());
  for (size_t c = 0; c < chunks.numChunks(); ++c) {
    zero::ShardRange r = ranges_[c];
    Tensor paramBase = sharded ? parameterShards[c] : chunks.paddedFlat(c);
    int64_t paramOffset = sharded ? r.begin : 0;
    paramFlats_.push_back(paramBase.narrow(0, r.begin - paramOffset, r.size()));
    STRATA_USER_CHECK(homes_[c] != zero::Tier::Nvme,
                      "Adafactor's state has no SSD form: chunk {} was placed on the SSD tier; give the "
                      "host more room (store.host_budget_gb) or use AdamW",
                      c);
    // NOTE [Adafactor host chunks]: the master moves to host memory (an fp32 chunk's parameters are copied
    // there to be its master), and m and the statistics are made there.
    bool onHost = homes_[c] == zero::Tier::Host;
    bool pin = onHost && config_.pinHostState && paramBase.device().isCuda();
    auto stateTensor = [&](int64_t n, DType dt, Device dev) {
      Tensor t = onHost ? hostStateTensor(n, dt, pin) : Tensor::empty({n}, dt, dev);
      ops::fill(t, 0.0);
      return t;
    };
    if (onHost) {
      Tensor master = hostStateTensor(r.size(), DType::F32, pin);
      ops::copy(master, masters_[c].defined() ? masters_[c] : paramFlats_.back());
      masters_[c] = master;
    }
    bool own = !masters_[c].defined();
    Tensor base = own ? paramBase : masters_[c];
    int64_t baseOffset = own ? paramOffset : r.begin;
    STRATA_CHECK(own || masters_[c].numel() == r.size(),
                 "Adafactor: chunk {}'s master has {} elements, its range {}", c, masters_[c].numel(),
                 r.size());
    Device device = base.device();
    if (config_.hasFirstMoment())
      m_[c] = stateTensor(r.size(), config_.firstMomentBf16 ? DType::BF16 : DType::F32, device);
    // The second moment's flat buffer: per piece its rows then columns, or its full v.
    std::vector<Tensor> params = chunks.parameters(c);
    struct Piece {
      size_t j;
      int64_t a, b;
      PieceFactors f;
    };
    std::vector<Piece> pieces;
    int64_t secondElems = 0;
    for (size_t j = 0; j < params.size(); ++j) {
      const zero::ChunkSlot& slot = layout.slots[size_t(layout.chunks[c].slots[j])];
      int64_t a = std::max(slot.offset, r.begin), b = std::min(slot.offset + slot.numel, r.end);
      if (a >= b) continue;
      pieces.push_back({j, a, b, factorsOf(slot.shape, slot.offset, a, b)});
      secondElems += pieces.back().f.secondMomentElems(b - a);
    }
    v_[c] = stateTensor(secondElems, DType::F32, device);
    int64_t at = 0;
    for (const Piece& piece : pieces) {
      const zero::ChunkSlot& slot = layout.slots[size_t(layout.chunks[c].slots[piece.j])];
      const Tensor& p = params[piece.j];
      int64_t a = piece.a, b = piece.b;
      // A whole parameter keeps its shape (checkpoints name it); a piece of one is flat.
      bool full = a == slot.offset && b == slot.offset + slot.numel;
      Shape shape = full ? p.shape() : Shape{b - a}, strides = full ? p.strides() : Shape{1};
      Slot s;
      s.name = slot.name;
      s.param = full && !sharded ? p : viewOf(paramBase, a - paramOffset, shape, strides, p.dtype());
      s.master = own ? s.param : viewOf(base, a - baseOffset, shape, strides, DType::F32);
      if (m_[c].defined()) s.m = viewOf(m_[c], a - r.begin, shape, strides, m_[c].dtype());
      if (piece.f.factored()) {
        s.row = viewOf(v_[c], at, {piece.f.rows}, {1}, DType::F32);
        s.col = viewOf(v_[c], at + piece.f.rows, {piece.f.cols}, {1}, DType::F32);
      } else {
        s.v = viewOf(v_[c], at, {b - a}, {1}, DType::F32);
      }
      at += piece.f.secondMomentElems(b - a);
      s.weightDecay = decayFor(slot.shape, config_.weightDecay);
      s.chunk = c;
      s.begin = a;
      s.end = b;
      s.shape = shape;
      s.strides = strides;
      slotsOf_[c].push_back(slots_.size());
      slots_.push_back(std::move(s));
    }
  }
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

namespace {

// `view` (into `from`) as the same view into `to`.
Tensor rebase(const Tensor& view, const Tensor& from, const Tensor& to) {
  if (!view.defined()) return view;
  return Tensor::fromStorage(to.storage(), view.shape(), view.strides(),
                             to.offset() + (view.offset() - from.offset()), view.dtype());
}

// The first n elements of `buffer`, (re)made on `device` to hold at least n.
Tensor scratch(Tensor& buffer, int64_t n, DType dtype, Device device) {
  if (!buffer.defined() || buffer.numel() < n) buffer = Tensor::empty({n}, dtype, device);
  return buffer.narrow(0, 0, n);
}

}  // namespace

void Adafactor::stepChunks(double lr, const std::vector<Tensor>& gradients, const Tensor& gradScale) {
  NoGradGuard noGrad;
  STRATA_CHECK(!v_.empty(), "Adafactor::stepChunks needs the chunked form");
  STRATA_CHECK(gradients.size() == ranges_.size(), "Adafactor: {} gradient buffers for {} chunks",
               gradients.size(), ranges_.size());
  ++step_;
  ops::AdafactorHyper h = hyper(lr);
  // Device-resident chunks with fp32 gradients in one launch; the others (16-bit gradients, host state) one
  // chunk at a time. Each set is updated alone, so the grouping does not change a bit.
  std::vector<ops::AdafactorTensors> sets;
  std::vector<size_t> others;
  std::vector<Tensor> fp32(gradients.size());
  for (size_t c = 0; c < gradients.size(); ++c) {
    if (homes_[c] != zero::Tier::Device || gradients[c].dtype() != DType::F32) {
      others.push_back(c);
      continue;
    }
    fp32[c] = gradients[c];
  }
  if (others.size() < gradients.size()) {
    std::vector<Tensor> grads = gradientPieces(fp32);
    for (size_t i = 0; i < slots_.size(); ++i)
      if (grads[i].defined()) sets.push_back(tensorsOf(slots_[i], grads[i]));
  }
  if (!sets.empty()) {
    Device dev = sets.front().param.device();
    ops::adafactor(sets, h, gradScale.defined() ? ops::to(gradScale, dev, DType::F32) : Tensor());
  }
  for (size_t c : others) stepChunk(c, h, gradients[c], gradScale);
}

void Adafactor::stepChunk(size_t c, const ops::AdafactorHyper& h, const Tensor& gradients,
                          const Tensor& gradScale) {
  const zero::ShardRange& r = ranges_[c];
  Device device = paramFlats_[c].device();
  // The range's gradients in fp32 (a 16-bit buffer is widened here, one chunk at a time).
  Tensor g = gradients.numel() == r.size() ? gradients : gradients.narrow(0, r.begin, r.size());
  if (g.dtype() != DType::F32) g = ops::to(g, device, DType::F32);
  std::vector<Tensor> rangeGrads(ranges_.size());
  rangeGrads[c] = g;
  std::vector<Tensor> grads = gradientPieces(rangeGrads);
  bool stream = homes_[c] == zero::Tier::Host && device.isCuda();
  // NOTE [Adafactor host chunks]: the state comes to device scratch, and goes back after the kernel.
  Tensor master = masters_[c], m = m_[c], v = v_[c];
  if (stream) {
    master = scratch(scratch_[0], r.size(), DType::F32, device);
    ops::copy(master, masters_[c]);
    if (m_[c].defined()) {
      m = scratch(scratch_[1], r.size(), m_[c].dtype(), device);
      ops::copy(m, m_[c]);
    }
    v = scratch(scratch_[2], v_[c].numel(), DType::F32, device);
    ops::copy(v, v_[c]);
  }
  bool fp32Params = paramFlats_[c].dtype() == DType::F32;
  std::vector<ops::AdafactorTensors> sets;
  for (size_t i : slotsOf_[c]) {
    ops::AdafactorTensors t = tensorsOf(slots_[i], grads[i]);
    if (stream) {
      t.param = rebase(t.param, masters_[c], master);
      t.m = rebase(t.m, m_[c], m);
      t.v = rebase(t.v, v_[c], v);
      t.row = rebase(t.row, v_[c], v);
      t.col = rebase(t.col, v_[c], v);
      if (fp32Params) t.copy = Tensor();  // copied whole below (the GPU kernel writes 16-bit copies only)
    }
    sets.push_back(t);
  }
  ops::adafactor(sets, h, gradScale.defined() ? ops::to(gradScale, device, DType::F32) : Tensor());
  if (stream) {
    if (fp32Params) ops::copy(paramFlats_[c], master);
    ops::copy(masters_[c], master);
    if (m_[c].defined()) ops::copy(m_[c], m);
    ops::copy(v_[c], v);  // the copies to the host return once the data is there: nothing is left pending
  }
}

void Adafactor::moveToDevice(size_t c, Device device) {
  NoGradGuard noGrad;
  if (homes_[c] == zero::Tier::Device) return;
  bool own = paramFlats_[c].dtype() == DType::F32;
  Tensor master = own ? Tensor() : ops::to(masters_[c], device, DType::F32);
  Tensor m = m_[c].defined() ? ops::to(m_[c], device, m_[c].dtype()) : Tensor();
  Tensor v = ops::to(v_[c], device, DType::F32);
  if (own) ops::copy(paramFlats_[c], masters_[c]);  // already equal: the parameters were written from it
  for (size_t i : slotsOf_[c]) {
    Slot& s = slots_[i];
    s.master = own ? s.param : rebase(s.master, masters_[c], master);
    s.m = rebase(s.m, m_[c], m);
    s.v = rebase(s.v, v_[c], v);
    s.row = rebase(s.row, v_[c], v);
    s.col = rebase(s.col, v_[c], v);
  }
  masters_[c] = master;
  m_[c] = m;
  v_[c] = v;
  homes_[c] = zero::Tier::Device;
  // The last host chunk gone: its device scratch is not needed again.
  if (std::find(homes_.begin(), homes_.end(), zero::Tier::Host) == homes_.end())
    for (Tensor& t : scratch_) t = Tensor();
}

std::vector<ChunkStateField> Adafactor::chunkState(size_t c) const {
  std::vector<ChunkStateField> out;
  if (m_.at(c).defined()) out.push_back({"exp_avg", m_[c], true});
  out.push_back({"adafactor_v", v_.at(c), false});
  return out;
}

uint64_t Adafactor::stateBytes(size_t c) const {
  return chunkStateBytes(masters_.at(c), m_.at(c), v_.at(c));
}

uint64_t Adafactor::deviceStateBytes(size_t c) const {
  // On the device an fp32 chunk's parameters are their own master.
  bool own = paramFlats_.at(c).dtype() == DType::F32;
  uint64_t bytes = uint64_t(v_.at(c).nbytes()) + (m_.at(c).defined() ? uint64_t(m_[c].nbytes()) : 0);
  return bytes + (own ? 0 : uint64_t(ranges_.at(c).size()) * 4);
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
    if (s.master.impl().storage != s.param.impl().storage) ops::copy(s.param, s.master);
}

}  // namespace strata::optim
