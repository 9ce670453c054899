// Fused attention with an additive bias (NOTE [Biased fused attention] in kernels/FlashAttention.cuh): the
// CPU reference and the autograd functions against the composed attention, the routing rule, and (tagged
// [cuda], skipped without a GPU) both CUDA backends against the composed path.
#include <cmath>
#include <string>

#include "TestUtil.h"

using namespace strata;

namespace {

// softmax(scale q k^T + bias [+ causal]) v and the gradients of q, k, v and the bias for the output gradient
// g, through the composed path (q, k, v [B, H, S, D]) or the fused one (given [B, S, H, D] views of the
// same), dropping probabilities with `dropout` from generator state `seed`. Computed in the inputs' dtype.
struct Attended {
  Tensor out, dq, dk, dv, dbias;
};
Attended attend(bool fused, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                const Tensor& g, bool causal, double scale, double dropout, uint64_t seed) {
  Tensor a = q.detach().clone(), b = k.detach().clone(), c = v.detach().clone(), d = bias.detach().clone();
  for (Tensor* t : {&a, &b, &c, &d}) t->setRequiresGrad(true);
  Generator gen(seed);
  gen.reserve(5);  // not at offset 0 (the dropout draw starts at 8: NOTE [Dropout bits])
  Tensor y;
  if (fused) {
    y = flashAttention(a.transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2), causal, scale, dropout, gen,
                       d)
            .transpose(1, 2);
  } else {
    AttentionMask mask;
    mask.causal = causal;
    mask.bias = d;
    y = scaledDotProductAttention(a, b, c, mask, dropout, true, scale, gen);
  }
  backward(sum(mul(y.to(DType::F32), g.to(DType::F32))));
  return {y.detach(), a.grad(), b.grad(), c.grad(), d.grad()};
}

void requireSame(const Attended& got, const Attended& want, double atol, double rtol) {
  const char* names[] = {"output", "dq", "dk", "dv", "dbias"};
  const Tensor* g[] = {&got.out, &got.dq, &got.dk, &got.dv, &got.dbias};
  const Tensor* w[] = {&want.out, &want.dq, &want.dk, &want.dv, &want.dbias};
  for (int i = 0; i < 5; ++i) {
    INFO(names[i]);
    REQUIRE(g[i]->defined());
    REQUIRE(g[i]->shape() == w[i]->shape());
    double worst = test::closeness(g[i]->toVector<double>(), w[i]->toVector<double>(), atol, rtol);
    INFO("worst scaled error " << worst);
    REQUIRE(worst <= 1.0);
  }
}

Tensor uniform(const Shape& shape, DType dt, uint64_t seed, double lo, double hi) {
  Generator gen(seed);
  return ops::rand(shape, gen, DType::F32, Device::cpu(), lo, hi).to(dt);
}

}  // namespace

TEST_CASE("fused attention with a bias equals the composed attention, values and all gradients",
          "[attention][autograd]") {
  // The CPU reference kernel through the autograd function, in f64: a bias shared by the batch (its gradient
  // summed over it) and one per batch, causal with S_k > S_q, with and without dropout (both paths draw one
  // mask from one generator state).
  int64_t B = 2, H = 3, Sq = 5, Sk = 7, D = 4;
  Tensor q = test::randomDouble({B, H, Sq, D}, 200), k = test::randomDouble({B, H, Sk, D}, 201),
         v = test::randomDouble({B, H, Sk, D}, 202), g = test::randomDouble({B, H, Sq, D}, 203);
  for (int64_t biasBatch : {int64_t(1), B}) {
    Tensor bias = test::randomDouble({biasBatch, H, Sq, Sk}, 204, -2, 2);
    for (bool causal : {false, true}) {
      for (double dropout : {0.0, 0.3}) {
        INFO("bias batch " << biasBatch << (causal ? ", causal" : "") << ", dropout " << dropout);
        Attended composed = attend(false, q, k, v, bias, g, causal, 0.7, dropout, 31);
        Attended fused = attend(true, q, k, v, bias, g, causal, 0.7, dropout, 31);
        requireSame(fused, composed, 1e-12, 1e-10);
        // The bias matters: without it the output moves.
        Attended unbiased = attend(false, q, k, v, ops::zerosLike(bias), g, causal, 0.7, dropout, 31);
        REQUIRE(test::closeness(composed.out.toVector<double>(), unbiased.out.toVector<double>(), 1e-6,
                                1e-6) > 1.0);
      }
    }
  }
}

