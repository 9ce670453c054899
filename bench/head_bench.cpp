// The fused LM head and cross-entropy (linearCrossEntropy), bf16: forward + backward per chunk size,
// then its parts (logits GEMM, in-place cross-entropy, the two gradient GEMMs) over all rows at one chunk
// size. tools/bench_head.py sets the whole-head lines beside PyTorch's `x @ w.T` + F.cross_entropy, eager and
// compiled, in the same run.
// Prints "head N V C chunk_rows ms tflops" per chunk size (chunk 0 = the default) and
// "part N V C chunk_rows name ms" per part. FLOPs: three GEMMs of 2*N*V*C.
// Usage: bench_head [--iters K] N,V,C[,chunk_rows...] ...
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>

#include "BenchUtil.h"

using namespace strata;

int main(int argc, char** argv) {
  if (!cudaAvailable()) {
    std::printf("bench_head: no CUDA device\n");
    return 0;
  }
  auto args = bench::parseCaseArgs(argc, argv, 10, 3, SIZE_MAX, "N,V,C[,chunk_rows...]");
  if (!args) return 2;
  int iters = args->iters;
  std::vector<std::vector<int64_t>> cases = args->cases;
  for (auto& c : cases)
    if (c.size() == 3) c.push_back(0);
  if (cases.empty()) cases = {{16384, 50304, 768, 0}, {16384, 50304, 2048, 0}};
  Device gpu = Device::cuda(0);
  Generator gen(1);
  for (const auto& c : cases) {
    int64_t N = c[0], V = c[1], C = c[2];
    Tensor x = ops::randn({N, C}, gen, DType::BF16, gpu, 0.0, 0.5);
    Tensor w = ops::randn({V, C}, gen, DType::BF16, gpu, 0.0, 0.02);
    Tensor target = ops::to(ops::rand({N}, gen, DType::F32, gpu, 0.0, double(V) - 1.0), gpu, DType::I64);
    x.setRequiresGrad(true);
    w.setRequiresGrad(true);
    double flops = 6.0 * double(N) * double(V) * double(C);
    for (size_t k = 3; k < c.size(); ++k) {
      int64_t chunk = c[k];
      auto step = [&] {
        Tensor loss = linearCrossEntropy(x, w, target, -100, chunk);
        backward(loss);
        x.setGrad(Tensor());
        w.setGrad(Tensor());
      };
      double ms = bench::medianMs(gpu, step, 2, iters);
      std::printf("head %ld %ld %ld %ld %.4f %.1f\n", N, V, C, chunk, ms, flops / (ms * 1e-3) / 1e12);
    }
    // The parts at the first chunk size given, each over all the rows.
    int64_t rows = c[3] > 0 ? c[3] : linearCrossEntropyChunkRows(N, V);
    Tensor xd = x.detach(), wd = w.detach(), wT = wd.transpose(0, 1);
    Tensor logits = ops::matmul(xd.narrow(0, 0, rows), wT);
    Tensor rowLoss = Tensor::empty({rows}, DType::F32, gpu), valid = Tensor::empty({rows}, DType::F32, gpu);
    Tensor gx = Tensor::empty({rows, C}, DType::BF16, gpu), gw = ops::zeros({V, C}, DType::F32, gpu);
    Tensor tc = target.narrow(0, 0, rows), xc = xd.narrow(0, 0, rows);
    int64_t passes = (N + rows - 1) / rows;
    auto part = [&](const char* name, const std::function<void()>& fn) {
      double ms = bench::medianMs(
          gpu,
          [&] {
            for (int64_t p = 0; p < passes; ++p) fn();
          },
          2, iters);
      std::printf("part %ld %ld %ld %ld %s %.4f\n", N, V, C, rows, name, ms);
    };
    part("logits_gemm", [&] { ops::matmulInto(logits, xc, wT); });
    part("cross_entropy_in_place", [&] { ops::crossEntropyInPlace(logits, tc, rowLoss, valid, true); });
    part("dx_gemm", [&] { ops::matmulInto(gx, logits, wd); });
    part("dw_gemm", [&] { ops::matmulAccumulate(gw, logits.transpose(0, 1), xc); });
    part("cross_entropy_pair", [&] {
      ops::CrossEntropyResult r = ops::crossEntropy(logits, tc);
      ops::crossEntropyBackward(ops::ones({}, DType::F32, gpu), logits, tc, r);
    });
  }
  return 0;
}
