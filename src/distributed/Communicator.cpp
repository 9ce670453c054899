#include "strata/distributed/Communicator.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "distributed/CollectiveCall.h"
#include "distributed/MpiCommunicator.h"
#include "distributed/NcclCommunicator.h"
#include "strata/core/Allocator.h"
#include "strata/core/Error.h"
#include "strata/core/Stream.h"
#include "strata/ops/Ops.h"

namespace strata::dist {

const char* gpuCollectivesName(GpuCollectives mode) {
  switch (mode) {
    case GpuCollectives::Nccl:
      return "nccl";
    case GpuCollectives::Staged:
      return "staged";
    case GpuCollectives::Auto:
      break;
  }
  return "auto";
}

GpuCollectives parseGpuCollectives(const std::string& text) {
  if (text == "auto") return GpuCollectives::Auto;
  if (text == "nccl") return GpuCollectives::Nccl;
  if (text == "staged") return GpuCollectives::Staged;
  STRATA_USER_FAIL("dist.gpu_collectives is '{}': use auto, nccl or staged", text);
}

const Stream& collectiveStream(Device device, bool gather) {
  const DeviceStreams& streams = deviceStreams(device);
  return gather ? streams.gather : streams.comm;
}

// Unique pointers to the backends need their complete types where they are destroyed: here.
Communicator::Communicator(GroupInfo info, Backends backends)
    : info_(std::move(info)),
      mpi_(std::move(backends.mpi)),
      nccl_(std::move(backends.nccl)),
      ncclGather_(std::move(backends.ncclGather)),
      gpu_(backends.gpu) {
  STRATA_CHECK(info_.size >= 1 && info_.rank >= 0 && info_.rank < info_.size, "group '{}': rank {} of {}",
               info_.name, info_.rank, info_.size);
  STRATA_CHECK(info_.timeoutSeconds > 0, "group '{}': timeout {} s must be positive", info_.name,
               info_.timeoutSeconds);
  STRATA_CHECK((nccl_ == nullptr) == (ncclGather_ == nullptr), "group '{}': NCCL needs both lanes",
               info_.name);
  STRATA_CHECK(gpu_ != GpuCollectives::Staged || mpi_ != nullptr,
               "group '{}': staged GPU collectives need MPI", info_.name);
}

Communicator::Communicator(GroupInfo info) : Communicator(std::move(info), Backends{}) {}

Communicator::~Communicator() {
  if (staging_[0].data || staging_[1].data) {
    // A staged copy back to the GPU may still read the buffers (NOTE [Staged GPU collectives]); after a
    // failure they are left alone, as a failed collective's tensors are.
    if (!failed()) {
      for (bool gather : {false, true}) collectiveStream(stagedDevice_, gather).synchronize();
      for (Staging& s : staging_)
        if (s.data) hostStateAllocator(true).deallocate(s.data);
    }
  }
}

bool Communicator::failed() const {
  return !failure().empty();
}

std::string Communicator::failure() const {
  {
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) return failure_;
  }
#if STRATA_NCCL
  for (const auto* nccl : {nccl_.get(), ncclGather_.get()})
    if (nccl) {
      std::string f = nccl->failure();
      if (!f.empty()) return f;
    }
#endif
  return {};
}

