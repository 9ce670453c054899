#include "strata/autograd/Engine.h"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "strata/autograd/GradMode.h"
#include "strata/autograd/Node.h"
#include "strata/core/Profiler.h"
#include "strata/ops/Ops.h"

namespace strata {

using autograd::Edge;
using autograd::Grads;
using autograd::Node;

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retainGraph) {
  STRATA_CHECK(grads.empty() || grads.size() == roots.size(), "backward: {} gradients given for {} roots",
               grads.size(), roots.size());
  NoGradGuard noGrad;  // the backward pass itself records nothing

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

  // Count, for every node reachable from the roots, how many edges lead into it.
  std::unordered_map<Node*, int> dependencies;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (const auto& e : rootEdges)
    if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& next : n->nextEdges()) {
      if (!next.valid()) continue;
      dependencies[next.node.get()]++;
      if (seen.insert(next.node.get()).second) stack.push_back(next.node.get());
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

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
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
    }
    out.resize(node->nextEdges().size());
    for (size_t i = 0; i < node->nextEdges().size(); ++i) {
      const Edge& e = node->nextEdges()[i];
      if (!e.valid()) continue;
      if (out[i].defined()) accumulate(e, std::move(out[i]));
      if (--dependencies[e.node.get()] == 0) ready.push(e.node);
    }
  }
}

}  // namespace strata
