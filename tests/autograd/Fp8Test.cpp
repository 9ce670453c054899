// fp8Linear and Fp8Scaling on the CPU (NOTE [FP8 training] in autograd/Fp8.h): the emulated products against
// the recipe written out with the conversion, the amaxes recorded, the bf16 fallback, and the state's save.
#include <algorithm>
#include <cmath>
#include <vector>

#include "TestUtil.h"
#include "strata/autograd/Fp8.h"
#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"

using namespace strata;
using namespace strata::test;

namespace {

// x quantised to `format` at `scale` and back (what the GEMMs multiply).
Tensor quantised(const Tensor& x, Fp8Format format, float scale) {
  std::vector<float> v = x.toVector<float>();
  for (float& e : v) e = fp8ToFloat(floatToFp8(e * scale, format), format) / scale;
  return Tensor::fromVector<float>(v, x.shape());
}

// Sets a state's three scales and their inverses.
void setScales(const Tensor& state, float x, float w, float g) {
  const float scales[3] = {x, w, g};
  for (int role = 0; role < 3; ++role) {
    ops::copy(state.narrow(0, fp8ScaleSlot(role), 1), Tensor::fromVector<float>({scales[role]}, {1}));
    ops::copy(state.narrow(0, fp8InverseSlot(role), 1), Tensor::fromVector<float>({1 / scales[role]}, {1}));
  }
}

float largest(const Tensor& x) {
  float m = 0;
  for (float e : x.toVector<float>()) m = std::max(m, std::abs(e));
  return m;
}

}  // namespace

TEST_CASE("fp8Linear multiplies E4M3 inputs and weights, E5M2 gradients, and records the amaxes",
          "[autograd][fp8]") {
  const int64_t rows = 32, K = 48, N = 16, H = 8;
  Generator g(7);
  Tensor x = ops::randn({2, rows / 2, K}, g).setRequiresGrad();
  Tensor w = ops::randn({K, N}, g, DType::F32, Device::cpu(), 0, 0.1).setRequiresGrad();
  Tensor b = ops::randn({N}, g).setRequiresGrad();
  auto scaling = autograd::Fp8Scaling::create(autograd::Fp8Recipe{H, 0, false}, Device::cpu());
  auto state = scaling->add("layer");
  // Move on to position 2 with some scales other than 1: x 8, W 64, g 1024 (inverses follow).
  scaling->update();
  scaling->update();
  setScales(state->state, 8.0f, 64.0f, 1024.0f);
  Tensor y = fp8Linear(x, w, b, *state);
  REQUIRE(y.shape() == Shape({2, rows / 2, N}));
  Tensor xq = quantised(x.detach(), Fp8Format::E4M3, 8), wq = quantised(w.detach(), Fp8Format::E4M3, 64);
  requireClose(y.detach(), ops::add(ops::matmul(xq, wq), b.detach()), 1e-5, 1e-5);
  Tensor gy = ops::randn({2, rows / 2, N}, g);
  backward({y}, {gy});
  Tensor gq = quantised(gy, Fp8Format::E5M2, 1024);
  requireClose(x.grad(), ops::matmul(gq, ops::contiguous(wq.transpose(0, 1))), 1e-5, 1e-5);
  Tensor gq2 = gq.reshape({rows, N});
  requireClose(w.grad(), ops::matmul(ops::contiguous(xq.reshape({rows, K}).transpose(0, 1)), gq2), 1e-5,
               1e-5);
  requireClose(b.grad(), ops::sum(gy.reshape({rows, N}), {0}), 1e-5, 1e-5);
  // Each cast maxed its tensor's amax into entry 2 of its history.
  std::vector<float> s = state->state.toVector<float>();
  REQUIRE(s[kFp8StateHeader + 2] == largest(x.detach()));
  REQUIRE(s[kFp8StateHeader + H + 2] == largest(w.detach()));
  REQUIRE(s[kFp8StateHeader + 2 * H + 2] == largest(gy));
  REQUIRE(s[kFp8StateHeader + 1] == 0.0f);
  // The next step's scales come from them.
  scaling->update();
  s = state->state.toVector<float>();
  REQUIRE(s[fp8ScaleSlot(0)] == 448.0f / largest(x.detach()));
  REQUIRE(s[fp8ScaleSlot(2)] == 57344.0f / largest(gy));
  REQUIRE(scaling->position() == 3);
}

