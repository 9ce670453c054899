// The collectives on N ranks (mpirun -np 2 and -np 4 through CTest), against serial references that every
// rank computes from all ranks' inputs. Every rank must reach every collective: checks use CHECK, not
// REQUIRE.
#include <cmath>
#include <cstring>
#include <vector>

#include "CatchShim.h"
#include "strata/core/Tensor.h"
#include "strata/distributed/ParallelContext.h"
#include "strata/ops/Ops.h"

using namespace strata;
using namespace strata::dist;

namespace {

ParallelOptions testOptions() {
  return ParallelOptions{.timeoutSeconds = 20};
}

// Rank r's input element i: values of mixed magnitude and sign, so that sums round differently in another
// order.
double inputValue(int rank, int64_t i) {
  return std::sin(0.37 * double(i) + 1.3 * rank) * std::pow(10.0, double((i + rank) % 5) - 2.0);
}

template <class T>
std::vector<T> inputOf(int rank, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = T(float(inputValue(rank, i)));
  return v;
}

template <class T>
Tensor inputTensor(int rank, int64_t n) {
  return Tensor::fromVector<T>(inputOf<T>(rank, n), {n});
}

// The serial reference of a sum over ranks: f32 accumulation in rank order, rounded once to T.
template <class T>
std::vector<T> serialSum(int ranks, int64_t n) {
  std::vector<float> acc(static_cast<size_t>(n), 0.0f);
  for (int r = 0; r < ranks; ++r) {
    std::vector<T> x = inputOf<T>(r, n);
    for (int64_t i = 0; i < n; ++i)
      acc[size_t(i)] = r == 0 ? float(x[size_t(i)]) : acc[size_t(i)] + float(x[size_t(i)]);
  }
  std::vector<T> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = T(acc[size_t(i)]);
  return out;
}

template <class T>
bool bitwiseEqual(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

TEMPLATE_TEST_CASE("allReduce sums bitwise equal to the serial sum in rank order", "[dist][mpi]", float,
                   BFloat16) {
  ParallelContext ctx(testOptions());
  Communicator& comm = ctx.world().communicator();
  for (int64_t n :
       {int64_t(1), int64_t(7), int64_t(1000), int64_t(4099)}) {  // uneven splits over the ranks too
    Tensor t = inputTensor<TestType>(ctx.rank(), n);
    comm.allReduce(t);
    CHECK(bitwiseEqual(t.toVector<TestType>(), serialSum<TestType>(ctx.worldSize(), n)));
    // Determinism: a second call on the same inputs gives the same bits.
    Tensor again = inputTensor<TestType>(ctx.rank(), n);
    comm.allReduce(again);
    CHECK(bitwiseEqual(again.toVector<TestType>(), t.toVector<TestType>()));
  }
}

TEST_CASE("allReduce of f16, f64 and integers, and max", "[dist][mpi]") {
  ParallelContext ctx(testOptions());
  Communicator& comm = ctx.world().communicator();
  const int n = ctx.worldSize();
  Tensor h = inputTensor<Half>(ctx.rank(), 333);
  comm.allReduce(h);
  CHECK(bitwiseEqual(h.toVector<Half>(), serialSum<Half>(n, 333)));

  Tensor d = Tensor::fromVector<double>({0.1 * (ctx.rank() + 1), 1e-17}, {2});
  comm.allReduce(d);
  double expected = 0;
  for (int r = 0; r < n; ++r) expected = r == 0 ? 0.1 : expected + 0.1 * (r + 1);
  CHECK(d.toVector<double>()[0] == expected);
  CHECK(d.toVector<double>()[1] == 1e-17 * n);

  Tensor i = Tensor::fromVector<int64_t>({int64_t(ctx.rank()), int64_t(1) << 40}, {2});
  comm.allReduce(i);
  CHECK(i.toVector<int64_t>() == std::vector<int64_t>{int64_t(n * (n - 1) / 2), n * (int64_t(1) << 40)});

  Tensor m = Tensor::fromVector<float>({float(ctx.rank()), -float(ctx.rank()), 2.5f}, {3});
  comm.allReduce(m, ReduceOp::Max);
  CHECK(m.toVector<float>() == std::vector<float>{float(n - 1), 0.0f, 2.5f});
}

TEMPLATE_TEST_CASE("allGather concatenates the ranks' blocks in rank order", "[dist][mpi]", float, BFloat16) {
  ParallelContext ctx(testOptions());
  Communicator& comm = ctx.world().communicator();
  const int64_t block = 37;
  Tensor in = inputTensor<TestType>(ctx.rank(), block);
  Tensor out = Tensor::empty({block * ctx.worldSize()}, in.dtype());
  comm.allGather(out, in);
  std::vector<TestType> expected;
  for (int r = 0; r < ctx.worldSize(); ++r) {
    auto part = inputOf<TestType>(r, block);
    expected.insert(expected.end(), part.begin(), part.end());
  }
  CHECK(bitwiseEqual(out.toVector<TestType>(), expected));

  // In place: this rank's block of `out` is the input.
  Tensor inPlace = ops::zeros({block * ctx.worldSize()}, in.dtype());
  Tensor mine = inPlace.narrow(0, block * ctx.rank(), block);
  ops::copy(mine, in);
  comm.allGather(inPlace, mine);
  CHECK(bitwiseEqual(inPlace.toVector<TestType>(), expected));
}

TEMPLATE_TEST_CASE("reduceScatter gives each rank its block of the serial sum", "[dist][mpi]", float,
                   BFloat16) {
  ParallelContext ctx(testOptions());
  Communicator& comm = ctx.world().communicator();
  const int64_t block = 129, total = block * ctx.worldSize();
  Tensor in = inputTensor<TestType>(ctx.rank(), total);
  Tensor out = Tensor::empty({block}, in.dtype());
  comm.reduceScatter(out, in);
  std::vector<TestType> sum = serialSum<TestType>(ctx.worldSize(), total);
  std::vector<TestType> expected(sum.begin() + block * ctx.rank(), sum.begin() + block * (ctx.rank() + 1));
  CHECK(bitwiseEqual(out.toVector<TestType>(), expected));

  // In place: out is this rank's block of in.
  Tensor again = inputTensor<TestType>(ctx.rank(), total);
  Tensor myBlock = again.narrow(0, block * ctx.rank(), block);
  comm.reduceScatter(myBlock, again);
  CHECK(bitwiseEqual(myBlock.toVector<TestType>(), expected));

  Tensor m = Tensor::fromVector<float>(std::vector<float>(size_t(ctx.worldSize()), float(ctx.rank())),
                                       {int64_t(ctx.worldSize())});
  Tensor mOut = Tensor::empty({1});
  comm.reduceScatter(mOut, m, ReduceOp::Max);
  CHECK(mOut.item() == ctx.worldSize() - 1);
}

TEST_CASE("broadcast copies the root's tensor to every rank", "[dist][mpi]") {
  ParallelContext ctx(testOptions());
  Communicator& comm = ctx.world().communicator();
  const int root = ctx.worldSize() - 1;
  Tensor t = inputTensor<float>(ctx.rank(), 100);
  comm.broadcast(t, root);
  CHECK(bitwiseEqual(t.toVector<float>(), inputOf<float>(root, 100)));
  Tensor bytes = Tensor::fromVector<uint8_t>({uint8_t(ctx.rank()), 7}, {2});
  comm.broadcast(bytes, 0);
  CHECK(bytes.toVector<uint8_t>() == std::vector<uint8_t>{0, 7});
}

TEST_CASE("allToAll sends block i to rank i", "[dist][mpi]") {
  ParallelContext ctx(testOptions());
  Communicator& comm = ctx.world().communicator();
  const int n = ctx.worldSize();
  const int64_t block = 3;
  // Rank r's block i holds 100 r + 10 i + j.
  std::vector<int32_t> values;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < block; ++j) values.push_back(100 * ctx.rank() + 10 * i + j);
  }
  std::vector<int32_t> expected;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < block; ++j) expected.push_back(100 * i + 10 * ctx.rank() + j);
  }
  Tensor in = Tensor::fromVector<int32_t>(values, {n * block});
  Tensor out = Tensor::empty({n * block}, DType::I32);
  comm.allToAll(out, in);
  CHECK(out.toVector<int32_t>() == expected);
  comm.allToAll(in, in);  // in place
  CHECK(in.toVector<int32_t>() == expected);
  comm.barrier();
}

