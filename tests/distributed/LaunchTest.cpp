#include <map>
#include <string>

#include "TestUtil.h"

using namespace strata;
using namespace strata::dist;

namespace {
LaunchInfo launchFrom(const std::map<std::string, std::string>& env) {
  return launchInfoFrom([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}
}  // namespace

TEST_CASE("launch info comes from mpirun, then LOCAL_RANK, then SLURM, else one rank", "[dist]") {
  LaunchInfo single = launchFrom({});
  CHECK(single.rank == 0);
  CHECK(single.worldSize == 1);
  CHECK(single.localRank == 0);
  CHECK(!single.underMpi);
  CHECK(single.source == "single");

  LaunchInfo mpi = launchFrom({{"OMPI_COMM_WORLD_RANK", "3"},
                               {"OMPI_COMM_WORLD_SIZE", "4"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                               {"LOCAL_RANK", "7"}});
  CHECK(mpi.rank == 3);
  CHECK(mpi.worldSize == 4);
  CHECK(mpi.localRank == 1);
  CHECK(mpi.underMpi);
  CHECK(mpi.source == "mpirun");

  LaunchInfo torchrun = launchFrom({{"LOCAL_RANK", "1"}, {"RANK", "5"}, {"WORLD_SIZE", "8"}});
  CHECK(torchrun.rank == 5);
  CHECK(torchrun.worldSize == 8);
  CHECK(torchrun.localRank == 1);
  CHECK(!torchrun.underMpi);

  LaunchInfo slurm = launchFrom({{"SLURM_LOCALID", "2"}, {"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}});
  CHECK(slurm.rank == 6);
  CHECK(slurm.worldSize == 8);
  CHECK(slurm.localRank == 2);
  CHECK(slurm.source == "SLURM");
}

TEST_CASE("bad launch variables are errors that name the variable", "[dist]") {
  std::string bad = test::errorOf([] { launchFrom({{"OMPI_COMM_WORLD_RANK", "x1"}}); });
  CHECK(bad.find("OMPI_COMM_WORLD_RANK='x1'") != std::string::npos);
  std::string outside = test::errorOf([] {
    launchFrom({{"LOCAL_RANK", "0"}, {"RANK", "4"}, {"WORLD_SIZE", "4"}});
  });
  CHECK(outside.find("rank 4 (from RANK) is not below the world size 4 (from WORLD_SIZE)") !=
        std::string::npos);
}

TEST_CASE("the GPU of a rank is its local rank modulo the device count", "[dist]") {
  CHECK(gpuForLocalRank(0, 4) == 0);
  CHECK(gpuForLocalRank(5, 4) == 1);
  CHECK(gpuForLocalRank(3, 1) == 0);
  CHECK(!test::errorOf([] { gpuForLocalRank(0, 0); }).empty());
}

TEST_CASE("the ranks on a host come from the launcher's local size, and split the host's resources",
          "[dist]") {
  CHECK(launchFrom({}).localSize == 1);
  LaunchInfo mpi = launchFrom({{"OMPI_COMM_WORLD_RANK", "5"},
                               {"OMPI_COMM_WORLD_SIZE", "8"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  CHECK(mpi.localSize == 4);
  CHECK(launchFrom({{"LOCAL_RANK", "1"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}})
            .localSize == 2);
  CHECK(
      launchFrom({{"SLURM_LOCALID", "2"}, {"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"LOCAL_SIZE", "3"}})
          .localSize == 3);
  // A local size that does not hold the local rank is a launcher's mistake, named.
  std::string bad = test::errorOf([] {
    launchFrom({{"OMPI_COMM_WORLD_RANK", "3"},
                {"OMPI_COMM_WORLD_SIZE", "4"},
                {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  });
  CHECK(bad.find("OMPI_COMM_WORLD_LOCAL_SIZE=2 does not hold local rank 3") != std::string::npos);

  // NOTE [Per-node shares]
  CHECK(perRankShare(1000, 1) == 1000);
  CHECK(perRankShare(1000, 4) == 250);
  CHECK(perRankShare(16, 3) == 5);
  CHECK(perRankShare(2, 4) == 1);  // never nothing: one thread, one byte
  CHECK(perRankShare(0, 4) == 0);
}
