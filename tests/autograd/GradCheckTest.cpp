// Finite-difference gradient checks in f64 for every differentiable op.
#include "TestUtil.h"
#include "strata/nn/Attention.h"
#include "strata/nn/RelativePositionBias.h"

using namespace strata;
using test::gradCheck;
using test::randomDouble;
using Ins = std::vector<Tensor>;

TEST_CASE("gradcheck: add, sub, mul, div with broadcasting", "[autograd][gradcheck]") {
  gradCheck([](const Ins& x) { return add(x[0], x[1]); }, {randomDouble({3, 4}, 1), randomDouble({4}, 2)});
  gradCheck([](const Ins& x) { return sub(x[0], x[1]); },
            {randomDouble({3, 1}, 3), randomDouble({2, 1, 4}, 4)});
  gradCheck([](const Ins& x) { return mul(x[0], x[1]); }, {randomDouble({2, 3}, 5), randomDouble({2, 1}, 6)});
  gradCheck([](const Ins& x) { return div(x[0], x[1]); },
            {randomDouble({2, 3}, 7), randomDouble({3}, 8, 0.5, 2)});
  gradCheck([](const Ins& x) { return x[0] * 3.0 + 1.0 - x[0] / 2.0; }, {randomDouble({5}, 9)});
}

TEST_CASE("gradcheck: exp, log, sqrt, rsqrt, pow, neg", "[autograd][gradcheck]") {
  gradCheck([](const Ins& x) { return exp(x[0]); }, {randomDouble({6}, 10)});
  gradCheck([](const Ins& x) { return log(x[0]); }, {randomDouble({6}, 11, 0.5, 2)});
  gradCheck([](const Ins& x) { return sqrt(x[0]); }, {randomDouble({6}, 12, 0.5, 2)});
  gradCheck([](const Ins& x) { return rsqrt(x[0]); }, {randomDouble({6}, 13, 0.5, 2)});
  gradCheck([](const Ins& x) { return pow(x[0], 3.0); }, {randomDouble({6}, 14)});
  gradCheck([](const Ins& x) { return pow(x[0], 0.7); }, {randomDouble({6}, 15, 0.5, 2)});
  gradCheck([](const Ins& x) { return -x[0]; }, {randomDouble({6}, 16)});
}

TEST_CASE("gradcheck: tanh, sigmoid, relu, silu, gelu", "[autograd][gradcheck]") {
  gradCheck([](const Ins& x) { return tanh(x[0]); }, {randomDouble({8}, 17, -2, 2)});
  gradCheck([](const Ins& x) { return sigmoid(x[0]); }, {randomDouble({8}, 18, -3, 3)});
  gradCheck([](const Ins& x) { return relu(x[0]); }, {randomDouble({8}, 19, -2, 2)});
  gradCheck([](const Ins& x) { return silu(x[0]); }, {randomDouble({8}, 20, -3, 3)});
  gradCheck([](const Ins& x) { return gelu(x[0], GeluApprox::Tanh); }, {randomDouble({8}, 21, -3, 3)});
  gradCheck([](const Ins& x) { return gelu(x[0], GeluApprox::None); }, {randomDouble({8}, 22, -3, 3)});
}

TEST_CASE("gradcheck: where and masked fill", "[autograd][gradcheck]") {
  Tensor mask = Tensor::fromVector<double>({1, 0, 1, 0, 0, 1}, {2, 3});
  gradCheck([mask](const Ins& x) { return where(mask, x[0], x[1]); },
            {randomDouble({2, 3}, 23), randomDouble({3}, 24)});
  gradCheck([mask](const Ins& x) { return maskedFill(x[0], mask, -5.0); }, {randomDouble({2, 3}, 25)});
}

