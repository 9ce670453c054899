// Private to the dist layer: the NCCL backend of Communicator, for CUDA tensors. Built when STRATA_NCCL is
// on.
//
// The NCCL communicator is non-blocking (ncclConfig_t.blocking = 0): every NCCL call may return
// ncclInProgress and is then polled with ncclCommGetAsyncError, against the deadline. Collectives run on the
// comm stream of the device. A watchdog thread keeps, for each collective in flight, an event recorded after
// it and its deadline; on a timeout or an asynchronous NCCL error it records the failure, writes it to
// stderr, aborts the NCCL communicator (kernels stuck waiting for a dead peer return, and so does any host
// thread synchronising on them), and aborts the job a few seconds later unless the process ended first (NOTE
// [Collective timeouts] in strata/dist/Communicator.h). The next collective on this communicator throws the
// failure.
#pragma once

#if STRATA_NCCL
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "dist/CollectiveCall.h"
#include "strata/core/Stream.h"
#include "strata/dist/Communicator.h"

namespace strata::dist {

class MpiCommunicator;

class NcclCommunicator {
 public:
  // Collective over the ranks of `mpi`: rank 0 makes the NCCL unique id and sends it with MPI_Bcast, then
  // every rank joins the NCCL communicator on CUDA device `deviceIndex`.
  NcclCommunicator(MpiCommunicator& mpi, int deviceIndex);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int deviceIndex() const { return deviceIndex_; }
  // The stream collectives run on: deviceStreams(cuda(deviceIndex)).comm.
  const Stream& stream() const { return stream_; }

  // As MpiCommunicator's; pointers are device memory of deviceIndex.
  void allGather(void* out, const void* in, int64_t count, DType dtype);
  void reduceScatter(void* out, const void* in, int64_t outCount, DType dtype, ReduceOp op);
  void allReduce(void* inout, int64_t count, DType dtype, ReduceOp op);
  void broadcast(void* data, int64_t count, DType dtype, int root);
  void allToAll(void* out, const void* in, int64_t count, DType dtype);

  // The first failure seen by the watchdog or a call; empty while healthy.
  std::string failure() const;

 private:
  struct InFlight {
    Event done;
    std::chrono::steady_clock::time_point deadline;
    CollectiveCall call;
  };
  // Runs `launch` (NCCL calls inside one group) on the comm stream, waits out ncclInProgress, and hands the
  // collective to the watchdog.
  void enqueue(const CollectiveCall& call, const std::function<void()>& launch);
  // Waits until the communicator's asynchronous state is no longer ncclInProgress; fails on an error or at
  // the deadline.
  void settle(const CollectiveCall& call, std::chrono::steady_clock::time_point deadline);
  void watch();
  void recordFailure(const std::string& message);

  GroupInfo info_;
  int deviceIndex_;
  Stream stream_;
  ncclComm_t comm_ = nullptr;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<InFlight> inFlight_;
  std::string failure_;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace strata::dist
#else
namespace strata::dist {
// Absent from this build (STRATA_NCCL off): an empty type, so Communicator's unique_ptr to it still compiles.
class NcclCommunicator {};
}  // namespace strata::dist
#endif
