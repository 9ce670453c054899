// Token or position embedding: a [num, dim] table looked up by integer ids.
#pragma once

#include "strata/autograd/Fp8.h"
#include "strata/core/Generator.h"
#include "strata/nn/Module.h"
#include "strata/nn/TensorParallel.h"

namespace strata::nn {

struct EmbeddingConfig {
  int64_t numEmbeddings = 0;
  int64_t embeddingDim = 0;
  double initStd = 0.02;
  Device device = Device::cpu();
  // >= 0: lookups of this id add nothing to the table's gradient (torch's padding_idx; BERT's [PAD]); under
  // vocabulary parallelism, on the rank holding its row.
  int64_t paddingIdx = -1;
  // Vocabulary-parallel (NOTE [Tensor parallelism] in nn/TensorParallel.h): this rank holds rows [rank num
  // / T, (rank + 1) num / T) of the one-rank table; lookups and the tied head meet through the group.
  TensorParallel tensorParallel = {};
};

class Embedding : public Module {
 public:
  Embedding(const EmbeddingConfig& config, Generator& gen);
  // ids (i32/i64, any shape) -> [..., dim] in `dtype`. forward({ids}) is apply(ids, weight's dtype).
  Tensor apply(const Tensor& ids, DType dtype);
  // The table used as a tied output layer. x [..., dim] in `compute` -> logits x @ weight^T [..., num].
  Tensor unembed(const Tensor& x, DType compute);
  // This rank's columns of unembed(x): [..., num / T] under vocabulary parallelism (for a head that adds its
  // own vocabulary-parallel bias and takes vocabParallelCrossEntropy), else unembed(x).
  Tensor unembedHere(const Tensor& x, DType compute);
  // Mean cross-entropy of unembed(x) against target, fused (linearCrossEntropy): x [N, dim] in the compute
  // dtype, target [N]. The [N, num] logits never exist at once.
  Tensor unembedCrossEntropy(const Tensor& x, const Tensor& target);
  // FP8 (precision.fp8_lm_head; NOTE [FP8 training] in autograd/Fp8.h): from here on unembedCrossEntropy's
  // GEMMs run in FP8 with the scales of `state` (not under vocabulary parallelism).
  void setFp8(std::shared_ptr<autograd::Fp8LinearState> state) { fp8_ = std::move(state); }
  // Vocabulary-parallel: unembed gathers the ranks' logits (generation), and unembedCrossEntropy takes the
  // loss from this rank's [N, num / T] logits (vocabParallelCrossEntropy), never gathering them. With
  // sequence parallelism (NOTE [Sequence parallelism] in nn/TensorParallel.h) lookups return this rank's part
  // of the sequence, and the head takes every rank's rows: unembed's x is [..., S/T, dim] (the logits cover
  // the whole sequence), unembedCrossEntropy's rows are the ranks' rows in rank order, so its target must be
  // in that order.
  bool vocabParallel() const { return tensorParallel_.active(); }
  const TensorParallel& tensorParallel() const { return tensorParallel_; }

  Tensor weight;

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  std::shared_ptr<autograd::Fp8LinearState> fp8_;
  Tensor lookup(const Tensor& ids, DType dtype);
  // The tied head's input under vocabulary parallelism: through f, or gathered along the sequence.
  Tensor headInput(const Tensor& x) const;

  int64_t paddingIdx_ = -1;
  TensorParallel tensorParallel_;
};

}  // namespace strata::nn
