#include "distributed/NcclCommunicator.h"

#if STRATA_NCCL
#include <cstdio>

#include "core/cuda/CudaContext.h"
#include "distributed/MpiCommunicator.h"
#include "strata/core/Error.h"

namespace strata::dist {

namespace {

// How long the watchdog lets the process end by itself (the failing collective's exception unwinding to the
// ParallelContext, which aborts the job) before it aborts the job itself.
constexpr double kAbortGraceSeconds = 5.0;

ncclDataType_t ncclType(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t ncclOp(ReduceOp op) {
  return op == ReduceOp::Sum ? ncclSum : ncclMax;
}

std::chrono::steady_clock::time_point deadlineAfter(double seconds) {
  using Clock = std::chrono::steady_clock;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string ncclErrorText(ncclResult_t rc, ncclComm_t comm) {
  std::string text = detail::format("NCCL error {}: {}", int(rc), ncclGetErrorString(rc));
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last && *last) text += detail::format(" ({})", last);
  return text;
}

}  // namespace

NcclCommunicator::NcclCommunicator(GroupInfo info, int deviceIndex, const Stream& stream,
                                   const ShareId& share)
    : info_(std::move(info)), deviceIndex_(deviceIndex), stream_(stream) {
  STRATA_CHECK(stream_.device() == Device::cuda(deviceIndex_),
               "NCCL communicator of cuda:{} on a stream of {}", deviceIndex_, toString(stream_.device()));
  cuda::DeviceGuard guard(deviceIndex_);
  ncclUniqueId id{};
  CollectiveCall call{"ncclCommInitRankConfig", nullptr, int64_t(sizeof(id)), DType::U8};
  if (info_.rank == 0) {
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) failCollective(info_, call, "failed: " + ncclErrorText(rc, nullptr));
  }
  if (share) share(id);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a hung init or collective can be aborted
  const auto deadline = deadlineAfter(info_.timeoutSeconds);
  ncclResult_t rc = ncclCommInitRankConfig(&comm_, info_.size, id, info_.rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    failCollective(info_, call, "failed: " + ncclErrorText(rc, nullptr));
  }
  try {
    settle(call, deadline);
  } catch (...) {
    std::lock_guard api(apiMutex_);
    if (!aborted_ && comm_) ncclCommAbort(comm_);
    aborted_ = true;
    throw;
  }
  watchdog_ = std::thread([this] { watch(); });
}

NcclCommunicator::~NcclCommunicator() {
  {
    // Let the collectives in flight finish (the watchdog still guards them), then stop the watchdog.
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [&] { return inFlight_.empty() || !failure_.empty(); });
    stopping_ = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  // Abort, not finalize: it is local, so a rank leaving early never waits on the others. Nothing is in
  // flight.
  std::lock_guard api(apiMutex_);
  if (!aborted_ && comm_) ncclCommAbort(comm_);
  aborted_ = true;
}

std::string NcclCommunicator::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void NcclCommunicator::fail(const std::string& message) {
  bool first = false;
  {
    std::lock_guard lock(mutex_);
    first = failure_.empty();
    if (first) failure_ = message;
  }
  if (!first) return;
  std::fprintf(stderr, "[strata] error: %s\n", message.c_str());
  std::fflush(stderr);
  {
    // NOTE [One thread in NCCL at a time]: no other NCCL call on comm_ runs while it is aborted.
    std::lock_guard api(apiMutex_);
    if (!aborted_ && comm_) ncclCommAbort(comm_);
    aborted_ = true;
  }
  wake_.notify_all();
}

void NcclCommunicator::settle(const CollectiveCall& call, Clock::time_point deadline) {
  const auto start = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    std::string errorText;  // read under the lock: ncclGetLastError is a call on comm_ too
    {
      std::lock_guard api(apiMutex_);
      if (aborted_) {
        state = ncclInternalError;
      } else {
        ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
        if (rc != ncclSuccess) state = rc;
        if (state != ncclSuccess && state != ncclInProgress) errorText = ncclErrorText(state, comm_);
      }
    }
    if (state == ncclSuccess) return;
    std::string reason;
    if (state != ncclInProgress) {
      std::string earlier = failure();
      reason = errorText.empty() ? "failed: the communicator was aborted after: " + earlier
                                 : "failed: " + errorText;
    } else if (Clock::now() >= deadline) {
      reason = timeoutReason(info_.timeoutSeconds);
    }
    if (!reason.empty()) {
      std::string message = "dist: " + describeCall(info_, call) + " " + reason;
      fail(message);
      STRATA_USER_FAIL("{}", message);
    }
    if (Clock::now() - start < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void NcclCommunicator::enqueue(const CollectiveCall& call, const std::function<ncclResult_t()>& launch) {
  {
    std::lock_guard lock(mutex_);
    STRATA_USER_CHECK(failure_.empty(), "dist: {} refused: an earlier collective failed: {}",
                      describeCall(info_, call), failure_);
  }
  cuda::DeviceGuard guard(deviceIndex_);
  const auto deadline = deadlineAfter(info_.timeoutSeconds);
  ncclResult_t rc = ncclSuccess;
  std::string errorText;
  {
    std::lock_guard api(apiMutex_);
    if (aborted_) {
      rc = ncclInvalidUsage;
      errorText = "the communicator was aborted";
    } else {
      rc = ncclGroupStart();
      if (rc == ncclSuccess) {
        ncclResult_t launched = launch();
        rc = ncclGroupEnd();
        // The first error wins: a launch that failed leaves the group's end to report what is left.
        if (launched != ncclSuccess && launched != ncclInProgress) rc = launched;
      }
      if (rc != ncclSuccess && rc != ncclInProgress) errorText = ncclErrorText(rc, comm_);
    }
  }
  if (rc != ncclSuccess && rc != ncclInProgress) {
    std::string message = "dist: " + describeCall(info_, call) + " failed: " + errorText;
    fail(message);
    STRATA_USER_FAIL("{}", message);
  }
  settle(call, deadline);
  InFlight entry{Event(Device::cuda(deviceIndex_)), deadline, call};
  entry.done.record(stream_);
  {
    std::lock_guard lock(mutex_);
    inFlight_.push_back(std::move(entry));
  }
  wake_.notify_all();
}

void NcclCommunicator::watch() {
  bindThreadToProcessDevice();  // NOTE [Process device] in strata/core/Device.h
  try {
    watchOnce();
  } catch (const std::exception& e) {
    // Nothing may escape a thread (std::terminate): the failure is recorded and reported like any other.
    fail(detail::format("dist: the NCCL watchdog of rank {} of group '{}' failed: {}", info_.rank, info_.name,
                        e.what()));
  } catch (...) {
    fail(detail::format("dist: the NCCL watchdog of rank {} of group '{}' failed", info_.rank, info_.name));
  }
  // After a failure: give the process a grace period to end through the failing collective's exception, then
  // abort the job.
  std::unique_lock lock(mutex_);
  if (stopping_ || failure_.empty() || !info_.abortJobOnFailure) return;
  if (!wake_.wait_for(lock, std::chrono::duration<double>(kAbortGraceSeconds), [&] { return stopping_; })) {
    std::fprintf(stderr, "[strata] error: rank %d of group '%s': aborting the job after: %s\n", info_.rank,
                 info_.name.c_str(), failure_.c_str());
    std::fflush(stderr);
    MpiCommunicator::abortJob(1);
  }
}

void NcclCommunicator::watchOnce() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, std::chrono::milliseconds(10));
      if (stopping_ || !failure_.empty()) return;
    }
    // An asynchronous error (a peer's connection lost): polled when the launching thread is not in NCCL.
    ncclResult_t state = ncclSuccess;
    {
      std::unique_lock api(apiMutex_, std::try_to_lock);
      if (api.owns_lock() && !aborted_ && ncclCommGetAsyncError(comm_, &state) != ncclSuccess)
        state = ncclSuccess;  // the poll itself failed: the next round, or the deadline, decides
    }
    std::string message;
    {
      std::lock_guard lock(mutex_);
      if (state != ncclSuccess && state != ncclInProgress) {
        const CollectiveCall call = inFlight_.empty() ? CollectiveCall{"(idle)"} : inFlight_.front().call;
        message = "dist: " + describeCall(info_, call) + " failed: " + ncclErrorText(state, nullptr);
      } else {
        while (!inFlight_.empty() && inFlight_.front().done.query()) inFlight_.pop_front();
        if (inFlight_.empty()) {
          wake_.notify_all();  // the destructor waits for this
        } else if (Clock::now() >= inFlight_.front().deadline) {
          message = "dist: " + describeCall(info_, inFlight_.front().call) + " " +
                    timeoutReason(info_.timeoutSeconds);
        }
      }
    }
    if (!message.empty()) {
      fail(message);
      return;
    }
  }
}

