// ParallelContext: this process's place in a distributed job, and its process groups. No globals: code that
// communicates is handed a context (or one of its groups), and a test may build several in one process.
//
// Construction reads the launch environment (Launch.h). With one rank it touches no MPI at all: the world
// group's communicator is the trivial one (collectives are copies), so `strata train` without mpirun, and the
// unit tests, need no MPI runtime. With N > 1 ranks it initialises MPI (see NOTE [MPI lifetime]), checks
// MPI's world matches the launch environment, and makes the world group over a duplicate of MPI_COMM_WORLD.
// With deviceType CUDA it also picks this rank's GPU (localRank % device count) and makes an NCCL
// communicator for each group, its unique id sent by MPI_Bcast.
//
// Creating and splitting groups are collectives over the parent group: every rank of it must call them, in
// the same order. They are blocking MPI calls without the collective timeout (MPI has no non-blocking split).
//
// NOTE [MPI lifetime]
// MPI may be initialised once per process, and never again after MPI_Finalize. So the first context that
// needs MPI calls MPI_Init_thread (asking for MPI_THREAD_MULTIPLE: the collectives of different groups may
// come from different threads) unless MPI is already initialised (MPI_Initialized, MPI's own record: Strata
// keeps no flag), and registers MPI_Finalize with std::atexit. Contexts come and go without finalising MPI;
// a later context reuses the runtime. MPI_Finalize runs once at normal process exit, after main returns.
//
// NOTE [Failure aborts the job]
// When a collective of one of its groups has failed (timed out, or an MPI/NCCL error), destroying the context
// calls MPI_Abort on MPI_COMM_WORLD (unless ParallelOptions::abortOnFailure is off): the ranks still waiting
// for this one are stopped instead of waiting out their own timeouts, and mpirun exits non-zero. The usual
// flow is: the collective throws strata::Error, the error unwinds to the command's handler, which prints it,
// and the context dies on the way. A command that fails for another reason on one rank only (a bad file)
// should call abort() so the other ranks do not wait for it.
//
// NOTE [GPU collectives]
// A CUDA run of several ranks moves CUDA tensors through NCCL when every rank has a GPU of its own, and
// through MPI with host staging (NOTE [Staged GPU collectives] in Communicator.h) when some GPU serves
// several ranks: NCCL refuses one GPU as two ranks of a communicator. At start the ranks tell each other
// their host and GPU (MPI_Allgather of the host's identity and the GPU's UUID), and dist.gpu_collectives
// decides:
// - auto: NCCL, or staged where ranks share a GPU (logged once, as a correctness mode, not a fast one);
// - nccl: NCCL; where ranks share a GPU, an error on every rank naming the GPU and the counts;
// - staged: staged, always.
// At one rank, nccl makes a one-rank NCCL communicator that every collective goes through (the engine's
// one-rank shortcuts off: Communicator::communicates()), so one GPU runs NCCL's init, its dtypes, groups,
// send/receive and the watchdog. auto and staged keep the one-rank group's local copies.
// The context also makes its GPU the process's (NOTE [Process device] in core/Device.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "strata/core/Device.h"
#include "strata/distributed/Launch.h"
#include "strata/distributed/ProcessGroup.h"

namespace strata::dist {

struct ParallelOptions {
  double timeoutSeconds = 300;  // dist.timeout_s: how long one collective may take
  // CPU: groups communicate CPU tensors (MPI). CUDA: CUDA tensors too (NCCL), on device localRank % count.
  DeviceType deviceType = DeviceType::CPU;
  bool abortOnFailure = true;                            // NOTE [Failure aborts the job]
  GpuCollectives gpuCollectives = GpuCollectives::Auto;  // dist.gpu_collectives: NOTE [GPU collectives]
};

// Where one rank runs: its host's identity and its GPU's (empty on the CPU).
struct RankPlace {
  std::string host;
  std::string gpu;
};

// What the ranks' places say about one rank's neighbours (NOTE [Per-node shares] in Launch.h).
struct RankTopology {
  int ranksOnHost = 1;    // ranks on this rank's host, itself included
  int ranksOnDevice = 1;  // ranks on this rank's GPU (on its host for a CPU rank)
  int gpusOnHost = 0;     // distinct GPUs the ranks of this rank's host use
  // The GPU with the most ranks anywhere in the job, and how many; and that GPU's host.
  int mostRanksOnOneGpu = 1;
  std::string busiestGpu, busiestHost;
};
RankTopology rankTopology(const std::vector<RankPlace>& places, int rank);

// The collectives' path for CUDA tensors (NOTE [GPU collectives]): Nccl or Staged, or Auto at one rank
// where the group keeps its local copies. An error when `asked` is Nccl and ranks share a GPU.
GpuCollectives resolveGpuCollectives(GpuCollectives asked, int worldSize, const RankTopology& topology);

// True when this build has the NCCL backend (CUDA and MPI found NCCL).
bool builtWithNccl();

class ParallelContext {
 public:
  // From the process environment (launchInfoFromEnvironment()).
  explicit ParallelContext(ParallelOptions options = {});
  ParallelContext(const LaunchInfo& launch, ParallelOptions options);
  ~ParallelContext();
  ParallelContext(const ParallelContext&) = delete;
  ParallelContext& operator=(const ParallelContext&) = delete;

  const LaunchInfo& launch() const { return launch_; }
  const ParallelOptions& options() const { return options_; }
  int rank() const { return launch_.rank; }
  int worldSize() const { return launch_.worldSize; }
  int localRank() const { return launch_.localRank; }
  // Rank 0 logs, writes metrics and the checkpoint manifest.
  bool isMain() const { return launch_.rank == 0; }
  // Where this rank computes: the CPU, or cuda(localRank % device count) for deviceType CUDA.
  Device device() const { return device_; }
  // This rank's neighbours: from the ranks' places (MPI) with several ranks, else the launch environment's
  // local size (NOTE [Per-node shares] in Launch.h).
  const RankTopology& topology() const { return topology_; }
  // How CUDA tensors travel (Auto: a CPU context, or one rank with local copies).
  GpuCollectives gpuCollectives() const { return gpu_; }

  // The group of all ranks, named "world".
  ProcessGroup& world() const { return *groups_.front(); }
  // Splits `parent` into groups: ranks calling with the same `color` form one group named `name`, ordered by
  // (key, rank in parent). A collective over `parent`. The name must be new; returns this rank's group.
  ProcessGroup& split(const std::string& name, const ProcessGroup& parent, int color, int key);
  // The group called `name`; an error naming the known groups when there is none.
  ProcessGroup& group(const std::string& name) const;
  bool hasGroup(const std::string& name) const;

  // True when a collective of any group has failed; the first failed group's error (empty when none).
  bool failed() const;
  std::string failure() const;
  // Stops every rank of the job now: writes `message` to stderr, then MPI_Abort with `code` (one rank without
  // MPI: std::_Exit). For a failure on one rank that the others cannot see.
  [[noreturn]] void abort(const std::string& message, int code = 1) const;

 private:
  LaunchInfo launch_;
  ParallelOptions options_;
  Device device_;
  RankTopology topology_;
  GpuCollectives gpu_ = GpuCollectives::Auto;
  bool usesMpi_ = false;
  std::vector<std::unique_ptr<ProcessGroup>> groups_;  // world first
};

}  // namespace strata::dist
