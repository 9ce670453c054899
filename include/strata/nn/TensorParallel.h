// Megatron's tensor parallelism (Shoeybi et al. 2019): the layers of a Transformer block split over the
// ranks of a tensor-parallel group, and the two conjugate operators that join them.
//
// NOTE [Tensor parallelism]
// With a tensor-parallel group of T ranks (rank t):
// - A column-parallel linear layer (nn::Linear with TensorSplit::Columns) holds columns [t O/T, (t+1) O/T)
//   of its [I, O] weight and of its bias; a layer whose columns come in g groups (GPT's fused q|k|v, g = 3)
//   holds that slice of each group, so rank t has the q, k and v of heads [t H/T, (t+1) H/T). Its input
//   goes through f (copyToTensorParallel): identity forward, all-reduce of the input's gradient backward.
// - A row-parallel layer (TensorSplit::Rows) holds rows [t I/T, (t+1) I/T) of its weight and the whole
//   bias. Its partial products go through g (reduceFromTensorParallel): all-reduce forward, identity
//   backward; the bias is added once, after the all-reduce.
// - Attention is column-parallel q/k/v then row-parallel output projection; the MLP column-parallel fc
//   then row-parallel proj. So each of them costs one all-reduce forward (g) and one backward (f).
// - The vocabulary-parallel embedding holds rows [t V/T, (t+1) V/T) of the table: a lookup reads the ids
//   this rank holds (zero rows for the others) and g sums the ranks' rows. Its use as the tied LM head
//   makes this rank's logits [N, V/T] from f(x), and vocabParallelCrossEntropy takes the loss without
//   gathering them: the row maxima and the sums of exponentials are all-reduced over the group, and each
//   target's logit comes from the rank that holds it (Megatron's vocab_parallel_cross_entropy).
// - Everything else (LayerNorms, the position table, row-parallel biases) is whole on every rank, and its
//   gradients are equal on every rank of the group: the gradient that reaches it is the same (f's
//   all-reduce made it so), so it needs no reduction across the group (under sequence parallelism, see
//   below, the norms and biases see a part of the sequence each, and f sums their gradients).
// Every slice is cut from the weights the one-rank model draws (the same generator draws, then a slice), so
// a run on T ranks starts from the one-rank model's numbers and trains like it to rounding.
// The collectives are functions given by the trainer over its tensor-parallel group (this layer does not
// know process groups); each is ordered with the compute stream by the function itself.
//
// NOTE [Sequence parallelism]
// With sequenceParallel (Korthikanti et al. 2022) the regions between the split layers (the LayerNorms, the
// residual stream, dropout) run on this rank's part of the sequence, [B, S/T, C], rank t holding positions
// [t S/T, (t+1) S/T). Before a column-parallel layer gatherSequence all-gathers the sequence (backward:
// reduce-scatter of the gradient), in place of f; after a row-parallel layer scatterSequence
// reduce-scatters its partial sums (backward: all-gather), in place of g; the row-parallel bias is added to
// this rank's part. The token embedding's partial rows are reduce-scattered the same way, the position rows
// are this rank's part of the whole table's lookup (splitSequence: backward all-gathers, so the table's
// gradient is whole on every rank), and the LM head gathers the rows it takes. The whole parameters used on a
// part of the sequence (the LayerNorms' and the row-parallel biases) go through f, whose backward sums their
// partial gradients over the group. GPT pads a sequence to a multiple of T (at the end: causal attention
// keeps the real positions exact) and drops the padding's outputs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "strata/core/Generator.h"
#include "strata/core/Tensor.h"

namespace strata::nn {

class Module;

// This rank's place in the tensor-parallel group, and the group's collectives (in place on contiguous
// tensors of the same size on every rank). size 1: no split and no collective.
struct TensorParallel {
  int size = 1;
  int rank = 0;
  std::function<void(const Tensor& inout)> allReduceSum;
  std::function<void(const Tensor& inout)> allReduceMax;
  // out = the ranks' `in` concatenated in rank order (out.numel() == size x in.numel()).
  std::function<void(const Tensor& out, const Tensor& in)> allGather;
  // out = block `rank` of the sum over the ranks of `in` (in.numel() == size x out.numel()).
  std::function<void(const Tensor& out, const Tensor& in)> reduceScatter;
  // NOTE [Sequence parallelism].
  bool sequenceParallel = false;