void NcclCommunicator::allGather(void* out, const void* in, int64_t count, DType dtype) {
  const CollectiveCall call{"allGather", nullptr, count, dtype};
  auto* stream = cuda::nativeStream(stream_);
  // In place: this rank's block of `out` is the send buffer, as NCCL's in-place all-gather expects.
  const void* send = in ? in : static_cast<const char*>(out) + size_t(info_.rank) * count * dtypeSize(dtype);
  enqueue(call, [&] { return ncclAllGather(send, out, size_t(count), ncclType(dtype), comm_, stream); });
}

void NcclCommunicator::reduceScatter(void* out, const void* in, int64_t outCount, DType dtype, ReduceOp op) {
  const CollectiveCall call{"reduceScatter", reduceOpName(op), outCount * info_.size, dtype};
  auto* stream = cuda::nativeStream(stream_);
  enqueue(call, [&] {
    return ncclReduceScatter(in, out, size_t(outCount), ncclType(dtype), ncclOp(op), comm_, stream);
  });
}

void NcclCommunicator::allReduce(void* inout, int64_t count, DType dtype, ReduceOp op) {
  const CollectiveCall call{"allReduce", reduceOpName(op), count, dtype};
  auto* stream = cuda::nativeStream(stream_);
  enqueue(call, [&] {
    return ncclAllReduce(inout, inout, size_t(count), ncclType(dtype), ncclOp(op), comm_, stream);
  });
}