TEST_CASE("fp8Linear records nothing without gradients and falls back to bf16 at other shapes",
          "[autograd][fp8]") {
  Generator g(3);
  auto scaling = autograd::Fp8Scaling::create(autograd::Fp8Recipe{4, 0, false}, Device::cpu());
  auto state = scaling->add("layer");
  Tensor x = ops::randn({16, 32}, g), w = ops::randn({32, 16}, g);
  {
    NoGradGuard noGrad;
    Tensor y = fp8Linear(x, w, Tensor(), *state);
    requireClose(y, ops::matmul(quantised(x, Fp8Format::E4M3, 1), quantised(w, Fp8Format::E4M3, 1)), 1e-5,
                 1e-5);
  }
  std::vector<float> s = state->state.toVector<float>();
  REQUIRE(std::all_of(s.begin() + kFp8StateHeader, s.end(), [](float v) { return v == 0.0f; }));
  // K = 20 is no multiple of 16: the product runs unquantised, as linear() does.
  Tensor x2 = ops::randn({16, 20}, g).setRequiresGrad(), w2 = ops::randn({20, 16}, g).setRequiresGrad();
  Tensor y2 = fp8Linear(x2, w2, Tensor(), *state);
  REQUIRE(y2.toVector<float>() == linear(x2, w2).toVector<float>());
  s = state->state.toVector<float>();
  REQUIRE(std::all_of(s.begin() + kFp8StateHeader, s.end(), [](float v) { return v == 0.0f; }));
}

namespace {

// proj(gelu(fc(x))) in FP8, fused (fp8GeluMlp) or composed (fp8Linear, gelu, fp8Linear), over two steps on
// `device`: the second step's output, every gradient, and both layers' states.
std::vector<Tensor> fp8MlpRun(bool fused, Device device, DType dtype, const std::vector<Tensor>& values,
                              const Tensor& gy) {
  auto scaling = autograd::Fp8Scaling::create(autograd::Fp8Recipe{4, 0, false}, device);
  auto fc = scaling->add("fc"), proj = scaling->add("proj");
  std::vector<Tensor> leaves;
  for (const Tensor& v : values) leaves.push_back(ops::to(v.clone(), device, dtype).setRequiresGrad());
  const Tensor &x = leaves[0], &w1 = leaves[1], &b1 = leaves[2], &w2 = leaves[3], &b2 = leaves[4];
  std::vector<Tensor> out;
  for (int step = 0; step < 2; ++step) {
    for (Tensor& l : leaves) l.setGrad(Tensor());
    Tensor y = fused ? fp8GeluMlp(x, w1, b1, w2, b2, *fc, *proj)
                     : fp8Linear(gelu(fp8Linear(x, w1, b1, *fc), GeluApprox::Tanh), w2, b2, *proj);
    backward({y}, {gy.to(device, dtype)});
    scaling->update();
    if (step == 1)
      out = {y.detach(), x.grad(), w1.grad(), b1.grad(), w2.grad(), b2.grad(), fc->state, proj->state};
  }
  for (Tensor& t : out) t = ops::to(t, Device::cpu(), DType::F32);
  return out;
}

std::vector<Tensor> fp8MlpValues(int64_t rows, int64_t C, int64_t F, uint64_t seed) {
  Generator g(seed);
  return {ops::randn({2, rows / 2, C}, g), ops::randn({C, F}, g, DType::F32, Device::cpu(), 0, 0.1),
          ops::randn({F}, g, DType::F32, Device::cpu(), 0, 0.1),
          ops::randn({F, C}, g, DType::F32, Device::cpu(), 0, 0.05),
          ops::randn({C}, g, DType::F32, Device::cpu(), 0, 0.1)};
}

void requireSameBits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    REQUIRE(a[i].toVector<float>() == b[i].toVector<float>());
  }
}