TEST_CASE("gradcheck: fused attention with a bias, shared by the batch and not", "[autograd][gradcheck]") {
  for (bool causal : {false, true}) {
    // Packed self-attention (the encoder's and decoder's self-attention) with a bias shared by the batch.
    test::gradCheck(
        [causal](const std::vector<Tensor>& x) {
          return flashAttentionPacked(x[0], 2, causal, 1.0, 0.0, defaultGenerator(), x[1]);
        },
        {test::randomDouble({2, 5, 3 * 2 * 3}, 205), test::randomDouble({1, 2, 5, 5}, 206, -2, 2)});
    // Separate q, k, v with S_k > S_q and a bias per batch.
    test::gradCheck(
        [causal](const std::vector<Tensor>& x) {
          return flashAttention(x[0], x[1], x[2], causal, 0.0, 0.0, defaultGenerator(), x[3]);
        },
        {test::randomDouble({2, 3, 2, 4}, 207), test::randomDouble({2, 5, 2, 4}, 208),
         test::randomDouble({2, 5, 2, 4}, 209), test::randomDouble({2, 2, 3, 5}, 210, -2, 2)});
  }
}

TEST_CASE("fused attention's bias from a strided view is read as the same values", "[attention]") {
  // A bias whose last dim is not contiguous (a permuted view) is copied first.
  int64_t B = 2, H = 2, Sq = 4, Sk = 6, D = 4;
  Tensor q = test::randomDouble({B, Sq, H, D}, 211), k = test::randomDouble({B, Sk, H, D}, 212),
         v = test::randomDouble({B, Sk, H, D}, 213);
  Tensor table = test::randomDouble({Sq, Sk, H}, 214, -2, 2);
  Tensor strided = table.permute({2, 0, 1}).unsqueeze(0);
  REQUIRE(strided.strides()[3] != 1);
  ops::AttentionOptions o{0.0, true};
  o.bias = strided;
  Tensor viaView = ops::flashAttention(q, k, v, o).out;
  o.bias = ops::contiguous(strided);
  test::requireClose(viaView, ops::flashAttention(q, k, v, o).out, 0.0, 0.0);
  // A bias of the wrong shape is refused with the shape it needs.
  o.bias = test::randomDouble({1, H, Sq, Sq}, 215);
  try {
    ops::flashAttention(q, k, v, o);
    FAIL("a [1, 2, 4, 4] bias for 6 keys was taken");
  } catch (const Error& e) {
    REQUIRE(std::string(e.what()).find("[1 or 2, 2, 4, 6]") != std::string::npos);
  }
}

TEST_CASE("fused attention takes a bias of [1 or B, H, S_q, S_k] in the operands' dtype, no key padding",
          "[attention]") {
  // The rule nn::Attention routes by (then flashAttentionUsable: a CUDA device, bf16/f16, head dims).
  int64_t B = 4, H = 3, Sq = 5, Sk = 7;
  auto takes = [&](const Shape& biasShape, DType dt, bool padded) {
    AttentionMask mask;
    if (!biasShape.empty()) mask.bias = ops::zeros(biasShape, dt);
    if (padded) mask.keyPadding = ops::zeros({B, Sk}, DType::U8);
    return fusedAttentionTakes(mask, B, H, Sq, Sk, DType::BF16);
  };
  CHECK(takes({}, DType::BF16, false));              // GPT, BERT unpadded, T5's cross-attention
  CHECK(takes({1, H, Sq, Sk}, DType::BF16, false));  // T5's self-attention
  CHECK(takes({B, H, Sq, Sk}, DType::BF16, false));  // a bias per batch
  CHECK_FALSE(takes({}, DType::BF16, true));         // key padding: the composed path
  CHECK_FALSE(takes({1, H, Sq, Sk}, DType::BF16, true));
  CHECK_FALSE(takes({1, H, Sq, Sk}, DType::F32, false));   // another dtype than the operands'
  CHECK_FALSE(takes({2, H, Sq, Sk}, DType::BF16, false));  // neither 1 nor B
  CHECK_FALSE(takes({1, 1, Sq, Sk}, DType::BF16, false));  // broadcast over heads
  CHECK_FALSE(takes({H, Sq, Sk}, DType::BF16, false));
  CHECK_FALSE(takes({1, H, 1, Sk}, DType::BF16, false));
}

