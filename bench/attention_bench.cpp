// Fused attention speed: forward and forward+backward of ops::flashAttention, bf16, causal, [B, S, H, D]
// operands. Prints one line per shape: "attn B S H D fwd_ms fwd_tflops bwd_ms bwd_tflops".
// FLOPs count the causal half only: forward 2 matmuls of 2*S*S*D/2 each per head, backward 2.5x the forward.
// Usage: bench_attention [--iters N] B,S,H,D ...
#include <cstdio>
#include <cstring>
#include <string>

#include "BenchUtil.h"

using namespace strata;

int main(int argc, char** argv) {
  if (!cudaAvailable()) {
    std::printf("bench_attention: no CUDA device\n");
    return 0;
  }
  auto args = bench::parseCaseArgs(argc, argv, 20, 4, 4, "B,S,H,D");
  if (!args) return 2;
  int iters = args->iters;
  std::vector<std::vector<int64_t>> shapes = args->cases;
  if (shapes.empty()) shapes = {{16, 512, 16, 128}, {4, 2048, 16, 128}, {16, 512, 12, 64}};
  Device gpu = Device::cuda(0);
  Generator gen(1);
  for (const auto& shape : shapes) {
    int64_t B = shape[0], S = shape[1], H = shape[2], D = shape[3];
    Tensor q = ops::randn({B, S, H, D}, gen, DType::BF16, gpu),
           k = ops::randn({B, S, H, D}, gen, DType::BF16, gpu),
           v = ops::randn({B, S, H, D}, gen, DType::BF16, gpu),
           g = ops::randn({B, S, H, D}, gen, DType::BF16, gpu);
    Tensor dq = ops::emptyLike(q), dk = ops::emptyLike(k), dv = ops::emptyLike(v);
    ops::AttentionOptions o{0.0, true};
    ops::FlashAttentionResult r;
    // Ten calls per timed sample, as the PyTorch side does.
    constexpr int kReps = 10;
    auto forward = [&] {
      for (int i = 0; i < kReps; ++i) r = ops::flashAttention(q, k, v, o);
    };
    auto backward = [&] {
      for (int i = 0; i < kReps; ++i) ops::flashAttentionBackward(q, k, v, r, g, dq, dk, dv, o);
    };
    double fwd = bench::medianMs(gpu, forward, 2, iters) / kReps;
    double bwd = bench::medianMs(gpu, backward, 2, iters) / kReps;
    double flops = 4.0 * double(B * H) * double(S) * double(S) * double(D) / 2.0;
    std::printf("attn %ld %ld %ld %ld %.4f %.1f %.4f %.1f\n", B, S, H, D, fwd, flops / (fwd * 1e-3) / 1e12,
                bwd, 2.5 * flops / (bwd * 1e-3) / 1e12);
  }
  return 0;
}