TEST_CASE("gradcheck: sum, mean, max, norm over dims", "[autograd][gradcheck]") {
  gradCheck([](const Ins& x) { return sum(x[0], {1}); }, {randomDouble({3, 4, 2}, 26)});
  gradCheck([](const Ins& x) { return sum(x[0]); }, {randomDouble({3, 4}, 27)});
  gradCheck([](const Ins& x) { return mean(x[0], {0, 2}, true); }, {randomDouble({3, 4, 2}, 28)});
  gradCheck([](const Ins& x) { return max(x[0], {1}); }, {randomDouble({3, 5}, 29)});
  gradCheck([](const Ins& x) { return max(x[0]); }, {randomDouble({3, 5}, 30)});
  gradCheck([](const Ins& x) { return norm(x[0], {1}); }, {randomDouble({3, 5}, 31)});
}

TEST_CASE("gradcheck: matmul, batched and broadcast", "[autograd][gradcheck]") {
  gradCheck([](const Ins& x) { return matmul(x[0], x[1]); },
            {randomDouble({3, 4}, 32), randomDouble({4, 5}, 33)});
  gradCheck([](const Ins& x) { return matmul(x[0], x[1]); },
            {randomDouble({2, 3, 4}, 34), randomDouble({4, 2}, 35)});
  gradCheck([](const Ins& x) { return matmul(x[0], x[1]); },
            {randomDouble({2, 1, 3, 4}, 36), randomDouble({3, 4, 2}, 37)});
  gradCheck([](const Ins& x) { return matmul(x[0], x[1].transpose(0, 1)); },
            {randomDouble({3, 4}, 38), randomDouble({5, 4}, 39)});
  gradCheck([](const Ins& x) { return matmul(x[0], x[1]); },
            {randomDouble({4}, 40), randomDouble({4, 3}, 41)});
}

TEST_CASE("gradcheck: softmax and log-softmax", "[autograd][gradcheck]") {
  gradCheck([](const Ins& x) { return softmax(x[0]); }, {randomDouble({3, 5}, 42)});
  gradCheck([](const Ins& x) { return softmax(x[0], 0); }, {randomDouble({3, 5}, 43)});
  gradCheck([](const Ins& x) { return logSoftmax(x[0]); }, {randomDouble({3, 5}, 44)});
}

TEST_CASE("gradcheck: layer norm and rms norm", "[autograd][gradcheck]") {
  gradCheck([](const Ins& x) { return layerNorm(x[0], x[1], x[2]); },
            {randomDouble({3, 6}, 45, -2, 2), randomDouble({6}, 46, 0.5, 1.5), randomDouble({6}, 47)});
  gradCheck([](const Ins& x) { return layerNorm(x[0], Tensor(), Tensor()); }, {randomDouble({2, 3, 5}, 48)});
  gradCheck([](const Ins& x) { return rmsNorm(x[0], x[1]); },
            {randomDouble({3, 6}, 49, -2, 2), randomDouble({6}, 50, 0.5, 1.5)});
}

TEST_CASE("gradcheck: layer norm with a fused residual add", "[autograd][gradcheck]") {
  // Both outputs feed the loss: the sum's gradient joins the norm's input gradient in the kernel.
  gradCheck(
      [](const Ins& x) {
        auto [sum, y] = addLayerNorm(x[0], x[1], x[2], x[3]);
        return sum * 0.5 + y;
      },
      {randomDouble({3, 6}, 51, -2, 2), randomDouble({3, 6}, 52), randomDouble({6}, 53, 0.5, 1.5),
       randomDouble({6}, 54)});
  // Only the norm's output used: the sum's gradient is zero.
  gradCheck([](const Ins& x) { return addLayerNorm(x[0], x[1], x[2], Tensor())[1]; },
            {randomDouble({2, 5}, 55, -2, 2), randomDouble({2, 5}, 56), randomDouble({5}, 57, 0.5, 1.5)});
}

