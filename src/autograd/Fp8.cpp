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
  const Tensor state = fp8.state;
  auto scale = [state](int role) { return detail::narrowRaw(state, 0, fp8ScaleSlot(role), 1); };
  auto inverse = [state](int role) { return detail::narrowRaw(state, 0, fp8InverseSlot(role), 1); };
  // Forwards without gradients record into scratch (NOTE [FP8 training]). The backward records into the
  // forward's entry: the position moves only between steps.
  bool record = gradEnabled();
  auto amax = [fp8](int role, bool rec) { return autograd::fp8Amax(fp8, role, rec); };
  bool nx = participates(x), nw = participates(weight), nb = participates(bias);
  Tensor x2 = detail::viewRaw(ops::contiguous(x), {rows, K});
  ops::Fp8Codes xq = ops::fp8Cast(x2, Fp8Format::E4M3, scale(0), amax(0, record), true, nw);
  ops::Fp8Codes wq = ops::fp8Cast(weight, Fp8Format::E4M3, scale(1), amax(1, record), false, true);
  Tensor out = Tensor::empty({rows, N}, x.dtype(), device);
  ops::fp8MatmulInto(out, xq.plain, Fp8Format::E4M3, inverse(0), wq.transposed, Fp8Format::E4M3, inverse(1),
                     bias.defined() ? ops::contiguous(bias) : Tensor(), false, ops::fp8FastForward());
  Shape outShape(x.shape().begin(), x.shape().end() - 1);
  outShape.push_back(N);
  out = detail::viewRaw(out, outShape);

  Tensor xT = xq.transposed;  // [K, rows] codes for wgrad
  Tensor w = nx ? weight.detach() : Tensor();
  uint64_t wVersion = nx ? weight.storage()->version() : 0;
  Tensor wLeaf = nw ? weight : Tensor(), bLeaf = nb ? bias : Tensor();
  Shape shX = x.shape();
  std::vector<Tensor> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  recordFunction("Fp8LinearBackward", inputs, {out}, [=](const Grads& gs) {
    Tensor g2 = detail::viewRaw(ops::contiguous(gs[0]), {rows, N});
    ops::Fp8Codes gq = ops::fp8Cast(g2, Fp8Format::E5M2, scale(2), amax(2, true), nx, nw);
    Tensor gx, gw, gb;
    if (nx) {
      STRATA_CHECK(w.storage()->version() == wVersion,
                   "fp8Linear: a weight saved for the backward was written in place after the forward (an "
                   "optimizer step between the forward and a backward through a retained graph?)");
      ops::Fp8Codes wp = ops::fp8Cast(w, Fp8Format::E4M3, scale(1), amax(1, true), true, false);
      Tensor gx2 = Tensor::empty({rows, K}, g2.dtype(), device);
      ops::fp8MatmulInto(gx2, gq.plain, Fp8Format::E5M2, inverse(2), wp.plain, Fp8Format::E4M3, inverse(1),
                         Tensor(), false);
      gx = detail::viewRaw(gx2, shX);
    }
    if (nw) {
      // Into the weight's gradient buffer when it has one (adding over micro-batches), as linear() does.
      autograd::GradSink sink = autograd::claimGradBuffer(wLeaf);
      Tensor target = sink ? sink.buffer : Tensor::empty({K, N}, autograd::gradDType(wLeaf), device);
      ops::fp8MatmulInto(target, xT, Fp8Format::E4M3, inverse(0), gq.transposed, Fp8Format::E5M2, inverse(2),
                         Tensor(), sink && sink.accumulate);
      if (!sink) gw = target;
    }
    if (nb) {
      gb = ops::sum(g2, {0}, false, autograd::gradDType(bLeaf));
      autograd::GradSink sink = autograd::claimGradBuffer(bLeaf);
      if (sink) {
        if (sink.accumulate)
          ops::addInPlace(sink.buffer, gb);
        else
          ops::copy(sink.buffer, gb);
        gb = Tensor();
      }
    }
    Grads grads{gx, gw};
    if (bias.defined()) grads.push_back(gb);
    return grads;
  });
  return out;
}

}  // namespace strata
