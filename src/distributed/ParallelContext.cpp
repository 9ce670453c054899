#include "strata/distributed/ParallelContext.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "distributed/MpiCommunicator.h"
#include "distributed/NcclCommunicator.h"
#include "strata/core/Error.h"
#include "strata/core/Stream.h"

namespace strata::dist {

RankTopology rankTopology(const std::vector<RankPlace>& places, int rank) {
  STRATA_CHECK(rank >= 0 && size_t(rank) < places.size(), "rankTopology: rank {} of {} places", rank,
               places.size());
  RankTopology t;
  const RankPlace& me = places[size_t(rank)];
  std::map<std::pair<std::string, std::string>, int> perGpu;  // (host, gpu) -> ranks
  std::set<std::string> gpusHere;
  t.ranksOnHost = 0;
  t.ranksOnDevice = 0;
  for (const RankPlace& p : places) {
    if (p.host == me.host) {
      ++t.ranksOnHost;
      if (p.gpu == me.gpu) ++t.ranksOnDevice;
      if (!p.gpu.empty()) gpusHere.insert(p.gpu);
    }
    if (!p.gpu.empty()) ++perGpu[{p.host, p.gpu}];
  }
  t.gpusOnHost = int(gpusHere.size());
  t.mostRanksOnOneGpu = perGpu.empty() ? 1 : 0;
  for (const auto& [where, ranks] : perGpu)
    if (ranks > t.mostRanksOnOneGpu) {
      t.mostRanksOnOneGpu = ranks;
      t.busiestHost = where.first;
      t.busiestGpu = where.second;
    }
  return t;
}

GpuCollectives resolveGpuCollectives(GpuCollectives asked, int worldSize, const RankTopology& topology) {
  if (worldSize == 1) return asked == GpuCollectives::Nccl ? GpuCollectives::Nccl : GpuCollectives::Auto;
  if (asked == GpuCollectives::Staged) return GpuCollectives::Staged;
  if (topology.mostRanksOnOneGpu <= 1) return GpuCollectives::Nccl;
  STRATA_USER_CHECK(asked != GpuCollectives::Nccl,
                    "dist.gpu_collectives is nccl, but {} ranks share one GPU (UUID {} on host {}): NCCL "
                    "needs a GPU per rank. "
                    "This job has {} ranks; launch at most one rank per GPU, or set dist.gpu_collectives: "
                    "staged (MPI through "
                    "host memory, a correctness mode)",
                    topology.mostRanksOnOneGpu, topology.busiestGpu.substr(0, 8),
                    topology.busiestHost.substr(0, topology.busiestHost.find('/')), worldSize);
  return GpuCollectives::Staged;
}

bool builtWithNccl() {
  return STRATA_NCCL != 0;
}

namespace {

std::unique_ptr<ProcessGroup> trivialGroup(GroupInfo info) {
  return std::make_unique<ProcessGroup>(std::make_unique<Communicator>(std::move(info)));
}

#if STRATA_NCCL
// Both lanes' NCCL communicators of a group (NOTE [Collective lanes]); `share` gives every rank rank 0's id.
void addNccl(Communicator::Backends& b, const GroupInfo& info, Device device,
             const NcclCommunicator::ShareId& share) {
  const DeviceStreams& streams = deviceStreams(device);
  try {
    b.nccl = std::make_unique<NcclCommunicator>(info, device.index, streams.comm, share);
    b.ncclGather = std::make_unique<NcclCommunicator>(info, device.index, streams.gather, share);
  } catch (const Error& e) {
    // A rank whose NCCL cannot start stops every rank now: the others would wait out dist.timeout_s in their
    // own init and then blame a dead peer.
    std::fprintf(stderr,
                 "[strata] rank %d of group '%s': NCCL could not start on cuda:%d: %s; aborting the job\n",
                 info.rank, info.name.c_str(), device.index, e.message().c_str());
    std::fflush(stderr);
#if STRATA_MPI
    if (info.size > 1) MpiCommunicator::abortJob(1);
#endif
    throw;
  }
  b.gpu = GpuCollectives::Nccl;
}
#endif

#if STRATA_MPI
// NOTE [MPI lifetime] in strata/distributed/ParallelContext.h.
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

std::unique_ptr<ProcessGroup> mpiGroup(GroupInfo info, MPI_Comm comm, Device device, GpuCollectives gpu) {
  Communicator::Backends b;
  b.mpi = std::make_unique<MpiCommunicator>(comm, info);
  b.gpu = device.isCuda() ? gpu : GpuCollectives::Auto;
  if (device.isCuda() && gpu == GpuCollectives::Nccl) {
#if STRATA_NCCL
    MpiCommunicator* mpi = b.mpi.get();
    addNccl(b, info, device,
            [mpi](ncclUniqueId& id) { mpi->broadcast(&id, int64_t(sizeof(id)), DType::U8, 0); });
#else
    STRATA_USER_FAIL(
        "dist: group '{}' of {} ranks on {} needs NCCL, and this build has none; set "
        "dist.gpu_collectives: staged to move CUDA tensors through MPI",
        info.name, info.size, device);
#endif
  }
  return std::make_unique<ProcessGroup>(std::make_unique<Communicator>(std::move(info), std::move(b)));
}

// Every rank's place (host and GPU), gathered over `comm`.
std::vector<RankPlace> gatherPlaces(MPI_Comm comm, int size, Device device) {
  constexpr size_t kField = 128;
  std::string host = hostIdentity(), gpu = deviceUuid(device);
  std::vector<char> mine(2 * kField, '\0'), all(2 * kField * size_t(size), '\0');
  std::memcpy(mine.data(), host.data(), std::min(host.size(), kField - 1));
  std::memcpy(mine.data() + kField, gpu.data(), std::min(gpu.size(), kField - 1));
  int rc =
      MPI_Allgather(mine.data(), int(mine.size()), MPI_CHAR, all.data(), int(mine.size()), MPI_CHAR, comm);
  STRATA_CHECK(rc == MPI_SUCCESS, "dist: exchanging the ranks' hosts and GPUs failed (MPI code {})", rc);
  std::vector<RankPlace> places(static_cast<size_t>(size));
  for (size_t r = 0; r < places.size(); ++r) {
    places[r].host = std::string(all.data() + r * 2 * kField);
    places[r].gpu = std::string(all.data() + r * 2 * kField + kField);
  }
  return places;
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
  topology_.ranksOnHost = launch_.localSize;
  topology_.ranksOnDevice = launch_.localSize;
  if (options_.deviceType == DeviceType::CUDA) {
    int count = cudaDeviceCount();
    STRATA_USER_CHECK(count > 0, "rank {}: a CUDA run was asked for, but no CUDA device is visible",
                      launch_.rank);
    device_ = Device::cuda(gpuForLocalRank(launch_.localRank, count));
    setProcessDevice(device_);  // NOTE [Process device]
    topology_.ranksOnDevice = (launch_.localSize + count - 1 - device_.index) / count;
    topology_.gpusOnHost = std::min(count, launch_.localSize);
  }
  GroupInfo world{"world", launch_.rank, launch_.worldSize, options_.timeoutSeconds, options_.abortOnFailure};
  if (launch_.worldSize == 1) {
    gpu_ = device_.isCuda() ? resolveGpuCollectives(options_.gpuCollectives, 1, topology_)
                            : GpuCollectives::Auto;
    if (gpu_ == GpuCollectives::Nccl) {
#if STRATA_NCCL
      // NOTE [GPU collectives]: one rank through NCCL; the id needs no sending.
      Communicator::Backends b;
      addNccl(b, world, device_, {});
      groups_.push_back(std::make_unique<ProcessGroup>(std::make_unique<Communicator>(world, std::move(b))));
      return;
#else
      STRATA_USER_FAIL("dist.gpu_collectives is nccl, and this build of Strata has no NCCL");
#endif
    }
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
  topology_ = rankTopology(gatherPlaces(comm, launch_.worldSize, device_), launch_.rank);
  if (device_.isCuda()) {
    gpu_ = resolveGpuCollectives(options_.gpuCollectives, launch_.worldSize, topology_);
    static std::atomic<bool> told{false};  // once per process, however many contexts a test makes
    if (gpu_ == GpuCollectives::Staged && launch_.rank == 0 && !told.exchange(true))
      spdlog::warn(
          "dist: CUDA collectives go through MPI and host memory ({}): a correctness mode, not a fast one",
          options_.gpuCollectives == GpuCollectives::Staged
              ? "dist.gpu_collectives: staged"
              : fmt::format("{} ranks share one GPU", topology_.mostRanksOnOneGpu));
  }
  groups_.push_back(mpiGroup(world, comm, device_, gpu_));
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
    std::fprintf(stderr, "[strata] rank %d: a collective failed (%s); aborting the job\n", launch_.rank,
                 failure().c_str());
    std::fflush(stderr);
    MpiCommunicator::abortJob(1);
  }
  while (!groups_.empty()) groups_.pop_back();  // newest first: split groups before the world
}

ProcessGroup& ParallelContext::split(const std::string& name, const ProcessGroup& parent, int color,
                                     int key) {
  STRATA_CHECK(!hasGroup(name), "dist: a group named '{}' exists already", name);
  if (parent.size() == 1) {
    groups_.push_back(trivialGroup(GroupInfo{name, 0, 1, options_.timeoutSeconds, options_.abortOnFailure}));
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
  GroupInfo info{name, rank, size, options_.timeoutSeconds, options_.abortOnFailure};
  if (size == 1) {
    MPI_Comm_free(&comm);
    groups_.push_back(trivialGroup(info));
  } else {
    groups_.push_back(mpiGroup(info, comm, device_, gpu_));
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

std::string ParallelContext::failure() const {
  for (const auto& g : groups_)
    if (g->communicator().failed())
      return detail::format("group '{}': {}", g->name(), g->communicator().failure());
  return {};
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