namespace {

bool overlaps(const Tensor& a, const Tensor& b) {
  auto* a0 = static_cast<const char*>(a.data());
  auto* b0 = static_cast<const char*>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// NOTE [Comm delay]: microseconds from STRATA_COMM_DELAY_US (0: off), read at each collective so a test can
// switch it.
double commDelayMicroseconds() {
  const char* text = std::getenv("STRATA_COMM_DELAY_US");
  if (text == nullptr || *text == '\0') return 0.0;
  char* end = nullptr;
  double v = std::strtod(text, &end);
  STRATA_USER_CHECK(end != text && *end == '\0' && v >= 0 && std::isfinite(v),
                    "STRATA_COMM_DELAY_US='{}' is not a number of microseconds", text);
  return v;
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
  if (local(device)) return device;
  if (device.isCpu() || gpu_ == GpuCollectives::Staged) {
    STRATA_CHECK(mpi_ != nullptr, "dist: {} of a {} tensor in group '{}' ({} ranks) needs MPI{}", op,
                 toString(device), info_.name, info_.size,
                 STRATA_MPI ? "" : ", and this build has none (STRATA_MPI=OFF)");
    return device;
  }
#if STRATA_NCCL
  STRATA_CHECK(nccl_ != nullptr,
               "dist: {} of a CUDA tensor in group '{}': the group has no NCCL communicator (make the "
               "ParallelContext with deviceType CUDA)",
               op, info_.name);
  STRATA_CHECK(device.index == nccl_->deviceIndex(),
               "dist: {}: tensor on {}, group '{}' communicates on cuda:{}", op, device, info_.name,
               nccl_->deviceIndex());
#else
  STRATA_FAIL("dist: {} of a CUDA tensor in group '{}' needs NCCL, and this build has none", op, info_.name);
#endif
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
}

void Communicator::delayLane(Device device, bool gather) const {
  double us = commDelayMicroseconds();
  if (us <= 0 || !device.isCuda()) return;
  StreamGuard onLane(collectiveStream(device, gather));
  ops::spin(device, us);
}

void Communicator::localCopy(const Tensor& out, const Tensor& in, bool gather) const {
  if (out.data() == in.data()) return;
  const Stream& lane = collectiveStream(out.device(), gather);
  copyAsync(out.data(), out.device(), in.data(), in.device(), out.nbytes(), lane);
  if (out.device().isCuda()) {
    out.storage()->recordStream(lane);
    in.storage()->recordStream(lane);
  }
}

void* Communicator::stagingBuffer(size_t index, size_t bytes) {
  Staging& s = staging_[index];
  if (s.bytes < bytes) {
    // The previous buffer is no longer read: every staged collective waits for its lane before the host
    // touches a buffer, and each buffer serves one collective at a time.
    Allocator& pinned = hostStateAllocator(true);
    if (s.data) pinned.deallocate(s.data);
    s.data = nullptr;
    s.bytes = 0;
    s.data = pinned.allocate(bytes);
    s.bytes = bytes;
  }
  return s.data;
}

void Communicator::staged(const Tensor& out, const Tensor& in, bool gather, bool inPlaceGather,
                          const std::function<void(void* hostOut, const void* hostIn)>& hostOp) {
  // NOTE [Staged GPU collectives]
  Device device = out.device();
  stagedDevice_ = device;
  const Stream& lane = collectiveStream(device, gather);
  const bool separateIn = in.data() != out.data() && !inPlaceGather;
  void* hostOut = stagingBuffer(0, out.nbytes());
  void* hostIn = separateIn ? stagingBuffer(1, in.nbytes()) : nullptr;
  // The previous staged collective's copy back may still read these buffers: the lanes run in order, so the
  // first copy below waits for it, and the host waits for the lane before it writes.
  if (inPlaceGather) {
    copyAsync(static_cast<char*>(hostOut) + size_t(info_.rank) * in.nbytes(), Device::cpu(), in.data(),
              device, in.nbytes(), lane);
  } else {
    copyAsync(separateIn ? hostIn : hostOut, Device::cpu(), in.data(), device, in.nbytes(), lane);
  }
  lane.synchronize();
  hostOp(hostOut, hostIn);
  copyAsync(out.data(), device, hostOut, Device::cpu(), out.nbytes(), lane);
  out.storage()->recordStream(lane);
  in.storage()->recordStream(lane);
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
    if (local(device)) return localCopy(out, in, /*gather=*/true);
    delayLane(device, /*gather=*/true);
#if STRATA_MPI
    if (device.isCpu())
      return mpi_->allGather(out.data(), inPlace ? nullptr : in.data(), in.numel(), in.dtype());
    if (gpu_ == GpuCollectives::Staged)
      return staged(out, in, /*gather=*/true, inPlace, [&](void* hostOut, const void* hostIn) {
        mpi_->allGather(hostOut, hostIn, in.numel(), in.dtype());
      });
#endif
#if STRATA_NCCL
    ncclGather_->allGather(out.data(), inPlace ? nullptr : in.data(), in.numel(), in.dtype());
    out.storage()->recordStream(ncclGather_->stream());
    in.storage()->recordStream(ncclGather_->stream());
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
    if (local(device)) return localCopy(out, in, /*gather=*/false);
    delayLane(device, /*gather=*/false);
#if STRATA_MPI
    if (device.isCpu()) return mpi_->reduceScatter(out.data(), in.data(), out.numel(), out.dtype(), op);
    if (gpu_ == GpuCollectives::Staged)
      return staged(out, in, /*gather=*/false, false, [&](void* hostOut, const void* hostIn) {
        mpi_->reduceScatter(hostOut, hostIn, out.numel(), out.dtype(), op);
      });
#endif
#if STRATA_NCCL
    nccl_->reduceScatter(out.data(), in.data(), out.numel(), out.dtype(), op);
    out.storage()->recordStream(nccl_->stream());
    in.storage()->recordStream(nccl_->stream());
#endif
  });
}

