#include "distributed/MpiCommunicator.h"

#if STRATA_MPI
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "distributed/RankOrderReduce.h"
#include "strata/core/Error.h"

namespace strata::dist {

namespace {

// 16-bit floats travel as raw 16-bit words: the MPI backend reduces them itself (RankOrderReduce), never MPI.
MPI_Datatype mpiType(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::BF16:
    case DType::F16:
      return MPI_UINT16_T;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::U8:
      return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

std::string mpiErrorString(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) return detail::format("MPI error code {}", rc);
  return std::string(text, size_t(length));
}

// Block i of `total` elements split over `parts` ranks as evenly as possible (the first total % parts blocks
// one larger).
int64_t blockCount(int64_t total, int parts, int i) {
  return total / parts + (i < total % parts ? 1 : 0);
}
int64_t blockStart(int64_t total, int parts, int i) {
  return i * (total / parts) + std::min<int64_t>(i, total % parts);
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, GroupInfo info) : comm_(comm), info_(std::move(info)) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // A communicator with a collective still in flight (abandoned_) is left alone: the job is being aborted.
  if (!finalized && abandoned_.empty() && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::abortJob(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void MpiCommunicator::fail(const CollectiveCall& call, const std::string& reason,
                           std::vector<std::byte>* staging) {
  if (staging) abandoned_.push_back(std::move(*staging));
  failCollective(info_, call, reason);
}

void MpiCommunicator::check(int rc, const CollectiveCall& call, std::vector<std::byte>* staging) {
  if (rc != MPI_SUCCESS) fail(call, "failed in MPI: " + mpiErrorString(rc), staging);
}

void MpiCommunicator::wait(MPI_Request& request, const CollectiveCall& call,
                           std::vector<std::byte>* staging) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(info_.timeoutSeconds));
  // Spin (yielding) for the first millisecond, then poll every 100 us: ranks oversubscribing the cores (CI)
  // leave each other CPU time, and a slow collective does not burn a core.
  for (;;) {
    int done = 0;
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call, staging);
    if (done) return;
    auto now = Clock::now();
    if (now >= deadline) fail(call, timeoutReason(info_.timeoutSeconds), staging);
    if (now - start < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void MpiCommunicator::waitAll(std::vector<MPI_Request>& requests, const CollectiveCall& call) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(info_.timeoutSeconds));
  // A failed transfer leaves requests posted on the tensors' bytes: the communicator is then left alone
  // (an empty entry in abandoned_), as after a collective in flight.
  std::vector<std::byte> inFlight;
  for (;;) {
    int done = 0;
    check(MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE), call, &inFlight);
    if (done) return;
    auto now = Clock::now();
    if (now >= deadline) fail(call, timeoutReason(info_.timeoutSeconds), &inFlight);
    if (now - start < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

namespace {
int intCount(int64_t count, const GroupInfo& group, const CollectiveCall& call) {
  if (count > INT_MAX) {
    failCollective(
        group, call,
        detail::format("has {} elements per message, more than MPI's int count allows; split it", count));
  }
  return int(count);
}
}  // namespace

void MpiCommunicator::allGather(void* out, const void* in, int64_t count, DType dtype) {
  CollectiveCall call{"allGather", nullptr, count, dtype};
  int n = intCount(count, info_, call);
  MPI_Request request;
  check(MPI_Iallgather(in ? in : MPI_IN_PLACE, n, mpiType(dtype), out, n, mpiType(dtype), comm_, &request),
        call);
  wait(request, call);
}

// Block r of every rank's `in` comes to rank r (an all-to-all into a staging buffer of N blocks), which then
// reduces the N blocks in rank order.
void MpiCommunicator::reduceScatter(void* out, const void* in, int64_t outCount, DType dtype, ReduceOp op) {
  CollectiveCall call{"reduceScatter", reduceOpName(op), outCount * info_.size, dtype};
  int n = intCount(outCount, info_, call);
  std::vector<std::byte> staging(size_t(outCount) * info_.size * dtypeSize(dtype));
  MPI_Request request;
  check(MPI_Ialltoall(in, n, mpiType(dtype), staging.data(), n, mpiType(dtype), comm_, &request), call,
        &staging);
  wait(request, call, &staging);
  reduceRowsInOrder(out, staging.data(), outCount, info_.size, dtype, op);
}

// A reduce-scatter over uneven blocks (all-to-all-v, reduce in rank order), then an all-gather-v of the
// reduced blocks: each element is reduced once, on one rank, in rank order, and every rank receives that
// result.
void MpiCommunicator::allReduce(void* inout, int64_t count, DType dtype, ReduceOp op) {
  CollectiveCall call{"allReduce", reduceOpName(op), count, dtype};
  const int size = info_.size, rank = info_.rank;
  const size_t elementBytes = dtypeSize(dtype);
  std::vector<int> blockCounts(size), blockStarts(size), myCounts(size), myStarts(size);
  for (int i = 0; i < size; ++i) {
    blockCounts[i] = intCount(blockCount(count, size, i), info_, call);
    blockStarts[i] = intCount(blockStart(count, size, i), info_, call);
  }
  const int mine = blockCounts[rank];
  for (int i = 0; i < size; ++i) {
    myCounts[i] = mine;
    myStarts[i] = i * mine;
  }
  // staging: N rows of my block, then the reduced block.
  std::vector<std::byte> staging(size_t(mine) * (size + 1) * elementBytes);
  std::byte* reduced = staging.data() + size_t(mine) * size * elementBytes;
  MPI_Datatype type = mpiType(dtype);
  MPI_Request request;
  check(MPI_Ialltoallv(inout, blockCounts.data(), blockStarts.data(), type, staging.data(), myCounts.data(),
                       myStarts.data(), type, comm_, &request),
        call, &staging);
  wait(request, call, &staging);
  reduceRowsInOrder(reduced, staging.data(), mine, size, dtype, op);
  check(MPI_Iallgatherv(reduced, mine, type, inout, blockCounts.data(), blockStarts.data(), type, comm_,
                        &request),
        call, &staging);
  wait(request, call, &staging);
}

void MpiCommunicator::broadcast(void* data, int64_t count, DType dtype, int root) {
  CollectiveCall call{"broadcast", nullptr, count, dtype};
  MPI_Request request;
  check(MPI_Ibcast(data, intCount(count, info_, call), mpiType(dtype), root, comm_, &request), call);
  wait(request, call);
}

void MpiCommunicator::allToAll(void* out, const void* in, int64_t count, DType dtype) {
  CollectiveCall call{"allToAll", nullptr, count, dtype};
  int n = intCount(count / info_.size, info_, call);
  std::vector<std::byte> staging;
  if (in == out) {  // in place: send from a copy
    staging.resize(size_t(count) * dtypeSize(dtype));
    std::memcpy(staging.data(), in, staging.size());
    in = staging.data();
  }
  MPI_Request request;
  check(MPI_Ialltoall(in, n, mpiType(dtype), out, n, mpiType(dtype), comm_, &request), call, &staging);
  wait(request, call, &staging);
}

void MpiCommunicator::sendReceive(const std::vector<Transfer>& sends, const std::vector<Transfer>& receives,
                                  const std::string& peers) {
  CollectiveCall call = sendReceiveCall(sends, receives, peers);
  std::vector<MPI_Request> requests;
  requests.reserve(sends.size() + receives.size());
  // Receives first, so that a peer's eager sends find them posted.
  for (const auto& t : receives) {
    requests.emplace_back();
    check(MPI_Irecv(t.data, intCount(t.count, info_, call), mpiType(t.dtype), t.peer, t.tag, comm_,
                    &requests.back()),
          call);
  }
  for (const auto& t : sends) {
    requests.emplace_back();
    check(MPI_Isend(t.data, intCount(t.count, info_, call), mpiType(t.dtype), t.peer, t.tag, comm_,
                    &requests.back()),
          call);
  }
  waitAll(requests, call);
}

void MpiCommunicator::barrier() {
  CollectiveCall call{"barrier", nullptr, 0, DType::U8};
  MPI_Request request;
  check(MPI_Ibarrier(comm_, &request), call);
  wait(request, call);
}

}  // namespace strata::dist
#endif
