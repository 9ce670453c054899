// CPU-vs-CUDA parity for every op over generated shapes and dtypes. Runs on the GPU machine; skips elsewhere.
#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>

#include "TestUtil.h"
#include "strata/core/Philox.h"

using namespace strata;

namespace {

// Sets an environment variable for a scope; unset again however the scope ends (a failed REQUIRE throws).
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) { ::setenv(n, value, 1); }
  ~ScopedEnv() { ::unsetenv(name); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

const Device kGpu = Device::cuda(0);

struct Tol {
  double atol, rtol;
};
Tol tolFor(DType t) {
  switch (t) {
    case DType::BF16:
      return {2e-2, 2e-2};
    case DType::F16:
      return {2e-3, 4e-3};
    default:
      return {1e-5, 1e-4};
  }
}

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Runs fn on CPU inputs and on GPU copies of them; compares every output.
void parity(const std::string& what, const Fn& fn, const std::vector<Tensor>& cpuInputs, Tol tol) {
  std::vector<Tensor> gpuInputs;
  for (const auto& t : cpuInputs) gpuInputs.push_back(t.defined() ? ops::to(t, kGpu, t.dtype()) : t);
  auto cpu = fn(cpuInputs);
  auto gpu = fn(gpuInputs);
  REQUIRE(cpu.size() == gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO(what << " output " << i << " shape " << toString(cpu[i].shape()));
    REQUIRE(gpu[i].device() == kGpu);
    REQUIRE(gpu[i].dtype() == cpu[i].dtype());
    REQUIRE(gpu[i].shape() == cpu[i].shape());
    double c = test::closeness(gpu[i].toVector<double>(), cpu[i].toVector<double>(), tol.atol, tol.rtol);
    INFO("worst scaled error " << c);
    REQUIRE(c <= 1.0);
  }
}

// Every value an AdamW update wrote (param, m, v and the 16-bit copy of each set), in order.
std::vector<double> adamwValues(const std::vector<ops::AdamWTensors>& sets) {
  std::vector<double> out;
  for (const auto& s : sets)
    for (const Tensor* t : {&s.param, &s.m, &s.v, &s.copy})
      if (t->defined()) {
        auto values = t->toVector<double>();
        out.insert(out.end(), values.begin(), values.end());
      }
  return out;
}

// The CPU's and the GPU's values are the same, bit for bit.
void requireSameValues(const std::vector<double>& cpu, const std::vector<double>& gpu) {
  REQUIRE(cpu.size() == gpu.size());
  size_t differing = 0;
  for (size_t k = 0; k < cpu.size(); ++k) differing += cpu[k] != gpu[k] ? 1 : 0;
  INFO(differing << " of " << cpu.size() << " values differ");
  REQUIRE(differing == 0);
}

Tensor randomOf(const Shape& shape, DType dt, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  Generator gen(seed);
  return ops::rand(shape, gen, DType::F32, Device::cpu(), lo, hi).to(dt);
}

const std::vector<DType> kFloatTypes = {DType::F32, DType::BF16, DType::F16};

}  // namespace

TEST_CASE("[cuda] random numbers and dropout masks match the cpu", "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  Generator a(3), b(3);
  auto cpu = ops::rand({4097}, a).toVector<float>();
  auto gpu = ops::rand({4097}, b, DType::F32, kGpu).toVector<float>();
  REQUIRE(cpu == gpu);  // bit-identical
  parity("randn",
         [](const std::vector<Tensor>& in) {
           Generator g(9);
           return std::vector<Tensor>{ops::randn({1000}, g, DType::F32, in[0].device())};
         },
         {ops::zeros({1})}, {1e-5, 1e-4});
  Tensor x = randomOf({3001}, DType::F32, 1);
  for (uint64_t offset : {17u, 16u, 3u})  // partial first groups, and a whole one (NOTE [Dropout bits])
    REQUIRE(ops::dropout(x, 0.3, 5, offset).toVector<float>() ==
            ops::dropout(x.to(kGpu), 0.3, 5, offset).toVector<float>());
}

TEST_CASE("[cuda] elementwise ops match the cpu for every dtype", "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  const char* unary[] = {"neg", "exp", "tanh", "sigmoid", "relu", "silu", "gelu_tanh", "gelu_erf"};
  const char* positive[] = {"log", "sqrt", "rsqrt"};
  const char* binary[] = {"add",
                          "sub",
                          "mul",
                          "div",
                          "maximum",
                          "relu_backward",
                          "silu_backward",
                          "gelu_tanh_backward",
                          "gelu_erf_backward",
                          "tanh_backward",
                          "sigmoid_backward"};
  for (DType dt : kFloatTypes) {
    for (Shape shape : {Shape{1}, Shape{7, 13}, Shape{4, 1000}, Shape{3, 5, 64}}) {
      Tensor x = randomOf(shape, dt, 10), p = randomOf(shape, dt, 11, 0.2, 3.0),
             y = randomOf(shape, dt, 12, 0.5, 2);
      for (const char* op : unary)
        parity(
            op, [op](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::map(op, in)}; }, {x},
            tolFor(dt));
      for (const char* op : positive)
        parity(
            op, [op](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::map(op, in)}; }, {p},
            tolFor(dt));
      for (const char* op : binary)
        parity(
            op, [op](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::map(op, in)}; }, {x, y},
            tolFor(dt));
      parity(
          "pow", [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::pow(in[0], 1.5)}; }, {p},
          tolFor(dt));
      parity(
          "affine",
          [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::affine(in[0], 2, 1)}; }, {x},
          tolFor(dt));
    }
    // Broadcasting, strided operands and where.
    Tensor a = randomOf({6, 1, 33}, dt, 13), b = randomOf({5, 1}, dt, 14);
    parity(
        "add broadcast",
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::add(in[0], in[1])}; }, {a, b},
        tolFor(dt));
    Tensor m = randomOf({40, 24}, dt, 15);
    parity(
        "mul strided",
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{ops::mul(detail::permuteRaw(in[0], {1, 0}), in[1])};
        },
        {m, randomOf({24, 40}, dt, 16)}, tolFor(dt));
    Tensor cond = randomOf({40, 24}, DType::F32, 17, -1, 1).to(DType::F32);
    parity(
        "where",
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{
              ops::where(ops::gt(in[0], ops::zeros({}, DType::F32, in[0].device())), in[1], in[2])};
        },
        {cond, m, randomOf({24}, dt, 18)}, tolFor(dt));
  }
}

