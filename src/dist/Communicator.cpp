#include "strata/dist/Communicator.h"

#include <cstring>

#include "dist/CollectiveCall.h"
#include "dist/MpiCommunicator.h"
#include "dist/NcclCommunicator.h"
#include "strata/core/Error.h"
#include "strata/core/Stream.h"

namespace strata::dist {

// Unique pointers to the backends need their complete types where they are destroyed: here.
Communicator::Communicator(GroupInfo info, std::unique_ptr<MpiCommunicator> mpi,
                           std::unique_ptr<NcclCommunicator> nccl)
    : info_(std::move(info)), mpi_(std::move(mpi)), nccl_(std::move(nccl)) {
  STRATA_CHECK(info_.size >= 1 && info_.rank >= 0 && info_.rank < info_.size, "group '{}': rank {} of {}",
               info_.name, info_.rank, info_.size);
  STRATA_CHECK(info_.timeoutSeconds > 0, "group '{}': timeout {} s must be positive", info_.name,
               info_.timeoutSeconds);
}

Communicator::~Communicator() = default;

bool Communicator::failed() const {
  return !failure().empty();
}

std::string Communicator::failure() const {
  {
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) return failure_;
  }
#if STRATA_NCCL
  if (nccl_) return nccl_->failure();
#endif
  return {};
}

