#include "strata/zero/GradientReducer.h"

#include "strata/autograd/GradMode.h"
#include "strata/autograd/Node.h"
#include "strata/core/Allocator.h"
#include "strata/core/Error.h"
#include "strata/core/Stream.h"
#include "strata/distributed/Communicator.h"
#include "strata/ops/Ops.h"
#include "strata/zero/PowerSgd.h"

namespace strata::zero {

GradientReducer::GradientReducer(ChunkManager& chunks, const ChunkGroups& groups, int stage, Device device,
                                 PowerSgdOptions powerSgd)
    : chunks_(chunks), groups_(groups), stage_(stage), device_(device), powerSgdOptions_(powerSgd) {
  if (powerSgd.rank > 0) {
    STRATA_CHECK(stage <= 1, "PowerSGD reduces by all-reduce: ZeRO stage {} reduce-scatters (stage 0 or 1)",
                 stage);
    powerSgd_ = std::make_unique<PowerSgd>(powerSgd.rank, powerSgd.seed);
  }
  shardGrads_.resize(chunks_.numChunks());
  hostGrads_.resize(chunks_.numChunks());
  onHost_.assign(chunks_.numChunks(), false);
  notices_.assign(chunks_.numChunks(), 0);
  chunks_.onGradientsComplete([this](size_t chunk) { reduce(chunk); });
}

void GradientReducer::reduce(size_t chunk) {
  ++notices_[chunk];
  NoGradGuard noGrad;
  // A parameter that got no gradient in the step counts as a zero gradient: every element of the chunk is
  // then a gradient the update may read (and the ranks agree on what they reduce).
  for (const Tensor& p : chunks_.parameters(chunk)) {
    if (p.grad().defined()) continue;
    autograd::GradSink sink = autograd::claimGradBuffer(p, /*evenWithHooks=*/true);
    ops::fill(sink.buffer, 0.0);
  }
  Tensor grads = chunks_.ensureGradients(chunk);
  bool home = homed_ && homed_(chunk);
  if (!groups_.communicates(chunk)) {
    if (home) sendHome(chunk, grads);
    return;
  }
  if (powerSgd_ && steps_ >= powerSgdOptions_.startStep) {
    STRATA_CHECK(!home, "chunk {}: PowerSGD's gradients cannot leave the device (NOTE [Gradient homes])",
                 chunk);
    std::vector<Tensor> paramGrads;
    for (const Tensor& p : chunks_.parameters(chunk)) paramGrads.push_back(p.grad());
    powerSgd_->reduce(chunk, paramGrads, groups_.comm(chunk), device_);
    return;
  }
  Tensor wide = grads.dtype() == DType::F32 ? grads : ops::to(grads, device_, DType::F32);
  // NOTE [Collective ordering and completion] in distributed/Communicator.h: the comm stream waits for the
  // backward that wrote the gradients.
  const Stream& commStream = deviceStreams(device_).comm;
  streamWaits(commStream, currentStream(device_), device_);
  if (stage_ >= 2) {
    ShardRange r = groups_.shard(chunk);
    shardGrads_[chunk] = Tensor::empty({r.size()}, DType::F32, device_);
    groups_.comm(chunk).reduceScatter(shardGrads_[chunk], wide);
    chunks_.releaseGradients(chunk);
    if (home) sendHome(chunk, shardGrads_[chunk]);
  } else {
    groups_.comm(chunk).allReduce(wide);
    if (wide.data() != grads.data()) {
      // Back into the 16-bit buffer, once the sum is there.
      streamWaits(currentStream(device_), commStream, device_);
      ops::copy(grads, wide);
    }
    if (home) sendHome(chunk, grads);
  }
}

void GradientReducer::setGradientHomes(std::function<bool(size_t)> homed,
                                       std::function<void(size_t, const Tensor&)> beforeLeaving,
                                       bool pinned) {
  STRATA_CHECK(stage_ == 0 || stage_ == 3, "gradient homes need ZeRO stage 0 or 3, not {}", stage_);
  homed_ = std::move(homed);
  beforeLeaving_ = std::move(beforeLeaving);
  pinHomes_ = pinned;
}

void GradientReducer::sendHome(size_t chunk, const Tensor& grads) {
  // NOTE [Gradient homes]. On the comm stream, after the reduction (or the backward) that wrote `grads`.
  Tensor& host = hostGrads_[chunk];
  if (!host.defined() || host.numel() != grads.numel() || host.dtype() != grads.dtype()) {
    auto storage = std::make_shared<StorageImpl>(size_t(grads.numel()) * dtypeSize(grads.dtype()),
                                                 hostStateAllocator(pinHomes_));
    host = Tensor::fromStorage(std::move(storage), {grads.numel()}, {1}, 0, grads.dtype());
  }
  // A buffer the driver would not page-lock cannot take an asynchronous copy: those gradients stay.
  if (device_.isCuda() && !isPageLocked(host.data(), host.nbytes())) return;
  const Stream& commStream = deviceStreams(device_).comm;
  streamWaits(commStream, currentStream(device_), device_);
  {
    StreamGuard onComm(commStream);
    if (beforeLeaving_) beforeLeaving_(chunk, grads);
  }
  copyAsync(host.data(), Device::cpu(), grads.data(), device_, host.nbytes(), commStream);
  // Freed now, reused once the copy is done.
  grads.storage()->recordStream(commStream);
  if (stage_ >= 2 && groups_.communicates(chunk))
    shardGrads_[chunk] = Tensor();
  else
    chunks_.releaseGradients(chunk);
  onHost_[chunk] = true;
}

uint64_t GradientReducer::hostGradientBytes() const {
  uint64_t bytes = 0;
  for (const Tensor& t : hostGrads_)
    if (t.defined()) bytes += uint64_t(t.nbytes());
  return bytes;
}

std::vector<Tensor> GradientReducer::finish() {
  // NOTE [Chunk gradients complete]: every chunk heard exactly once in the step's last backward.
  for (size_t c = 0; c < notices_.size(); ++c) {
    STRATA_CHECK(notices_[c] == 1, "chunk {}: {} gradient-complete notices in one step", c, notices_[c]);
    notices_[c] = 0;
  }
  ++steps_;
  std::vector<Tensor> grads(chunks_.numChunks());
  bool anyHome = false;
  for (size_t c = 0; c < grads.size(); ++c) {
    anyHome = anyHome || onHost_[c];
    grads[c] = onHost_[c]                               ? hostGrads_[c]
               : stage_ >= 2 && groups_.communicates(c) ? shardGrads_[c]
                                                        : chunks_.gradients(c);
  }
  // The reductions ran on the comm stream: the update's reads wait for them. NOTE [Gradient homes]: the
  // CPU reads the host buffers once their copies are done.
  if (groups_.communicates() || anyHome)
    streamWaits(currentStream(device_), deviceStreams(device_).comm, device_);
  if (anyHome && device_.isCuda()) deviceStreams(device_).comm.synchronize();
  return grads;
}

GradientReducer::~GradientReducer() = default;

std::vector<Shape> GradientReducer::communicatedShapes() const {
  std::vector<Shape> shapes;
  for (size_t c = 0; c < chunks_.numChunks(); ++c)
    if (groups_.communicates(c))
      for (const Tensor& p : chunks_.parameters(c)) shapes.push_back(p.shape());
  return shapes;
}

void GradientReducer::dropPowerSgdState() {
  if (powerSgd_) powerSgd_->reset();
}

namespace {
std::vector<Shape> shapesOf(const std::vector<Tensor>& parameters) {
  std::vector<Shape> shapes;
  for (const Tensor& p : parameters) shapes.push_back(p.shape());
  return shapes;
}
}  // namespace

int64_t GradientReducer::powerSgdStateElements(size_t c) const {
  if (!powerSgd_ || !groups_.communicates(c)) return 0;
  return PowerSgd::stateElements(shapesOf(chunks_.parameters(c)), powerSgdOptions_.rank);
}

bool GradientReducer::hasPowerSgdState(size_t c) const {
  return powerSgd_ && powerSgd_->hasState(c);
}

Tensor GradientReducer::savePowerSgdState(size_t c) const {
  return powerSgd_->saveState(c);
}

void GradientReducer::loadPowerSgdState(size_t c, const Tensor& flat) {
  powerSgd_->loadState(c, shapesOf(chunks_.parameters(c)), flat, device_);
}

int64_t GradientReducer::plainElements() const {
  return PowerSgd::sentElements(communicatedShapes(), 0);
}

int64_t GradientReducer::powerSgdElements() const {
  return PowerSgd::sentElements(communicatedShapes(), powerSgdOptions_.rank);
}

int64_t GradientReducer::powerSgdStateBytes() const {
  return powerSgd_ ? PowerSgd::stateBytes(communicatedShapes(), powerSgdOptions_.rank) : 0;
}

void GradientReducer::release() {
  chunks_.releaseGradients();
  for (auto& g : shardGrads_) g = Tensor();
  onHost_.assign(onHost_.size(), false);
}

}  // namespace strata::zero
