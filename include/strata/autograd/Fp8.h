// FP8 training: the Linear layers' GEMMs on FP8 tensor cores, with delayed scaling from amax histories.
//
// NOTE [FP8 training]
// precision.fp8 (with precision.dtype bf16) runs each nn::Linear's three GEMMs in FP8, following Transformer
// Engine's recipe (DelayedScaling):
// - Forward y = x W (+ b): x and W cast to E4M3; backward dgrad gx = g W^T with g in E5M2 and W in E4M3;
//   wgrad gW = x^T g with x in E4M3 and g in E5M2. Products accumulate in fp32 and are written in bf16
//   (gx, y) or straight into the weight's gradient buffer (fp32 or bf16, adding over micro-batches). The bias
//   rides the forward GEMM's epilogue; its gradient is a sum over rows as in bf16.
// - cuBLASLt's FP8 kernels on Hopper take both operands K-contiguous (the "TN" layout): A [m, k], B [n, k].
//   So each cast writes the layouts its GEMMs read, in one pass: x as [rows, K] for the forward and [K, rows]
//   for wgrad (saved for the backward: one byte per element instead of bf16's two), W as [N, K] in the
//   forward and [K, N] again in the backward (recast from the bf16 weight, not held), g as [rows, N] for
//   dgrad and [N, rows] for wgrad. The FP8 copies live in scratch; the chunks keep the bf16 parameters and
//   the optimizer its fp32 masters, as without FP8.
// - The products promote their partial sums to fp32 at intervals (cuBLASLt's default). With
//   STRATA_FP8_FAST_ACCUM=1 the forward's skip that, as Transformer Engine's recipe does (faster, a little
//   less exact); the gradients' products keep it.
// - cuBLASLt needs K and every leading dimension a multiple of 16. A layer whose rows, in or out features are
//   not runs that call in bf16 (ops::fp8Shape decides; the CPU emulation decides alike).
// - Per-tensor scales, delayed: each layer keeps, on the device, a scale for x, W and g, their inverses (the
//   GEMMs' dequantisation factors, cuBLASLt's A/B_SCALE_POINTER) and an amax history of
//   precision.fp8_amax_history steps for each. A cast multiplies by the current scale (saturating, round to
//   nearest even; core/Fp8.h) and maxes the tensor's largest finite |value| into the history's current
//   entry (a step with infinities or NaNs is skipped by the step engine; it must not freeze the scales for
//   a whole history, nor make the state unsaveable). At the end of every optimizer step one kernel updates
//   every layer (Fp8Scaling::update): amax = the history's max (precision.fp8_amax_compute max) or its
//   newest entry (most_recent), scale = (fp8_max / amax) / 2^precision.fp8_margin, kept when amax is zero
//   or not finite; then the next entry is zeroed and becomes current. The host only counts the position,
//   so nothing waits for the device. Scales start at 1.
// - Forwards without gradients (evaluation, generation) cast with the same scales but record nothing, so
//   they never change training; a checkpointed region records in its recomputation, once.
// - The scales and histories are training state: the step engine saves them with the optimizer state
//   (piece kind "fp8", one per rank: each rank scales by what it saw) and a resume restores them, so it
//   continues bit for bit.
// - On the CPU the same recipe runs as an emulation: the casts produce the device's codes bit for bit (one
//   conversion for both), and the products of the decoded values are summed in fp32. CI tests the recipe and
//   exact resume there; the [cuda] tests compare the GPU's casts and GEMMs with it.
// - The LM head (the zoo's heads are embedding tables: Embedding::unembedCrossEntropy, the fused head and
//   loss of linearCrossEntropy) stays in bf16 unless precision.fp8_lm_head: its logits' GEMM and both
//   gradient GEMMs then run in FP8 per row chunk, the softmax gradient cast to E5M2, with a state of its own.
//   Under vocabulary parallelism the head stays in bf16.
// - Not in FP8: LayerNorm, attention's softmax and its two batched products, the loss itself, the optimizer.
//
// NOTE [FP8 fused casts]
// A cast is a pass over its tensor, so work on the same elements rides it (ops::fp8CastFused):
// - The bias's gradient is the column sums of g, taken by g's E5M2 cast from the values it converts, in a
//   fixed order (blocks of 64 rows summed row by row, then the blocks in order; the CPU's order too), instead
//   of a second pass over g.
// - A GELU MLP whose fc and proj are both FP8 (fp8GeluMlp; nn::Mlp uses it) never writes h = gelu(pre):
//   proj's input cast reads pre and casts gelu(pre), rounded to the compute dtype as the GELU op would store
//   it. In the backward, fc's gradient cast reads h's gradient and pre and casts gelu'(pre) * dh, likewise
//   rounded, and sums its columns for fc's bias. The codes, the amaxes and the gradients are the composed
//   layers' (fp8Linear, gelu, fp8Linear) bit for bit; what is saved is the same (pre, and the codes for the
//   weights' gradients). Each pass that goes saves a write and a read of the [rows, 4C] activation or its
//   gradient.
// - On the GPU the fusing kernel takes rows and columns in multiples of 8 with 16-byte aligned rows (the
//   FP8 GEMMs' shapes always are); elsewhere the front end composes the same steps.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/Fp8.h"
#include "strata/core/Tensor.h"

