#include "strata/distributed/Launch.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "strata/core/Error.h"

namespace strata::dist {

namespace {

// The integer in environment variable `name`, or `fallback` when it is unset or empty.
int readInt(const std::function<const char*(const char*)>& lookup, const char* name, int fallback) {
  const char* text = lookup(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  STRATA_USER_CHECK(end != text && *end == '\0' && value >= 0 && value <= (1 << 30),
                    "environment variable {}='{}' is not a non-negative integer", name, text);
  return int(value);
}

bool isSet(const std::function<const char*(const char*)>& lookup, const char* name) {
  const char* text = lookup(name);
  return text != nullptr && *text != '\0';
}

}  // namespace

LaunchInfo launchInfoFrom(const std::function<const char*(const char*)>& lookup) {
  LaunchInfo info;
  const char* rankVar = "RANK";
  const char* sizeVar = "WORLD_SIZE";
  if (isSet(lookup, "OMPI_COMM_WORLD_RANK")) {
    rankVar = "OMPI_COMM_WORLD_RANK";
    sizeVar = "OMPI_COMM_WORLD_SIZE";
    info.rank = readInt(lookup, rankVar, 0);
    info.worldSize = readInt(lookup, sizeVar, 1);
    info.localRank = readInt(lookup, "OMPI_COMM_WORLD_LOCAL_RANK", info.rank);
    info.underMpi = true;
    info.source = "mpirun";
  } else if (isSet(lookup, "LOCAL_RANK")) {
    info.localRank = readInt(lookup, "LOCAL_RANK", 0);
    info.rank = readInt(lookup, rankVar, info.localRank);
    info.worldSize = readInt(lookup, sizeVar, info.rank + 1);
    info.source = "LOCAL_RANK";
  } else if (isSet(lookup, "SLURM_LOCALID")) {
    info.localRank = readInt(lookup, "SLURM_LOCALID", 0);
    rankVar = isSet(lookup, "RANK") ? "RANK" : "SLURM_PROCID";
    sizeVar = isSet(lookup, "WORLD_SIZE") ? "WORLD_SIZE" : "SLURM_NTASKS";
    info.rank = readInt(lookup, rankVar, info.localRank);
    info.worldSize = readInt(lookup, sizeVar, info.rank + 1);
    info.source = "SLURM";
  }
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_SIZE"}) {
    if (!isSet(lookup, var)) continue;
    info.localSize = readInt(lookup, var, 1);
    STRATA_USER_CHECK(info.localSize >= 1 && info.localRank < info.localSize,
                      "environment variable {}={} does not hold local rank {}", var, info.localSize,
                      info.localRank);
    break;
  }
  STRATA_USER_CHECK(info.worldSize >= 1, "environment variable {} must be at least 1", sizeVar);
  STRATA_USER_CHECK(info.rank < info.worldSize, "rank {} (from {}) is not below the world size {} (from {})",
                    info.rank, rankVar, info.worldSize, sizeVar);
  return info;
}

LaunchInfo launchInfoFromEnvironment() {
  return launchInfoFrom([](const char* name) { return std::getenv(name); });
}

uint64_t perRankShare(uint64_t total, int localSize) {
  if (localSize <= 1 || total == 0) return total;
  return std::max<uint64_t>(1, total / uint64_t(localSize));
}

int gpuForLocalRank(int localRank, int deviceCount) {
  STRATA_CHECK(deviceCount > 0, "no CUDA device to place local rank {} on", localRank);
  STRATA_CHECK(localRank >= 0, "negative local rank {}", localRank);
  return localRank % deviceCount;
}

}  // namespace strata::dist
