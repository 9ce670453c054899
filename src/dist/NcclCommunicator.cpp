#include "dist/NcclCommunicator.h"

#if STRATA_NCCL
#include <cstdio>

#include "core/cuda/CudaContext.h"
#include "dist/MpiCommunicator.h"
#include "strata/core/Error.h"

namespace strata::dist {

namespace {

using Clock = std::chrono::steady_clock;

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

Clock::time_point deadlineAfter(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string ncclErrorText(ncclResult_t rc, ncclComm_t comm) {
  std::string text = detail::format("NCCL error {}: {}", int(rc), ncclGetErrorString(rc));
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last && *last) text += detail::format(" ({})", last);
  return text;
}

}  // namespace

NcclCommunicator::NcclCommunicator(MpiCommunicator& mpi, int deviceIndex)
    : info_(mpi.info()), deviceIndex_(deviceIndex), stream_(deviceStreams(Device::cuda(deviceIndex)).comm) {
  cuda::DeviceGuard guard(deviceIndex_);
  ncclUniqueId id{};
  CollectiveCall call{"ncclCommInitRankConfig", nullptr, int64_t(sizeof(id)), DType::U8};
  if (info_.rank == 0) {
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) failCollective(info_, call, "failed: " + ncclErrorText(rc, nullptr));
  }
  mpi.broadcast(&id, int64_t(sizeof(id)), DType::U8, 0);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a hung init or collective can be aborted
  const auto deadline = deadlineAfter(info_.timeoutSeconds);
  ncclResult_t rc = ncclCommInitRankConfig(&comm_, info_.size, id, info_.rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    if (comm_) ncclCommAbort(comm_);
    failCollective(info_, call, "failed: " + ncclErrorText(rc, nullptr));
  }
  settle(call, deadline);  // on a failure, aborts comm_ (recordFailure) and throws
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
  if (failure_.empty() && comm_) ncclCommAbort(comm_);
}

std::string NcclCommunicator::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void NcclCommunicator::recordFailure(const std::string& message) {
  // Called with mutex_ held. The first failure aborts the NCCL communicator, once.
  if (!failure_.empty()) return;
  failure_ = message;
  std::fprintf(stderr, "[strata] error: %s\n", message.c_str());
  std::fflush(stderr);
  ncclCommAbort(comm_);
  wake_.notify_all();
}

void NcclCommunicator::settle(const CollectiveCall& call, Clock::time_point deadline) {
  const auto start = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess) state = rc;
    if (state == ncclSuccess) return;
    std::string reason;
    if (state != ncclInProgress) {
      reason = "failed: " + ncclErrorText(state, comm_);
    } else if (Clock::now() >= deadline) {
      reason = timeoutReason(info_.timeoutSeconds);
    }
    if (!reason.empty()) {
      {
        std::lock_guard lock(mutex_);
        recordFailure("dist: " + describeCall(info_, call) + " " + reason);
      }
      STRATA_USER_FAIL("{}", "dist: " + describeCall(info_, call) + " " + reason);
    }
    if (Clock::now() - start < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void NcclCommunicator::enqueue(const CollectiveCall& call, const std::function<void()>& launch) {
  {
    std::lock_guard lock(mutex_);
    STRATA_USER_CHECK(failure_.empty(), "dist: {} refused: an earlier collective failed: {}",
                      describeCall(info_, call), failure_);
  }
  cuda::DeviceGuard guard(deviceIndex_);
  const auto deadline = deadlineAfter(info_.timeoutSeconds);
  ncclResult_t rc = ncclGroupStart();
  if (rc == ncclSuccess) {
    launch();
    rc = ncclGroupEnd();
  }
  if (rc != ncclSuccess && rc != ncclInProgress) {
    std::string message = "dist: " + describeCall(info_, call) + " failed: " + ncclErrorText(rc, comm_);
    {
      std::lock_guard lock(mutex_);
      recordFailure(message);
    }
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
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::milliseconds(10));
    if (stopping_) break;
    if (!failure_.empty()) {
      // Give the process a grace period to end through the failing collective's exception.
      if (!wake_.wait_for(lock, std::chrono::duration<double>(kAbortGraceSeconds),
                          [&] { return stopping_; })) {
        std::fprintf(stderr, "[strata] error: rank %d of group '%s': aborting the job after: %s\n",
                     info_.rank, info_.name.c_str(), failure_.c_str());
        std::fflush(stderr);
        MpiCommunicator::abortJob(1);
      }
      break;
    }
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
        state != ncclInProgress) {
      const CollectiveCall& call = inFlight_.empty() ? CollectiveCall{"(idle)"} : inFlight_.front().call;
      recordFailure("dist: " + describeCall(info_, call) + " failed: " + ncclErrorText(state, comm_));
      continue;
    }
    while (!inFlight_.empty() && inFlight_.front().done.query()) inFlight_.pop_front();
    if (inFlight_.empty()) {
      wake_.notify_all();  // the destructor waits for this
    } else if (Clock::now() >= inFlight_.front().deadline) {
      recordFailure("dist: " + describeCall(info_, inFlight_.front().call) + " " +
                    timeoutReason(info_.timeoutSeconds));
    }
  }
}

