#include "strata/dist/ParallelContext.h"

#include <cstdio>
#include <cstdlib>

#include "dist/MpiCommunicator.h"
#include "dist/NcclCommunicator.h"
#include "strata/core/Error.h"

namespace strata::dist {

namespace {

std::unique_ptr<ProcessGroup> trivialGroup(GroupInfo info) {
  return std::make_unique<ProcessGroup>(std::make_unique<Communicator>(std::move(info), nullptr, nullptr));
}

#if STRATA_MPI
// NOTE [MPI lifetime] in strata/dist/ParallelContext.h.
void ensureMpiInitialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  STRATA_CHECK(!finalized,
               "dist: MPI was finalised already; a ParallelContext of several ranks cannot start");
  int provided = 0;
  int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  STRATA_CHECK(rc == MPI_SUCCESS, "dist: MPI_Init_thread failed with code {}", rc);
  std::atexit([] {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
  });
}

std::unique_ptr<ProcessGroup> mpiGroup(GroupInfo info, MPI_Comm comm, Device device) {
  auto mpi = std::make_unique<MpiCommunicator>(comm, info);
  std::unique_ptr<NcclCommunicator> nccl;
#if STRATA_NCCL
  if (device.isCuda()) nccl = std::make_unique<NcclCommunicator>(*mpi, device.index);
#else
  STRATA_USER_CHECK(device.isCpu(), "dist: group '{}' of {} ranks on {} needs NCCL, and this build has none",
                    info.name, info.size, device);
#endif
  return std::make_unique<ProcessGroup>(
      std::make_unique<Communicator>(std::move(info), std::move(mpi), std::move(nccl)));
}
#endif

}  // namespace

ParallelContext::ParallelContext(ParallelOptions options)
    : ParallelContext(launchInfoFromEnvironment(), options) {}

ParallelContext::ParallelContext(const LaunchInfo& launch, ParallelOptions options)
    : launch_(launch), options_(options) {
  STRATA_USER_CHECK(options_.timeoutSeconds > 0, "dist.timeout_s must be positive, got {}",
                    options_.timeoutSeconds);
  STRATA_CHECK(launch_.worldSize >= 1 && launch_.rank >= 0 && launch_.rank < launch_.worldSize,
               "dist: rank {} of {} ranks", launch_.rank, launch_.worldSize);
  if (options_.deviceType == DeviceType::CUDA) {
    int count = cudaDeviceCount();
    STRATA_USER_CHECK(count > 0, "rank {}: a CUDA run was asked for, but no CUDA device is visible",
                      launch_.rank);
    device_ = Device::cuda(gpuForLocalRank(launch_.localRank, count));
  }
  GroupInfo world{"world", launch_.rank, launch_.worldSize, options_.timeoutSeconds};
  if (launch_.worldSize == 1) {
    groups_.push_back(trivialGroup(world));
    return;
  }
#if STRATA_MPI
  ensureMpiInitialized();
  usesMpi_ = true;
  int mpiRank = 0, mpiSize = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpiRank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpiSize);
  STRATA_USER_CHECK(
      mpiRank == launch_.rank && mpiSize == launch_.worldSize,
      "the launch environment ({}) says rank {} of {}, but MPI says rank {} of {}; start the job "
      "with mpirun -np N",
      launch_.source, launch_.rank, launch_.worldSize, mpiRank, mpiSize);
  MPI_Comm comm = MPI_COMM_NULL;
  STRATA_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm) == MPI_SUCCESS, "dist: MPI_Comm_dup of the world failed");
  groups_.push_back(mpiGroup(world, comm, device_));
#else
  STRATA_USER_FAIL(
      "the launch environment ({}) says {} ranks, but this build of Strata has no MPI: install "
      "libopenmpi-dev "
      "and configure with -DSTRATA_MPI=ON",
      launch_.source, launch_.worldSize);
#endif
}

ParallelContext::~ParallelContext() {
  if (usesMpi_ && options_.abortOnFailure && failed()) {
    // NOTE [Failure aborts the job]
    std::fprintf(stderr, "[strata] rank %d: a collective failed; aborting the job\n", launch_.rank);
    std::fflush(stderr);
    MpiCommunicator::abortJob(1);
  }
  while (!groups_.empty()) groups_.pop_back();  // newest first: split groups before the world
}

ProcessGroup& ParallelContext::split(const std::string& name, const ProcessGroup& parent, int color,
                                     int key) {
  STRATA_CHECK(!hasGroup(name), "dist: a group named '{}' exists already", name);
  if (parent.size() == 1) {
    groups_.push_back(trivialGroup(GroupInfo{name, 0, 1, options_.timeoutSeconds}));
    return *groups_.back();
  }
#if STRATA_MPI
  MpiCommunicator* mpi = parent.communicator().mpiBackend();
  STRATA_CHECK(mpi != nullptr, "dist: group '{}' has no MPI communicator to split", parent.name());
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = MPI_Comm_split(mpi->comm(), color, key, &comm);
  STRATA_CHECK(rc == MPI_SUCCESS, "dist: splitting group '{}' into '{}' failed (MPI code {})", parent.name(),
               name, rc);
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  GroupInfo info{name, rank, size, options_.timeoutSeconds};
  if (size == 1) {
    MPI_Comm_free(&comm);
    groups_.push_back(trivialGroup(info));
  } else {
    groups_.push_back(mpiGroup(info, comm, device_));
  }
  return *groups_.back();
#else
  STRATA_FAIL("dist: splitting group '{}' of {} ranks needs MPI", parent.name(), parent.size());
#endif
}

bool ParallelContext::hasGroup(const std::string& name) const {
  for (const auto& g : groups_) {
    if (g->name() == name) return true;
  }
  return false;
}

ProcessGroup& ParallelContext::group(const std::string& name) const {
  std::string known;
  for (const auto& g : groups_) {
    if (g->name() == name) return *g;
    known += (known.empty() ? "" : ", ") + g->name();
  }
  STRATA_FAIL("dist: no group named '{}' (groups: {})", name, known);
}

bool ParallelContext::failed() const {
  for (const auto& g : groups_) {
    if (g->communicator().failed()) return true;
  }
  return false;
}

void ParallelContext::abort(const std::string& message, int code) const {
  std::fflush(stdout);
  std::fprintf(stderr, "[strata] rank %d: %s; aborting the job\n", launch_.rank, message.c_str());
  std::fflush(stderr);
#if STRATA_MPI
  if (usesMpi_) MpiCommunicator::abortJob(code);
#endif
  std::_Exit(code);
}

}  // namespace strata::dist
