// AdamW with fp32 state (m, v) beside each fp32 master parameter, decoupled weight decay, and bias
// correction. Parameters of rank < 2 (biases, norm gains) get no weight decay, as in GPT-2/nanoGPT.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "strata/core/Tensor.h"

namespace strata::optim {

struct AdamWConfig {
  double lr = 6e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weightDecay = 0.1;
};

class AdamW {
 public:
  AdamW(std::vector<std::pair<std::string, Tensor>> namedParameters, const AdamWConfig& config);

  // One update with learning rate `lr` from each parameter's .grad() times `gradScale` (a device fp32 scalar,
  // e.g. the clipping coefficient; undefined for 1). Parameters without a gradient are skipped.
  void step(double lr, const Tensor& gradScale = Tensor());
  void zeroGrad();

  int64_t stepCount() const { return step_; }
  void setStepCount(int64_t s) { step_ = s; }
  const AdamWConfig& config() const { return config_; }
  // Optimizer state by name ("m.<param>", "v.<param>"), for checkpoints.
  std::vector<std::pair<std::string, Tensor>> namedState() const;

 private:
  struct Slot {
    std::string name;
    Tensor param, m, v;
    float weightDecay;
  };
  AdamWConfig config_;
  std::vector<Slot> slots_;
  int64_t step_ = 0;
};

// The global L2 norm of the gradients, as an fp32 scalar on `device` (no host sync).
Tensor gradNorm(const std::vector<Tensor>& parameters, Device device);
// min(1, maxNorm / (norm + 1e-6)) as an fp32 scalar on norm's device; pass it to AdamW::step to clip.
Tensor clipCoefficient(const Tensor& norm, double maxNorm);

}  // namespace strata::optim
