// FP8 Linear and delayed scaling's state (NOTE [FP8 training] in autograd/Fp8.h).
#include "strata/autograd/Fp8.h"

#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"
#include "strata/autograd/Node.h"
#include "strata/ops/Ops.h"

namespace strata::autograd {

namespace {
constexpr int64_t kHeader = 3;  // position, layers, history length
}  // namespace

std::shared_ptr<Fp8Scaling> Fp8Scaling::create(const Fp8Recipe& recipe, Device device) {
  STRATA_USER_CHECK(recipe.amaxHistory >= 1 && recipe.amaxHistory <= (int64_t(1) << 24),
                    "precision.fp8_amax_history must be in [1, 2^24], got {}", recipe.amaxHistory);
  STRATA_USER_CHECK(recipe.margin >= 0 && recipe.margin <= 64,
                    "precision.fp8_margin must be in [0, 64], got {}", recipe.margin);
  return std::shared_ptr<Fp8Scaling>(new Fp8Scaling(recipe, device));
}

std::shared_ptr<Fp8LinearState> Fp8Scaling::add(const std::string& name) {
  Tensor state = ops::zeros({fp8StateElements(recipe_.amaxHistory)}, DType::F32, device_);
  for (int role = 0; role < 3; ++role) {  // scales and their inverses start at 1
    ops::fill(state.narrow(0, fp8ScaleSlot(role), 1), 1.0);
    ops::fill(state.narrow(0, fp8InverseSlot(role), 1), 1.0);
  }
  states_.emplace_back(name, state);
  auto s = std::make_shared<Fp8LinearState>();
  s->state = state;
  s->scaling = shared_from_this();
  return s;
}

void Fp8Scaling::update() {
  std::vector<Tensor> all;
  for (const auto& [name, state] : states_) all.push_back(state);
  ops::fp8UpdateScales(all, recipe_.amaxHistory, position_, int(recipe_.margin), recipe_.mostRecent);
  position_ = (position_ + 1) % recipe_.amaxHistory;
}

int64_t Fp8Scaling::savedElements() const {
  return kHeader + int64_t(states_.size()) * fp8StateElements(recipe_.amaxHistory);
}

Tensor Fp8Scaling::save() const {
  std::vector<float> flat{float(position_), float(states_.size()), float(recipe_.amaxHistory)};
  flat.reserve(size_t(savedElements()));
  for (const auto& [name, state] : states_) {
    std::vector<float> v = ops::to(state, Device::cpu(), DType::F32).toVector<float>();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  return Tensor::fromVector<float>(flat, {int64_t(flat.size())});
}

void Fp8Scaling::load(const Tensor& flat, const std::string& source) {
  std::vector<float> v = ops::to(flat, Device::cpu(), DType::F32).toVector<float>();
  STRATA_USER_CHECK(
      v.size() >= size_t(kHeader) && int64_t(v[1]) == int64_t(states_.size()) &&
          int64_t(v[2]) == recipe_.amaxHistory && int64_t(v.size()) == savedElements(),
      "{} holds FP8 scaling state of {} layers with an amax history of {} steps; this run has {} "
      "FP8 layers and precision.fp8_amax_history {}. Resume with the saved model, "
      "precision.fp8_amax_history and precision.fp8_lm_head",
      source, v.size() >= 2 ? int64_t(v[1]) : 0, v.size() >= 3 ? int64_t(v[2]) : 0, states_.size(),
      recipe_.amaxHistory);
  position_ = int64_t(v[0]);
  STRATA_USER_CHECK(position_ >= 0 && position_ < recipe_.amaxHistory,
                    "{}: FP8 history position {} is corrupted", source, position_);
  int64_t per = fp8StateElements(recipe_.amaxHistory);
  for (size_t i = 0; i < states_.size(); ++i) {
    std::vector<float> one(v.begin() + kHeader + int64_t(i) * per,
                           v.begin() + kHeader + int64_t(i + 1) * per);
    ops::copy(states_[i].second, Tensor::fromVector<float>(one, {per}));
  }
}

Tensor fp8Amax(const Fp8LinearState& fp8, int role, bool record) {
  if (!record) return ops::zeros({1}, DType::F32, fp8.state.device());
  int64_t H = fp8.scaling->recipe().amaxHistory;
  return detail::narrowRaw(fp8.state, 0, fp8HistorySlot(role, H) + fp8.scaling->position(), 1);
}

}  // namespace strata::autograd

namespace strata {

using autograd::Grads;
using autograd::participates;
using autograd::recordFunction;

namespace {

// One FP8 layer's scale, inverse and amax slots (NOTE [FP8 training]).
struct Fp8Slots {
  const autograd::Fp8LinearState& fp8;
  Tensor scale(int role) const { return detail::narrowRaw(fp8.state, 0, fp8ScaleSlot(role), 1); }
  Tensor inverse(int role) const { return detail::narrowRaw(fp8.state, 0, fp8InverseSlot(role), 1); }
  Tensor amax(int role, bool record) const { return autograd::fp8Amax(fp8, role, record); }
};

// out [rows, N] = codes(x) W (+ b) from x's E4M3 codes [rows, K]: W cast to [N, K] codes for this product.
Tensor fp8Forward(const Tensor& xPlain, const Tensor& weight, const Tensor& bias, const Fp8Slots& s,
                  bool record, DType dtype) {
  ops::Fp8Codes wq = ops::fp8Cast(weight, Fp8Format::E4M3, s.scale(1), s.amax(1, record), false, true);
  Tensor out = Tensor::empty({xPlain.size(0), weight.size(1)}, dtype, xPlain.device());
  ops::fp8MatmulInto(out, xPlain, Fp8Format::E4M3, s.inverse(0), wq.transposed, Fp8Format::E4M3, s.inverse(1),
                     bias.defined() ? ops::contiguous(bias) : Tensor(), false, ops::fp8FastForward());
  return out;
}

// The input's gradient [rows, K] = codes(g) W^T from g's E5M2 codes [rows, N], W recast as [K, N] codes.
Tensor fp8InputGrad(const Tensor& gPlain, const Tensor& w, uint64_t wVersion, const Fp8Slots& s,
                    DType dtype) {
  STRATA_CHECK(w.storage()->version() == wVersion,
               "fp8Linear: a weight saved for the backward was written in place after the forward (an "
               "optimizer step between the forward and a backward through a retained graph?)");
  ops::Fp8Codes wp = ops::fp8Cast(w, Fp8Format::E4M3, s.scale(1), s.amax(1, true), true, false);
  Tensor gx = Tensor::empty({gPlain.size(0), w.size(0)}, dtype, gPlain.device());
  ops::fp8MatmulInto(gx, gPlain, Fp8Format::E5M2, s.inverse(2), wp.plain, Fp8Format::E4M3, s.inverse(1),
                     Tensor(), false);
  return gx;
}

// The weight's gradient [K, N] = codes(x)^T codes(g) from both transposed codes, into the weight's gradient
// buffer when it has one (adding over micro-batches, as linear() does); else returned.
Tensor fp8WeightGrad(const Tensor& xT, const Tensor& gT, const Tensor& wLeaf, const Fp8Slots& s) {
  autograd::GradSink sink = autograd::claimGradBuffer(wLeaf);
  Tensor target =
      sink ? sink.buffer : Tensor::empty({xT.size(0), gT.size(0)}, autograd::gradDType(wLeaf), xT.device());
  ops::fp8MatmulInto(target, xT, Fp8Format::E4M3, s.inverse(0), gT, Fp8Format::E5M2, s.inverse(2), Tensor(),
                     sink && sink.accumulate);
  return sink ? Tensor() : target;
}

// The bias's gradient from the gradient cast's column sums (fp32), into the bias's buffer when it has one.
Tensor fp8BiasGrad(const Tensor& sums, const Tensor& bLeaf) {
  DType dtype = autograd::gradDType(bLeaf);
  Tensor gb = sums.dtype() == dtype ? sums : ops::to(sums, sums.device(), dtype);
  autograd::GradSink sink = autograd::claimGradBuffer(bLeaf);
  if (!sink) return gb;
  if (sink.accumulate)
    ops::addInPlace(sink.buffer, gb);
  else
    ops::copy(sink.buffer, gb);
  return Tensor();
}

Tensor columnSums(bool wanted, int64_t n, Device device) {
  return wanted ? Tensor::empty({n}, DType::F32, device) : Tensor();
}

Shape withLast(const Shape& shape, int64_t last) {
  Shape out(shape.begin(), shape.end() - 1);
  out.push_back(last);
  return out;
}

}  // namespace

Tensor fp8Linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                 const autograd::Fp8LinearState& fp8) {
  STRATA_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(0),
               "fp8Linear: x {} does not match weight {} ([in, out])", toString(x.shape()),
               toString(weight.shape()));
  int64_t K = weight.size(0), N = weight.size(1), rows = x.numel() / K;
  if (!ops::fp8Shape(rows, K, N)) return linear(x, weight, bias);
  STRATA_CHECK(x.dtype() == weight.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
               "fp8Linear: {} input with a {} weight; parameters are in the compute dtype", x.dtype(),
               weight.dtype());
  Device device = x.device();
  Fp8Slots s{fp8};
  // Forwards without gradients record into scratch (NOTE [FP8 training]). The backward records into the
  // forward's entry: the position moves only between steps.
  bool record = gradEnabled();
  bool nx = participates(x), nw = participates(weight), nb = participates(bias);
  Tensor x2 = detail::viewRaw(ops::contiguous(x), {rows, K});
  ops::Fp8Codes xq = ops::fp8Cast(x2, Fp8Format::E4M3, s.scale(0), s.amax(0, record), true, nw);
  Tensor out =
      detail::viewRaw(fp8Forward(xq.plain, weight, bias, s, record, x.dtype()), withLast(x.shape(), N));