TEST_CASE("layer norm with a residual equals add + layer norm", "[autograd]") {
  Tensor outs[2][2];
  std::vector<Tensor> grads[2];
  for (int path = 0; path < 2; ++path) {
    std::vector<Tensor> in{randomDouble({4, 8}, 58, -2, 2), randomDouble({4, 8}, 59),
                           randomDouble({8}, 60, 0.5, 1.5), randomDouble({8}, 61)};
    for (auto& t : in) t.setRequiresGrad(true);
    Tensor total, y;
    if (path == 0) {
      total = in[0] + in[1];
      y = layerNorm(total, in[2], in[3]);
    } else {
      auto r = addLayerNorm(in[0], in[1], in[2], in[3]);
      total = r[0];
      y = r[1];
    }
    backward(sum(total * total) + sum(y * y * y));
    outs[path][0] = total.detach();
    outs[path][1] = y.detach();
    for (auto& t : in) grads[path].push_back(t.grad());
  }
  for (int i = 0; i < 2; ++i) test::requireClose(outs[1][i], outs[0][i], 1e-12, 1e-10);
  for (size_t i = 0; i < 4; ++i) test::requireClose(grads[1][i], grads[0][i], 1e-12, 1e-10);
}

TEST_CASE("layer norm reads fp32 parameters with bf16 input and returns fp32 gradients", "[autograd]") {
  Generator gen(9);
  Tensor x = ops::rand({6, 32}, gen, DType::F32, Device::cpu(), -2, 2).to(DType::BF16);
  Tensor w = ops::rand({32}, gen, DType::F32, Device::cpu(), 0.5, 1.5);
  Tensor b = ops::rand({32}, gen, DType::F32, Device::cpu(), -0.5, 0.5);
  Tensor ys[2], gw[2], gb[2];
  for (int path = 0; path < 2; ++path) {
    // path 0: fp32 parameters read as they are by bf16 input; path 1: the same in f64 (the reference).
    DType pd = path == 0 ? DType::F32 : DType::F64;
    Tensor wi = w.detach().clone().to(pd), bi = b.detach().clone().to(pd);
    wi.setRequiresGrad(true);
    bi.setRequiresGrad(true);
    Tensor y = layerNorm(path == 0 ? x : x.to(DType::F64), wi, bi);
    REQUIRE(y.dtype() == (path == 0 ? DType::BF16 : DType::F64));
    Tensor y64 = y.to(DType::F64);
    backward(sum(y64 * y64));
    REQUIRE(wi.grad().dtype() == pd);
    ys[path] = y64.detach();
    gw[path] = wi.grad().to(DType::F64);
    gb[path] = bi.grad().to(DType::F64);
  }
  test::requireClose(ys[0], ys[1], 2e-2, 1e-2);
  test::requireClose(gw[0], gw[1], 5e-2, 2e-2);
  test::requireClose(gb[0], gb[1], 5e-2, 2e-2);
}

TEST_CASE("gradcheck: embedding", "[autograd][gradcheck]") {
  Tensor idx = Tensor::fromVector<int64_t>({3, 0, 3, 1, 2, 0}, {2, 3});
  gradCheck([idx](const Ins& x) { return embedding(x[0], idx); }, {randomDouble({5, 4}, 51)});
}

TEST_CASE("embedding with a padding id: its lookups add nothing to the table's gradient", "[autograd]") {
  Tensor idx = Tensor::fromVector<int64_t>({3, 0, 3, 1, 2, 0}, {2, 3});
  for (DType dt : {DType::F64, DType::F32}) {
    Tensor plain = randomDouble({5, 4}, 53).to(dt), padded = randomDouble({5, 4}, 53).to(dt);
    plain.setRequiresGrad(true);
    padded.setRequiresGrad(true);
    Tensor projection = randomDouble({2, 3, 4}, 54).to(dt);
    Tensor a = embedding(plain, idx), b = embedding(padded, idx, 3);
    // The padding id's rows are still read.
    REQUIRE(b.toVector<double>() == a.toVector<double>());
    backward(sum(mul(a, projection)));
    backward(sum(mul(b, projection)));
    std::vector<double> ga = plain.grad().toVector<double>(), gb = padded.grad().toVector<double>();
    for (int64_t row = 0; row < 5; ++row)
      for (int64_t c = 0; c < 4; ++c) {
        INFO("row " << row << " column " << c);
        size_t i = size_t(row * 4 + c);
        REQUIRE(gb[i] == (row == 3 ? 0.0 : ga[i]));
        if (row == 3) REQUIRE(ga[i] != 0.0);
      }
  }
}

