// The GPU paths of the dist layer on one GPU (NOTE [GPU collectives] in distributed/ParallelContext.h): a
// one-rank NCCL communicator that every collective goes through, the comm delay that turns a missing wait
// into wrong numbers (NOTE [Comm delay] in distributed/Communicator.h), and a collective that outlasts
// dist.timeout_s.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "TestUtil.h"
#include "strata/distributed/ParallelContext.h"
#include "strata/train/Trainer.h"

using namespace strata;
using namespace strata::dist;

// A GPU and an NCCL build, or the test returns (CTest counts a CUDA-less machine's return as skipped).
#define STRATA_REQUIRE_NCCL()                 \
  do {                                        \
    STRATA_REQUIRE_CUDA();                    \
    if (!builtWithNccl()) {                   \
      WARN("no NCCL in this build: skipped"); \
      return;                                 \
    }                                         \
  } while (0)

namespace {

// Sets an environment variable for a scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
    setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

std::unique_ptr<ParallelContext> ncclAlone(double timeoutSeconds = 30) {
  return std::make_unique<ParallelContext>(LaunchInfo{},
                                           ParallelOptions{.timeoutSeconds = timeoutSeconds,
                                                           .deviceType = DeviceType::CUDA,
                                                           .abortOnFailure = false,
                                                           .gpuCollectives = GpuCollectives::Nccl});
}

// 6 steps of a small GPT on the GPU at `stage` (evaluations included), its losses in record order.
std::vector<double> gptLosses(const std::string& name, int stage, const std::string& collectives,
                              const std::string& dtype) {
  std::filesystem::path corpus = std::filesystem::temp_directory_path() / "strata-nccl-one-rank-corpus.txt";
  if (!std::filesystem::exists(corpus)) {
    std::ofstream text(corpus);
    for (int i = 0; i < 300; ++i) text << "what is done cannot be undone " << i % 5 << "\n";
  }
  std::filesystem::path out = test::freshDir("strata-nccl-one-rank-" + name);
  std::vector<std::string> sets = {"data.path=" + corpus.string(),
                                   "train.out_dir=" + out.string(),
                                   "train.device=cuda",
                                   "precision.dtype=" + dtype,
                                   "model.num_layers=2",
                                   "model.hidden_size=64",
                                   "model.num_attention_heads=2",
                                   "model.seq_length=64",
                                   "model.vocab_size=256",
                                   "model.dropout=0",
                                   "train.micro_batch_size=2",
                                   "train.global_batch_size=4",
                                   "train.train_iters=6",
                                   "train.log_interval=1",
                                   "train.eval_interval=3",
                                   "train.eval_iters=2",
                                   "train.sample_length=0",
                                   "zero_optimization.chunk_size_mb=0.05",
                                   "zero_optimization.stage=" + std::to_string(stage),
                                   "dist.gpu_collectives=" + collectives};
  train::Trainer(config::parseConfig("", "nccl-one-rank", sets)).run();
  std::vector<double> losses;
  std::ifstream in(out / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
    if (j.contains("val_loss")) losses.push_back(j["val_loss"].get<double>());
  }
  return losses;
}

}  // namespace

TEST_CASE("NCCL at one rank trains a GPT at stages 0 to 3 bit for bit like the local path, comm delay on",
          "[cuda][dist]") {
  STRATA_REQUIRE_NCCL();
  ScopedEnv delay("STRATA_COMM_DELAY_US", "2000");
  for (const char* dtype : {"bf16", "fp32"})
    for (int stage : {0, 1, 2, 3}) {
      INFO(dtype << " at stage " << stage);
      std::string tag = std::string(dtype) + "-stage" + std::to_string(stage);
      std::vector<double> local = gptLosses(tag + "-local", stage, "auto", dtype);
      std::vector<double> nccl = gptLosses(tag + "-nccl", stage, "nccl", dtype);
      REQUIRE(local.size() == 8);  // 6 steps, 2 evaluations
      CHECK(nccl == local);
    }
}