void NcclCommunicator::allGather(void* out, const void* in, int64_t count, DType dtype) {
  const CollectiveCall call{"allGather", nullptr, count, dtype};
  auto* stream = cuda::nativeStream(stream_);
  // In place: this rank's block of `out` is the send buffer, as NCCL's in-place all-gather expects.
  const void* send = in ? in : static_cast<const char*>(out) + size_t(info_.rank) * count * dtypeSize(dtype);
  enqueue(call, [&] { ncclAllGather(send, out, size_t(count), ncclType(dtype), comm_, stream); });
}

void NcclCommunicator::reduceScatter(void* out, const void* in, int64_t outCount, DType dtype, ReduceOp op) {
  const CollectiveCall call{"reduceScatter", reduceOpName(op), outCount * info_.size, dtype};
  auto* stream = cuda::nativeStream(stream_);
  enqueue(call,
          [&] { ncclReduceScatter(in, out, size_t(outCount), ncclType(dtype), ncclOp(op), comm_, stream); });
}

void NcclCommunicator::allReduce(void* inout, int64_t count, DType dtype, ReduceOp op) {
  const CollectiveCall call{"allReduce", reduceOpName(op), count, dtype};
  auto* stream = cuda::nativeStream(stream_);
  enqueue(call,
          [&] { ncclAllReduce(inout, inout, size_t(count), ncclType(dtype), ncclOp(op), comm_, stream); });
}

void NcclCommunicator::broadcast(void* data, int64_t count, DType dtype, int root) {
  const CollectiveCall call{"broadcast", nullptr, count, dtype};
  auto* stream = cuda::nativeStream(stream_);
  enqueue(call, [&] { ncclBroadcast(data, data, size_t(count), ncclType(dtype), root, comm_, stream); });
}

// NCCL has no all-to-all: one send and one receive per peer inside a group. `in` and `out` must not overlap
// (Communicator stages an in-place all-to-all).
void NcclCommunicator::allToAll(void* out, const void* in, int64_t count, DType dtype) {
  const CollectiveCall call{"allToAll", nullptr, count, dtype};
  auto* stream = cuda::nativeStream(stream_);
  const size_t block = size_t(count / info_.size);
  const size_t blockBytes = block * dtypeSize(dtype);
  enqueue(call, [&] {
    for (int peer = 0; peer < info_.size; ++peer) {
      ncclSend(static_cast<const char*>(in) + peer * blockBytes, block, ncclType(dtype), peer, comm_, stream);
      ncclRecv(static_cast<char*>(out) + peer * blockBytes, block, ncclType(dtype), peer, comm_, stream);
    }
  });
}

}  // namespace strata::dist
#endif
