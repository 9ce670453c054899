#include "strata/data/BatchTrace.h"

#include <map>

#include "strata/autograd/Engine.h"
#include "strata/autograd/GradMode.h"
#include "strata/ops/Ops.h"

namespace strata::data {

std::vector<std::pair<std::string, Tensor>> BatchTrace::all() const {
  std::vector<std::pair<std::string, Tensor>> out = inputs;
  out.insert(out.end(), outputs.begin(), outputs.end());
  out.emplace_back("loss", loss);
  out.insert(out.end(), gradients.begin(), gradients.end());
  return out;
}

BatchTrace traceBatch(Objective& objective, const TokenBatch& batch, DType compute,
                      const models::HfLayout& layout) {
  nn::Module& model = objective.model();
  for (auto& [name, p] : model.namedParameters())
    STRATA_CHECK(!p.grad().defined(), "traceBatch: parameter '{}' already holds a gradient", name);
  BatchTrace trace;
  for (auto& [name, t] : objective.modelInputs(batch)) trace.inputs.emplace_back(name, t.to(Device::cpu()));
  {
    NoGradGuard noGrad;
    for (auto& [name, t] : objective.logits(batch, compute))
      trace.outputs.emplace_back(name, t.to(Device::cpu(), DType::F32));
  }
  // The gradients come from the loss as training computes it (the objective's own path: BERT's MLM head on
  // every position, T5's fused head and cross-entropy), not from the logits above.
  Tensor loss = objective.loss(batch, compute);
  backward(loss);
  trace.loss = loss.detach().to(Device::cpu(), DType::F32);
  std::map<std::string, Tensor> grads;
  for (auto& [name, p] : model.namedParameters()) {
    STRATA_CHECK(p.grad().defined(), "traceBatch: parameter '{}' got no gradient", name);
    grads.emplace(name, p.grad());
  }
  for (auto& [name, g] : models::exportHf(grads, layout)) trace.gradients.emplace_back("grad." + name, g);
  return trace;
}

}  // namespace strata::data
