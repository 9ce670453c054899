// Token or position embedding: a [num, dim] table looked up by integer ids.
#pragma once

#include "strata/core/Generator.h"
#include "strata/nn/Module.h"

namespace strata::nn {

struct EmbeddingConfig {
  int64_t numEmbeddings = 0;
  int64_t embeddingDim = 0;
  double initStd = 0.02;
  Device device = Device::cpu();
};

class Embedding : public Module {
 public:
  Embedding(const EmbeddingConfig& config, Generator& gen);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  // ids (i32/i64, any shape) -> [..., dim] in `dtype`.
  Tensor apply(const Tensor& ids, DType dtype);

  Tensor weight;
};

}  // namespace strata::nn
