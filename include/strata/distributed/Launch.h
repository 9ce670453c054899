// Launch: who this process is in the job, read from the environment the launcher set.
//
// `mpirun -np N strata train cfg.yaml` starts N ranks; Open MPI gives each one OMPI_COMM_WORLD_RANK, _SIZE
// and _LOCAL_RANK. Other launchers (torchrun-style scripts, srun) are recognised by LOCAL_RANK or
// SLURM_LOCALID, with RANK/WORLD_SIZE (or SLURM_PROCID/SLURM_NTASKS) for the global numbers; MPI must still
// be able to start under them (srun with PMI support). With none of these set, the process is a single rank.
// The number of ranks on this host (which share its memory, disk, cores and GPUs) comes from
// OMPI_COMM_WORLD_LOCAL_SIZE, else LOCAL_WORLD_SIZE (torchrun) or LOCAL_SIZE; unknown, it is 1.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace strata::dist {

struct LaunchInfo {
  int rank = 0;       // in the world, 0..worldSize-1
  int worldSize = 1;  // number of ranks in the job
  int localRank = 0;  // among the ranks on this host; picks the GPU
  int localSize = 1;  // ranks on this host: they split its memory, disk and cores (NOTE [Per-node shares])
  bool underMpi = false;  // OMPI_COMM_WORLD_* were set (started by Open MPI's mpirun)
  // Where the numbers came from: "mpirun", "LOCAL_RANK", "SLURM" or "single".
  std::string source = "single";
};

// Reads the process environment (see the top of this file). A variable that is set but not a valid number, or
// a rank outside [0, size), is an error naming the variable.
LaunchInfo launchInfoFromEnvironment();
// The same, reading variables through `lookup` (nullptr for unset), so tests need not touch the environment.
LaunchInfo launchInfoFrom(const std::function<const char*(const char*)>& lookup);

// The CUDA device of a rank: localRank % deviceCount. deviceCount must be positive.
int gpuForLocalRank(int localRank, int deviceCount);

// NOTE [Per-node shares]
// Ranks on one host share its memory, its disk and its cores. What Strata sizes automatically from the
// machine (the store's host and SSD budgets, the CPU threads of the optimizer and the CPU kernels) is the
// machine's amount divided by the ranks on the host, so N ranks never claim N times the host. An explicit
// budget (store.host_budget_gb, store.nvme_budget_gb) or train.threads is per rank and taken as given.
// `share` of `total` for one of `localSize` ranks (at least 1 when total is positive).
uint64_t perRankShare(uint64_t total, int localSize);

}  // namespace strata::dist
