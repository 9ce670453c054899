// Helpers shared by the tests: host comparisons and the finite-difference gradient check.
#pragma once

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "CatchShim.h"
#include "models/Zoo.h"
#include "strata/strata.h"

namespace strata::test {

// An empty directory under the system's temp directory (removed first if it exists).
inline std::filesystem::path freshDir(const std::string& name) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// One layer of width 16 (2 heads, FFN 32, 16 positions) of a zoo architecture (gpt, bert, t5: bias-free,
// heads of 8, `decoderSeqLength` target positions), over `vocab` tokens.
inline models::ModelSpec tinyZooSpec(const std::string& arch, int64_t vocab, int64_t decoderSeqLength) {
  models::ModelSpec s;
  s.arch = arch;
  s.numLayers = 1;
  s.hiddenSize = 16;
  s.numHeads = 2;
  s.ffnHiddenSize = 32;
  s.seqLength = 16;
  s.vocabSize = vocab;
  s.bias = arch != "t5";
  s.kvChannels = arch == "t5" ? 8 : 0;
  s.decoderSeqLength = arch == "t5" ? decoderSeqLength : 0;
  return s;
}

// A two-layer GPT small enough for exhaustive checks: hidden 32, 2 heads, 16 positions, 64 tokens.
inline models::ModelSpec tinyGptSpec() {
  models::ModelSpec spec;
  spec.numLayers = 2;
  spec.hiddenSize = 32;
  spec.numHeads = 2;
  spec.seqLength = 16;
  spec.vocabSize = 64;
  return spec;
}

// The message of the strata::Error that `f` throws, or "" when it throws none.
inline std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Largest |a - b| / (atol + rtol |b|) over elements; <= 1 means close.
inline double closeness(const std::vector<double>& a, const std::vector<double>& b, double atol,
                        double rtol) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    worst = std::max(worst, std::abs(a[i] - b[i]) / (atol + rtol * std::abs(b[i])));
  }
  return worst;
}

inline void requireClose(const Tensor& a, const Tensor& b, double atol = 1e-5, double rtol = 1e-4) {
  REQUIRE(a.shape() == b.shape());
  double c = closeness(a.toVector<double>(), b.toVector<double>(), atol, rtol);
  INFO("worst scaled error " << c);
  REQUIRE(c <= 1.0);
}

inline Tensor randomDouble(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0) {
  Generator gen(seed);
  return ops::rand(shape, gen, DType::F64, Device::cpu(), low, high);
}

// Checks the analytic gradient of f against central differences, in f64 on the CPU. f's output is reduced to
// a scalar through a fixed random projection so every output element contributes.
inline void gradCheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs,
                      double eps = 1e-6, double atol = 1e-6, double rtol = 1e-4) {
  for (auto& t : inputs) {
    REQUIRE(t.dtype() == DType::F64);
    if (!t.requiresGrad()) t.setRequiresGrad(true);
    t.setGrad(Tensor());
  }
  Tensor out = f(inputs);
  Tensor projection = randomDouble(out.shape(), 4242, 0.5, 1.5);
  Tensor loss = sum(mul(out, projection));
  backward(loss);
  auto scalarLoss = [&]() {
    NoGradGuard noGrad;
    return sum(mul(f(inputs), projection)).item();
  };
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    REQUIRE(x.grad().defined());
    std::vector<double> analytic = x.grad().toVector<double>();
    std::vector<double> numeric(analytic.size());
    REQUIRE(x.isContiguous());
    double* p = x.data<double>();
    for (size_t i = 0; i < numeric.size(); ++i) {
      double orig = p[i];
      p[i] = orig + eps;
      double up = scalarLoss();
      p[i] = orig - eps;
      double down = scalarLoss();
      p[i] = orig;
      numeric[i] = (up - down) / (2 * eps);
    }
    double c = closeness(analytic, numeric, atol, rtol);
    INFO("input " << k << ": worst scaled gradient error " << c);
    REQUIRE(c <= 1.0);
  }
}

}  // namespace strata::test
