#include "strata/nn/MoE.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"

namespace strata::nn {

MoE::MoE(const MoEConfig& config, Generator& gen) : config_(config) {
  STRATA_CHECK(config.numExperts >= 1, "MoE: {} experts", config.numExperts);
  STRATA_CHECK(config.topK == 1 || config.topK == 2, "MoE: top-{} routing (1 or 2)", config.topK);
  STRATA_CHECK(config.topK <= config.numExperts, "MoE: top-{} of {} experts", config.topK, config.numExperts);
  STRATA_CHECK(config.capacityFactor > 0 && config.evalCapacityFactor > 0,
               "MoE: capacity factors must be > 0");
  router_ = registerModule(
      "router",
      std::make_shared<Linear>(
          LinearConfig{config.hiddenSize, config.numExperts, false, config.initStd, config.device}, gen));
  experts_ = registerModule("experts", std::make_shared<ModuleList>());
  for (int64_t e = 0; e < config.numExperts; ++e)
    experts_->append(
        std::make_shared<Mlp>(MlpConfig{config.hiddenSize, config.ffnHiddenSize, config.bias, 0.0,
                                        config.initStd, config.outInitStd, config.device, config.activation},
                              gen));
}

Tensor MoE::apply(const Tensor& x) {
  return forward({x})[0];
}

std::vector<Tensor> MoE::forwardImpl(const std::vector<Tensor>& inputs) {
  const Tensor& x = inputs.at(0);
  const int64_t C = config_.hiddenSize, E = config_.numExperts, K = config_.topK;
  STRATA_CHECK(x.size(-1) == C, "MoE: input {} does not end in the hidden size {}", toString(x.shape()), C);
  const int64_t N = x.numel() / C;
  Device device = x.device();
  Tensor xf = x.reshape({N, C});
  // NOTE [MoE dispatch]: the router in fp32 (or wider).
  DType routerType = dtypeSize(x.dtype()) < 4 ? DType::F32 : x.dtype();
  // As a call of the router (NOTE [Module calls]: its hooks see the use of its weight).
  Tensor logits = router_->call({xf}, [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{linear(in[0].to(routerType), router_->weight.to(routerType))};  // [N, E]
  })[0];
  Tensor probs = softmax(logits, -1);
  std::vector<double> p = probs.detach().to(Device::cpu(), DType::F64).toVector<double>();

  // Each token's top-k (ties to the lower index), and the slots in priority order.
  std::vector<int64_t> choice(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return p[size_t(n * E + a)] > p[size_t(n * E + b)]; });
    for (int64_t j = 0; j < K; ++j) choice[size_t(n * K + j)] = order[size_t(j)];
  }
  double factor = isTraining() ? config_.capacityFactor : config_.evalCapacityFactor;
  int64_t capacity = std::max<int64_t>(1, int64_t(std::ceil(factor * double(N * K) / double(E))));
  std::vector<int64_t> position(size_t(N * K), -1), count(size_t(E), 0);
  for (int64_t j = 0; j < K; ++j)
    for (int64_t n = 0; n < N; ++n) {
      int64_t e = choice[size_t(n * K + j)];
      if (count[size_t(e)] < capacity) position[size_t(n * K + j)] = count[size_t(e)]++;
    }
  // Rows of the dispatch buffer: expert by expert, each expert's tokens in slot order.
  std::vector<int64_t> offset(size_t(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e) offset[size_t(e) + 1] = offset[size_t(e)] + count[size_t(e)];
  int64_t rows = offset[size_t(E)];
  std::vector<int64_t> gather(static_cast<size_t>(rows));
  std::vector<std::vector<int64_t>> rowOf(static_cast<size_t>(K),
                                          std::vector<int64_t>(static_cast<size_t>(N), rows));  // rows: zero
  std::vector<std::vector<int64_t>> probIndex(static_cast<size_t>(K),
                                              std::vector<int64_t>(static_cast<size_t>(N)));
  stats_ = MoEStats{};
  stats_.capacity = capacity;
  stats_.choices = N * K;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K; ++j) {
      int64_t e = choice[size_t(n * K + j)], at = position[size_t(n * K + j)];
      probIndex[size_t(j)][size_t(n)] = n * E + e;
      if (at < 0) {
        ++stats_.dropped;
        continue;
      }
      int64_t row = offset[size_t(e)] + at;
      gather[size_t(row)] = n;
      rowOf[size_t(j)][size_t(n)] = row;
    }
  stats_.tokensPerExpert = count;
  auto indexTensor = [&](const std::vector<int64_t>& v) {
    return Tensor::fromVector<int64_t>(v, {int64_t(v.size())}).to(device);
  };

  // Dispatch, the experts, combine.
  std::vector<Tensor> outputs;
  Tensor dispatched = rows > 0 ? embedding(xf, indexTensor(gather)) : Tensor();  // [rows, C]
  for (int64_t e = 0; e < E; ++e) {
    int64_t n = count[size_t(e)];
    if (n > 0) {
      outputs.push_back(expert(size_t(e)).apply(dispatched.narrow(0, offset[size_t(e)], n)));
    } else {
      // An expert without tokens is still called (with nothing to do), in order, so its hooks run every
      // forward: the chunk layout's first-use order (and ZeRO's gathers) do not depend on the routing.
      for (auto& [name, m] : expert(size_t(e)).namedModules())
        m->call({}, [](const std::vector<Tensor>&) { return std::vector<Tensor>{}; });
    }
  }
  outputs.push_back(zeros({1, C}, x.dtype(), device));  // the row a dropped choice gathers
  Tensor expertRows = outputs.size() == 1 ? outputs[0] : cat(outputs, 0);
  Tensor flatProbs = probs.reshape({N * E, 1});
  std::vector<Tensor> weights;
  for (int64_t j = 0; j < K; ++j) weights.push_back(embedding(flatProbs, indexTensor(probIndex[size_t(j)])));
  if (K == 2) {
    Tensor total = weights[0] + weights[1];
    weights[0] = weights[0] / total;
    weights[1] = weights[1] / total;
  }
  Tensor y;
  for (int64_t j = 0; j < K; ++j) {
    Tensor part = embedding(expertRows, indexTensor(rowOf[size_t(j)])) * weights[size_t(j)].to(x.dtype());
    y = y.defined() ? y + part : part;
  }

  // The auxiliary losses (fp32 or wider, like the router).
  {
    std::vector<double> firstShare(size_t(E), 0.0);
    for (int64_t n = 0; n < N; ++n) firstShare[size_t(choice[size_t(n * K)])] += 1.0 / double(N);
    Tensor f = Tensor::fromVector<double>(firstShare, {E}).to(device, routerType);
    Tensor balance = sum(mean(probs, {0}) * f) * double(E);
    Tensor peak = max(logits.detach(), {1}, true);
    Tensor lse = log(sum(exp(logits - peak), {1})) + peak.reshape({N});
    Tensor z = mean(lse * lse);
    stats_.auxLoss = balance.detach().to(Device::cpu(), DType::F64).item();
    stats_.zLoss = z.detach().to(Device::cpu(), DType::F64).item();
    auxLoss_ = balance * config_.auxLossCoef + z * config_.zLossCoef;
  }
  return {y.reshape(x.shape())};
}

}  // namespace strata::nn
