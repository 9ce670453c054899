// bf16 GEMM through Strata's matmul (cuBLASLt). For each shape: check sampled outputs against a
// double-precision host reference, then time. Prints one line per shape:
//   gemm M N K dtype median_ms tflops max_rel_err
// Usage: bench_gemm [--dtype bf16|f16|f32] [--iters N] [M,N,K ...]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "BenchUtil.h"

using namespace strata;

int main(int argc, char** argv) {
  DType dtype = DType::BF16;
  int iters = 50;
  std::vector<std::array<int64_t, 3>> shapes;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--dtype" && i + 1 < argc)
      dtype = dtypeFromName(argv[++i]);
    else if (a == "--iters" && i + 1 < argc)
      iters = std::stoi(argv[++i]);
    else {
      std::array<int64_t, 3> s{};
      if (std::sscanf(a.c_str(), "%ld,%ld,%ld", &s[0], &s[1], &s[2]) != 3) {
        std::fprintf(stderr, "bad shape '%s' (expected M,N,K)\n", a.c_str());
        return 2;
      }
      shapes.push_back(s);
    }
  }
  if (shapes.empty())
    shapes = {
        {4096, 4096, 4096}, {8192, 8192, 8192}, {8192, 6144, 2048}, {8192, 8192, 2048}, {8192, 2048, 8192}};
  if (!cudaAvailable()) {
    std::fprintf(stderr, "bench_gemm needs a CUDA device\n");
    return 1;
  }
  Device gpu = Device::cuda(0);
  for (auto [M, N, K] : shapes) {
    Generator gen(1);
    Tensor a = ops::randn({M, K}, gen, dtype, gpu, 0.0, 1.0);
    Tensor b = ops::randn({K, N}, gen, dtype, gpu, 0.0, 1.0);
    Tensor c = ops::matmul(a, b);
    // Check 64 sampled outputs against a double-precision dot product of the same (rounded) inputs.
    std::vector<float> ah = a.toVector<float>(), bh = b.toVector<float>(), ch = c.toVector<float>();
    double worst = 0;
    for (int s = 0; s < 64; ++s) {
      int64_t i = (s * 7919) % M, j = (s * 104729) % N;
      double ref = 0, mag = 0;
      for (int64_t p = 0; p < K; ++p) {
        ref += double(ah[size_t(i * K + p)]) * double(bh[size_t(p * N + j)]);
        mag += std::abs(double(ah[size_t(i * K + p)]) * double(bh[size_t(p * N + j)]));
      }
      worst = std::max(worst,
                       std::abs(double(ch[size_t(i * N + j)]) - ref) / (mag / std::sqrt(double(K)) + 1e-6));
    }
    double ms = bench::medianMs(
        gpu, [&] { c = ops::matmul(a, b); }, 5, iters);
    double tflops = 2.0 * double(M) * double(N) * double(K) / (ms * 1e-3) / 1e12;
    std::printf("gemm %ld %ld %ld %s %.4f %.1f %.2e\n", M, N, K, dtypeName(dtype), ms, tflops, worst);
    std::fflush(stdout);
  }
  return 0;
}
