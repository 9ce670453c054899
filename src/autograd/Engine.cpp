#include "strata/autograd/Engine.h"

#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "strata/autograd/GradMode.h"
#include "strata/autograd/Node.h"
#include "strata/core/Profiler.h"
#include "strata/ops/Ops.h"

namespace strata {

using autograd::AccumulateGrad;
using autograd::Edge;
using autograd::Grads;
using autograd::Node;

namespace autograd {
namespace {

// One running backward pass (NOTE [Backward passes] in Engine.h).
struct BackwardPass {
  uint64_t id = 0;
  std::vector<std::function<void()>> endCallbacks;
  // Leaves whose gradient-complete hooks fired in this pass or in a pass nested in it.
  std::unordered_set<const TensorImpl*> completed;
};

std::atomic<uint64_t> gNextPassId{1};
// The passes running on this thread, innermost last.
thread_local std::vector<BackwardPass*> tPasses;

// Pushes a pass for the lifetime of one backward() call; pops it however the call ends.
class PassScope {
 public:
  PassScope() {
    pass_.id = gNextPassId.fetch_add(1);
    tPasses.push_back(&pass_);
  }
  ~PassScope() { tPasses.pop_back(); }
  PassScope(const PassScope&) = delete;
  PassScope& operator=(const PassScope&) = delete;
  BackwardPass& pass() { return pass_; }