// fp8GeluMlp against the composed layers on `device`, in fp32 and bf16: the same bits, and scales moved off 1
// (the second step cast with recorded amaxes).
void requireFusedMlpIsComposed(Device device, int64_t rows, int64_t C, int64_t F, uint64_t seed) {
  std::vector<Tensor> values = fp8MlpValues(rows, C, F, seed);
  Generator g(seed + 1);
  Tensor gy = ops::randn({2, rows / 2, C}, g, DType::F32, Device::cpu(), 0, 1e-2);
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtypeName(dt));
    std::vector<Tensor> fused = fp8MlpRun(true, device, dt, values, gy);
    requireSameBits(fused, fp8MlpRun(false, device, dt, values, gy));
    REQUIRE(fused[6].toVector<float>()[size_t(fp8ScaleSlot(0))] != 1.0f);
  }
}

}  // namespace

TEST_CASE("fp8GeluMlp gives fp8Linear, gelu, fp8Linear's bits: outputs, gradients and scales",
          "[autograd][fp8]") {
  // 144 rows: two blocks of 64 rows for the bias sums and a partial one (FP8 shapes: multiples of 16).
  requireFusedMlpIsComposed(Device::cpu(), 144, 32, 128, 17);
}

TEST_CASE("Fp8Scaling saves and loads its scales, histories and position", "[autograd][fp8]") {
  auto a = autograd::Fp8Scaling::create(autograd::Fp8Recipe{4, 1, false}, Device::cpu());
  auto sa = a->add("one");
  a->add("two");
  ops::copy(sa->state.narrow(0, kFp8StateHeader, 1), Tensor::fromVector<float>({2.0f}, {1}));
  a->update();
  REQUIRE(sa->state.toVector<float>()[fp8ScaleSlot(0)] == 448.0f / 2.0f / 2.0f);
  Tensor flat = a->save();
  REQUIRE(flat.numel() == a->savedElements());
  auto b = autograd::Fp8Scaling::create(autograd::Fp8Recipe{4, 1, false}, Device::cpu());
  auto sb = b->add("one");
  b->add("two");
  b->load(flat, "test");
  REQUIRE(b->position() == 1);
  REQUIRE(sb->state.toVector<float>() == sa->state.toVector<float>());
  // Another history length or other layers are refused, naming the key.
  auto c = autograd::Fp8Scaling::create(autograd::Fp8Recipe{8, 1, false}, Device::cpu());
  c->add("one");
  c->add("two");
  REQUIRE(errorOf([&] { c->load(flat, "test"); }).find("precision.fp8_amax_history") != std::string::npos);
}

TEST_CASE("[cuda] fp8Linear on the GPU gives the CPU emulation's outputs, gradients and scales",
          "[cuda][autograd][fp8]") {
  STRATA_REQUIRE_CUDA();
  const Device gpu = Device::cuda(0);
  const int64_t rows = 64, K = 96, N = 80, H = 4;
  for (DType dt : {DType::F32, DType::BF16}) {
    INFO(dtypeName(dt));
    Generator g(13);
    // Values a bf16 holds exactly, so both devices cast the same numbers.
    auto values = [&](const Shape& shape, double std) {
      return ops::to(ops::randn(shape, g, DType::F32, Device::cpu(), 0, std), Device::cpu(), DType::BF16)
          .to(DType::F32);
    };
    Tensor x = values({rows, K}, 1.0), w = values({K, N}, 0.05), b = values({N}, 1.0),
           gy = values({rows, N}, 1e-3);
    auto run = [&](Device device, DType dtype) {
      auto scaling = autograd::Fp8Scaling::create(autograd::Fp8Recipe{H, 0, false}, device);
      auto state = scaling->add("layer");
      // Fresh leaves (ops::to may hand back its input when nothing changes).
      Tensor xd = ops::to(x.clone(), device, dtype).setRequiresGrad();
      Tensor wd = ops::to(w.clone(), device, dtype).setRequiresGrad();
      Tensor bd = ops::to(b.clone(), device, dtype).setRequiresGrad();
      std::vector<Tensor> out;
      // Two steps: the second casts with the scales the first one's amaxes gave.
      for (int step = 0; step < 2; ++step) {
        xd.setGrad(Tensor());
        wd.setGrad(Tensor());
        bd.setGrad(Tensor());
        Tensor y = fp8Linear(xd, wd, bd, *state);
        backward({y}, {gy.to(device, dtype)});
        scaling->update();
        if (step == 1) out = {y.detach(), xd.grad(), wd.grad(), bd.grad(), state->state};
      }
      for (Tensor& t : out) t = ops::to(t, Device::cpu(), DType::F32);
      return out;
    };
    std::vector<Tensor> cpu = run(Device::cpu(), DType::F32), dev = run(gpu, dt);
    // The same products; the sums' order, the tensor cores' narrower adds (about 14 bits between promotions
    // to fp32) and a bf16 output's rounding differ.
    double rtol = dt == DType::BF16 ? 1e-2 : 1e-3;
    for (size_t i = 0; i < 4; ++i) {
      INFO("tensor " << i);
      std::vector<float> v = cpu[i].toVector<float>();
      double scale = 0;
      for (float e : v) scale = std::max(scale, double(std::abs(e)));
      requireClose(dev[i], cpu[i], 4e-3 * scale, rtol);
    }
    // The scales and histories: the amaxes of the same values, the same arithmetic.
    REQUIRE(dev[4].toVector<float>() == cpu[4].toVector<float>());
  }
}