TEST_CASE("[cuda] fused attention with a bias matches the composed path: output, dq, dk, dv, dbias",
          "[cuda][parity][attention]") {
  STRATA_REQUIRE_CUDA();
  // Odd lengths (neither a tile multiple nor even, so dBias takes single-float atomics), S_k > S_q and
  // S_k == S_q (cuDNN's causal case with a bias), a bias shared by the batch (T5) and one per batch; each
  // backend, and dropout in Strata's kernel. The reference: the composed path on the CPU in f32 from the same
  // bf16 values, with the same dropout mask.
  std::vector<ops::AttentionBackend> backends{ops::AttentionBackend::Native};
  if (ops::cudnnAttentionBuilt()) backends.push_back(ops::AttentionBackend::Cudnn);
  struct Case {
    int64_t B, H, Sq, Sk, D;
  };
  const Device gpu = Device::cuda(0);
  for (Case c : {Case{2, 3, 37, 53, 64}, Case{2, 3, 37, 37, 64}, Case{2, 2, 128, 128, 64},
                 Case{1, 2, 200, 300, 128}}) {
    Tensor q = uniform({c.B, c.H, c.Sq, c.D}, DType::BF16, 220, -1, 1);
    Tensor k = uniform({c.B, c.H, c.Sk, c.D}, DType::BF16, 221, -1, 1);
    Tensor v = uniform({c.B, c.H, c.Sk, c.D}, DType::BF16, 222, -1, 1);
    Tensor g = uniform({c.B, c.H, c.Sq, c.D}, DType::BF16, 223, -1, 1);
    for (int64_t biasBatch : {int64_t(1), c.B}) {
      Tensor bias = uniform({biasBatch, c.H, c.Sq, c.Sk}, DType::BF16, 224, -2, 2);
      for (bool causal : {false, true}) {
        for (double dropout : {0.0, 0.1}) {
          auto f32 = [](const Tensor& t) { return t.to(DType::F32); };
          Attended want = attend(false, f32(q), f32(k), f32(v), f32(bias), g, causal, 0.0, dropout, 41);
          for (ops::AttentionBackend backend : backends) {
            if (dropout > 0 && backend == ops::AttentionBackend::Cudnn) continue;  // cuDNN draws its own
            INFO("B " << c.B << " H " << c.H << " Sq " << c.Sq << " Sk " << c.Sk << " D " << c.D
                      << ", bias batch " << biasBatch << (causal ? ", causal" : "") << ", dropout " << dropout
                      << (backend == ops::AttentionBackend::Cudnn ? ", cuDNN" : ", Strata's kernel"));
            // The ops level, to pick the backend: [B, S, H, D] views of [B, H, S, D] copies on the GPU.
            auto dev = [&](const Tensor& t) { return ops::to(t, gpu, t.dtype()).transpose(1, 2); };
            Tensor qd = dev(q), kd = dev(k), vd = dev(v), gd = dev(g);
            ops::AttentionOptions o{0.0, causal, backend};
            o.bias = ops::to(bias, gpu, bias.dtype());
            if (dropout > 0) {
              Generator gen(41);
              gen.reserve(5);
              o.dropout = dropout;
              o.seed = gen.seed();
              o.offset = gen.reserve(uint64_t(c.B * c.H * c.Sq * c.Sk), 8);
            }
            ops::FlashAttentionResult r = ops::flashAttention(qd, kd, vd, o);
            Tensor dq = ops::emptyLike(qd), dk = ops::emptyLike(kd), dv = ops::emptyLike(vd);
            Tensor dbias = ops::emptyLike(o.bias);
            ops::flashAttentionBackward(qd, kd, vd, r, gd, dq, dk, dv, o, dbias);
            auto back = [](const Tensor& t) { return ops::to(t, Device::cpu(), DType::F32).transpose(1, 2); };
            Attended got{back(r.out), back(dq), back(dk), back(dv),
                         ops::to(dbias, Device::cpu(), DType::F32)};
            requireSame(got, want, 3e-2, 3e-2);
          }
        }
      }
    }
  }
}