 private:
  BackwardPass pass_;
};

}  // namespace

bool inBackwardPass() {
  return !tPasses.empty();
}

uint64_t currentBackwardPass() {
  return tPasses.empty() ? 0 : tPasses.back()->id;
}

uint64_t outermostBackwardPass() {
  return tPasses.empty() ? 0 : tPasses.front()->id;
}

void queueEndOfBackwardCallback(std::function<void()> callback, bool outermost) {
  STRATA_CHECK(!tPasses.empty(),
               "queueEndOfBackwardCallback: no backward pass is running (call it from a hook or a node's "
               "backward)");
  (outermost ? tPasses.front() : tPasses.back())->endCallbacks.push_back(std::move(callback));
}

bool gradientCompleted(const Tensor& leaf) {
  return !tPasses.empty() && tPasses.back()->completed.count(&leaf.impl()) > 0;
}

void completeGradient(const Tensor& leaf) {
  if (!leaf.defined()) return;
  if (!tPasses.empty()) {
    // Marks propagate outwards, so the innermost set answers for every pass on the stack.
    if (!tPasses.back()->completed.insert(&leaf.impl()).second) return;
    for (size_t i = 0; i + 1 < tPasses.size(); ++i) tPasses[i]->completed.insert(&leaf.impl());
  }
  auto& hooks = leaf.impl().autograd.gradCompleteHooks;
  for (size_t i = 0; i < hooks.size(); ++i) {
    Tensor t = leaf;
    hooks[i](t);
  }
}

}  // namespace autograd

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retainGraph) {
  STRATA_CHECK(grads.empty() || grads.size() == roots.size(), "backward: {} gradients given for {} roots",
               grads.size(), roots.size());
  NoGradGuard noGrad;  // the backward pass itself records nothing
  autograd::PassScope scope;

  std::vector<Edge> rootEdges;
  std::vector<Tensor> rootGrads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    Edge e = autograd::gradientEdge(r);
    STRATA_CHECK(e.valid(), "backward: root {} does not require grad and has no grad_fn", i);
    Tensor g;
    if (!grads.empty() && grads[i].defined()) {
      g = grads[i];
      STRATA_CHECK(g.shape() == r.shape(), "backward: gradient {} has shape {}, root has {}", i,
                   toString(g.shape()), toString(r.shape()));
    } else {
      STRATA_CHECK(r.numel() == 1, "backward: root {} of shape {} needs an explicit gradient", i,
                   toString(r.shape()));
      g = ops::ones(r.shape(), r.dtype(), r.device());
    }
    rootEdges.push_back(e);
    rootGrads.push_back(g);
  }

  // Count, for every node reachable from the roots, how many edges lead into it, and note the leaves'
  // accumulators (nodes without next edges), which phase 2 visits.
  std::unordered_map<Node*, int> dependencies;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  std::vector<std::shared_ptr<AccumulateGrad>> leaves;
  auto discover = [&](Node* n) {
    if (!seen.insert(n).second) return;
    stack.push_back(n);
    if (n->nextEdges().empty())
      if (auto* acc = dynamic_cast<AccumulateGrad*>(n))
        leaves.push_back(std::static_pointer_cast<AccumulateGrad>(acc->shared_from_this()));
  };
  for (const auto& e : rootEdges) discover(e.node.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& next : n->nextEdges()) {
      if (!next.valid()) continue;
      dependencies[next.node.get()]++;
      discover(next.node.get());
    }
  }

  std::unordered_map<Node*, Grads> buffers;
  auto accumulate = [&](const Edge& e, Tensor g) {
    Grads& buf = buffers[e.node.get()];
    if (buf.empty()) buf.resize(e.node->numOutputs());
    Tensor& slot = buf[size_t(e.inputNr)];
    slot = slot.defined() ? ops::add(slot, g) : std::move(g);
  };

  auto later = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequenceNr() < b->sequenceNr();
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(later)> ready(
      later);
  std::unordered_set<Node*> queued;
  for (size_t i = 0; i < rootEdges.size(); ++i) accumulate(rootEdges[i], rootGrads[i]);
  for (const auto& e : rootEdges)
    if (dependencies[e.node.get()] == 0 && queued.insert(e.node.get()).second) ready.push(e.node);

  auto run = [&](const std::shared_ptr<Node>& node) {
    Grads in = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    in.resize(node->numOutputs());

    bool any = false;
    for (const auto& g : in) any = any || g.defined();
    Grads out;
    if (any) {
      node->runPreHooks();
      // Multi-output nodes get zeros for outputs that received no gradient.
      for (size_t i = 0; i < in.size() && in.size() > 1; ++i) {
        if (in[i].defined()) continue;
        const auto& meta = node->outputs()[i];
        in[i] = ops::zeros(meta.shape, meta.dtype, meta.device);
      }
      out = node->apply(std::move(in));
      if (profiler::active()) profiler::mark(node->name());
      if (!retainGraph) node->releaseSaved();
    } else if (auto* acc = dynamic_cast<AccumulateGrad*>(node.get())) {
      // Every edge into the leaf is in and none carried a gradient: its nodes wrote it into the leaf's
      // buffer (NOTE [Gradient buffers] in Node.h), or it got none. Either way it is complete.
      autograd::completeGradient(Tensor(acc->leaf()));
    }
    return out;
  };
  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    Grads out = run(node);
    out.resize(node->nextEdges().size());
    for (size_t i = 0; i < node->nextEdges().size(); ++i) {
      const Edge& e = node->nextEdges()[i];
      if (!e.valid()) continue;
      if (out[i].defined()) accumulate(e, std::move(out[i]));
      if (--dependencies[e.node.get()] != 0) continue;
      // A leaf's accumulator runs as soon as its last gradient is in, so its gradient-complete notice comes
      // while backward goes on (ZeRO reduces chunks from it); other nodes wait for their turn in order.
      if (dynamic_cast<AccumulateGrad*>(e.node.get()) != nullptr)
        run(e.node);
      else
        ready.push(e.node);
    }
  }

  // Phase 2: reachable leaves that got no gradient.
  for (const auto& acc : leaves) autograd::completeGradient(Tensor(acc->leaf()));
  // Phase 3: callbacks, including any queued by callbacks. The vector may grow while one runs.
  auto& callbacks = scope.pass().endCallbacks;
  for (size_t i = 0; i < callbacks.size(); ++i) {
    std::function<void()> callback = std::move(callbacks[i]);
    callback();
  }
}

}  // namespace strata