  Tensor xT = xq.transposed;  // [K, rows] codes for wgrad
  Tensor w = nx ? weight.detach() : Tensor();
  uint64_t wVersion = nx ? weight.storage()->version() : 0;
  Tensor wLeaf = nw ? weight : Tensor(), bLeaf = nb ? bias : Tensor();
  Shape shX = x.shape();
  std::vector<Tensor> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  autograd::Fp8LinearState held = fp8;
  recordFunction("Fp8LinearBackward", inputs, {out}, [=](const Grads& gs) {
    Fp8Slots sb{held};
    Tensor g2 = detail::viewRaw(ops::contiguous(gs[0]), {rows, N});
    // The bias's gradient is the cast's column sums (NOTE [FP8 fused casts]).
    Tensor sums = columnSums(nb, N, device);
    ops::Fp8Codes gq = ops::fp8CastFused(g2, ops::Fp8Prologue::None, Tensor(), Fp8Format::E5M2, sb.scale(2),
                                         sb.amax(2, true), nx, nw, sums);
    Tensor gx = nx ? detail::viewRaw(fp8InputGrad(gq.plain, w, wVersion, sb, g2.dtype()), shX) : Tensor();
    Tensor gw = nw ? fp8WeightGrad(xT, gq.transposed, wLeaf, sb) : Tensor();
    Tensor gb = nb ? fp8BiasGrad(sums, bLeaf) : Tensor();
    Grads grads{gx, gw};
    if (bias.defined()) grads.push_back(gb);
    return grads;
  });
  return out;
}