TEST_CASE("[cuda] copies and conversions match the cpu", "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  Tensor x = randomOf({37, 19}, DType::F32, 20, -100, 100);
  for (DType to : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8}) {
    Tensor src = to == DType::U8 ? ops::affine(x, 0.5, 100).to(DType::F32) : x;
    parity("to",
           [to](const std::vector<Tensor>& in) {
             return std::vector<Tensor>{ops::to(in[0], in[0].device(), to)};
           },
           {src}, {1e-6, 1e-6});
    parity("strided copy",
           [to](const std::vector<Tensor>& in) {
             return std::vector<Tensor>{
                 ops::to(ops::contiguous(detail::permuteRaw(in[0], {1, 0})), in[0].device(), to)};
           },
           {src}, {1e-6, 1e-6});
  }
  parity("cat",
         [](const std::vector<Tensor>& in) {
           return std::vector<Tensor>{ops::cat({in[0], in[1]}, 1)};
         },
         {x, randomOf({37, 5}, DType::F32, 21)}, {0, 0});
  parity("arange",
         [](const std::vector<Tensor>& in) {
           return std::vector<Tensor>{ops::arange(0, 1000, 1, DType::BF16, in[0].device())};
         },
         {x}, {0, 0});
  Tensor host = ops::arange(0, 12).view({3, 4});
  REQUIRE(host.to(kGpu).to(Device::cpu()).toVector<float>() == host.toVector<float>());
}

TEST_CASE("[cuda] reductions match the cpu", "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    for (Shape shape : {Shape{1000}, Shape{37, 513}, Shape{8, 300, 7}, Shape{3, 100000}, Shape{100000, 3}}) {
      Tensor x = randomOf(shape, dt, 30);
      Tol t = tolFor(dt);
      Tol sumTol{t.atol * 50, t.rtol * 2};  // long sums in a different order
      parity(
          "sum all", [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::sum(in[0])}; }, {x},
          sumTol);
      parity(
          "sum dim0", [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::sum(in[0], {0})}; },
          {x}, sumTol);
      parity(
          "sum last",
          [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::sum(in[0], {-1}, true)}; }, {x},
          sumTol);
      parity("amax", [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::amax(in[0], {0})}; },
             {x}, {0, 0});
      parity(
          "mean", [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::mean(in[0], {-1})}; },
          {x}, sumTol);
    }
  }
}

TEST_CASE("[cuda] matmul matches the cpu: plain, transposed, batched, broadcast", "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    Tol t = tolFor(dt);
    Tol mmTol{t.atol * 4, t.rtol * 2};
    for (auto [m, k, n] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 1, 1}, {17, 33, 9}, {128, 64, 256}, {300, 257, 31}}) {
      Tensor a = randomOf({m, k}, dt, 40, -1, 1), b = randomOf({k, n}, dt, 41, -1, 1);
      parity(
          "mm", [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::matmul(in[0], in[1])}; },
          {a, b}, mmTol);
      parity(
          "mm transposed",
          [](const std::vector<Tensor>& in) {
            return std::vector<Tensor>{
                ops::matmul(detail::permuteRaw(in[1], {1, 0}), detail::permuteRaw(in[0], {1, 0}))};
          },
          {a, b}, mmTol);
    }
    Tensor x = randomOf({2, 3, 40, 24}, dt, 42, -1, 1), w = randomOf({24, 16}, dt, 43, -1, 1);
    parity(
        "bmm weight",
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::matmul(in[0], in[1])}; }, {x, w},
        mmTol);
    Tensor y = randomOf({3, 24, 8}, dt, 44, -1, 1);
    parity(
        "bmm broadcast",
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::matmul(in[0], in[1])}; }, {x, y},
        mmTol);
    Tensor q = randomOf({2, 5, 4, 16}, dt, 45, -1, 1), k = randomOf({2, 4, 5, 16}, dt, 46, -1, 1);
    parity(
        "attention scores",
        [](const std::vector<Tensor>& in) {
          Tensor qh = detail::permuteRaw(in[0], {0, 2, 1, 3}), kh = detail::permuteRaw(in[1], {0, 1, 3, 2});
          return std::vector<Tensor>{ops::matmul(qh, kh)};
        },
        {q, k}, mmTol);
  }
}

TEST_CASE("[cuda] softmax and norms match the cpu, forward and backward", "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    Tol t = tolFor(dt);
    Tol bwd{t.atol * 4, t.rtol * 4};
    for (Shape shape : {Shape{3, 7}, Shape{64, 1024}, Shape{5, 50304}, Shape{4, 3, 768}, Shape{3, 12288}}) {
      int64_t C = shape.back();
      Tensor x = randomOf(shape, dt, 50, -3, 3), g = randomOf(shape, dt, 51);
      for (bool log : {false, true}) {
        parity(
            log ? "log_softmax" : "softmax",
            [log](const std::vector<Tensor>& in) {
              Tensor y = log ? ops::logSoftmax(in[0]) : ops::softmax(in[0]);
              return std::vector<Tensor>{y, ops::softmaxBackward(y, in[1], -1, log)};
            },
            {x, g}, bwd);
      }
      if (C / int64_t(16 / dtypeSize(dt)) > 4096) {
        // The norm backward supports rows up to 4096 packs (32768 bf16 values) and says so for wider ones.
        REQUIRE_THROWS_AS(
            ops::layerNormBackward(g.to(kGpu), x.to(kGpu), Tensor(),
                                   ops::layerNorm(x.to(kGpu), Tensor(), Tensor(), 1e-5), false, false),
            Error);
        continue;
      }
      Tensor w = randomOf({C}, dt, 52, 0.5, 1.5), b = randomOf({C}, dt, 53);
      parity("layer_norm",
             [](const std::vector<Tensor>& in) {
               ops::NormResult r = ops::layerNorm(in[0], in[2], in[3], 1e-5);
               ops::NormGrads gr = ops::layerNormBackward(in[1], in[0], in[2], r, true, true);
               return std::vector<Tensor>{r.y, r.mean, r.rstd, gr.x, gr.weight, gr.bias};
             },
             {x, g, w, b}, {bwd.atol * C / 64 + bwd.atol, bwd.rtol});
      parity("rms_norm",
             [](const std::vector<Tensor>& in) {
               ops::NormResult r = ops::rmsNorm(in[0], in[2], 1e-6);
               ops::NormGrads gr = ops::rmsNormBackward(in[1], in[0], in[2], r, true);
               return std::vector<Tensor>{r.y, r.rstd, gr.x, gr.weight};
             },
             {x, g, w}, {bwd.atol * C / 64 + bwd.atol, bwd.rtol});
    }
  }
}

TEST_CASE("[cuda] scaled causal softmax matches the cpu, forward and backward", "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    Tol t = tolFor(dt);
    for (Shape shape : {Shape{2, 3, 16, 16}, Shape{1, 2, 8, 40}, Shape{2, 1, 64, 1024}}) {
      Tensor x = randomOf(shape, dt, 90, -4, 4), g = randomOf(shape, dt, 91);
      for (bool causal : {false, true}) {
        parity(causal ? "causal softmax" : "scaled softmax",
               [causal](const std::vector<Tensor>& in) {
                 Tensor y = ops::scaledSoftmax(in[0], 0.125, causal);
                 return std::vector<Tensor>{y, ops::scaledSoftmaxBackward(y, in[1], 0.125)};
               },
               {x, g}, {t.atol * 4, t.rtol * 4});
      }
    }
  }
}