void Communicator::allReduce(const Tensor& inout, ReduceOp op) {
  [[maybe_unused]] Device device = checkTensors("allReduce", inout, inout);
  if (local(device)) return;
  guarded(inout, inout, [&] {
    delayLane(device, /*gather=*/false);
#if STRATA_MPI
    if (device.isCpu()) return mpi_->allReduce(inout.data(), inout.numel(), inout.dtype(), op);
    if (gpu_ == GpuCollectives::Staged)
      return staged(inout, inout, /*gather=*/false, false, [&](void* hostOut, const void*) {
        mpi_->allReduce(hostOut, inout.numel(), inout.dtype(), op);
      });
#endif
#if STRATA_NCCL
    nccl_->allReduce(inout.data(), inout.numel(), inout.dtype(), op);
    inout.storage()->recordStream(nccl_->stream());
#endif
  });
}

void Communicator::broadcast(const Tensor& t, int root) {
  [[maybe_unused]] Device device = checkTensors("broadcast", t, t);
  STRATA_CHECK(root >= 0 && root < info_.size, "dist: broadcast in group '{}': root {} is not a rank of {}",
               info_.name, root, info_.size);
  if (local(device)) return;
  guarded(t, t, [&] {
    delayLane(device, /*gather=*/false);
#if STRATA_MPI
    if (device.isCpu()) return mpi_->broadcast(t.data(), t.numel(), t.dtype(), root);
    if (gpu_ == GpuCollectives::Staged)
      return staged(t, t, /*gather=*/false, false, [&](void* hostOut, const void*) {
        mpi_->broadcast(hostOut, t.numel(), t.dtype(), root);
      });
#endif
#if STRATA_NCCL
    nccl_->broadcast(t.data(), t.numel(), t.dtype(), root);
    t.storage()->recordStream(nccl_->stream());
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
    if (local(device)) return localCopy(out, in, /*gather=*/false);
    delayLane(device, /*gather=*/false);
#if STRATA_MPI
    if (device.isCpu()) return mpi_->allToAll(out.data(), in.data(), in.numel(), in.dtype());
    if (gpu_ == GpuCollectives::Staged) {
      // MPI's all-to-all reads and writes separate host buffers, in place or not.
      Tensor source = in;
      if (inPlace) {
        const Stream& lane = collectiveStream(device, false);
        source = Tensor::empty(in.shape(), in.dtype(), device);
        copyAsync(source.data(), device, in.data(), device, in.nbytes(), lane);
        source.storage()->recordStream(lane);
      }
      return staged(out, source, /*gather=*/false, false, [&](void* hostOut, const void* hostIn) {
        mpi_->allToAll(hostOut, hostIn, in.numel(), in.dtype());
      });
    }
#endif
#if STRATA_NCCL
    Tensor source = in;
    if (inPlace) {  // NCCL's sends and receives run concurrently: send from a copy
      source = Tensor::empty(in.shape(), in.dtype(), device);
      copyAsync(source.data(), device, in.data(), device, in.nbytes(), nccl_->stream());
      source.storage()->recordStream(nccl_->stream());
    }
    nccl_->allToAll(out.data(), source.data(), in.numel(), in.dtype());
    out.storage()->recordStream(nccl_->stream());
    in.storage()->recordStream(nccl_->stream());
#endif
  });
}

