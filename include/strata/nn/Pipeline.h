// Pipeline parallelism (GPipe's stages with Megatron's schedules): a model's layers split into contiguous
// model chunks, each rank of a pipeline-parallel group holding some of them.
//
// NOTE [Pipeline stages]
// With a pipeline-parallel group of P ranks and V virtual stages per rank there are P x V model chunks,
// numbered in the order the data goes through them; rank p holds chunks p, p + P, ..., p + (V - 1) P (V = 1:
// the plain contiguous split, one stage per rank; V > 1: Megatron's interleaved schedule, Narayanan et al.
// 2021). Chunk 0 also holds the embeddings, chunk P V - 1 the final norm, the LM head and the loss. A rank
// builds only the parameters of its chunks; each parameter keeps the name it has in the whole model
// ("h.5.attn.qkv.weight"), so checkpoints, conversion and the optimizer see the same names at every layout.
// The split is balanced by cost, not by count (balancedSplit): the blocks' FLOPs, with the first chunk
// carrying the embedding's and the last the LM head's and the loss's, all in the same unit, so a large
// vocabulary leaves fewer blocks on the last stage. Every chunk keeps at least one block.
// A model whose embedding and LM head share one table (GPT's tied wte) holds it on the first chunk and on the
// last, one copy each, drawn from the same generator offsets so they start equal; their gradients are summed
// over the two ranks that hold them (the trainer's "embedding" group, as Megatron's) before the norm and the
// update, so the copies stay equal. The gradient norm counts the table once (the first stage's copy).
// Between chunks travels one tensor, the residual stream (GPT: [B, S, C] in the compute dtype; under
// sequence parallelism this rank's part of the sequence). A chunk's input is a leaf that requires grad, its
// backward starts from the gradient the next chunk sent, and the input's gradient goes back.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/core/Shape.h"
#include "strata/core/Tensor.h"

namespace strata::nn {

// This rank's place in the pipeline (NOTE [Pipeline stages]). size 1: the whole model, no pipeline.
struct PipelineParallel {
  int size = 1;           // P: ranks of the pipeline-parallel group (parallel.pipeline)
  int rank = 0;           // p: this rank's stage
  int virtualStages = 1;  // V: model chunks per rank (parallel.virtual_stages)

  bool active() const { return size > 1; }
  int64_t chunks() const { return int64_t(size) * virtualStages; }
  // The model chunk this rank runs as its `local`-th (0 .. V - 1).
  int64_t chunkOf(int64_t local) const { return local * size + rank; }
  bool holdsFirst() const { return rank == 0; }
  bool holdsLast() const { return rank == size - 1; }
};

// The blocks [begin, end) of each of `parts` model chunks, contiguous and in order, each with at least one
// block, minimising the largest chunk's cost: the sum of its blocks' costs, plus `firstExtra` on chunk 0 and
// `lastExtra` on the last (the embedding; the head and the loss). Of equally good splits, the one that gives
// the earlier chunks fewer blocks. An error naming the keys when there are fewer blocks than parts.
struct BlockRange {
  int64_t begin = 0, end = 0;
};
std::vector<BlockRange> balancedSplit(const std::vector<double>& blockCost, double firstExtra,
                                      double lastExtra, int64_t parts);

// A model that runs as pipeline stages (GPT). The pipeline schedule (train/PipelineSchedule.h) drives it.
class PipelineStageModel {
 public:
  virtual ~PipelineStageModel() = default;
  virtual const PipelineParallel& pipeline() const = 0;
  // Runs this rank's `local`-th model chunk as one call of the model (its hooks, and the gradient notices of
  // all of its parameters: NOTE [Module calls] in nn/Module.h). `input` is the previous chunk's output
  // (undefined for chunk 0, which embeds `ids`); returns the next chunk's input, or on the last chunk the
  // mean loss against `targets`.
  virtual Tensor stageForward(int64_t local, const Tensor& input, const Tensor& ids, const Tensor& targets,
                              DType compute) = 0;
  // The shape of what travels between chunks for a micro-batch of `ids` [B, S].
  virtual Shape stageActivationShape(const Shape& ids) const = 0;
  // The parameters a first and a last chunk both hold (a tied embedding): their gradients are summed over
  // the two ranks; empty when nothing is tied.
  virtual std::vector<std::string> tiedParameters() const = 0;
};

}  // namespace strata::nn