namespace strata::autograd {

struct Fp8Recipe {
  int64_t amaxHistory = 1024;  // precision.fp8_amax_history
  int64_t margin = 0;          // precision.fp8_margin
  bool mostRecent = false;     // precision.fp8_amax_compute most_recent (else max)
};

class Fp8Scaling;

// One layer's FP8 state: fp32 [fp8StateElements(amaxHistory)] on the device (scales of x, W, g; their
// inverses; the three histories; the layout in core/Fp8.h), and the scaling it belongs to (the recipe and the
// current history position).
struct Fp8LinearState {
  Tensor state;
  std::shared_ptr<const Fp8Scaling> scaling;
};

// The FP8 states of one model's layers (NOTE [FP8 training]).
class Fp8Scaling : public std::enable_shared_from_this<Fp8Scaling> {
 public:
  static std::shared_ptr<Fp8Scaling> create(const Fp8Recipe& recipe, Device device);
  // A new layer's state (scales 1, histories zero); saved in the order added.
  std::shared_ptr<Fp8LinearState> add(const std::string& name);
  // Delayed scaling's step (ops::fp8UpdateScales over every layer), then the next history position.
  void update();
  const Fp8Recipe& recipe() const { return recipe_; }
  int64_t position() const { return position_; }
  size_t layers() const { return states_.size(); }
  const std::vector<std::pair<std::string, Tensor>>& states() const { return states_; }
  // The whole state as one flat fp32 tensor on the host: position, layers, history length, then each
  // layer's state in order; load() takes it back, refusing one of other layers or another history length.
  int64_t savedElements() const;
  Tensor save() const;
  void load(const Tensor& flat, const std::string& source);

 private:
  Fp8Scaling(const Fp8Recipe& recipe, Device device) : recipe_(recipe), device_(device) {}
  Fp8Recipe recipe_;
  Device device_;
  int64_t position_ = 0;
  std::vector<std::pair<std::string, Tensor>> states_;
};

// The one-element slot a cast of `role` (0 x, 1 W, 2 g) maxes its amax into: the history's current entry
// when `record`, else scratch (forwards without gradients record nothing).
Tensor fp8Amax(const Fp8LinearState& fp8, int role, bool record);
}  // namespace strata::autograd

namespace strata {

// y = x W (+ b) as linear() (autograd/Functions.h), its three GEMMs in FP8 with `fp8`'s scales (NOTE [FP8
// training]); in bf16 when ops::fp8Shape refuses the shapes.
Tensor fp8Linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                 const autograd::Fp8LinearState& fp8);

// proj(gelu_tanh(fc(x))) with both layers in FP8 (fcFp8's and projFp8's scales): as fp8Linear, then
// gelu(.., GeluApprox::Tanh), then fp8Linear, the same bits, with the GELU fused into proj's input cast and
// its backward into fc's gradient cast (NOTE [FP8 fused casts]); composed as written when ops::fp8Shape
// refuses either layer's shapes.
Tensor fp8GeluMlp(const Tensor& x, const Tensor& fcWeight, const Tensor& fcBias, const Tensor& projWeight,
                  const Tensor& projBias, const autograd::Fp8LinearState& fcFp8,
                  const autograd::Fp8LinearState& projFp8);

}  // namespace strata
