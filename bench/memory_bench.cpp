// Memory-bound kernels: achieved bandwidth against the device-to-device copy rate, measured in the same run.
// Bytes counted are the fewest each kernel must move (every input read once, every output written once).
// Prints one line per kernel:  mem NAME shape dtype median_ms GB/s percent_of_copy
// Usage: bench_memory [--rows N] [--cols C] [--dtype bf16]
#include <cstdio>
#include <string>

#include "BenchUtil.h"

using namespace strata;

int main(int argc, char** argv) {
  int64_t rows = 16384, cols = 4096;
  DType dtype = DType::BF16;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--rows")
      rows = std::stoll(argv[i + 1]);
    else if (a == "--cols")
      cols = std::stoll(argv[i + 1]);
    else if (a == "--dtype")
      dtype = dtypeFromName(argv[i + 1]);
  }
  if (!cudaAvailable()) {
    std::fprintf(stderr, "bench_memory needs a CUDA device\n");
    return 1;
  }
  Device gpu = Device::cuda(0);
  Generator gen(1);
  double elem = double(dtypeSize(dtype)), n = double(rows * cols);
  Tensor x = ops::randn({rows, cols}, gen, dtype, gpu), y = ops::randn({rows, cols}, gen, dtype, gpu);
  Tensor g = ops::randn({rows, cols}, gen, dtype, gpu);
  Tensor w = ops::randn({cols}, gen, dtype, gpu), b = ops::randn({cols}, gen, dtype, gpu);

  // Device-to-device copy: the ceiling (bytes read + bytes written).
  Tensor dst = ops::emptyLike(x);
  double copyMs = bench::medianMs(gpu, [&] { ops::copy(dst, x); });  // cudaMemcpyAsync device-to-device
  double copyGBs = 2.0 * n * elem / (copyMs * 1e-3) / 1e9;
  std::printf("mem copy %ldx%ld %s %.4f %.0f 100.0\n", rows, cols, dtypeName(dtype), copyMs, copyGBs);

  ops::NormResult ln = ops::layerNorm(x, w, b, 1e-5);
  Tensor sm = ops::softmax(x);
  auto report = [&](const char* name, double tensors, const std::function<void()>& fn) {
    double ms = bench::medianMs(gpu, fn);
    double gbs = tensors * n * elem / (ms * 1e-3) / 1e9;
    std::printf("mem %s %ldx%ld %s %.4f %.0f %.1f\n", name, rows, cols, dtypeName(dtype), ms, gbs,
                100.0 * gbs / copyGBs);
    std::fflush(stdout);
  };
  report("layer_norm_fwd", 2, [&] { ops::layerNorm(x, w, b, 1e-5); });
  report("layer_norm_bwd", 3, [&] { ops::layerNormBackward(g, x, w, ln, true, true); });
  report("softmax_fwd", 2, [&] { ops::softmax(x); });
  report("softmax_bwd", 3, [&] { ops::softmaxBackward(sm, g, -1, false); });
  report("gelu_fwd", 2, [&] { ops::geluTanh(x); });
  report("gelu_bwd", 3, [&] { ops::geluTanhBackward(g, x); });
  report("add_fwd", 3, [&] { ops::add(x, y); });
  // The backward of a broadcast bias add: the column sum of the incoming gradient.
  report("add_bwd_bias", 1, [&] { ops::sumTo(g, {cols}); });
  return 0;
}
