// Private to the dist layer: the MPI backend of Communicator, for CPU tensors. Built when STRATA_MPI is on.
//
// Each collective is a non-blocking MPI one (MPI_Iallgather, MPI_Ialltoallv, ...) polled with MPI_Test until
// it completes or the group's deadline passes (NOTE [Collective timeouts] in
// strata/distributed/Communicator.h). The communicator's error handler returns errors instead of aborting, so
// an MPI failure (a peer's connection lost) becomes a strata::Error naming the collective too.
#pragma once

#if STRATA_MPI
#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "distributed/CollectiveCall.h"
#include "strata/distributed/Communicator.h"

namespace strata::dist {

class MpiCommunicator {
 public:
  // Takes ownership of `comm` (freed on destruction) and makes it return errors. `info.rank` and `info.size`
  // must be this process's place in `comm`.
  MpiCommunicator(MPI_Comm comm, GroupInfo info);
  ~MpiCommunicator();
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  MPI_Comm comm() const { return comm_; }
  const GroupInfo& info() const { return info_; }

  // Raw-buffer collectives; `count` is in elements of `dtype`, as in Communicator. in == nullptr means in
  // place (allGather: this rank's block of out is already there).
  void allGather(void* out, const void* in, int64_t count, DType dtype);
  void reduceScatter(void* out, const void* in, int64_t outCount, DType dtype, ReduceOp op);
  void allReduce(void* inout, int64_t count, DType dtype, ReduceOp op);
  void broadcast(void* data, int64_t count, DType dtype, int root);
  void allToAll(void* out, const void* in, int64_t count, DType dtype);
  void barrier();
  // NOTE [Point-to-point] in strata/distributed/Communicator.h: raw buffers; all posted, then all waited for.
  struct Transfer {
    void* data = nullptr;
    int64_t count = 0;
    DType dtype = DType::U8;
    int peer = 0;
    int tag = 0;
  };
  // `peers` describes the transfers for errors.
  void sendReceive(const std::vector<Transfer>& sends, const std::vector<Transfer>& receives,
                   const std::string& peers);

  // Aborts every process of the job (MPI_Abort on MPI_COMM_WORLD). Does not return.
  [[noreturn]] static void abortJob(int code);

 private:
  // Polls `request` until it completes; fails the collective on an MPI error or at the deadline. Staging
  // buffers a failed collective may still write into are kept (abandoned_) for the life of the communicator.
  void wait(MPI_Request& request, const CollectiveCall& call, std::vector<std::byte>* staging = nullptr);
  // The same for several requests (MPI_Testall).
  void waitAll(std::vector<MPI_Request>& requests, const CollectiveCall& call);
  // `rc` must be MPI_SUCCESS, else the collective fails with MPI's message.
  void check(int rc, const CollectiveCall& call, std::vector<std::byte>* staging = nullptr);
  [[noreturn]] void fail(const CollectiveCall& call, const std::string& reason,
                         std::vector<std::byte>* staging);

  MPI_Comm comm_;
  GroupInfo info_;
  std::vector<std::vector<std::byte>> abandoned_;
};

}  // namespace strata::dist
#else
namespace strata::dist {
// Absent from this build (STRATA_MPI off): an empty type, so Communicator's unique_ptr to it still compiles.
class MpiCommunicator {};
}  // namespace strata::dist
#endif
