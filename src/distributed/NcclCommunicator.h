// Private to the dist layer: the NCCL backend of Communicator, for CUDA tensors. Built when STRATA_NCCL is
// on.
//
// The NCCL communicator is non-blocking (ncclConfig_t.blocking = 0): every NCCL call may return
// ncclInProgress and is then polled with ncclCommGetAsyncError, against the deadline. Collectives run on one
// stream of the device (the comm stream, or the gather stream for a group's all-gathers: NOTE [Collective
// lanes] in strata/distributed/Communicator.h). A watchdog thread keeps, for each collective in flight, an
// event recorded after it and its deadline; on a timeout or an asynchronous NCCL error it records the
// failure, writes it to stderr, aborts the NCCL communicator (kernels stuck waiting for a dead peer return,
// and so does any host thread synchronising on them), and aborts the job a few seconds later unless the
// process ended first (NOTE [Collective timeouts] in strata/distributed/Communicator.h). The next collective
// on this communicator throws the failure.
//
// NOTE [One thread in NCCL at a time]
// NCCL forbids concurrent calls on one communicator, and ncclCommAbort is one of them. Every NCCL call of
// this class (the launching thread's group calls and polls, the watchdog's polls and its abort) is made
// holding apiMutex_, and no call waits inside it: the communicator is non-blocking, so each call returns at
// once. The watchdog only tries the lock for its polls (the launching thread may hold it) and takes it for
// the abort. Lock order: apiMutex_ before mutex_ (the state's), never the other way.
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
#include <vector>

#include "distributed/CollectiveCall.h"
#include "strata/core/Stream.h"
#include "strata/distributed/Communicator.h"

namespace strata::dist {

class NcclCommunicator {
 public:
  // Gives every rank of the group the same NCCL unique id: rank 0 fills it, `share` sends it to the others
  // (MPI_Bcast over the group's MPI communicator; nothing at one rank).
  using ShareId = std::function<void(ncclUniqueId& id)>;
  // Collective over the ranks of `info`: every rank joins the NCCL communicator on CUDA device `deviceIndex`,
  // its collectives on `stream` (a stream of that device).
  NcclCommunicator(GroupInfo info, int deviceIndex, const Stream& stream, const ShareId& share);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int deviceIndex() const { return deviceIndex_; }
  const Stream& stream() const { return stream_; }

  // As MpiCommunicator's; pointers are device memory of deviceIndex.
  void allGather(void* out, const void* in, int64_t count, DType dtype);
  void reduceScatter(void* out, const void* in, int64_t outCount, DType dtype, ReduceOp op);
  void allReduce(void* inout, int64_t count, DType dtype, ReduceOp op);
  void broadcast(void* data, int64_t count, DType dtype, int root);
  void allToAll(void* out, const void* in, int64_t count, DType dtype);
  // NOTE [Point-to-point] in strata/distributed/Communicator.h: every ncclSend and ncclRecv in one group, in
  // the order given (the caller orders them alike on both sides). `peers` describes them for errors.
  struct Transfer {
    void* data = nullptr;
    int64_t count = 0;
    DType dtype = DType::U8;
    int peer = 0;
  };
  void sendReceive(const std::vector<Transfer>& sends, const std::vector<Transfer>& receives,
                   const std::string& peers);

  // The first failure seen by the watchdog or a call; empty while healthy.
  std::string failure() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct InFlight {
    Event done;
    Clock::time_point deadline;
    CollectiveCall call;
  };
  // Runs `launch` (NCCL calls inside one group; it returns the first call's error) on the stream, waits out
  // ncclInProgress, and hands the collective to the watchdog.
  void enqueue(const CollectiveCall& call, const std::function<ncclResult_t()>& launch);
  // Waits until the communicator's asynchronous state is no longer ncclInProgress; fails on an error or at
  // the deadline.
  void settle(const CollectiveCall& call, Clock::time_point deadline);
  void watch();
  void watchOnce();
  // Records the first failure and aborts the NCCL communicator once (takes apiMutex_, then mutex_).
  void fail(const std::string& message);

  GroupInfo info_;
  int deviceIndex_;
  Stream stream_;
  ncclComm_t comm_ = nullptr;
  std::mutex apiMutex_;   // NOTE [One thread in NCCL at a time]
  bool aborted_ = false;  // under apiMutex_: comm_ was aborted and must not be called again
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
