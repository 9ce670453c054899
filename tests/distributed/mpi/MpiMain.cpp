// main() of strata_dist_tests, run as `mpirun -np N strata_dist_tests`: every rank runs the Catch tests, then
// the ranks agree on the outcome, so a failure on any rank fails the job on all of them.
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include <cstdio>

#include "strata/core/Tensor.h"
#include "strata/distributed/ParallelContext.h"

int main(int argc, char** argv) {
  int failures = Catch::Session().run(argc, argv);
  strata::dist::ParallelContext ctx(strata::dist::ParallelOptions{.timeoutSeconds = 30});
  strata::Tensor anyFailed = strata::Tensor::fromVector<int32_t>({failures > 0 ? 1 : 0}, {1});
  ctx.world().communicator().allReduce(anyFailed, strata::dist::ReduceOp::Max);
  if (anyFailed.item() != 0) {
    std::printf("rank %d: a test failed on %s\n", ctx.rank(), failures > 0 ? "this rank" : "another rank");
    return 1;
  }
  return 0;
}
