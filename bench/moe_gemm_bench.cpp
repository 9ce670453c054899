// The experts' GEMMs of one MoE layer, two ways, on the GPU ("a loop of GEMMs or a batched one;
// choose by measurement"). For each shape and routing, the forward GEMMs of every expert's MLP (x W1, then h
// W2) over the tokens each expert keeps:
//   loop     one GEMM pair per expert on its own rows (what nn::MoE runs: no padding, E launches each);
//   batched  one batched GEMM pair over [E, capacity] rows, each expert's rows padded to the capacity
//   (GShard's
//            fixed-shape dispatch: one launch, FLOPs on padding).
// Prints the median ms of each and the useful TFLOP/s (FLOPs of the kept tokens only).
// Usage: bench_moe_gemm [--iters N]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "BenchUtil.h"

using namespace strata;

namespace {

struct Case {
  const char* name;
  int64_t tokens, hidden, ffn, experts;
  std::vector<double> share;  // of the tokens' choices per expert (normalised); empty: balanced
};

}  // namespace

int main(int argc, char** argv) {
  int iters = 30;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--iters" && i + 1 < argc) iters = std::stoi(argv[++i]);
  if (!cudaAvailable()) {
    std::fprintf(stderr, "bench_moe_gemm needs a CUDA device\n");
    return 1;
  }
  Device gpu = Device::cuda(0);
  const double capacityFactor = 1.25;
  std::vector<Case> cases = {
      {"1.3B-shape, 8 experts, balanced", 8192, 2048, 8192, 8, {}},
      {"1.3B-shape, 8 experts, skewed", 8192, 2048, 8192, 8, {0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05}},
      {"64 small experts, balanced", 8192, 2048, 2048, 64, {}},
  };
  std::printf(
      "| case | kept rows per expert | loop ms | batched ms | loop TFLOP/s | batched TFLOP/s | batched/loop "
      "time |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    Generator gen(3);
    int64_t E = c.experts, C = c.hidden, F = c.ffn;
    int64_t capacity = int64_t(std::ceil(capacityFactor * double(c.tokens) / double(E)));
    std::vector<int64_t> rows(static_cast<size_t>(E));
    double total = 0;
    for (int64_t e = 0; e < E; ++e) total += c.share.empty() ? 1.0 : c.share[size_t(e)];
    for (int64_t e = 0; e < E; ++e) {
      double s = (c.share.empty() ? 1.0 : c.share[size_t(e)]) / total;
      rows[size_t(e)] = std::min<int64_t>(capacity, int64_t(s * double(c.tokens)));
    }
    int64_t kept = 0;
    for (int64_t r : rows) kept += r;
    std::vector<Tensor> w1, w2, xs;
    for (int64_t e = 0; e < E; ++e) {
      w1.push_back(ops::randn({C, F}, gen, DType::BF16, gpu, 0.0, 0.02));
      w2.push_back(ops::randn({F, C}, gen, DType::BF16, gpu, 0.0, 0.02));
      xs.push_back(ops::randn({std::max<int64_t>(rows[size_t(e)], 1), C}, gen, DType::BF16, gpu, 0.0, 1.0));
    }
    Tensor x3 = ops::randn({E, capacity, C}, gen, DType::BF16, gpu, 0.0, 1.0);
    Tensor w13 = ops::randn({E, C, F}, gen, DType::BF16, gpu, 0.0, 0.02);
    Tensor w23 = ops::randn({E, F, C}, gen, DType::BF16, gpu, 0.0, 0.02);
    double loopMs = bench::medianMs(
        gpu,
        [&] {
          for (int64_t e = 0; e < E; ++e)
            ops::matmul(ops::matmul(xs[size_t(e)], w1[size_t(e)]), w2[size_t(e)]);
        },
        5, iters);
    double batchedMs = bench::medianMs(
        gpu, [&] { ops::matmul(ops::matmul(x3, w13), w23); }, 5, iters);
    double useful = 4.0 * double(kept) * double(C) * double(F);
    std::string perExpert = c.share.empty()
                                ? std::to_string(rows[0])
                                : std::to_string(*std::min_element(rows.begin(), rows.end())) + "–" +
                                      std::to_string(*std::max_element(rows.begin(), rows.end()));
    std::printf("| %s (%ld tokens, %ld x %ld, capacity %ld) | %s | %.3f | %.3f | %.0f | %.0f | %.2f |\n",
                c.name, c.tokens, C, F, capacity, perExpert.c_str(), loopMs, batchedMs,
                useful / (loopMs * 1e-3) / 1e12, useful / (batchedMs * 1e-3) / 1e12, batchedMs / loopMs);
    std::fflush(stdout);
  }
  return 0;
}