void Communicator::sendReceive(const std::vector<PeerTransfer>& sends,
                               const std::vector<PeerTransfer>& receives) {
  // NOTE [Point-to-point]
  if (sends.empty() && receives.empty()) return;
  const Tensor& first = sends.empty() ? receives.front().tensor : sends.front().tensor;
  std::string peers;
  auto check = [&](const PeerTransfer& t, const char* way) {
    checkTensors("sendReceive", t.tensor, t.tensor);
    STRATA_CHECK(t.tensor.device() == first.device(), "dist: sendReceive: tensors on {} and {}",
                 t.tensor.device(), first.device());
    STRATA_CHECK(t.peer >= 0 && t.peer < info_.size && t.peer != info_.rank,
                 "dist: sendReceive in group '{}': rank {} cannot {} rank {} of {}", info_.name, info_.rank,
                 way, t.peer, info_.size);
    STRATA_CHECK(t.tag >= 0 && t.tag < (1 << 15), "dist: sendReceive: tag {} out of [0, 32767]", t.tag);
    peers += detail::format("{}{} rank {} ({} elements, tag {})", peers.empty() ? "" : ", ", way, t.peer,
                            t.tensor.numel(), t.tag);
  };
  for (const auto& t : sends) check(t, "send to");
  for (const auto& t : receives) check(t, "receive from");
  Device device = first.device();
  STRATA_CHECK(!local(device), "dist: sendReceive in group '{}' of one rank: there is no peer", info_.name);
  // The same order on both sides of every pair (NCCL matches a pair's transfers in the order posted).
  auto ordered = [](std::vector<PeerTransfer> list) {
    std::stable_sort(list.begin(), list.end(), [](const PeerTransfer& a, const PeerTransfer& b) {
      return a.peer != b.peer ? a.peer < b.peer : a.tag < b.tag;
    });
    return list;
  };
  std::vector<PeerTransfer> out = ordered(sends), in = ordered(receives);
  try {
    delayLane(device, /*gather=*/false);
#if STRATA_MPI
    auto mpiTransfers = [](const std::vector<PeerTransfer>& list, const std::vector<void*>& host) {
      std::vector<MpiCommunicator::Transfer> raw;
      for (size_t i = 0; i < list.size(); ++i) {
        void* data = host.empty() ? list[i].tensor.data() : host[i];
        raw.push_back({data, list[i].tensor.numel(), list[i].tensor.dtype(), list[i].peer, list[i].tag});
      }
      return raw;
    };
    if (device.isCpu()) {
      mpi_->sendReceive(mpiTransfers(out, {}), mpiTransfers(in, {}), peers);
    } else if (gpu_ == GpuCollectives::Staged) {
      // NOTE [Staged GPU collectives]: through the page-locked staging buffers (sends packed in the first,
      // receives in the second) on the comm lane.
      const Stream& lane = collectiveStream(device, false);
      auto pack = [&](const std::vector<PeerTransfer>& list, size_t index) {
        size_t total = 0;
        for (const auto& t : list) total += (t.tensor.nbytes() + 63) / 64 * 64;
        std::vector<void*> places;
        if (total == 0) return std::vector<void*>(list.size(), nullptr);
        auto* base = static_cast<char*>(stagingBuffer(index, total));
        for (const auto& t : list) {
          places.push_back(base);
          base += (t.tensor.nbytes() + 63) / 64 * 64;
        }
        return places;
      };
      std::vector<void*> hostOut = pack(out, 0), hostIn = pack(in, 1);
      for (size_t i = 0; i < out.size(); ++i)
        copyAsync(hostOut[i], Device::cpu(), out[i].tensor.data(), device, out[i].tensor.nbytes(), lane);
      lane.synchronize();
      mpi_->sendReceive(mpiTransfers(out, hostOut), mpiTransfers(in, hostIn), peers);
      for (size_t i = 0; i < in.size(); ++i)
        copyAsync(in[i].tensor.data(), device, hostIn[i], Device::cpu(), in[i].tensor.nbytes(), lane);
      lane.synchronize();  // the staging buffers are free again
    }
    if (device.isCpu() || gpu_ == GpuCollectives::Staged) {
      for (const auto& t : in) t.tensor.storage()->bumpVersion();
      return;
    }
#endif
#if STRATA_NCCL
    auto ncclTransfers = [](const std::vector<PeerTransfer>& list) {
      std::vector<NcclCommunicator::Transfer> raw;
      for (const auto& t : list) raw.push_back({t.tensor.data(), t.tensor.numel(), t.tensor.dtype(), t.peer});
      return raw;
    };
    nccl_->sendReceive(ncclTransfers(out), ncclTransfers(in), peers);
    for (const auto& list : {&out, &in})
      for (const auto& t : *list) t.tensor.storage()->recordStream(nccl_->stream());
    for (const auto& t : in) t.tensor.storage()->bumpVersion();
#endif
  } catch (const Error& e) {
    std::lock_guard lock(mutex_);
    if (failure_.empty()) failure_ = e.message();
    // A timed-out transfer may still read or write these bytes.
    for (const auto& list : {&out, &in})
      for (const auto& t : *list) abandoned_.push_back(t.tensor.storage());
    throw;
  }
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

std::vector<std::string> allGatherText(Communicator& comm, const std::string& text) {
  int n = comm.size();
  if (n == 1) return {text};
  Tensor lengths = Tensor::empty({n}, DType::I64, Device::cpu());
  comm.allGather(lengths, Tensor::fromVector(std::vector<int64_t>{int64_t(text.size())}, {1}));
  std::vector<int64_t> len = lengths.toVector<int64_t>();
  int64_t longest = std::max<int64_t>(1, *std::max_element(len.begin(), len.end()));
  std::string padded = text;
  padded.resize(size_t(longest), '\0');
  Tensor all = Tensor::empty({n * longest}, DType::U8, Device::cpu());
  comm.allGather(all, Tensor::fromHost(padded.data(), DType::U8, padded.size(), {longest}, Device::cpu()));
  std::vector<std::string> out;
  const char* bytes = static_cast<const char*>(all.data());
  for (int r = 0; r < n; ++r) out.emplace_back(bytes + r * longest, size_t(len[size_t(r)]));
  return out;
}

}  // namespace strata::dist