TEST_CASE("[cuda] embedding and cross entropy match the cpu", "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    Tol t = tolFor(dt);
    Tensor w = randomOf({50, 24}, dt, 60);
    Generator gen(61);
    Tensor idx = ops::affine(ops::rand({7, 9}, gen, DType::F32, Device::cpu(), 0, 50), 1, 0).to(DType::I64);
    Tensor g = randomOf({63, 24}, dt, 62);
    parity("embedding",
           [](const std::vector<Tensor>& in) {
             Tensor flat = detail::viewRaw(in[1], {-1});
             return std::vector<Tensor>{ops::embedding(in[0], in[1]),
                                        ops::embeddingBackward(in[2], flat, 50, in[0].dtype())};
           },
           {w, idx, g}, {t.atol * 4, t.rtol * 4});
    for (int64_t V : {11, 1000, 50257}) {
      Tensor logits = randomOf({33, V}, dt, 63, -4, 4);
      Tensor target =
          ops::affine(ops::rand({33}, gen, DType::F32, Device::cpu(), 0, double(V)), 1, 0).to(DType::I64);
      ops::fill(detail::narrowRaw(target, 0, 3, 2), -100.0);
      parity("cross_entropy",
             [](const std::vector<Tensor>& in) {
               ops::CrossEntropyResult r = ops::crossEntropy(in[0], in[1]);
               Tensor g =
                   ops::crossEntropyBackward(ops::full({}, 2.0, DType::F32, in[0].device()), in[0], in[1], r);
               return std::vector<Tensor>{r.loss, r.lse, g};
             },
             {logits, target}, {t.atol * 4, t.rtol * 4});
    }
    // The in-place form (the fused LM head's): packed rows (V % 8 == 0) and unpacked ones.
    for (int64_t V : {11, 1000, 50257, 50304}) {
      Tensor logits = randomOf({33, V}, dt, 64, -4, 4);
      Tensor target =
          ops::affine(ops::rand({33}, gen, DType::F32, Device::cpu(), 0, double(V)), 1, 0).to(DType::I64);
      ops::fill(detail::narrowRaw(target, 0, 5, 3), -100.0);
      parity("cross_entropy_in_place",
             [](const std::vector<Tensor>& in) {
               Tensor g = in[0].clone();
               Tensor rowLoss = Tensor::empty({33}, DType::F32, g.device());
               Tensor valid = Tensor::empty({33}, DType::F32, g.device());
               ops::crossEntropyInPlace(g, in[1], rowLoss, valid, true);
               return std::vector<Tensor>{rowLoss, valid, g};
             },
             {logits, target}, {t.atol * 4, t.rtol * 4});
    }
  }
}

TEST_CASE("[cuda] embedding backward sums repeated ids in input order: the cpu's bits, every run",
          "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  // 4096 ids drawn from 37 rows: each repeats about a hundred times, so an unordered (atomic) sum would round
  // differently from run to run.
  Generator gen(71);
  Tensor idx = ops::affine(ops::rand({4096}, gen, DType::F32, Device::cpu(), 0, 37), 1, 0).to(DType::I64);
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor g = randomOf({4096, 40}, dt, 72);
    auto backward = [&](Device d) {
      return ops::embeddingBackward(g.to(d), idx.to(d), 37, DType::F32).to(Device::cpu()).toVector<float>();
    };
    std::vector<float> cpu = backward(Device::cpu());
    std::vector<float> gpu = backward(Device::cuda());
    CHECK(gpu == cpu);
    CHECK(backward(Device::cuda()) == gpu);
  }
}

TEST_CASE("[cuda] autograd through a small network matches the cpu", "[cuda][parity][autograd]") {
  STRATA_REQUIRE_CUDA();
  auto run = [](Device dev) {
    Generator gen(70);
    Tensor w1 = ops::randn({16, 32}, gen, DType::F32, dev, 0, 0.2).setRequiresGrad(true);
    Tensor w2 = ops::randn({32, 10}, gen, DType::F32, dev, 0, 0.2).setRequiresGrad(true);
    Tensor ln = ops::ones({32}, DType::F32, dev).setRequiresGrad(true);
    Tensor x = ops::randn({8, 4, 16}, gen, DType::F32, dev);
    Tensor target = Tensor::fromVector<int64_t>(std::vector<int64_t>(32, 3), {32}, dev);
    Tensor h = layerNorm(gelu(matmul(x, w1)), ln, Tensor());
    AttentionMask mask;
    mask.causal = true;
    Tensor a =
        scaledDotProductAttention(h.view({8, 1, 4, 32}), h.view({8, 1, 4, 32}), h.view({8, 1, 4, 32}), mask);
    Tensor logits = matmul(a.view({32, 32}), w2);
    Tensor loss = crossEntropy(logits, target);
    backward(loss);
    return std::vector<Tensor>{loss, w1.grad(), w2.grad(), ln.grad()};
  };
  auto cpu = run(Device::cpu());
  auto gpu = run(kGpu);
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO("tensor " << i);
    double c = test::closeness(gpu[i].toVector<double>(), cpu[i].toVector<double>(), 1e-5, 1e-3);
    INFO("worst scaled error " << c);
    REQUIRE(c <= 1.0);
  }
}

TEST_CASE("[cuda] caching allocator reuses device memory", "[cuda][allocator]") {
  STRATA_REQUIRE_CUDA();
  auto& alloc = deviceAllocator(kGpu);
  { Tensor t = Tensor::empty({1 << 20}, DType::F32, kGpu); }
  AllocatorStats before = alloc.stats();
  { Tensor t = Tensor::empty({1 << 20}, DType::F32, kGpu); }
  AllocatorStats after = alloc.stats();
  REQUIRE(after.numRawAllocations == before.numRawAllocations);
  REQUIRE(after.numCacheHits == before.numCacheHits + 1);
  REQUIRE(after.reservedBytes >= (4u << 20));
}