TEST_CASE("gradcheck: cross entropy with ignore_index", "[autograd][gradcheck]") {
  Tensor target = Tensor::fromVector<int64_t>({2, -100, 0, 4}, {4});
  gradCheck([target](const Ins& x) { return crossEntropy(x[0], target); }, {randomDouble({4, 5}, 52, -2, 2)});
}

TEST_CASE("gradcheck: dropout replays its mask", "[autograd][gradcheck]") {
  gradCheck(
      [](const Ins& x) {
        Generator gen(99);  // same mask on every evaluation
        return dropout(x[0], 0.3, true, gen);
      },
      {randomDouble({20}, 53)});
}

TEST_CASE("gradcheck: views, cat and split", "[autograd][gradcheck]") {
  gradCheck([](const Ins& x) { return x[0].transpose(0, 1).reshape({12}); }, {randomDouble({3, 4}, 54)});
  gradCheck(
      [](const Ins& x) {
        return x[0].permute({2, 0, 1}).narrow(0, 1, 2);
      },
      {randomDouble({2, 3, 4}, 55)});
  gradCheck([](const Ins& x) { return x[0].unsqueeze(1).expand({3, 4, 2}); }, {randomDouble({3, 2}, 56)});
  gradCheck([](const Ins& x) { return x[0].select(1, 2) * x[0].select(1, 0); }, {randomDouble({3, 4}, 57)});
  gradCheck(
      [](const Ins& x) {
        return cat({x[0], x[1]}, 0);
      },
      {randomDouble({2, 3}, 58), randomDouble({1, 3}, 59)});
  gradCheck(
      [](const Ins& x) {
        auto parts = split(x[0], {1, 3}, 1);
        return parts[0] * parts[1];
      },
      {randomDouble({2, 4}, 60)});
  gradCheck([](const Ins& x) { return x[0].to(DType::F32).to(DType::F64); }, {randomDouble({4}, 61)}, 1e-3,
            1e-4, 1e-3);
}

TEST_CASE("gradcheck: scaled dot product attention with masks", "[autograd][gradcheck]") {
  AttentionMask mask;
  mask.causal = true;
  mask.keyPadding = Tensor::fromVector<double>({0, 0, 0, 1, 0, 0, 0, 0}, {2, 4});
  gradCheck([mask](const Ins& x) { return scaledDotProductAttention(x[0], x[1], x[2], mask); },
            {randomDouble({2, 2, 4, 3}, 62), randomDouble({2, 2, 4, 3}, 63), randomDouble({2, 2, 4, 3}, 64)});
}

TEST_CASE("gradcheck: fused attention, strided and packed, causal with S_k > S_q", "[autograd][gradcheck]") {
  for (bool causal : {false, true}) {
    // q [B, Sq, H, D] from a transposed [B, H, Sq, D] tensor: strided operands are read in place.
    gradCheck(
        [causal](const Ins& x) { return flashAttention(x[0].transpose(1, 2), x[1], x[2], causal); },
        {randomDouble({2, 2, 3, 4}, 65), randomDouble({2, 5, 2, 4}, 66), randomDouble({2, 5, 2, 4}, 67)});
    gradCheck([causal](const Ins& x) { return flashAttentionPacked(x[0], 2, causal, 0.7); },
              {randomDouble({2, 5, 3 * 2 * 3}, 68)});
  }
}

