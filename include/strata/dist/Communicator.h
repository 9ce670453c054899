// Communicator: the collectives of one process group, on Tensors.
//
// Every rank of the group calls the same collectives in the same order, with tensors of the same dtype and
// size. The tensors are contiguous, and `in`/`out` are on the same device. Sizes are equal shards: for a
// group of N ranks, allGather takes in.numel() * N == out.numel(), reduceScatter in.numel() == out.numel() *
// N, allToAll in.numel() == out.numel() divisible by N (block i of `in` goes to rank i; block i of `out`
// comes from rank i). Dtypes: f32, bf16, f16, f64, i32, i64, u8. In-place forms: allGather with `in` being
// this rank's block of `out`, reduceScatter with `out` being this rank's block of `in`, allToAll with in ==
// out. Other overlaps of `in` and `out` are refused.
//
// Backends. CPU tensors go through MPI, CUDA tensors through NCCL. A group of one rank needs neither: its
// collectives are copies (or nothing), so one process without mpirun runs the same code path.
//
// NOTE [Collective ordering and completion]
// A CPU collective has completed when the call returns. A CUDA collective is enqueued on the comm stream of
// its device (deviceStreams(device).comm) and the call returns without waiting for the GPU: order it after
// the work that produced `in` with an Event (record on the producer's stream, block the comm stream), and
// order the consumers of `out` after it the same way. The tensors' storages are marked as used on the comm
// stream (recordStream), so freeing them early is safe. barrier() is a host-side barrier of the ranks'
// threads; it does not wait for the GPU.
//
// NOTE [Deterministic reductions]
// Sums are bitwise reproducible from run to run.
// - CPU (MPI): each element is reduced on one rank, over the ranks' values in rank order 0, 1, ..., N-1,
//   accumulating in f32 for f32/bf16/f16 (one rounding to bf16/f16 at the end), f64 for f64 and the integer
//   type for integers; the result then goes to every rank. So an all-reduce equals the serial loop
//   `acc = x0; acc += x1; ...` over the ranks' tensors, whatever the MPI library's algorithms are. It moves
//   the data twice (an all-to-all, then an all-gather): correct and deterministic over fast, for the CPU.
// - CUDA (NCCL): NCCL's own order, which is fixed for a given world size, message size and NCCL version and
//   settings (NCCL_ALGO, NCCL_PROTO); bf16/f16 sums round at each step of NCCL's ring. CPU and CUDA results
//   of one sum are not bitwise equal.
//
// NOTE [Collective timeouts]
// A collective that has not completed within the group's timeout (`dist.timeout_s`) fails with a
// strata::Error naming the op, the rank, the group and the sizes; the message is also written to stderr at
// once. A failed communicator refuses all later collectives, and the ParallelContext that owns it aborts the
// whole job (MPI_Abort) when it is destroyed, so no rank is left hanging: see ParallelContext.h. MPI
// collectives are non-blocking ones polled against the deadline. NCCL collectives are watched by a thread
// that checks each one's completion event; on a timeout or an NCCL error it aborts the NCCL communicator
// (which frees the GPU and any host thread waiting on it), and aborts the job a few seconds later if the
// process has not ended.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "strata/core/Device.h"
#include "strata/core/Storage.h"
#include "strata/core/Tensor.h"

namespace strata::dist {

class MpiCommunicator;   // src/dist: the MPI backend
class NcclCommunicator;  // src/dist: the NCCL backend

enum class ReduceOp { Sum, Max };
const char* reduceOpName(ReduceOp op);

// What names a group in errors, and how long its collectives may take.
struct GroupInfo {
  std::string name = "world";
  int rank = 0;
  int size = 1;
  double timeoutSeconds = 300;  // dist.timeout_s
};

class Communicator {
 public:
  // A communicator for `info`. `mpi` and `nccl` are the backends for CPU and CUDA tensors; a group of one
  // rank needs neither, and a group without one refuses tensors of that device. ParallelContext builds these.
  Communicator(GroupInfo info, std::unique_ptr<MpiCommunicator> mpi, std::unique_ptr<NcclCommunicator> nccl);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  const GroupInfo& info() const { return info_; }
  int rank() const { return info_.rank; }
  int size() const { return info_.size; }

  // out = concat over ranks of in (rank order).
  void allGather(const Tensor& out, const Tensor& in);
  // out = block `rank` of the reduction over ranks of in.
  void reduceScatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::Sum);
  // inout = the reduction over ranks of inout.
  void allReduce(const Tensor& inout, ReduceOp op = ReduceOp::Sum);
  // t = root's t.
  void broadcast(const Tensor& t, int root);
  // Block i of out = block `rank` of rank i's in.
  void allToAll(const Tensor& out, const Tensor& in);
  void barrier();

  // True once a collective of this communicator timed out or failed; the first failure's message.
  bool failed() const;
  std::string failure() const;

  // The backends, for ParallelContext (splitting groups, sending NCCL ids). Null when absent.
  MpiCommunicator* mpiBackend() const { return mpi_.get(); }
  NcclCommunicator* ncclBackend() const { return nccl_.get(); }

 private:
  // Checks the group is healthy and the tensors are usable; returns their device.
  Device checkTensors(const char* op, const Tensor& out, const Tensor& in) const;
  // Runs `body`; on an error, records the failure and keeps the tensors' bytes alive (a timed-out transfer
  // may still write into them) before rethrowing.
  template <class Body>
  void guarded(const Tensor& out, const Tensor& in, Body&& body);
  // The copy a one-rank group does in place of a collective.
  void localCopy(const Tensor& out, const Tensor& in) const;

  GroupInfo info_;
  std::unique_ptr<MpiCommunicator> mpi_;
  std::unique_ptr<NcclCommunicator> nccl_;
  mutable std::mutex mutex_;
  std::string failure_;
  std::vector<Storage> abandoned_;  // storages of a failed collective, never freed
};

}  // namespace strata::dist