  bool active() const { return size > 1; }
  bool splitsSequence() const { return active() && sequenceParallel; }
};

// What a model split by `tp` checks first: tp.size divides the heads, the MLP width (`ffnKey` names its
// config key) and the vocabulary, each failure naming the key; without sequence parallelism unless
// `allowsSequenceParallel`, else an error naming `model` and what it splits.
void checkTensorSplit(const TensorParallel& tp, const std::string& model, int64_t heads, int64_t ffn,
                      const char* ffnKey, int64_t vocab, bool allowsSequenceParallel);

// How a Linear layer splits over the group (NOTE [Tensor parallelism]).
enum class TensorSplit { None, Columns, Rows };

// f: identity forward; the all-reduce (sum) of the gradient backward.
Tensor copyToTensorParallel(const Tensor& x, const TensorParallel& tp);
// g: the all-reduce (sum) forward; identity backward.
Tensor reduceFromTensorParallel(const Tensor& x, const TensorParallel& tp);
// The ranks' last dimensions side by side ([..., n] -> [..., T n]); backward takes this rank's part of the
// gradient. For outputs that every rank then uses alike (the logits of generation).
Tensor gatherFromTensorParallel(const Tensor& x, const TensorParallel& tp);

// NOTE [Sequence parallelism]: the ranks' parts of dimension `dim` side by side ([.., n, ..] -> [.., T n,
// ..]) with the reduce-scatter of the gradient backward; the reduce-scatter of x along `dim` ([.., T n, ..]
// -> this rank's [.., n, ..] of the sum) with the all-gather backward; and this rank's part of x along `dim`
// with the all-gather backward.
Tensor gatherSequence(const Tensor& x, const TensorParallel& tp, int64_t dim = 1);
Tensor scatterSequence(const Tensor& x, const TensorParallel& tp, int64_t dim = 1);
Tensor splitSequence(const Tensor& x, const TensorParallel& tp, int64_t dim = 1);
// A whole parameter used on this rank's part of the sequence: f under sequence parallelism (its gradient
// summed over the group), else the parameter itself.
Tensor sequenceParallelParameter(const Tensor& p, const TensorParallel& tp);

// The mean cross-entropy of the vocabulary-parallel logits [N, V/T] (this rank's columns, the vocabulary's
// [rank V/T, (rank+1) V/T)) against target [N] (global ids; ignoreIndex skipped), as a scalar equal on
// every rank (fp32; f64 for f64 logits). Backward gives this rank's logits their gradient (softmax minus the
// one-hot), in their dtype.
Tensor vocabParallelCrossEntropy(const Tensor& logits, const Tensor& target, const TensorParallel& tp,
                                 int64_t ignoreIndex = -100);

// How a parameter is cut into the ranks' slices: along `dim`, in `groups` equal groups each cut into T
// (GPT's fused q|k|v: columns, 3 groups; a row-parallel weight: rows, 1 group).
struct TensorSlice {
  int64_t dim = 0;
  int64_t groups = 1;
};
// A module whose own parameters (not its submodules') are cut over the group, beside split Linear layers and
// vocabulary-parallel tables: BERT's MLM bias (the vocabulary's), T5's relative position table (its heads).
class TensorParallelSliced {
 public:
  virtual ~TensorParallelSliced() = default;
  // Its parameters that are slices (names relative to the module), and how; empty when not split.
  virtual std::map<std::string, TensorSlice> ownSlices() const = 0;
};

// The parameters of `model` that are slices (different on every rank of the group), and how: the weights of
// split Linear layers, column-parallel biases, vocabulary-parallel tables, the TensorParallelSliced modules'
// own. The others are whole and equal.
std::map<std::string, TensorSlice> tensorParallelSlices(Module& model);
// The whole parameter from the ranks' slices in rank order (the inverse of the cut), on the CPU.
Tensor joinSlices(const std::vector<Tensor>& slices, const TensorSlice& how);

// NOTE [Tensor-parallel random streams]
// Dropout on a tensor that every rank of the group holds whole (the residual stream without sequence
// parallelism) must draw the same mask on every rank, and does: the ranks' default generators start from one
// seed and reserve the same counts. Dropout on a tensor that is this rank's own part (its heads' attention
// probabilities; under sequence parallelism its part of the sequence) must not repeat the other ranks'
// masks: while a TensorParallelRandom lives, the generator draws with this rank's own seed (the seed mixed
// with the rank) at the offsets the group shares, and at its end the seed comes back. The ranks reserve the
// same counts there too, so the shared stream goes on at the same offset on every rank, and a replay (the
// dropout's backward, recomputation) replays the same masks (the Megatron RNG tracker's job).
class TensorParallelRandom {
 public:
  // Nothing when `on` is false or the group has one rank.
  explicit TensorParallelRandom(const TensorParallel& tp, bool on = true,
                                Generator& gen = defaultGenerator());
  ~TensorParallelRandom();
  TensorParallelRandom(const TensorParallelRandom&) = delete;
  TensorParallelRandom& operator=(const TensorParallelRandom&) = delete;

 private:
  Generator* gen_ = nullptr;
  uint64_t seed_ = 0;
};

// The group `model`'s split layers use (size 1 when none is split).
TensorParallel tensorParallelOf(Module& model);

// Columns of w [I, O] as rank `rank` of `size` holds them with `groups` groups of columns (NOTE [Tensor
// parallelism]): [I, O / size], contiguous. A bias [O] is taken as [1, O].
Tensor columnSlice(const Tensor& w, int64_t groups, int size, int rank);

}  // namespace strata::nn