void NcclCommunicator::broadcast(void* data, int64_t count, DType dtype, int root) {
  const CollectiveCall call{"broadcast", nullptr, count, dtype};
  auto* stream = cuda::nativeStream(stream_);
  enqueue(call,
          [&] { return ncclBroadcast(data, data, size_t(count), ncclType(dtype), root, comm_, stream); });
}

// NCCL has no all-to-all: one send and one receive per peer inside a group. `in` and `out` must not overlap
// (Communicator stages an in-place all-to-all).
void NcclCommunicator::allToAll(void* out, const void* in, int64_t count, DType dtype) {
  const CollectiveCall call{"allToAll", nullptr, count, dtype};
  auto* stream = cuda::nativeStream(stream_);
  const size_t block = size_t(count / info_.size);
  const size_t blockBytes = block * dtypeSize(dtype);
  enqueue(call, [&] {
    ncclResult_t first = ncclSuccess;
    auto keep = [&](ncclResult_t rc) {
      if (first == ncclSuccess && rc != ncclSuccess && rc != ncclInProgress) first = rc;
    };
    for (int peer = 0; peer < info_.size; ++peer) {
      keep(ncclSend(static_cast<const char*>(in) + peer * blockBytes, block, ncclType(dtype), peer, comm_,
                    stream));
      keep(
          ncclRecv(static_cast<char*>(out) + peer * blockBytes, block, ncclType(dtype), peer, comm_, stream));
    }
    return first;
  });
}

void NcclCommunicator::sendReceive(const std::vector<Transfer>& sends, const std::vector<Transfer>& receives,
                                   const std::string& peers) {
  CollectiveCall call = sendReceiveCall(sends, receives, peers);
  auto* stream = cuda::nativeStream(stream_);
  enqueue(call, [&] {
    ncclResult_t first = ncclSuccess;
    auto keep = [&](ncclResult_t rc) {
      if (first == ncclSuccess && rc != ncclSuccess && rc != ncclInProgress) first = rc;
    };
    for (const auto& t : sends)
      keep(ncclSend(t.data, size_t(t.count), ncclType(t.dtype), t.peer, comm_, stream));
    for (const auto& t : receives)
      keep(ncclRecv(t.data, size_t(t.count), ncclType(t.dtype), t.peer, comm_, stream));
    return first;
  });
}

}  // namespace strata::dist
#endif
