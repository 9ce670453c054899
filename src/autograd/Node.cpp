#include "strata/autograd/Node.h"

#include "strata/autograd/Engine.h"
#include "strata/autograd/GradMode.h"
#include "strata/core/Profiler.h"
#include "strata/ops/Ops.h"

namespace strata::autograd {
namespace {
std::atomic<uint64_t> gNextSequenceNr{0};

// Whether a and b (same shape and dtype) share bytes other than element for element, so an in-place
// a += b could read an element of b it has already overwritten.
bool overlapsOtherwise(const Tensor& a, const Tensor& b) {
  if (a.storage() != b.storage() || a.numel() == 0) return false;
  if (a.offset() == b.offset() && a.strides() == b.strides()) return false;
  auto last = [](const Tensor& t) {
    int64_t end = t.offset();
    for (int64_t d = 0; d < t.dim(); ++d) end += (t.size(d) - 1) * t.stride(d);
    return end;
  };
  return a.offset() <= last(b) && b.offset() <= last(a);
}
}  // namespace

Node::Node(std::string name) : name_(std::move(name)), sequenceNr_(gNextSequenceNr.fetch_add(1)) {}

uint64_t Node::peekNextSequenceNr() {
  return gNextSequenceNr.load();
}

Grads FunctionNode::apply(Grads&& gradOutputs) {
  STRATA_CHECK(
      fn_ != nullptr,
      "{}: trying to run backward through the graph a second time, but its saved tensors were freed; "
      "pass retainGraph=true to the first backward",
      name());
  return fn_(gradOutputs);
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
    : Node("AccumulateGrad"), leaf_(std::move(leaf)) {}

Grads AccumulateGrad::apply(Grads&& gradOutputs) {
  Tensor leaf(leaf_);
  Tensor g = std::move(gradOutputs[0]);
  if (!g.defined()) return {};
  for (auto& hook : leaf_->autograd.gradHooks) {
    Tensor replaced = hook(g);
    if (replaced.defined()) g = replaced;
  }
  STRATA_CHECK(g.shape() == leaf.shape(), "gradient of shape {} for leaf '{}' of shape {}",
               toString(g.shape()), leaf.name(), toString(leaf.shape()));
  DType gd = gradDType(leaf);
  if (g.dtype() != gd || g.device() != leaf.device()) g = ops::to(g, leaf.device(), gd);
  if (leaf_->autograd.gradHome) {
    // NOTE [Gradient buffers]
    GradSink sink = claimGradBuffer(leaf, /*evenWithHooks=*/true);
    if (!sink.accumulate)
      ops::copy(sink.buffer, g);
    else if (!overlapsOtherwise(sink.buffer, g))
      ops::addInPlace(sink.buffer, g);
    else
      ops::copy(sink.buffer, ops::add(sink.buffer, g));
    completeGradient(leaf);
    return {};
  }
  Tensor existing = leaf.grad();
  // NOTE [Gradient accumulation in place]
  if (existing.defined()) {
    bool inPlace = existing.dtype() == g.dtype() && existing.device() == g.device() &&
                   existing.isContiguous() && !overlapsOtherwise(existing, g);
    if (inPlace) {
      ops::addInPlace(existing, g);
    } else {
      leaf.setGrad(ops::add(existing, g));
    }
  } else {
    // Keep the incoming buffer when nothing else holds it; otherwise copy, so in-place updates of one leaf's
    // gradient (accumulation, clipping, unscaling) never reach another tensor.
    bool sole = g.implPtr().use_count() == 1 && g.storage().use_count() == 1 && g.isContiguous();
    if (sole) {
      leaf.setGrad(g.detach());
    } else {
      Tensor own = ops::emptyLike(g);
      ops::copy(own, g);
      leaf.setGrad(own);
    }
  }
  completeGradient(leaf);
  return {};
}

void setGradHome(const Tensor& leaf, DType dtype, std::function<Tensor()> make) {
  STRATA_CHECK(leaf.isLeaf(), "setGradHome: '{}' is not a leaf", leaf.name());
  STRATA_CHECK(isFloating(dtype), "setGradHome: gradients of '{}' cannot be {}", leaf.name(), dtype);
  auto& meta = leaf.impl().autograd;
  meta.grad.reset();
  meta.gradHome = make ? std::make_shared<GradHome>(GradHome{dtype, std::move(make)}) : nullptr;
}

void setGradBuffer(const Tensor& leaf, const Tensor& buffer) {
  if (!buffer.defined()) return setGradHome(leaf, leaf.dtype(), nullptr);
  setGradHome(leaf, buffer.dtype(), [buffer] { return buffer; });
}

DType gradDType(const Tensor& t) {
  const auto& home = t.impl().autograd.gradHome;
  return home ? home->dtype : t.dtype();
}

GradSink claimGradBuffer(const Tensor& t, bool evenWithHooks) {
  if (!t.defined() || !t.isLeaf() || !t.requiresGrad()) return {};
  auto& meta = t.impl().autograd;
  if (!meta.gradHome || (!evenWithHooks && !meta.gradHooks.empty())) return {};
  if (meta.grad) return GradSink{*meta.grad, true};
  Tensor buffer = meta.gradHome->make();
  STRATA_CHECK(
      buffer.shape() == t.shape() && buffer.dtype() == meta.gradHome->dtype && buffer.isContiguous() &&
          buffer.device() == t.device(),
      "the gradient home of '{}' gave {} {} on {}; the leaf is {} on {} with {} gradients (same shape "
      "and device, contiguous)",
      t.name(), toString(buffer.shape()), buffer.dtype(), toString(buffer.device()), toString(t.shape()),
      toString(t.device()), meta.gradHome->dtype);
  meta.grad = std::make_shared<Tensor>(buffer);
  return GradSink{buffer, false};
}

bool needsGrad(const std::vector<Tensor>& inputs) {
  if (!gradEnabled()) return false;
  for (const auto& t : inputs)
    if (participates(t)) return true;
  return false;
}

Edge gradientEdge(const Tensor& t) {
  if (!t.defined()) return {};
  auto& meta = t.impl().autograd;
  if (meta.gradFn) return Edge{meta.gradFn, meta.outputNr};
  if (!meta.requiresGrad) return {};
  std::shared_ptr<Node> acc = meta.gradAccumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.implPtr());
    meta.gradAccumulator = acc;
  }
  return Edge{acc, 0};
}

