#include <string>
#include <vector>

#include "TestUtil.h"

using namespace strata;
using namespace strata::dist;

TEST_CASE("one rank needs no MPI: collectives are copies", "[dist]") {
  ParallelContext ctx(LaunchInfo{}, ParallelOptions{.timeoutSeconds = 5});
  CHECK(ctx.worldSize() == 1);
  CHECK(ctx.isMain());
  CHECK(ctx.device() == Device::cpu());
  Communicator& comm = ctx.world().communicator();
  CHECK(ctx.world().name() == "world");
  CHECK(comm.size() == 1);

  Tensor in = Tensor::fromVector<float>({1.5f, -2.f, 3.25f}, {3});
  Tensor out = Tensor::empty({3});
  comm.allGather(out, in);
  CHECK(out.toVector<float>() == std::vector<float>{1.5f, -2.f, 3.25f});
  ops::fill(out, 0);
  comm.reduceScatter(out, in);
  CHECK(out.toVector<float>() == std::vector<float>{1.5f, -2.f, 3.25f});
  ops::fill(out, 0);
  comm.allToAll(out, in);
  CHECK(out.toVector<float>() == std::vector<float>{1.5f, -2.f, 3.25f});
  comm.allReduce(in, ReduceOp::Max);
  comm.broadcast(in, 0);
  comm.barrier();
  CHECK(in.toVector<float>() == std::vector<float>{1.5f, -2.f, 3.25f});
  CHECK(!comm.failed());

  // Wrong sizes and roots are errors, not silent truncation.
  Tensor wrong = Tensor::empty({4});
  CHECK(test::errorOf([&] { comm.allGather(wrong, in); }).find("out must have in x 1") != std::string::npos);
  CHECK(test::errorOf([&] { comm.broadcast(in, 1); }).find("root 1") != std::string::npos);
  Tensor ints = Tensor::fromVector<int32_t>({1, 2, 3}, {3});
  CHECK(test::errorOf([&] { comm.allGather(ints, in); }).find("out is i32, in is f32") != std::string::npos);
  CHECK(!comm.failed());  // argument errors do not fail the communicator
}

TEST_CASE("a context holds named groups; splitting one rank gives a one-rank group", "[dist]") {
  ParallelContext ctx(LaunchInfo{}, ParallelOptions{});
  ProcessGroup& experts = ctx.split("expert", ctx.world(), 0, 0);
  CHECK(experts.name() == "expert");
  CHECK(experts.size() == 1);
  CHECK(ctx.hasGroup("expert"));
  CHECK(&ctx.group("world") == &ctx.world());
  CHECK(test::errorOf([&] { ctx.group("tensor"); }).find("groups: world, expert") != std::string::npos);
  CHECK(!test::errorOf([&] { ctx.split("expert", ctx.world(), 0, 0); }).empty());
  CHECK(!test::errorOf([] {
           ParallelContext bad(LaunchInfo{}, ParallelOptions{.timeoutSeconds = 0});
         }).empty());
}

TEST_CASE("the ranks' places say who shares a host and a GPU", "[dist]") {
  // Two hosts: a has one GPU for three ranks, b two GPUs for two ranks.
  std::vector<RankPlace> places = {{"a/1", "g0"}, {"a/1", "g0"}, {"a/1", "g0"}, {"b/2", "h0"}, {"b/2", "h1"}};
  RankTopology onA = rankTopology(places, 1);
  CHECK(onA.ranksOnHost == 3);
  CHECK(onA.ranksOnDevice == 3);
  CHECK(onA.gpusOnHost == 1);
  CHECK(onA.mostRanksOnOneGpu == 3);
  CHECK(onA.busiestGpu == "g0");
  RankTopology onB = rankTopology(places, 4);
  CHECK(onB.ranksOnHost == 2);
  CHECK(onB.ranksOnDevice == 1);
  CHECK(onB.gpusOnHost == 2);
  CHECK(onB.mostRanksOnOneGpu == 3);  // the job's, not the host's
  // CPU ranks: the host is the device.
  RankTopology cpu = rankTopology({{"a/1", ""}, {"a/1", ""}, {"b/2", ""}}, 0);
  CHECK(cpu.ranksOnHost == 2);
  CHECK(cpu.ranksOnDevice == 2);
  CHECK(cpu.gpusOnHost == 0);
  CHECK(cpu.mostRanksOnOneGpu == 1);
}

TEST_CASE("more ranks than GPUs: auto stages through MPI, nccl is refused with the counts", "[dist]") {
  // NOTE [GPU collectives]
  RankTopology shared = rankTopology({{"a/1", "g0"}, {"a/1", "g0"}, {"a/1", "g1"}, {"a/1", "g1"}}, 0);
  RankTopology ownGpus = rankTopology({{"a/1", "g0"}, {"a/1", "g1"}, {"b/1", "g0"}}, 0);
  CHECK(resolveGpuCollectives(GpuCollectives::Auto, 4, shared) == GpuCollectives::Staged);
  CHECK(resolveGpuCollectives(GpuCollectives::Staged, 4, shared) == GpuCollectives::Staged);
  std::string refused = test::errorOf([&] { resolveGpuCollectives(GpuCollectives::Nccl, 4, shared); });
  CHECK(refused.find("dist.gpu_collectives is nccl, but 2 ranks share one GPU") != std::string::npos);
  CHECK(refused.find("on host a") != std::string::npos);
  CHECK(refused.find("This job has 4 ranks") != std::string::npos);
  CHECK(refused.find("dist.gpu_collectives: staged") != std::string::npos);
  CHECK(resolveGpuCollectives(GpuCollectives::Auto, 3, ownGpus) == GpuCollectives::Nccl);
  CHECK(resolveGpuCollectives(GpuCollectives::Nccl, 3, ownGpus) == GpuCollectives::Nccl);
  CHECK(resolveGpuCollectives(GpuCollectives::Staged, 3, ownGpus) == GpuCollectives::Staged);
  // One rank: local copies, unless NCCL is asked for (the one-rank NCCL communicator).
  RankTopology one = rankTopology({{"a/1", "g0"}}, 0);
  CHECK(resolveGpuCollectives(GpuCollectives::Auto, 1, one) == GpuCollectives::Auto);
  CHECK(resolveGpuCollectives(GpuCollectives::Staged, 1, one) == GpuCollectives::Auto);
  CHECK(resolveGpuCollectives(GpuCollectives::Nccl, 1, one) == GpuCollectives::Nccl);
  CHECK(parseGpuCollectives("staged") == GpuCollectives::Staged);
  CHECK(test::errorOf([] { parseGpuCollectives("mpi"); }).find("use auto, nccl or staged") !=
        std::string::npos);
}

TEST_CASE("a CPU context of one rank keeps local copies and sizes itself from the launch", "[dist]") {
  LaunchInfo launch;
  launch.localSize = 3;
  ParallelContext ctx(launch, ParallelOptions{.gpuCollectives = GpuCollectives::Nccl});
  CHECK(!ctx.world().communicator().communicates());
  CHECK(ctx.gpuCollectives() == GpuCollectives::Auto);  // a CPU context moves no CUDA tensors
  CHECK(ctx.topology().ranksOnHost == 3);
  CHECK(ctx.topology().ranksOnDevice == 3);
}