TEST_CASE("[cuda] fused multi-tensor AdamW gives the cpu kernel's bits", "[cuda][parity][optim]") {
  // NOTE [AdamW bits] in strata/ops/Ops.h: the pipelined optimizer updates a piece on either side.
  STRATA_REQUIRE_CUDA();
  auto run = [](Device dev) {
    Generator gen(80);
    // Inputs drawn on the CPU, so that both sides start from the same bits.
    auto draw = [&](int64_t n, double scale = 1.0) {
      Tensor x = ops::randn({n}, gen, DType::F32, Device::cpu());
      if (scale != 1.0) x = ops::mul(x, ops::full({}, scale, DType::F32, Device::cpu()));
      return ops::to(x, dev, DType::F32);
    };
    std::vector<ops::AdamWTensors> sets;
    const DType copies[] = {DType::F16, DType::BF16, DType::F32};
    for (int64_t n : {1, 7, 1000, 70000, 131072, 4099}) {  // odd sizes, tensors that span several chunks
      ops::AdamWTensors s;
      s.param = draw(n);
      s.grad = draw(n, 3.7);
      s.m = ops::zeros({n}, DType::F32, dev);
      s.v = ops::zeros({n}, DType::F32, dev);
      s.weightDecay = n > 100 ? 0.1f : 0.0f;
      // Copies written with the update (f16, bf16 and f32, and none for the smallest).
      if (n > 1) s.copy = Tensor::empty({n}, copies[sets.size() % 3], dev);
      sets.push_back(s);
    }
    // A view that starts off 16-byte alignment takes the kernel's scalar loop.
    Tensor base = draw(4100);
    ops::AdamWTensors odd{base.narrow(0, 1, 4099),
                          draw(4099),
                          ops::zeros({4099}, DType::F32, dev),
                          ops::zeros({4099}, DType::F32, dev),
                          0.1f,
                          Tensor::empty({4099}, DType::BF16, dev)};
    sets.push_back(odd);
    Tensor scale = ops::full({}, 0.37, DType::F32, dev);
    for (int step = 1; step <= 3; ++step) {
      ops::AdamWHyper h;
      h.lr = 1e-2f;
      h.beta1 = 0.9f;
      h.beta2 = 0.95f;
      h.biasCorrection1 = float(1 - std::pow(0.9, step));
      h.biasCorrection2 = float(1 - std::pow(0.95, step));
      ops::adamw(sets, h, step == 2 ? Tensor() : scale);
    }
    std::vector<Tensor> out;
    for (auto& s : sets) {
      out.push_back(s.param);
      out.push_back(s.m);
      out.push_back(s.v);
      if (s.copy.defined()) {
        out.push_back(s.copy);
        // The copy is the updated param rounded once: bit for bit a cast of it on the same device.
        REQUIRE(s.copy.toVector<double>() == s.param.to(s.copy.dtype()).toVector<double>());
      }
    }
    return out;
  };
  auto cpu = run(Device::cpu());
  auto gpu = run(kGpu);
  for (size_t i = 0; i < cpu.size(); ++i) {
    std::vector<double> c = cpu[i].toVector<double>(), g = gpu[i].toVector<double>();
    REQUIRE(c.size() == g.size());
    size_t differing = 0, first = 0;
    for (size_t k = 0; k < c.size(); ++k)
      if (c[k] != g[k] && differing++ == 0) first = k;
    INFO("tensor " << i << ": " << differing << " of " << c.size() << " differ; the first at " << first
                   << ": cpu " << c[first] << " gpu " << g[first]);
    REQUIRE(differing == 0);
  }
}

TEST_CASE("[cuda] fused AdamW reads bf16 and f16 gradients as the cpu kernel does, bit for bit",
          "[cuda][parity][optim]") {
  // 16-bit gradient buffers (precision.grad_accum_dtype): both kernels widen them exactly as they read.
  STRATA_REQUIRE_CUDA();
  for (DType gradDType : {DType::BF16, DType::F16}) {
    auto run = [&](Device dev) {
      Generator gen(81);
      auto draw = [&](int64_t n, DType dt) {
        return ops::to(ops::randn({n}, gen, DType::F32, Device::cpu()), Device::cpu(), dt).to(dev);
      };
      std::vector<ops::AdamWTensors> sets;
      for (int64_t n : {1, 7, 70000, 4099}) {
        ops::AdamWTensors s{draw(n, DType::F32),
                            draw(n, gradDType),
                            ops::zeros({n}, DType::F32, dev),
                            ops::zeros({n}, DType::F32, dev),
                            0.1f,
                            Tensor::empty({n}, DType::BF16, dev)};
        sets.push_back(s);
      }
      // Gradients one element into their buffer: 2-byte aligned only, the kernel's scalar loop.
      Tensor g = draw(4100, gradDType);
      sets.push_back(ops::AdamWTensors{draw(4099, DType::F32), g.narrow(0, 1, 4099),
                                       ops::zeros({4099}, DType::F32, dev),
                                       ops::zeros({4099}, DType::F32, dev), 0.0f, Tensor()});
      for (int step = 1; step <= 2; ++step) {
        ops::AdamWHyper h;
        h.lr = 1e-2f;
        h.biasCorrection1 = float(1 - std::pow(0.9, step));
        h.biasCorrection2 = float(1 - std::pow(0.999, step));
        ops::adamw(sets, h, ops::full({}, 0.37, DType::F32, dev));
      }
      return adamwValues(sets);
    };
    INFO(dtypeName(gradDType) << " gradients");
    requireSameValues(run(Device::cpu()), run(kGpu));
  }
}

TEST_CASE("[cuda] fused AdamW with bf16 moments gives the cpu kernel's bits", "[cuda][parity][optim]") {
  // optimizer.moments_dtype: bf16 (NOTE [AdamW bits] in strata/ops/Ops.h): m and v widened as read, rounded
  // to nearest even as written, on either side. Sets with fp32 moments in the same call take the other
  // launch.
  STRATA_REQUIRE_CUDA();
  auto run = [&](Device dev) {
    Generator gen(82);
    auto draw = [&](int64_t n, DType dt, double lo, double hi) {
      return ops::rand({n}, gen, DType::F32, Device::cpu(), lo, hi).to(dt).to(dev);
    };
    std::vector<ops::AdamWTensors> sets;
    for (int64_t n : {1, 7, 1000, 70000, 131072, 4099}) {
      DType moments = n == 1000 ? DType::F32 : DType::BF16;  // one fp32 set beside the bf16 ones
      sets.push_back(ops::AdamWTensors{draw(n, DType::F32, -1, 1),
                                       draw(n, n % 2 ? DType::BF16 : DType::F32, -3, 3),
                                       draw(n, moments, -0.1, 0.1), draw(n, moments, 0, 0.01), 0.1f,
                                       Tensor::empty({n}, DType::BF16, dev)});
    }
    // Moments one element into their buffers: 2-byte aligned only, the kernel's scalar loop.
    Tensor m = draw(4100, DType::BF16, -0.1, 0.1), v = draw(4100, DType::BF16, 0, 0.01);
    sets.push_back(ops::AdamWTensors{draw(4099, DType::F32, -1, 1), draw(4099, DType::F32, -3, 3),
                                     m.narrow(0, 1, 4099), v.narrow(0, 1, 4099), 0.0f, Tensor()});
    for (int step = 1; step <= 3; ++step) {
      ops::AdamWHyper h;
      h.lr = 1e-2f;
      h.beta1 = 0.9f;
      h.beta2 = 0.95f;
      h.biasCorrection1 = float(1 - std::pow(0.9, step));
      h.biasCorrection2 = float(1 - std::pow(0.95, step));
      ops::adamw(sets, h, step == 2 ? Tensor() : ops::full({}, 0.37, DType::F32, dev));
    }
    return adamwValues(sets);
  };
  requireSameValues(run(Device::cpu()), run(kGpu));
}