TEST_CASE("split groups communicate within themselves", "[dist][mpi]") {
  ParallelContext ctx(testOptions());
  // Even and odd ranks; ordered by descending world rank, so group rank 0 is the highest world rank.
  ProcessGroup& parity = ctx.split("parity", ctx.world(), ctx.rank() % 2, -ctx.rank());
  int members = 0, highest = -1;
  for (int r = 0; r < ctx.worldSize(); ++r) {
    if (r % 2 == ctx.rank() % 2) {
      ++members;
      highest = r;
    }
  }
  CHECK(parity.size() == members);
  CHECK(parity.rank() == (highest - ctx.rank()) / 2);
  Tensor t = Tensor::fromVector<int32_t>({ctx.rank()}, {1});
  parity.communicator().allReduce(t);
  int expected = 0;
  for (int r = ctx.rank() % 2; r < ctx.worldSize(); r += 2) expected += r;
  CHECK(t.item() == expected);
  ctx.world().communicator().barrier();
}

TEST_CASE("sendReceive passes tensors around a ring, both ways at once, tags kept apart", "[dist][mpi]") {
  ParallelContext ctx(testOptions());
  Communicator& comm = ctx.world().communicator();
  int n = comm.size(), r = comm.rank();
  int next = (r + 1) % n, prev = (r + n - 1) % n;
  // Forward to the next rank (tag 0) and backward to the previous one (tag 1) in one call, as a pipeline's
  // send-forward-receive-backward does; with 2 ranks both go to the same peer and only the tags tell them
  // apart.
  Tensor forward = inputTensor<float>(r, 300);
  Tensor backward = Tensor::fromVector<int64_t>({int64_t(r) * 1000 + 7, -int64_t(r)}, {2});
  Tensor fromPrev = Tensor::empty({300}, DType::F32, Device::cpu());
  Tensor fromNext = Tensor::empty({2}, DType::I64, Device::cpu());
  comm.sendReceive({PeerTransfer{backward, prev, 1}, PeerTransfer{forward, next, 0}},
                   {PeerTransfer{fromNext, next, 1}, PeerTransfer{fromPrev, prev, 0}});
  CHECK(bitwiseEqual(fromPrev.toVector<float>(), inputOf<float>(prev, 300)));
  CHECK(fromNext.toVector<int64_t>() == std::vector<int64_t>{int64_t(next) * 1000 + 7, -int64_t(next)});
  // Separate send and receive calls in an order that pairs up: rank 0 sends first, the others receive first.
  Tensor token = Tensor::fromVector<double>({double(r) + 0.5}, {1});
  Tensor got = Tensor::empty({1}, DType::F64, Device::cpu());
  if (r == 0) {
    comm.send(token, next, 2);
    comm.receive(got, prev, 2);
  } else {
    comm.receive(got, prev, 2);
    comm.send(token, next, 2);
  }
  CHECK(got.item() == double(prev) + 0.5);
  comm.barrier();
}

TEST_CASE("a receive that no rank sends times out naming the op and the peer", "[dist][mpi]") {
  // A context of its own that does not abort the job on failure, so the test goes on afterwards.
  ParallelOptions options = testOptions();
  options.timeoutSeconds = 0.5;
  options.abortOnFailure = false;
  ParallelContext ctx(options);
  std::string message = "no error";
  if (ctx.rank() == 1) {
    Tensor t = Tensor::empty({4}, DType::F32, Device::cpu());
    try {
      ctx.world().communicator().receive(t, 0, 5);
    } catch (const Error& e) {
      message = e.what();
    }
    INFO(message);
    CHECK(message.find("sendReceive") != std::string::npos);
    CHECK(message.find("receive from rank 0 (4 elements, tag 5)") != std::string::npos);
    CHECK(message.find("dist.timeout_s") != std::string::npos);
    CHECK(ctx.world().communicator().failed());
  }
  // Then rank 0 sends what rank 1 waited for, so that no receive is left posted when MPI finalizes.
  ParallelContext after(testOptions());
  after.world().communicator().barrier();
  if (ctx.rank() == 0) ctx.world().communicator().send(ops::zeros({4}, DType::F32, Device::cpu()), 1, 5);
  after.world().communicator().barrier();
}
