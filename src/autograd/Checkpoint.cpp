#include "strata/autograd/Checkpoint.h"

#include "strata/autograd/Engine.h"
#include "strata/autograd/GradMode.h"
#include "strata/autograd/Node.h"
#include "strata/core/Generator.h"

namespace strata {

using autograd::Grads;

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  GeneratorState rng = defaultGenerator().state();
  std::vector<Tensor> outputs;
  {
    NoGradGuard noGrad;
    outputs = fn(inputs);
  }
  if (!gradEnabled()) return outputs;

  std::vector<Tensor> savedInputs;
  std::vector<bool> needs;
  for (const auto& t : inputs) {
    savedInputs.push_back(t.defined() ? t.detach() : t);
    needs.push_back(autograd::participates(t));
  }
  // The node is recorded even when no input needs grad: parameters used inside fn still do.
  auto node = std::make_shared<autograd::FunctionNode>("CheckpointBackward", [=](const Grads& g) {
    GeneratorState now = defaultGenerator().state();
    defaultGenerator().setState(rng);
    std::vector<Tensor> in;
    for (size_t i = 0; i < savedInputs.size(); ++i) {
      Tensor t = savedInputs[i].defined() ? savedInputs[i].detach() : savedInputs[i];
      if (needs[i]) t.setRequiresGrad(true);
      in.push_back(t);
    }
    std::vector<Tensor> recomputed;
    {
      EnableGradGuard enable;
      recomputed = fn(in);
    }
    defaultGenerator().setState(now);
    std::vector<Tensor> roots, rootGrads;
    for (size_t i = 0; i < recomputed.size() && i < g.size(); ++i) {
      if (!autograd::participates(recomputed[i]) || !g[i].defined()) continue;
      roots.push_back(recomputed[i]);
      rootGrads.push_back(g[i]);
    }
    if (!roots.empty()) backward(roots, rootGrads);
    Grads result;
    for (size_t i = 0; i < in.size(); ++i) result.push_back(needs[i] ? in[i].grad() : Tensor());
    return result;
  });
  for (const auto& t : inputs) node->nextEdges().push_back(autograd::gradientEdge(t));
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i] = outputs[i].detach();
    node->outputs().push_back(
        autograd::OutputMeta{outputs[i].shape(), outputs[i].dtype(), outputs[i].device()});
    if (!isFloating(outputs[i].dtype())) continue;
    auto& meta = outputs[i].impl().autograd;
    meta.gradFn = node;
    meta.outputNr = int(i);
    meta.requiresGrad = true;
  }
  return outputs;
}

}  // namespace strata