TEST_CASE("[cuda] fused attention matches the cpu reference, forward and backward",
          "[cuda][parity][attention]") {
  STRATA_REQUIRE_CUDA();
  // Sequence lengths that are not tile multiples, S_k > S_q (bottom-right causal alignment), both head dims,
  // and q/k/v read as strided slices of one packed [B, S, 3, H, D] buffer.
  struct Case {
    int64_t B, Sq, Sk, H, D;
  };
  for (DType dt : {DType::BF16, DType::F16}) {
    for (Case c : {Case{2, 100, 100, 3, 64}, Case{1, 130, 200, 2, 128}, Case{2, 64, 64, 2, 128},
                   Case{1, 150, 150, 2, 80}, Case{1, 1024, 1024, 1, 64}}) {
      for (bool causal : {false, true}) {
        Tensor q = randomOf({c.B, c.Sq, c.H, c.D}, dt, 100, -1, 1);
        Tensor kv = randomOf({c.B, c.Sk, 2, c.H, c.D}, dt, 101, -1, 1);
        Tensor g = randomOf({c.B, c.Sq, c.H, c.D}, dt, 102, -1, 1);
        // Scores of O(1) with a 1/sqrt(D) scale; bf16 inputs to both sides, fp32 math on both.
        Tol tol = dt == DType::BF16 ? Tol{2e-2, 2e-2} : Tol{4e-3, 4e-3};
        parity(
            causal ? "causal flash attention" : "flash attention",
            [causal](const std::vector<Tensor>& in) {
              Tensor k = in[1].select(2, 0), v = in[1].select(2, 1);
              ops::AttentionOptions o{0.0, causal};
              ops::FlashAttentionResult r = ops::flashAttention(in[0], k, v, o);
              Tensor dq = ops::emptyLike(in[0]);
              Tensor dkv = Tensor::empty(in[1].shape(), in[1].dtype(), in[1].device());
              Tensor dk = dkv.select(2, 0), dv = dkv.select(2, 1);
              ops::flashAttentionBackward(in[0], k, v, r, in[2], dq, dk, dv, o);
              return std::vector<Tensor>{r.out, r.lse2, dq, dkv};
            },
            {q, kv, g}, tol);
      }
    }
  }
}

namespace {

// NOTE [Fused attention dropout], element by element rather than to a tolerance. With q = 0 every
// probability is 1/Sk. With v the identity (v[j, d] = 1 where d == j; Sk <= D) output (i, d) is
// z(i, d) / (Sk (1 - p)), zero exactly where the mask drops probability (i, j = d). With a one-hot dO
// (dO[i, d] = 1 where d == i; Sq <= D), dV[j, d] = z(d, j) / (Sk (1 - p)): the dK/dV kernel's mask.
void requireExactDropMask(Device dev, DType dt, int64_t B, int64_t Sq, int64_t Sk, int64_t H, int64_t D,
                          uint64_t offset) {
  const double p = 0.3;
  const uint64_t seed = 4321;
  std::vector<float> v(size_t(B * Sk * H * D), 0.0f), g(size_t(B * Sq * H * D), 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t j = 0; j < Sk; ++j) v[size_t(((b * Sk + j) * H + h) * D + j)] = 1.0f;
      for (int64_t i = 0; i < Sq; ++i) g[size_t(((b * Sq + i) * H + h) * D + i)] = 1.0f;
    }
  Tensor vt = ops::to(Tensor::fromVector(v, {B, Sk, H, D}), dev, dt);
  Tensor gt = ops::to(Tensor::fromVector(g, {B, Sq, H, D}), dev, dt);
  Tensor q = ops::zeros({B, Sq, H, D}, dt, dev), k = ops::zeros({B, Sk, H, D}, dt, dev);
  ops::AttentionOptions o{0.0, false, ops::AttentionBackend::Native, p, seed, offset};
  ops::FlashAttentionResult r = ops::flashAttention(q, k, vt, o);
  Tensor dq = ops::emptyLike(q), dk = ops::emptyLike(k), dv = ops::emptyLike(vt);
  ops::flashAttentionBackward(q, k, vt, r, gt, dq, dk, dv, o);
  auto out = r.out.toVector<float>(), dV = dv.toVector<float>();
  uint32_t threshold = dropThreshold(p);
  auto keep = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    return dropKeep(seed, offset + uint64_t(((b * H + h) * Sq + i) * Sk + j), threshold);
  };
  int64_t wrong = 0, kept = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < Sq; ++i)
        for (int64_t j = 0; j < Sk; ++j) {
          bool k1 = keep(b, h, i, j);
          kept += k1;
          wrong += (out[size_t(((b * Sq + i) * H + h) * D + j)] != 0.0f) != k1;
          wrong += (dV[size_t(((b * Sk + j) * H + h) * D + i)] != 0.0f) != k1;
        }
    }
  INFO("B " << B << " Sq " << Sq << " Sk " << Sk << " H " << H << " D " << D << " offset " << offset);
  REQUIRE(wrong == 0);
  REQUIRE(double(kept) / double(B * H * Sq * Sk) == Approx(1.0 - p).margin(0.03));
}

}  // namespace

TEST_CASE("fused attention's dropout mask, element by element, on the cpu", "[attention][dropout]") {
  // The reference the GPU kernels are held to, and the check itself, in CI.
  requireExactDropMask(Device::cpu(), DType::F32, 2, 40, 64, 2, 64, 776);
  requireExactDropMask(Device::cpu(), DType::F32, 1, 60, 60, 1, 64, 777);
}

TEST_CASE("[cuda] fused attention's dropout mask, element by element", "[cuda][parity][attention]") {
  STRATA_REQUIRE_CUDA();
  // Grouped draws (offset and Sk multiples of 8) and per-element ones; Sq and Sk off and on the 64 tiles.
  for (DType dt : {DType::BF16, DType::F16}) {
    requireExactDropMask(kGpu, dt, 2, 64, 64, 2, 64, 776);
    requireExactDropMask(kGpu, dt, 1, 100, 120, 3, 128, 800);
    requireExactDropMask(kGpu, dt, 2, 77, 56, 2, 80, 16);
    requireExactDropMask(kGpu, dt, 1, 62, 60, 2, 64, 777);
    requireExactDropMask(kGpu, dt, 1, 128, 128, 1, 128, 5);
  }
}