std::shared_ptr<Node> recordFunction(const char* name, const std::vector<Tensor>& inputs,
                                     const std::vector<Tensor>& outputs, BackwardFn fn) {
  if (profiler::active()) {
    // The forward of this function ran since the previous mark. Strip "Backward" from the node's name.
    std::string_view n(name);
    if (n.size() > 8 && n.substr(n.size() - 8) == "Backward") n.remove_suffix(8);
    profiler::mark(std::string(n) + " fwd");
  }
  if (!needsGrad(inputs)) return nullptr;
  auto node = std::make_shared<FunctionNode>(name, std::move(fn));
  for (const auto& t : inputs) node->nextEdges().push_back(participates(t) ? gradientEdge(t) : Edge{});
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    node->outputs().push_back(OutputMeta{out.shape(), out.dtype(), out.device()});
    auto& meta = out.impl().autograd;
    meta.gradFn = node;
    meta.outputNr = int(i);
    meta.requiresGrad = true;
  }
  return node;
}

std::vector<Tensor> withBackwardHook(const std::vector<Tensor>& tensors, std::function<void()> hook) {
  std::vector<Tensor> inputs, outputs(tensors);
  std::vector<size_t> where;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!participates(tensors[i])) continue;
    inputs.push_back(tensors[i]);
    outputs[i] = tensors[i].detach();
    where.push_back(i);
  }
  if (inputs.empty() || !gradEnabled()) return tensors;
  std::vector<Tensor> wrapped;
  for (size_t i : where) wrapped.push_back(outputs[i]);
  auto node = recordFunction("BackwardHook", inputs, wrapped, [](const Grads& g) { return g; });
  node->addPreHook(std::move(hook));
  return outputs;
}

}  // namespace strata::autograd
