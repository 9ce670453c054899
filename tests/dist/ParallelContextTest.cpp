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