TEST_CASE("NCCL at one rank: every collective goes through NCCL and equals the local copy", "[cuda][dist]") {
  STRATA_REQUIRE_NCCL();
  auto ctx = ncclAlone();
  Device gpu = ctx->device();
  REQUIRE(gpu.isCuda());
  CHECK(processDeviceIndex() == gpu.index);
  Communicator& comm = ctx->world().communicator();
  REQUIRE(comm.communicates());
  CHECK(ctx->gpuCollectives() == GpuCollectives::Nccl);
  // Every dtype NCCL is given (NOTE [Collective ordering and completion]: the caller orders the lanes).
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F64, DType::I32, DType::I64, DType::U8}) {
    INFO(dtypeName(dtype));
    Tensor host = ops::to(ops::arange(0, 96, 1, DType::F32), Device::cpu(), dtype);
    Tensor in = ops::to(host, gpu, dtype);
    for (bool gather : {false, true}) {
      const Stream& lane = collectiveStream(gpu, gather);
      Tensor out = Tensor::empty(in.shape(), dtype, gpu);
      streamWaits(lane, currentStream(gpu), gpu);
      if (gather)
        comm.allGather(out, in);
      else
        comm.reduceScatter(out, in);
      streamWaits(currentStream(gpu), lane, gpu);
      CHECK(ops::to(out, Device::cpu(), DType::F64).toVector<double>() ==
            ops::to(host, Device::cpu(), DType::F64).toVector<double>());
    }
    Tensor inout = ops::to(host, gpu, dtype);
    streamWaits(collectiveStream(gpu, false), currentStream(gpu), gpu);
    comm.allReduce(inout);
    comm.broadcast(inout, 0);
    Tensor exchanged = Tensor::empty(in.shape(), dtype, gpu);
    comm.allToAll(exchanged, in);
    comm.allToAll(inout, inout);  // in place: NCCL sends from a copy
    streamWaits(currentStream(gpu), collectiveStream(gpu, false), gpu);
    CHECK(ops::to(inout, Device::cpu(), DType::F64).toVector<double>() ==
          ops::to(host, Device::cpu(), DType::F64).toVector<double>());
    CHECK(ops::to(exchanged, Device::cpu(), DType::F64).toVector<double>() ==
          ops::to(host, Device::cpu(), DType::F64).toVector<double>());
  }
  // CPU tensors of a one-rank NCCL group stay local copies (no MPI at one rank).
  Tensor cpuIn = Tensor::fromVector<float>({1, 2, 3}, {3});
  Tensor cpuOut = Tensor::empty({3});
  comm.allGather(cpuOut, cpuIn);
  CHECK(cpuOut.toVector<float>() == std::vector<float>{1, 2, 3});
  CHECK(!comm.failed());
}

TEST_CASE("the comm delay makes a missing wait on a collective's stream read stale numbers", "[cuda][dist]") {
  STRATA_REQUIRE_NCCL();
  auto ctx = ncclAlone();
  Device gpu = ctx->device();
  Communicator& comm = ctx->world().communicator();
  ScopedEnv delay("STRATA_COMM_DELAY_US", "50000");
  Tensor in = ops::full({1 << 16}, 7.0, DType::F32, gpu);
  const Stream& lane = collectiveStream(gpu, true);
  auto run = [&](bool wait) {
    Tensor out = ops::zeros({1 << 16}, DType::F32, gpu);
    streamWaits(lane, currentStream(gpu), gpu);
    comm.allGather(out, in);
    if (wait) streamWaits(currentStream(gpu), lane, gpu);
    Tensor read = ops::to(out, gpu, DType::F32);  // on the compute stream
    double sum = ops::to(read, Device::cpu(), DType::F64).toVector<double>()[0];
    synchronizeDevice(gpu);
    return sum;
  };
  // Without the wait the compute stream copies the output before the 50 ms spin and the gather are done.
  CHECK(run(false) == 0.0);
  CHECK(run(true) == 7.0);
}

TEST_CASE("a collective that outlasts dist.timeout_s fails with the named error, not a crash",
          "[cuda][dist]") {
  STRATA_REQUIRE_NCCL();
  auto ctx = ncclAlone(/*timeoutSeconds=*/2);
  Device gpu = ctx->device();
  Communicator& comm = ctx->world().communicator();
  Tensor t = ops::full({1024}, 1.0, DType::F32, gpu);
  {
    // A 3.5 s spin on the comm stream holds the all-reduce past its 2 s deadline.
    ScopedEnv delay("STRATA_COMM_DELAY_US", "3500000");
    comm.allReduce(t);
  }
  auto start = std::chrono::steady_clock::now();
  while (!comm.failed() && std::chrono::steady_clock::now() - start < std::chrono::seconds(20))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(comm.failed());
  CHECK(comm.failure().find("allReduce(sum) of 1024 f32 elements (4096 bytes) on rank 0 of group 'world' (1 "
                            "ranks) did not finish within 2 s (dist.timeout_s)") != std::string::npos);
  std::string refused = test::errorOf([&] { comm.allReduce(t); });
  CHECK(refused.find("refused: an earlier collective failed") != std::string::npos);
  synchronizeDevice(gpu);  // the spin ends; the aborted communicator is destroyed with the context
}