TEST_CASE("fused attention equals the composed attention, values and gradients", "[autograd][attention]") {
  // The composed path ([B, H, S, D], matmul + scaled softmax + dropout + matmul) is the reference. With
  // dropout both draw the same mask from the same generator state (NOTE [Fused attention dropout]).
  for (double dropout : {0.0, 0.3}) {
    for (bool causal : {false, true}) {
      INFO("dropout " << dropout << ", causal " << causal);
      Tensor q = randomDouble({2, 3, 6, 8}, 70), k = randomDouble({2, 3, 9, 8}, 71),
             v = randomDouble({2, 3, 9, 8}, 72), g = randomDouble({2, 3, 6, 8}, 73);
      std::vector<Tensor> grads[2];
      Tensor outs[2];
      for (int path = 0; path < 2; ++path) {
        Tensor a = q.detach().clone(), b = k.detach().clone(), c = v.detach().clone();
        for (Tensor* t : {&a, &b, &c}) t->setRequiresGrad(true);
        AttentionMask mask;
        mask.causal = causal;
        Generator gen(99);
        gen.reserve(5);  // not at offset 0 (the dropout draw then starts at 8: NOTE [Dropout bits])
        Tensor y = path == 0 ? scaledDotProductAttention(a, b, c, mask, dropout, true, 0.0, gen)
                             : flashAttention(a.transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2), causal,
                                              0.0, dropout, gen)
                                   .transpose(1, 2);
        backward(sum(mul(y, g)));
        outs[path] = y.detach();
        grads[path] = {a.grad(), b.grad(), c.grad()};
      }
      test::requireClose(outs[1], outs[0], 1e-12, 1e-10);
      for (int i = 0; i < 3; ++i) test::requireClose(grads[1][size_t(i)], grads[0][size_t(i)], 1e-12, 1e-10);
      if (dropout > 0) {
        // Some probabilities were dropped: the output differs from the one without dropout.
        AttentionMask mask;
        mask.causal = causal;
        Tensor plain = scaledDotProductAttention(q, k, v, mask).detach();
        REQUIRE(test::closeness(outs[0].toVector<double>(), plain.toVector<double>(), 1e-6, 1e-6) > 1.0);
      }
    }
  }
}

TEST_CASE("gradcheck: fused attention with dropout (one mask, replayed)", "[autograd][gradcheck]") {
  // A generator made inside the function: every evaluation drops the same probabilities.
  gradCheck(
      [](const Ins& x) {
        Generator gen(12);
        return flashAttention(x[0], x[1], x[2], false, 0.0, 0.25, gen);
      },
      {randomDouble({2, 3, 2, 4}, 74), randomDouble({2, 5, 2, 4}, 75), randomDouble({2, 5, 2, 4}, 76)});
  gradCheck(
      [](const Ins& x) {
        Generator gen(13);
        return flashAttentionPacked(x[0], 2, true, 0.7, 0.25, gen);
      },
      {randomDouble({2, 5, 3 * 2 * 3}, 77)});
}

TEST_CASE("gradcheck: linear with a fused bias", "[autograd][gradcheck]") {
  gradCheck([](const Ins& x) { return linear(x[0], x[1], x[2]); },
            {randomDouble({2, 3, 4}, 80), randomDouble({4, 5}, 81), randomDouble({5}, 82)});
  // A transposed input goes through the flattening copy.
  gradCheck([](const Ins& x) { return linear(x[0].transpose(0, 1), x[1], x[2]); },
            {randomDouble({3, 2, 4}, 83), randomDouble({4, 5}, 84), randomDouble({5}, 85)});
}

TEST_CASE("gradcheck: fused GELU MLP, with and without biases", "[autograd][gradcheck]") {
  gradCheck([](const Ins& x) { return geluMlp(x[0], x[1], x[2], x[3], x[4]); },
            {randomDouble({2, 3, 4}, 86), randomDouble({4, 8}, 87), randomDouble({8}, 88),
             randomDouble({8, 4}, 89), randomDouble({4}, 94)});
  gradCheck([](const Ins& x) { return geluMlp(x[0].transpose(0, 1), x[1], Tensor(), x[2]); },
            {randomDouble({3, 2, 4}, 95), randomDouble({4, 6}, 96), randomDouble({6, 5}, 97)});
}

TEST_CASE("fused GELU MLP equals linear, gelu, linear", "[autograd]") {
  Tensor outs[2];
  std::vector<Tensor> grads[2];
  for (int path = 0; path < 2; ++path) {
    std::vector<Tensor> in{randomDouble({3, 5, 8}, 100), randomDouble({8, 16}, 101), randomDouble({16}, 102),
                           randomDouble({16, 8}, 103), randomDouble({8}, 104)};
    for (auto& t : in) t.setRequiresGrad(true);
    Tensor y = path == 0 ? linear(gelu(linear(in[0], in[1], in[2]), GeluApprox::Tanh), in[3], in[4])
                         : geluMlp(in[0], in[1], in[2], in[3], in[4]);
    backward(sum(y * y));
    outs[path] = y.detach();
    for (auto& t : in) grads[path].push_back(t.grad());
  }
  test::requireClose(outs[1], outs[0], 1e-12, 1e-10);
  for (size_t i = 0; i < 5; ++i) test::requireClose(grads[1][i], grads[0][i], 1e-12, 1e-10);
}