Tensor fp8GeluMlp(const Tensor& x, const Tensor& fcWeight, const Tensor& fcBias, const Tensor& projWeight,
                  const Tensor& projBias, const autograd::Fp8LinearState& fcFp8,
                  const autograd::Fp8LinearState& projFp8) {
  STRATA_CHECK(fcWeight.dim() == 2 && projWeight.dim() == 2 && x.dim() >= 1 &&
                   x.size(-1) == fcWeight.size(0) && projWeight.size(0) == fcWeight.size(1),
               "fp8GeluMlp: x {} does not fit fc {} and proj {} ([in, out])", toString(x.shape()),
               toString(fcWeight.shape()), toString(projWeight.shape()));
  int64_t K = fcWeight.size(0), F = fcWeight.size(1), C = projWeight.size(1), rows = x.numel() / K;
  if (!ops::fp8Shape(rows, K, F) || !ops::fp8Shape(rows, F, C))
    return fp8Linear(gelu(fp8Linear(x, fcWeight, fcBias, fcFp8), GeluApprox::Tanh), projWeight, projBias,
                     projFp8);
  for (const Tensor& t : {fcWeight, fcBias, projWeight, projBias})
    STRATA_CHECK(!t.defined() || t.dtype() == x.dtype(),
                 "fp8GeluMlp: {} input with a {} parameter; parameters are in the compute dtype", x.dtype(),
                 t.dtype());
  Device device = x.device();
  DType dtype = x.dtype();
  Fp8Slots fc{fcFp8}, proj{projFp8};
  bool record = gradEnabled();
  bool nx = participates(x), nw1 = participates(fcWeight), nb1 = participates(fcBias);
  bool nw2 = participates(projWeight), nb2 = participates(projBias);
  Tensor x2 = detail::viewRaw(ops::contiguous(x), {rows, K});
  ops::Fp8Codes xq = ops::fp8Cast(x2, Fp8Format::E4M3, fc.scale(0), fc.amax(0, record), true, nw1);
  Tensor pre = fp8Forward(xq.plain, fcWeight, fcBias, fc, record, dtype);
  // The GELU inside proj's input cast: h itself is never written (NOTE [FP8 fused casts]).
  ops::Fp8Codes hq = ops::fp8CastFused(pre, ops::Fp8Prologue::GeluTanh, Tensor(), Fp8Format::E4M3,
                                       proj.scale(0), proj.amax(0, record), true, nw2);
  Tensor out = detail::viewRaw(fp8Forward(hq.plain, projWeight, projBias, proj, record, dtype),
                               withLast(x.shape(), C));

  bool fcGrads = nx || nw1 || nb1;
  Tensor xT = xq.transposed, hT = hq.transposed, savedPre = fcGrads ? pre : Tensor();
  Tensor w1 = nx ? fcWeight.detach() : Tensor(), w2 = fcGrads ? projWeight.detach() : Tensor();
  uint64_t v1 = nx ? fcWeight.storage()->version() : 0, v2 = fcGrads ? projWeight.storage()->version() : 0;
  Tensor w1Leaf = nw1 ? fcWeight : Tensor(), b1Leaf = nb1 ? fcBias : Tensor();
  Tensor w2Leaf = nw2 ? projWeight : Tensor(), b2Leaf = nb2 ? projBias : Tensor();
  Shape shX = x.shape();
  std::vector<Tensor> inputs{x, fcWeight};
  if (fcBias.defined()) inputs.push_back(fcBias);
  inputs.push_back(projWeight);
  if (projBias.defined()) inputs.push_back(projBias);
  bool hasB1 = fcBias.defined(), hasB2 = projBias.defined();
  autograd::Fp8LinearState fcHeld = fcFp8, projHeld = projFp8;
  recordFunction("Fp8GeluMlpBackward", inputs, {out}, [=](const Grads& gs) {
    Fp8Slots fcb{fcHeld}, projb{projHeld};
    Tensor g2 = detail::viewRaw(ops::contiguous(gs[0]), {rows, C});
    Tensor projSums = columnSums(nb2, C, device);
    ops::Fp8Codes gq = ops::fp8CastFused(g2, ops::Fp8Prologue::None, Tensor(), Fp8Format::E5M2,
                                         projb.scale(2), projb.amax(2, true), fcGrads, nw2, projSums);
    Tensor gw2 = nw2 ? fp8WeightGrad(hT, gq.transposed, w2Leaf, projb) : Tensor();
    Tensor gb2 = nb2 ? fp8BiasGrad(projSums, b2Leaf) : Tensor();
    Tensor gx, gw1, gb1;
    if (fcGrads) {
      // h's gradient, then the GELU's backward inside fc's gradient cast (NOTE [FP8 fused casts]).
      Tensor dh = fp8InputGrad(gq.plain, w2, v2, projb, g2.dtype());
      Tensor fcSums = columnSums(nb1, F, device);
      ops::Fp8Codes dq = ops::fp8CastFused(dh, ops::Fp8Prologue::GeluTanhBackward, savedPre, Fp8Format::E5M2,
                                           fcb.scale(2), fcb.amax(2, true), nx, nw1, fcSums);
      if (nx) gx = detail::viewRaw(fp8InputGrad(dq.plain, w1, v1, fcb, g2.dtype()), shX);
      if (nw1) gw1 = fp8WeightGrad(xT, dq.transposed, w1Leaf, fcb);
      if (nb1) gb1 = fp8BiasGrad(fcSums, b1Leaf);
    }
    Grads grads{gx, gw1};
    if (hasB1) grads.push_back(gb1);
    grads.push_back(gw2);
    if (hasB2) grads.push_back(gb2);
    return grads;
  });
  return out;
}

}  // namespace strata