TEST_CASE("linearCrossEntropy in FP8 multiplies E4M3 rows and table, E5M2 softmax gradients",
          "[autograd][fp8]") {
  // 48 rows in chunks of 16 (20 rounds down), a table of 32 entries of 16.
  const int64_t N = 48, V = 32, C = 16, H = 4;
  Generator g(21);
  Tensor x = ops::randn({N, C}, g).setRequiresGrad();
  Tensor w = ops::randn({V, C}, g, DType::F32, Device::cpu(), 0, 0.5).setRequiresGrad();
  std::vector<int64_t> t;
  for (int64_t i = 0; i < N; ++i) t.push_back(i % 5 == 0 ? -100 : (i * 7) % V);
  Tensor target = Tensor::fromVector<int64_t>(t, {N});
  auto scaling = autograd::Fp8Scaling::create(autograd::Fp8Recipe{H, 0, false}, Device::cpu());
  auto state = scaling->add("wte");
  setScales(state->state, 16.0f, 128.0f, 4096.0f);
  Tensor loss = linearCrossEntropy(x, w, target, -100, 20, state.get());
  backward(loss);
  // The recipe written out: the logits of the quantised operands, the softmax gradient quantised to E5M2,
  // both gradient products over the quantised operands, divided by the rows counted.
  Tensor xq = quantised(x.detach(), Fp8Format::E4M3, 16), wq = quantised(w.detach(), Fp8Format::E4M3, 128);
  Tensor logits = ops::matmul(xq, ops::contiguous(wq.transpose(0, 1)));
  Tensor reference = crossEntropy(logits, target);
  REQUIRE(std::abs(loss.item() - reference.item()) < 1e-5);
  std::vector<float> p = ops::softmax(logits).toVector<float>();
  double counted = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (t[size_t(i)] < 0) {
      for (int64_t v = 0; v < V; ++v) p[size_t(i * V + v)] = 0;
      continue;
    }
    p[size_t(i * V + t[size_t(i)])] -= 1;
    counted += 1;
  }
  Tensor dq = quantised(Tensor::fromVector<float>(p, {N, V}), Fp8Format::E5M2, 4096);
  requireClose(x.grad(), ops::mul(ops::matmul(dq, wq), ops::full({}, 1 / counted)), 1e-5, 1e-4);
  requireClose(w.grad(),
               ops::mul(ops::matmul(ops::contiguous(dq.transpose(0, 1)), xq), ops::full({}, 1 / counted)),
               1e-5, 1e-4);
  // The three amaxes of this step's entry.
  std::vector<float> s = state->state.toVector<float>();
  REQUIRE(s[kFp8StateHeader] == largest(x.detach()));
  REQUIRE(s[kFp8StateHeader + H] == largest(w.detach()));
  REQUIRE(s[kFp8StateHeader + 2 * H] > 0.5f);
  REQUIRE(s[kFp8StateHeader + 2 * H] <= 1.0f);
}

TEST_CASE("[cuda] fp8GeluMlp on the GPU gives the GPU's composed layers' bits", "[cuda][autograd][fp8]") {
  STRATA_REQUIRE_CUDA();
  requireFusedMlpIsComposed(Device::cuda(0), 256, 64, 256, 23);
}