TEST_CASE("[cuda] fused attention with dropout drops what the cpu reference drops, forward and backward",
          "[cuda][parity][attention]") {
  STRATA_REQUIRE_CUDA();
  // NOTE [Fused attention dropout]: the mask is a function of (seed, offset, b, h, i, j), so the GPU kernels
  // and the CPU reference (itself equal to softmax + ops::dropout + matmul: GradCheckTest) drop the same
  // probabilities. Asked for cuDNN, Strata's kernel runs: cuDNN draws another mask.
  struct Case {
    int64_t B, Sq, Sk, H, D;
  };
  for (Case c : {Case{2, 77, 77, 2, 64}, Case{1, 130, 200, 2, 128}, Case{1, 150, 150, 2, 80},
                 Case{2, 512, 512, 2, 64}}) {
    for (bool causal : {false, true}) {
      INFO("Sq " << c.Sq << " Sk " << c.Sk << " D " << c.D << (causal ? " causal" : ""));
      Tensor q = randomOf({c.B, c.Sq, c.H, c.D}, DType::BF16, 107, -1, 1);
      Tensor k = randomOf({c.B, c.Sk, c.H, c.D}, DType::BF16, 108, -1, 1);
      Tensor v = randomOf({c.B, c.Sk, c.H, c.D}, DType::BF16, 109, -1, 1);
      Tensor g = randomOf({c.B, c.Sq, c.H, c.D}, DType::BF16, 110, -1, 1);
      // Offset 777 takes the kernels' per-element draws; 776 with Sk a multiple of 8 their grouped ones.
      for (uint64_t offset : {uint64_t(777), uint64_t(776)}) {
        INFO("offset " << offset);
        auto run = [&](Device dev, double dropout, bool* cudnn) {
          Tensor qd = ops::to(q, dev, q.dtype()), kd = ops::to(k, dev, k.dtype()),
                 vd = ops::to(v, dev, v.dtype());
          // With dropout cuDNN is asked for (and must not run); without, Strata's kernel for the comparison.
          ops::AttentionBackend backend =
              dropout > 0 ? ops::AttentionBackend::Cudnn : ops::AttentionBackend::Native;
          ops::AttentionOptions o{0.0, causal, backend, dropout, 1234, offset};
          ops::FlashAttentionResult r = ops::flashAttention(qd, kd, vd, o);
          Tensor dq = ops::emptyLike(qd), dk = ops::emptyLike(kd), dv = ops::emptyLike(vd);
          ops::flashAttentionBackward(qd, kd, vd, r, ops::to(g, dev, g.dtype()), dq, dk, dv, o);
          if (cudnn) *cudnn = r.cudnn;
          return std::vector<Tensor>{r.out, r.lse2, dq, dk, dv};
        };
        bool cudnn = true;
        auto cpu = run(Device::cpu(), 0.1, nullptr), gpu = run(kGpu, 0.1, &cudnn);
        REQUIRE_FALSE(cudnn);
        for (size_t i = 0; i < cpu.size(); ++i) {
          INFO("output " << i);
          double worst = test::closeness(gpu[i].toVector<double>(), cpu[i].toVector<double>(), 2e-2, 2e-2);
          INFO("worst scaled error " << worst);
          REQUIRE(worst <= 1.0);
        }
        // Dropout changed the output (and left the softmax statistics alone).
        auto plain = run(kGpu, 0.0, nullptr);
        REQUIRE(test::closeness(gpu[0].toVector<double>(), plain[0].toVector<double>(), 2e-2, 2e-2) > 1.0);
        REQUIRE(test::closeness(gpu[1].toVector<double>(), plain[1].toVector<double>(), 1e-6, 1e-6) <= 1.0);
      }
    }
  }
}

TEST_CASE("[cuda] every attention backend matches the cpu: head dims 64, 80, 128, seq 77 to 2048",
          "[cuda][parity][attention]") {
  STRATA_REQUIRE_CUDA();
  std::vector<ops::AttentionBackend> backends{ops::AttentionBackend::Native};
  if (ops::cudnnAttentionBuilt()) backends.push_back(ops::AttentionBackend::Cudnn);
  struct Case {
    int64_t B, S, H, D;
  };
  // Lengths off the tile sizes (77, 1000) and on them (512, 2048), each head dim.
  for (Case c : {Case{2, 77, 2, 64}, Case{2, 77, 2, 80}, Case{2, 77, 2, 128}, Case{1, 512, 2, 80},
                 Case{1, 1000, 1, 128}, Case{1, 2048, 1, 64}, Case{1, 2048, 1, 128}}) {
    for (bool causal : {true, false}) {
      Tensor q = randomOf({c.B, c.S, c.H, c.D}, DType::BF16, 103, -1, 1);
      Tensor k = randomOf({c.B, c.S, c.H, c.D}, DType::BF16, 104, -1, 1);
      Tensor v = randomOf({c.B, c.S, c.H, c.D}, DType::BF16, 105, -1, 1);
      Tensor g = randomOf({c.B, c.S, c.H, c.D}, DType::BF16, 106, -1, 1);
      auto run = [&](Device dev, ops::AttentionBackend backend, bool* cudnn) {
        Tensor qd = ops::to(q, dev, q.dtype()), kd = ops::to(k, dev, k.dtype()),
               vd = ops::to(v, dev, v.dtype());
        ops::AttentionOptions o{0.0, causal, backend};
        ops::FlashAttentionResult r = ops::flashAttention(qd, kd, vd, o);
        Tensor dq = ops::emptyLike(qd), dk = ops::emptyLike(kd), dv = ops::emptyLike(vd);
        ops::flashAttentionBackward(qd, kd, vd, r, ops::to(g, dev, g.dtype()), dq, dk, dv, o);
        if (cudnn) *cudnn = r.cudnn;
        return std::vector<Tensor>{r.out, r.lse2, dq, dk, dv};
      };
      auto cpu = run(Device::cpu(), ops::AttentionBackend::Auto, nullptr);
      for (ops::AttentionBackend backend : backends) {
        bool cudnn = false;
        auto gpu = run(kGpu, backend, &cudnn);
        INFO("S " << c.S << " D " << c.D << (causal ? " causal" : "") << " backend "
                  << (cudnn ? "cudnn" : "native"));
        // cuDNN may refuse a case (then Strata's kernel ran); at these head dims it takes every one.
        REQUIRE(cudnn == (backend == ops::AttentionBackend::Cudnn));
        for (size_t i = 0; i < cpu.size(); ++i) {
          INFO("output " << i);
          double worst = test::closeness(gpu[i].toVector<double>(), cpu[i].toVector<double>(), 2e-2, 2e-2);
          INFO("worst scaled error " << worst);
          REQUIRE(worst <= 1.0);
        }
      }
    }
  }
}

namespace {

// Key padding for [2, S] keys: the second sequence is padded after S - 20 tokens (1 = padded, as
// AttentionMask::keyPadding reads it).
Tensor paddedKeys(int64_t S) {
  std::vector<uint8_t> padded(size_t(2 * S), 0);
  for (int64_t s = S - 20; s < S; ++s) padded[size_t(S + s)] = 1;
  return Tensor::fromVector<uint8_t>(padded, {2, S});
}

// Padded attention over [B, H, S, D] q, k, v with the output gradient g: output, dq, dk, dv.
std::vector<Tensor> paddedAttention(const std::vector<Tensor>& in) {
  std::vector<Tensor> x;
  for (int i = 0; i < 3; ++i) x.push_back(in[size_t(i)].detach().clone().setRequiresGrad(true));
  AttentionMask mask;
  mask.keyPadding = in[4];
  Tensor y = scaledDotProductAttention(x[0], x[1], x[2], mask);
  backward(sum(mul(y.to(DType::F32), in[3].to(DType::F32))));
  return {y.detach(), x[0].grad(), x[1].grad(), x[2].grad()};
}

}  // namespace