TEST_CASE("gemm epilogues: linearGelu, matmulGeluBackward and linearParamGrads match the separate ops",
          "[ops]") {
  Tensor x = randomDouble({6, 5}, 105), w = randomDouble({5, 8}, 106), b = randomDouble({8}, 107);
  ops::LinearGeluResult r = ops::linearGelu(x, w, b);
  Tensor pre = ops::linear(x, w, b);
  test::requireClose(r.pre, pre, 1e-14, 1e-12);
  test::requireClose(r.out, ops::geluTanh(pre), 1e-14, 1e-12);
  Tensor g = randomDouble({6, 3}, 108), w2 = randomDouble({3, 8}, 109);
  test::requireClose(ops::matmulGeluBackward(g, w2, pre), ops::geluTanhBackward(ops::matmul(g, w2), pre),
                     1e-14, 1e-12);
  // bf16 operands with fp32 gradients, and a strided (transposed) output gradient.
  Tensor xb = x.to(DType::BF16), gy = randomDouble({8, 6}, 110).to(DType::BF16).transpose(0, 1);
  ops::LinearParamGrads pg = ops::linearParamGrads(xb, gy, DType::F32, true);
  REQUIRE(pg.weight.dtype() == DType::F32);
  REQUIRE(pg.bias.dtype() == DType::F32);
  test::requireClose(pg.weight, ops::matmul(xb.transpose(0, 1), ops::contiguous(gy), DType::F32), 1e-6, 1e-5);
  test::requireClose(pg.bias, ops::sum(gy, {0}, false, DType::F32), 1e-6, 1e-5);
}

TEST_CASE("gradcheck: chunked linear cross-entropy, with ignored targets", "[autograd][gradcheck]") {
  Tensor target = Tensor::fromVector<int64_t>({3, -100, 0, 6, 2}, {5});
  for (int64_t chunk : {0, 2}) {
    gradCheck([&](const Ins& x) { return linearCrossEntropy(x[0], x[1], target, -100, chunk); },
              {randomDouble({5, 4}, 90), randomDouble({7, 4}, 91)});
  }
}

TEST_CASE("linear cross-entropy of no rows: zero loss and zero gradients", "[autograd]") {
  Tensor x = randomDouble({0, 4}, 94), w = randomDouble({7, 4}, 95);
  x.setRequiresGrad(true);
  w.setRequiresGrad(true);
  Tensor loss = linearCrossEntropy(x, w, Tensor::empty({0}, DType::I64));
  backward(loss);
  REQUIRE(loss.item() == 0.0);
  for (double g : w.grad().toVector<double>()) REQUIRE(g == 0.0);
}

TEST_CASE("chunked linear cross-entropy equals logits + cross-entropy", "[autograd][attention]") {
  Tensor target = Tensor::fromVector<int64_t>({3, 1, 0, 6, 2, 5}, {6});
  Tensor losses[2], gx[2], gw[2];
  for (int path = 0; path < 2; ++path) {
    Tensor x = randomDouble({6, 4}, 92), w = randomDouble({7, 4}, 93);
    x.setRequiresGrad(true);
    w.setRequiresGrad(true);
    Tensor loss = path == 0 ? crossEntropy(matmul(x, w.transpose(0, 1)), target)
                            : linearCrossEntropy(x, w, target, -100, 4);
    backward(loss * 3.0);  // a non-unit incoming gradient (as loss scaling gives)
    losses[path] = loss.detach();
    gx[path] = x.grad();
    gw[path] = w.grad();
  }
  test::requireClose(losses[1], losses[0], 1e-12, 1e-10);
  test::requireClose(gx[1], gx[0], 1e-12, 1e-10);
  test::requireClose(gw[1], gw[0], 1e-12, 1e-10);
}

