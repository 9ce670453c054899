// strata_dist_faults MODE: a job whose collectives cannot complete, run by fault_test.sh under mpirun. Every
// rank that is still alive must end with the timeout error (printed as "rank R caught: ..."), not hang.
//   mismatch: rank 0 calls allReduce on the world while the other ranks call barrier on another group.
//   skip:     the last rank skips an allReduce the others call, then waits in a barrier.
//   killed:   the last rank dies (std::_Exit) while the others are in an allReduce.
// STRATA_DIST_TEST_DEVICE=cuda: the collectives move CUDA tensors (through NCCL, or through MPI with host
// staging where the ranks share a GPU).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "strata/core/Error.h"
#include "strata/core/Tensor.h"
#include "strata/distributed/ParallelContext.h"

using namespace strata;
using namespace strata::dist;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: strata_dist_faults mismatch|skip|killed\n");
    return 2;
  }
  const std::string mode = argv[1];
  const char* device = std::getenv("STRATA_DIST_TEST_DEVICE");
  const bool gpu = device != nullptr && std::string(device) == "cuda";
  ParallelContext ctx(
      ParallelOptions{.timeoutSeconds = 2, .deviceType = gpu ? DeviceType::CUDA : DeviceType::CPU});
  Communicator& world = ctx.world().communicator();
  ProcessGroup& other = ctx.split("other", ctx.world(), 0, ctx.rank());
  const bool last = ctx.rank() == ctx.worldSize() - 1;
  Tensor t = Tensor::fromVector<float>(std::vector<float>(4096, 1.0f), {4096}).to(ctx.device());
  world.barrier();  // start together
  try {
    if (mode == "mismatch") {
      if (ctx.rank() == 0) {
        world.allReduce(t);
      } else {
        other.communicator().barrier();
      }
    } else if (mode == "skip") {
      if (!last) world.allReduce(t);
      other.communicator().barrier();
    } else if (mode == "killed") {
      if (last) std::_Exit(3);
      world.allReduce(t);
    } else {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      return 2;
    }
    std::printf("rank %d: no error\n", ctx.rank());
    return 0;
  } catch (const Error& e) {
    std::printf("rank %d caught: %s\n", ctx.rank(), e.what());
    std::fflush(stdout);
    // Let the other ranks report their own timeouts before this one's context aborts the job.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    return 1;
  }
}
