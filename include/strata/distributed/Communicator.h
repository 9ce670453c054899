// Communicator: the collectives of one process group, on Tensors.
//
// The distributed layer (include/strata/distributed, src/distributed) keeps the short namespace strata::dist,
// as torch.distributed is imported as dist.
//
// Every rank of the group calls the same collectives in the same order, with tensors of the same dtype and
// size. The tensors are contiguous, and `in`/`out` are on the same device. Sizes are equal shards: for a
// group of N ranks, allGather takes in.numel() * N == out.numel(), reduceScatter in.numel() == out.numel() *
// N, allToAll in.numel() == out.numel() divisible by N (block i of `in` goes to rank i; block i of `out`
// comes from rank i). Dtypes: f32, bf16, f16, f64, i32, i64, u8. In-place forms: allGather with `in` being
// this rank's block of `out`, reduceScatter with `out` being this rank's block of `in`, allToAll with in ==
// out. Other overlaps of `in` and `out` are refused.
//
// Backends. CPU tensors go through MPI. CUDA tensors go through NCCL, or through MPI with host staging where
// ranks share a GPU (NOTE [GPU collectives] in ParallelContext.h). A group of one rank needs neither: its
// collectives are copies (or nothing), so one process without mpirun runs the same code path; a one-rank
// group made with NCCL (dist.gpu_collectives: nccl) sends every collective through NCCL instead
// (communicates()).
//
// NOTE [Collective ordering and completion]
// A CPU collective has completed when the call returns. A CUDA collective is enqueued on a stream of its
// device, its lane's (NOTE [Collective lanes]), and the call returns without waiting for the GPU: order it
// after the work that produced `in` with an Event (record on the producer's stream, block the lane's stream),
// and order the consumers of `out` after it the same way. The tensors' storages are marked as used on that
// stream (recordStream), so freeing them early is safe. barrier() is a host-side barrier of the ranks'
// threads; it does not wait for the GPU.
//
// NOTE [Collective lanes]
// All-gathers run on the gather stream (deviceStreams(device).gather), every other collective on the comm
// stream (deviceStreams(device).comm), each with an NCCL communicator of its own: a stage-3 parameter gather
// that the next module waits for does not queue behind the gradients' reduce-scatters. Each lane keeps the
// issue order, which every rank shares.
//
// NOTE [Staged GPU collectives]
// Where ranks share a GPU, NCCL cannot run (one GPU may not be two ranks of a communicator). A CUDA
// collective then copies its input to pinned host memory on its lane's stream, waits for the copy, runs the
// MPI collective on the host (rank-ordered sums: NOTE [Deterministic reductions]), and copies the result back
// on the same stream: the same stream and event contract as NCCL, so the engine's waits are exercised as they
// would be on separate GPUs. It is a correctness mode, not a fast one: the host waits for every collective.
//
// NOTE [Point-to-point]
// sendReceive posts a set of sends and receives between pairs of ranks of the group and returns when all of
// them have completed (CPU), or are enqueued (CUDA: on the comm lane, as a collective; NOTE [Collective
// ordering and completion]). A send to `peer` with `tag` matches the receive from this rank with the same tag
// on `peer`, of the same dtype and element count; several transfers between one pair with one tag match in
// the order each side lists them. Posting the sends and receives of both directions together (Megatron's
// batch_isend_irecv) is what lets two ranks that both send and receive not wait for each other: a pipeline
// schedule's send-forward-receive-backward is one call. CPU tensors go through MPI_Isend/MPI_Irecv (the tag
// is MPI's), polled against the deadline; CUDA tensors through ncclSend/ncclRecv inside one
// ncclGroupStart/End, ordered by (peer, tag, listed order) on both sides so the sequences match without tags;
// staged GPU groups copy through the host. A transfer that does not complete within dist.timeout_s fails like
// a collective (NOTE [Collective timeouts]), naming the peers.
//
// NOTE [Comm delay]
// STRATA_COMM_DELAY_US=N (a test switch) puts a kernel that holds the lane's stream for N microseconds before
// each CUDA collective (ops::spin). A consumer that reads a collective's output without waiting for its
// stream then reads it before it is written, and a test sees wrong numbers instead of passing by luck.
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
//   of one sum are not bitwise equal. Staged CUDA collectives sum as the CPU does.
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
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "strata/core/Device.h"
#include "strata/core/Storage.h"
#include "strata/core/Stream.h"
#include "strata/core/Tensor.h"