TEST_CASE("gradcheck: gated GELU", "[autograd][gradcheck]") {
  gradCheck([](const Ins& x) { return gatedGelu(x[0], x[1]); },
            {randomDouble({3, 5}, 70, -3, 3), randomDouble({3, 5}, 71, -2, 2)});
  // Equal to its composition.
  Tensor a = randomDouble({4, 6}, 72, -3, 3), b = randomDouble({4, 6}, 73);
  test::requireClose(gatedGelu(a, b), gelu(a, GeluApprox::Tanh) * b, 1e-14, 1e-12);
}

TEST_CASE("gradcheck: attention with key padding, an additive bias and S_q != S_k", "[autograd][gradcheck]") {
  // Cross-attention shapes: 3 queries over 5 keys; batch 0 pads its last two keys, batch 1 none.
  Tensor pad = Tensor::fromVector<double>({0, 0, 0, 1, 1, 0, 0, 0, 0, 0}, {2, 5});
  auto attend = [pad](const Ins& x, bool causal, double scale) {
    AttentionMask mask;
    mask.keyPadding = pad;
    mask.bias = x[3];
    mask.causal = causal;
    return scaledDotProductAttention(x[0], x[1], x[2], mask, 0.0, false, scale);
  };
  Ins in{randomDouble({2, 2, 3, 4}, 74), randomDouble({2, 2, 5, 4}, 75), randomDouble({2, 2, 5, 4}, 76),
         randomDouble({1, 2, 3, 5}, 77)};
  gradCheck([&](const Ins& x) { return attend(x, false, 0.0); }, in);
  gradCheck([&](const Ins& x) { return attend(x, true, 1.0); }, in);
  // A padded key gets no weight: changing its value leaves the output alone.
  NoGradGuard noGrad;
  Ins moved = in;
  moved[2] = in[2].clone();
  Tensor v = moved[2].select(0, 0).narrow(1, 3, 2);
  ops::copy(v, ops::full(v.shape(), 7.0, DType::F64));
  test::requireClose(attend(moved, false, 0.0), attend(in, false, 0.0), 1e-14, 1e-12);
}

TEST_CASE("gradcheck: cross-attention module with a padding mask and a head width of its own",
          "[autograd][gradcheck]") {
  Generator gen(78);
  nn::AttentionConfig config{8, 2, false, true, false, 0.0, 0.3, 0.3, Device::cpu()};
  config.headDim = 3;  // inner width 6 on a model width of 8, as T5 v1.1
  config.scale = 1.0;
  nn::Attention attn(config, gen);
  attn.castParameters(DType::F64);
  REQUIRE(attn.namedParameters()[1].second.shape() == Shape({8, 12}));  // kv
  Tensor pad = Tensor::fromVector<double>({0, 0, 0, 1, 0, 0, 0, 0}, {2, 4});
  std::vector<Tensor> params = attn.parameters();
  gradCheck(
      [&](const Ins& x) {
        AttentionMask mask;
        mask.keyPadding = pad;
        return attn.apply(x[0], x[1], mask);
      },
      {randomDouble({2, 3, 8}, 79), randomDouble({2, 4, 8}, 80)});
  for (const Tensor& p : params) REQUIRE(p.grad().defined());
}

TEST_CASE("gradcheck: relative position bias", "[autograd][gradcheck]") {
  Generator gen(81);
  for (bool bidirectional : {true, false}) {
    nn::RelativePositionBias bias({3, 8, 20, bidirectional, 1.0, Device::cpu()}, gen);
    bias.castParameters(DType::F64);
    // The bias enters attention scores: check the gradient through a softmax over keys.
    // The table itself is the checked input (gradCheck perturbs it in place).
    gradCheck([&](const Ins& x) { return softmax(bias.apply(5, 7, DType::F64) + x[1]); },
              {bias.weight, randomDouble({2, 3, 5, 7}, 83)});
  }
}