TEST_CASE("padded attention: finite, and padded keys get no gradient (the mask the [cuda] case uses)",
          "[attention]") {
  int64_t S = 30;
  Tensor q = randomOf({2, 2, S, 8}, DType::F32, 107, -1, 1),
         k = randomOf({2, 2, S, 8}, DType::F32, 108, -1, 1);
  Tensor v = randomOf({2, 2, S, 8}, DType::F32, 109, -1, 1),
         g = randomOf({2, 2, S, 8}, DType::F32, 110, -1, 1);
  auto out = paddedAttention({q, k, v, g, paddedKeys(S)});
  for (const Tensor& t : out)
    for (double x : t.toVector<double>()) REQUIRE(std::isfinite(x));
  // dk and dv of sequence 1's padded keys are zero; its kept keys' are not.
  for (size_t i : {size_t(2), size_t(3)}) {
    std::vector<double> grad = out[i].toVector<double>();
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t s = 0; s < S; ++s) {
        double norm = 0;
        for (int64_t d = 0; d < 8; ++d) norm += std::abs(grad[size_t(((S * 2 + h * S) + s) * 8 + d)]);
        if (s >= S - 20)
          REQUIRE(norm == 0.0);
        else
          REQUIRE(norm > 0.0);
      }
  }
}

TEST_CASE("[cuda] attention with key padding matches the cpu (the composed path BERT and T5 take)",
          "[cuda][parity][attention]") {
  STRATA_REQUIRE_CUDA();
  for (int64_t D : {64, 80, 128}) {
    for (int64_t S : {77, 300}) {
      Tensor q = randomOf({2, 2, S, D}, DType::BF16, 107, -1, 1),
             k = randomOf({2, 2, S, D}, DType::BF16, 108, -1, 1);
      Tensor v = randomOf({2, 2, S, D}, DType::BF16, 109, -1, 1),
             g = randomOf({2, 2, S, D}, DType::BF16, 110, -1, 1);
      parity("padded attention", paddedAttention, {q, k, v, g, paddedKeys(S)}, {3e-2, 3e-2});
    }
  }
}

TEST_CASE("[cuda] packed fused self-attention trains like the cpu", "[cuda][parity][attention]") {
  STRATA_REQUIRE_CUDA();
  // The autograd function the Attention module uses: one packed qkv in, one packed gradient out.
  Tensor qkv = randomOf({2, 77, 3 * 2 * 64}, DType::BF16, 110, -1, 1);
  Tensor g = randomOf({2, 77, 2 * 64}, DType::BF16, 111, -1, 1);
  parity("packed attention",
         [](const std::vector<Tensor>& in) {
           Tensor x = in[0].detach().clone();
           x.setRequiresGrad(true);
           Tensor y = flashAttentionPacked(x, 2, true);
           backward(sum(mul(y.to(DType::F32), in[1].to(DType::F32))));
           return std::vector<Tensor>{y.detach(), x.grad()};
         },
         {qkv, g}, {2e-2, 2e-2});
}

TEST_CASE("[cuda] multi-tensor sum of squares matches the cpu", "[cuda][parity][optim]") {
  STRATA_REQUIRE_CUDA();
  // Sizes across the 65536-element chunking, and an unaligned contiguous view (offset 1) for the scalar path.
  Tensor big = randomOf({200003}, DType::F32, 120), small = randomOf({7}, DType::F32, 121);
  Tensor shifted = randomOf({1001}, DType::F32, 122).narrow(0, 1, 1000);
  parity("sum of squares",
         [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::sumOfSquares(in)}; },
         {big, small, shifted}, {1e-3, 1e-5});
}

TEST_CASE("[cuda] the sum of squares in parts equals the sum in one call bit for bit", "[cuda][optim]") {
  STRATA_REQUIRE_CUDA();
  // NOTE [Gradient homes] in zero/GradientReducer.h: chunks take their partial sums at different times.
  Device dev = Device::cuda(0);
  auto onDevice = [&](const Tensor& t) { return ops::to(t, dev, DType::F32); };
  std::vector<Tensor> tensors = {onDevice(randomOf({200003}, DType::F32, 140)),
                                 onDevice(randomOf({7}, DType::F32, 141)),
                                 onDevice(randomOf({1001}, DType::F32, 142)).narrow(0, 1, 1000)};
  double whole = ops::sumOfSquares(tensors).item();
  for (size_t split = 1; split < tensors.size(); ++split) {
    INFO("split at " << split);
    Tensor first = ops::sumOfSquaresParts(std::vector<Tensor>(tensors.begin(), tensors.begin() + split));
    Tensor second = ops::sumOfSquaresParts(std::vector<Tensor>(tensors.begin() + split, tensors.end()));
    REQUIRE(ops::sumParts({first, second}).item() == whole);
  }
  REQUIRE(ops::sumParts({ops::sumOfSquaresParts(tensors)}).item() == whole);
}

TEST_CASE("[cuda] linear with the bias epilogue matches the cpu", "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    Tol t = tolFor(dt);
    for (auto [rows, K, N] : {std::array<int64_t, 3>{64, 32, 48}, std::array<int64_t, 3>{300, 96, 200}}) {
      parity(
          "linear + bias",
          [](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::linear(in[0], in[1], in[2])}; },
          {randomOf({rows, K}, dt, 130, -1, 1), randomOf({K, N}, dt, 131, -1, 1), randomOf({N}, dt, 132)},
          {t.atol * 4, t.rtol * 4});
    }
  }
}

TEST_CASE("[cuda] autotuned GEMMs match the cpu and leave accumulated outputs alone", "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  // Shapes no other test plans, so these plans are made (and autotuned) here.
  ScopedEnv autotune("STRATA_GEMM_AUTOTUNE", "1");
  Tensor a = randomOf({328, 200}, DType::BF16, 140, -1, 1), b = randomOf({200, 136}, DType::BF16, 141, -1, 1);
  Tensor base = randomOf({328, 136}, DType::F32, 142, -1, 1);
  parity("autotuned matmul and accumulate",
         [](const std::vector<Tensor>& in) {
           Tensor acc = in[2].clone();
           ops::matmulAccumulate(acc, in[0], in[1]);  // beta 1: timed into scratch, then run once
           return std::vector<Tensor>{ops::matmul(in[0], in[1]), acc};
         },
         {a, b, base}, {8e-2, 8e-2});
}