namespace {

bool overlaps(const Tensor& a, const Tensor& b) {
  auto* a0 = static_cast<const char*>(a.data());
  auto* b0 = static_cast<const char*>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

Device Communicator::checkTensors(const char* op, const Tensor& out, const Tensor& in) const {
  std::string earlier = failure();
  STRATA_USER_CHECK(earlier.empty(),
                    "dist: {} on rank {} of group '{}' refused: an earlier collective failed: {}", op,
                    info_.rank, info_.name, earlier);
  STRATA_CHECK(out.defined() && in.defined(), "dist: {}: undefined tensor", op);
  STRATA_CHECK(out.isContiguous() && in.isContiguous(), "dist: {}: tensors must be contiguous", op);
  STRATA_CHECK(out.dtype() == in.dtype(), "dist: {}: out is {}, in is {}", op, out.dtype(), in.dtype());
  STRATA_CHECK(out.device() == in.device(), "dist: {}: out is on {}, in on {}", op, out.device(),
               in.device());
  Device device = out.device();
  if (info_.size > 1) {
    if (device.isCpu()) {
      STRATA_CHECK(mpi_ != nullptr, "dist: {} of a CPU tensor in group '{}' ({} ranks) needs MPI{}", op,
                   info_.name, info_.size, STRATA_MPI ? "" : ", and this build has none (STRATA_MPI=OFF)");
    } else {
#if STRATA_NCCL
      STRATA_CHECK(nccl_ != nullptr,
                   "dist: {} of a CUDA tensor in group '{}': the group has no NCCL communicator (make the "
                   "ParallelContext with deviceType CUDA)",
                   op, info_.name);
      STRATA_CHECK(device.index == nccl_->deviceIndex(),
                   "dist: {}: tensor on {}, group '{}' communicates on cuda:{}", op, device, info_.name,
                   nccl_->deviceIndex());
#else
      STRATA_FAIL("dist: {} of a CUDA tensor in group '{}' needs NCCL, and this build has none", op,
                  info_.name);
#endif
    }
  }
  return device;
}

template <class Body>
void Communicator::guarded(const Tensor& out, const Tensor& in, Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    std::lock_guard lock(mutex_);
    if (failure_.empty()) failure_ = e.message();
    abandoned_.push_back(out.storage());
    abandoned_.push_back(in.storage());
    throw;
  }
  out.storage()->bumpVersion();
  if (out.device().isCuda()) {
    // NOTE [Collective ordering and completion]: the bytes are in use on the comm stream until it gets there.
    out.storage()->recordStream(deviceStreams(out.device()).comm);
    in.storage()->recordStream(deviceStreams(out.device()).comm);
  }
}

void Communicator::localCopy(const Tensor& out, const Tensor& in) const {
  if (out.data() == in.data()) return;
  copyAsync(out.data(), out.device(), in.data(), in.device(), out.nbytes(), deviceStreams(out.device()).comm);
}

void Communicator::allGather(const Tensor& out, const Tensor& in) {
  [[maybe_unused]] Device device = checkTensors("allGather", out, in);
  STRATA_CHECK(
      in.numel() * info_.size == out.numel(),
      "dist: allGather in group '{}' ({} ranks): out has {} elements, in has {} (out must have in x {})",
      info_.name, info_.size, out.numel(), in.numel(), info_.size);
  const auto* myBlock = static_cast<const char*>(out.data()) + size_t(info_.rank) * in.nbytes();
  const bool inPlace = in.data() == myBlock;
  STRATA_CHECK(inPlace || !overlaps(out, in), "dist: allGather: in overlaps out but is not rank {}'s block",
               info_.rank);
  guarded(out, in, [&] {
    if (info_.size == 1) return localCopy(out, in);
#if STRATA_MPI
    if (device.isCpu())
      return mpi_->allGather(out.data(), inPlace ? nullptr : in.data(), in.numel(), in.dtype());
#endif
#if STRATA_NCCL
    nccl_->allGather(out.data(), inPlace ? nullptr : in.data(), in.numel(), in.dtype());
#endif
  });
}

void Communicator::reduceScatter(const Tensor& out, const Tensor& in, ReduceOp op) {
  [[maybe_unused]] Device device = checkTensors("reduceScatter", out, in);
  STRATA_CHECK(
      out.numel() * info_.size == in.numel(),
      "dist: reduceScatter in group '{}' ({} ranks): in has {} elements, out has {} (in must have out x {})",
      info_.name, info_.size, in.numel(), out.numel(), info_.size);
  const auto* myBlock = static_cast<const char*>(in.data()) + size_t(info_.rank) * out.nbytes();
  STRATA_CHECK(out.data() == myBlock || !overlaps(out, in),
               "dist: reduceScatter: out overlaps in but is not rank {}'s block", info_.rank);
  guarded(out, in, [&] {
    if (info_.size == 1) return localCopy(out, in);
#if STRATA_MPI
    if (device.isCpu()) return mpi_->reduceScatter(out.data(), in.data(), out.numel(), out.dtype(), op);
#endif
#if STRATA_NCCL
    nccl_->reduceScatter(out.data(), in.data(), out.numel(), out.dtype(), op);
#endif
  });
}

void Communicator::allReduce(const Tensor& inout, ReduceOp op) {
  [[maybe_unused]] Device device = checkTensors("allReduce", inout, inout);
  if (info_.size == 1) return;
  guarded(inout, inout, [&] {
#if STRATA_MPI
    if (device.isCpu()) return mpi_->allReduce(inout.data(), inout.numel(), inout.dtype(), op);
#endif
#if STRATA_NCCL
    nccl_->allReduce(inout.data(), inout.numel(), inout.dtype(), op);
#endif
  });
}

void Communicator::broadcast(const Tensor& t, int root) {
  [[maybe_unused]] Device device = checkTensors("broadcast", t, t);
  STRATA_CHECK(root >= 0 && root < info_.size, "dist: broadcast in group '{}': root {} is not a rank of {}",
               info_.name, root, info_.size);
  if (info_.size == 1) return;
  guarded(t, t, [&] {
#if STRATA_MPI
    if (device.isCpu()) return mpi_->broadcast(t.data(), t.numel(), t.dtype(), root);
#endif
#if STRATA_NCCL
    nccl_->broadcast(t.data(), t.numel(), t.dtype(), root);
#endif
  });
}

void Communicator::allToAll(const Tensor& out, const Tensor& in) {
  [[maybe_unused]] Device device = checkTensors("allToAll", out, in);
  STRATA_CHECK(
      out.numel() == in.numel() && in.numel() % info_.size == 0,
      "dist: allToAll in group '{}' ({} ranks): in and out need the same number of elements, divisible "
      "by {}; in has {}, out {}",
      info_.name, info_.size, info_.size, in.numel(), out.numel());
  const bool inPlace = out.data() == in.data();
  STRATA_CHECK(inPlace || !overlaps(out, in), "dist: allToAll: in and out overlap without being the same");
  guarded(out, in, [&] {
    if (info_.size == 1) return localCopy(out, in);
#if STRATA_MPI
    if (device.isCpu()) return mpi_->allToAll(out.data(), in.data(), in.numel(), in.dtype());
#endif
#if STRATA_NCCL
    Tensor source = in;
    if (inPlace) {  // NCCL's sends and receives run concurrently: send from a copy
      source = Tensor::empty(in.shape(), in.dtype(), device);
      copyAsync(source.data(), device, in.data(), device, in.nbytes(), nccl_->stream());
      source.storage()->recordStream(nccl_->stream());
    }
    nccl_->allToAll(out.data(), source.data(), in.numel(), in.dtype());
#endif
  });
}

void Communicator::barrier() {
  std::string earlier = failure();
  STRATA_USER_CHECK(earlier.empty(),
                    "dist: barrier on rank {} of group '{}' refused: an earlier collective failed: {}",
                    info_.rank, info_.name, earlier);
  if (info_.size == 1) return;
#if STRATA_MPI
  STRATA_CHECK(mpi_ != nullptr, "dist: barrier in group '{}' needs MPI", info_.name);
  try {
    mpi_->barrier();
  } catch (const Error& e) {
    std::lock_guard lock(mutex_);
    if (failure_.empty()) failure_ = e.message();
    throw;
  }
#else
  STRATA_FAIL("dist: barrier in group '{}' ({} ranks) needs MPI, and this build has none", info_.name,
              info_.size);
#endif
}

}  // namespace strata::dist