namespace strata::dist {

class MpiCommunicator;   // src/distributed: the MPI backend
class NcclCommunicator;  // src/distributed: the NCCL backend

enum class ReduceOp { Sum, Max };

// One send or receive of sendReceive (NOTE [Point-to-point]): a contiguous tensor and the group rank of the
// peer; `tag` tells apart transfers between the same pair (a pipeline's activations and gradients).
struct PeerTransfer {
  Tensor tensor;
  int peer = 0;
  int tag = 0;
};
const char* reduceOpName(ReduceOp op);

// How a group moves CUDA tensors (dist.gpu_collectives; NOTE [GPU collectives] in ParallelContext.h): NCCL,
// or MPI through pinned host memory (Staged). Auto chooses between them at start.
enum class GpuCollectives { Auto, Nccl, Staged };
const char* gpuCollectivesName(GpuCollectives mode);
// "auto", "nccl" or "staged"; anything else is an error naming the key.
GpuCollectives parseGpuCollectives(const std::string& text);

// The stream of a collective's lane on `device` (NOTE [Collective lanes]): the gather stream for all-gathers,
// the comm stream for every other collective.
const Stream& collectiveStream(Device device, bool gather);

// What names a group in errors, and how long its collectives may take.
struct GroupInfo {
  std::string name = "world";
  int rank = 0;
  int size = 1;
  double timeoutSeconds = 300;  // dist.timeout_s
  // Whether a failed NCCL collective's watchdog aborts the job when the process has not ended a few seconds
  // after the failure (ParallelOptions::abortOnFailure).
  bool abortJobOnFailure = true;
};

class Communicator {
 public:
  // The backends of a group. `mpi` serves CPU tensors and, with gpu == Staged, CUDA tensors too; `nccl` (the
  // comm lane) and `ncclGather` (the gather lane) serve CUDA tensors with gpu == Nccl. A group of one rank
  // needs none; given NCCL it uses it anyway (communicates()). A group without a backend for a device refuses
  // its tensors.
  struct Backends {
    std::unique_ptr<MpiCommunicator> mpi;
    std::unique_ptr<NcclCommunicator> nccl;
    std::unique_ptr<NcclCommunicator> ncclGather;
    GpuCollectives gpu = GpuCollectives::Auto;
  };
  // A communicator for `info`. ParallelContext builds these.
  Communicator(GroupInfo info, Backends backends);
  // A group of one rank without backends: its collectives are copies.
  explicit Communicator(GroupInfo info);
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
  // NOTE [Point-to-point]: every send and receive posted together, completed together.
  void sendReceive(const std::vector<PeerTransfer>& sends, const std::vector<PeerTransfer>& receives);
  void send(const Tensor& t, int peer, int tag = 0) { sendReceive({PeerTransfer{t, peer, tag}}, {}); }
  void receive(const Tensor& t, int peer, int tag = 0) { sendReceive({}, {PeerTransfer{t, peer, tag}}); }

  // True when collectives really communicate: a group of several ranks, or one rank given NCCL. False for a
  // trivial one-rank group, whose collectives are local copies and which callers may skip altogether.
  bool communicates() const { return info_.size > 1 || nccl_ != nullptr; }
  // How CUDA tensors travel in this group: Nccl, Staged, or Auto for a trivial group.
  GpuCollectives gpuCollectives() const { return gpu_; }

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
  // True when a collective of `device`'s tensors is a local copy (or nothing): one rank, and for CUDA tensors
  // no NCCL (a one-rank NCCL group still sends CPU tensors nowhere).
  bool local(Device device) const { return info_.size == 1 && !(device.isCuda() && nccl_ != nullptr); }
  // The copy a one-rank group does in place of a collective.
  void localCopy(const Tensor& out, const Tensor& in, bool gather) const;
  // NOTE [Comm delay]: the spin before a CUDA collective on its lane, when STRATA_COMM_DELAY_US is set.
  void delayLane(Device device, bool gather) const;
  // NOTE [Staged GPU collectives]: `hostOp(hostOut, hostIn)` runs the MPI collective on pinned copies of
  // `out` and `in` (hostIn null when `in` is `out`; an in-place all-gather's `in` lands in its block of
  // hostOut).
  void staged(const Tensor& out, const Tensor& in, bool gather, bool inPlaceGather,
              const std::function<void(void* hostOut, const void* hostIn)>& hostOp);
  // Pinned host memory for staging, grown as needed; used by one collective at a time.
  void* stagingBuffer(size_t index, size_t bytes);

  GroupInfo info_;
  std::unique_ptr<MpiCommunicator> mpi_;
  std::unique_ptr<NcclCommunicator> nccl_;
  std::unique_ptr<NcclCommunicator> ncclGather_;
  GpuCollectives gpu_ = GpuCollectives::Auto;
  struct Staging {
    void* data = nullptr;
    size_t bytes = 0;
  };
  Staging staging_[2];  // out, in
  Device stagedDevice_;
  mutable std::mutex mutex_;
  std::string failure_;
  std::vector<Storage> abandoned_;  // storages of a failed collective, never freed
};

// Every rank's text, in rank order, through the CPU (MPI) path: the lengths, then the texts padded to the
// longest (two all-gathers; a group of one returns its own).
std::vector<std::string> allGatherText(Communicator& comm, const std::string& text);

}  // namespace strata::dist