TEST_CASE("[cuda] plain-cuBLAS GEMMs (STRATA_GEMM_BACKEND=cublas) match the cpu", "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  // Shapes no other test plans, so these plans are made here with the backend set.
  ScopedEnv backend("STRATA_GEMM_BACKEND", "cublas");
  for (DType dt : kFloatTypes) {
    Tol t = tolFor(dt);
    Tol mmTol{t.atol * 4, t.rtol * 2};
    Tensor a = randomOf({331, 203}, dt, 150, -1, 1), b = randomOf({203, 139}, dt, 151, -1, 1);
    Tensor a3 = randomOf({3, 61, 40}, dt, 153, -1, 1), b3 = randomOf({3, 40, 29}, dt, 154, -1, 1);
    parity(
        "cublas mm, transposed, batched",
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{
              ops::matmul(in[0], in[1]),
              ops::matmul(detail::permuteRaw(in[1], {1, 0}), detail::permuteRaw(in[0], {1, 0})),
              ops::matmul(in[2], in[3])};
        },
        {a, b, a3, b3}, mmTol);
    if (dt == DType::F32) continue;
    Tensor base = randomOf({331, 139}, DType::F32, 152, -1, 1);
    parity("cublas accumulate into fp32",
           [](const std::vector<Tensor>& in) {
             Tensor acc = in[2].clone();
             ops::matmulAccumulate(acc, in[0], in[1]);
             return std::vector<Tensor>{acc};
           },
           {a, b, base}, {8e-2, 8e-2});
  }
}

// bf16 parameters with fp32 gradient buffers, as training lays them out (NOTE [Gradient buffers]): clones of
// `in` that require grad, with buffers for those from index `firstParam` on.
std::vector<Tensor> withGradBuffers(const std::vector<Tensor>& in, size_t count, size_t firstParam) {
  std::vector<Tensor> p;
  for (size_t i = 0; i < count; ++i) {
    p.push_back(in[i].detach().clone());
    p.back().setRequiresGrad(true);
    if (i >= firstParam)
      autograd::setGradBuffer(p.back(), ops::full(p.back().shape(), NAN, DType::F32, p.back().device()));
  }
  return p;
}

TEST_CASE("[cuda] bf16 linear accumulates fp32 gradients in its parameters' buffers like the cpu",
          "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  // Two backwards: the weight-gradient GEMM stores (beta 0, bias from the epilogue), then adds (beta 1).
  Tensor x = randomOf({4, 50, 96}, DType::BF16, 140, -1, 1),
         w = randomOf({96, 80}, DType::BF16, 141, -0.2, 0.2);
  Tensor b = randomOf({80}, DType::BF16, 142), g = randomOf({4, 50, 80}, DType::BF16, 143, -1, 1);
  parity("bf16 linear, fp32 gradient buffers",
         [](const std::vector<Tensor>& in) {
           std::vector<Tensor> p = withGradBuffers(in, 3, 1);
           Tensor y;
           for (int micro = 0; micro < 2; ++micro) {
             y = linear(p[0], p[1], p[2]);
             backward(sum(mul(y.to(DType::F32), in[3].to(DType::F32))));
           }
           REQUIRE(p[1].grad().dtype() == DType::F32);
           REQUIRE(p[2].grad().dtype() == DType::F32);
           return std::vector<Tensor>{y.detach(), p[0].grad(), p[1].grad(), p[2].grad()};
         },
         {x, w, b, g}, {5e-2, 2e-2});
}

TEST_CASE("[cuda] GELU and bias-gradient GEMM epilogues match the cpu", "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    Tol t = tolFor(dt);
    Tensor x = randomOf({300, 96}, dt, 150, -1, 1), w = randomOf({96, 200}, dt, 151, -0.3, 0.3);
    Tensor b = randomOf({200}, dt, 152), g = randomOf({300, 64}, dt, 153, -1, 1);
    Tensor w2 = randomOf({64, 200}, dt, 154, -0.3, 0.3);
    parity("linearGelu",
           [](const std::vector<Tensor>& in) {
             ops::LinearGeluResult r = ops::linearGelu(in[0], in[1], in[2]);
             return std::vector<Tensor>{r.out, r.pre};
           },
           {x, w, b}, {t.atol * 4, t.rtol * 4});
    parity("matmulGeluBackward",
           [](const std::vector<Tensor>& in) {
             return std::vector<Tensor>{ops::matmulGeluBackward(in[0], in[1], in[2])};
           },
           {g, w2, randomOf({300, 200}, dt, 155, -3, 3)}, {t.atol * 4, t.rtol * 4});
    parity("linearParamGrads",
           [](const std::vector<Tensor>& in) {
             ops::LinearParamGrads p = ops::linearParamGrads(in[0], in[1], DType::F32, true);
             return std::vector<Tensor>{p.weight, p.bias};
           },
           {x, g}, {t.atol * 8, t.rtol * 8});
  }
}

TEST_CASE("[cuda] bf16 GELU MLP accumulates fp32 gradients in its parameters' buffers like the cpu",
          "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  Tensor x = randomOf({4, 50, 96}, DType::BF16, 160, -1, 1),
         g = randomOf({4, 50, 96}, DType::BF16, 161, -1, 1);
  Tensor w1 = randomOf({96, 384}, DType::BF16, 162, -0.2, 0.2), b1 = randomOf({384}, DType::BF16, 163);
  Tensor w2 = randomOf({384, 96}, DType::BF16, 164, -0.1, 0.1), b2 = randomOf({96}, DType::BF16, 165);
  parity("bf16 gelu mlp, fp32 gradient buffers",
         [](const std::vector<Tensor>& in) {
           std::vector<Tensor> p = withGradBuffers(in, 5, 1);
           Tensor y;
           for (int micro = 0; micro < 2; ++micro) {
             y = geluMlp(p[0], p[1], p[2], p[3], p[4]);
             backward(sum(mul(y.to(DType::F32), in[5].to(DType::F32))));
           }
           for (size_t i = 1; i < 5; ++i) REQUIRE(p[i].grad().dtype() == DType::F32);
           return std::vector<Tensor>{y.detach(),  p[0].grad(), p[1].grad(),
                                      p[2].grad(), p[3].grad(), p[4].grad()};
         },
         {x, w1, b1, w2, b2, g}, {1e-1, 2e-2});  // two backwards: gradients twice the size
}

TEST_CASE("[cuda] layer norm with a fused residual and fp32 parameters matches the cpu", "[cuda][parity]") {
  STRATA_REQUIRE_CUDA();
  // Widths covering the register-cached rows (64, 2048) and an odd width (unpacked loads).
  for (int64_t C : {64, 2048, 100}) {
    for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
      Tol t = tolFor(dt);
      Tensor x = randomOf({37, C}, dt, 170, -2, 2), r = randomOf({37, C}, dt, 171),
             g = randomOf({37, C}, dt, 172);
      Tensor gs = randomOf({37, C}, dt, 173);
      Tensor w = randomOf({C}, DType::F32, 174, 0.5, 1.5), b = randomOf({C}, DType::F32, 175);
      parity("add + layer_norm, fp32 params",
             [](const std::vector<Tensor>& in) {
               ops::NormResult n = ops::layerNorm(in[0], in[3], in[4], 1e-5, in[1]);
               ops::NormGrads gr = ops::layerNormBackward(in[2], n.sum, in[3], n, true, true, in[5]);
               REQUIRE(gr.weight.dtype() == DType::F32);
               return std::vector<Tensor>{n.y, n.sum, n.mean, n.rstd, gr.x, gr.weight, gr.bias};
             },
             {x, r, g, w, b, gs}, {t.atol * double(C) / 64 + t.atol, t.rtol});
    }
  }
}
