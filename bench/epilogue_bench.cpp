// The GELU MLP's GEMMs with and without their cuBLASLt epilogues, bf16, at one transformer's shapes: which
// fusions pay. For tokens T, width D and hidden F it times each GEMM the MLP runs, plain and with the
// epilogue Strata uses (BIAS, GELU_AUX_BIAS, DGELU, BGRADA), and the separate GELU passes the plain forms
// need. Prints "epi T D F name ms tflops" (tflops 0 for the pointwise passes); tools/bench_epilogue.py sets
// them beside torch's mm/addmm and GELU kernels, same shapes, same run.
// Usage: bench_epilogue [--iters K] T,D,F ...
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "BenchUtil.h"

using namespace strata;

int main(int argc, char** argv) {
  if (!cudaAvailable()) {
    std::printf("bench_epilogue: no CUDA device\n");
    return 0;
  }
  auto args = bench::parseCaseArgs(argc, argv, 20, 3, 3, "T,D,F");
  if (!args) return 2;
  int iters = args->iters;
  std::vector<std::vector<int64_t>> shapes = args->cases;
  if (shapes.empty()) shapes = {{16384, 768, 3072}, {8192, 2048, 8192}};
  Device gpu = Device::cuda(0);
  Generator gen(1);
  for (const auto& shape : shapes) {
    int64_t T = shape[0], D = shape[1], F = shape[2];
    auto r = [&](Shape s, double std) { return ops::randn(s, gen, DType::BF16, gpu, 0.0, std); };
    Tensor x = r({T, D}, 1.0), w1 = r({D, F}, 0.02), b1 = r({F}, 0.02), w2 = r({F, D}, 0.02),
           b2 = r({D}, 0.02);
    Tensor pre = r({T, F}, 1.0), h = ops::geluTanh(pre), g = r({T, D}, 1.0), dpre = r({T, F}, 1.0);
    Tensor w2T = w2.transpose(0, 1), w1T = w1.transpose(0, 1);
    // The same weights stored [out, in] (PyTorch's layout), used through transposed views.
    Tensor w1o = ops::contiguous(w1T), w2o = ops::contiguous(w2T);
    Tensor gw1o = Tensor::empty({F, D}, DType::F32, gpu), gw2o = Tensor::empty({D, F}, DType::F32, gpu);
    Tensor gw1 = Tensor::empty({D, F}, DType::F32, gpu), gw2 = Tensor::empty({F, D}, DType::F32, gpu);
    double gemm = 2.0 * double(T) * double(D) * double(F);
    auto time = [&](const char* name, double flops, const std::function<void()>& fn) {
      double ms = bench::medianMs(gpu, fn, 3, iters);
      std::printf("epi %ld %ld %ld %s %.4f %.1f\n", T, D, F, name, ms,
                  flops > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0);
    };
    time("fc_plain", gemm, [&] { ops::matmul(x, w1); });
    time("fc_bias", gemm, [&] { ops::linear(x, w1, b1); });
    time("fc_gelu_aux_bias", gemm, [&] { ops::linearGelu(x, w1, b1); });
    time("gelu_pass", 0, [&] { ops::geluTanh(pre); });
    time("proj_bias", gemm, [&] { ops::linear(h, w2, b2); });
    time("dh_plain", gemm, [&] { ops::matmul(g, w2T); });
    time("dh_dgelu", gemm, [&] { ops::matmulGeluBackward(g, w2T, pre); });
    time("gelu_backward_pass", 0, [&] { ops::geluTanhBackward(dpre, pre); });
    time("dw2_plain", gemm, [&] { ops::matmulInto(gw2, h.transpose(0, 1), g); });
    time("dw2_bgrad", gemm, [&] { ops::linearParamGradsInto(h, g, gw2, false, true, DType::F32); });
    time("dw1_plain", gemm, [&] { ops::matmulInto(gw1, x.transpose(0, 1), dpre); });
    time("dw1_bgrad", gemm, [&] { ops::linearParamGradsInto(x, dpre, gw1, false, true, DType::F32); });
    time("dx_plain", gemm, [&] { ops::matmul(dpre, w1T); });
    // [out, in] weights: the forward reads them transposed, dX reads them as stored, dW is written [out, in].
    time("fc_bias_outin", gemm, [&] { ops::linear(x, w1o.transpose(0, 1), b1); });
    time("fc_gelu_aux_bias_outin", gemm, [&] { ops::linearGelu(x, w1o.transpose(0, 1), b1); });
    time("proj_bias_outin", gemm, [&] { ops::linear(h, w2o.transpose(0, 1), b2); });
    time("dh_plain_outin", gemm, [&] { ops::matmul(g, w2o); });
    time("dh_dgelu_outin", gemm, [&] { ops::matmulGeluBackward(g, w2o, pre); });
    time("dw2_plain_outin", gemm, [&] { ops::matmulInto(gw2o, g.transpose(0, 1), h); });
    time("dw1_plain_outin", gemm, [&] { ops::matmulInto(gw1o, dpre.transpose(0, 1), x); });
    time("dx_plain_outin", gemm, [&] { ops::matmul(dpre, w1o); });
  }
  return 0;
}
