#include "strata/nn/MoE.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"
#include "strata/autograd/Node.h"
#include "strata/ops/Ops.h"

namespace strata::nn {

namespace {

// Row indices as an i64 tensor on `device` (the gathers' index).
Tensor indexTensor(const std::vector<int64_t>& v, Device device) {
  return Tensor::fromVector<int64_t>(v, {int64_t(v.size())}).to(device);
}

}  // namespace

MoE::MoE(const MoEConfig& config, Generator& gen) : config_(config) {
  STRATA_CHECK(config.numExperts >= 1, "MoE: {} experts", config.numExperts);
  STRATA_CHECK(config.topK == 1 || config.topK == 2, "MoE: top-{} routing (1 or 2)", config.topK);
  STRATA_CHECK(config.topK <= config.numExperts, "MoE: top-{} of {} experts", config.topK, config.numExperts);
  STRATA_CHECK(config.capacityFactor > 0 && config.evalCapacityFactor > 0,
               "MoE: capacity factors must be > 0");
  const ExpertParallel& ep = config.expertParallel;
  STRATA_CHECK(ep.size >= 1 && ep.rank >= 0 && ep.rank < ep.size, "MoE: expert-parallel rank {} of {}",
               ep.rank, ep.size);
  STRATA_USER_CHECK(config.numExperts % ep.size == 0,
                    "MoE: {} experts do not split evenly over an expert-parallel group of {} ranks",
                    config.numExperts, ep.size);
  STRATA_CHECK(ep.size == 1 || ep.allToAll, "MoE: expert parallelism without an all_to_all");
  // NOTE [Experts under tensor parallelism]: the ranks of the group must route the same tokens.
  STRATA_USER_CHECK(!config.tensorParallel.splitsSequence(),
                    "mixture-of-experts layers (model.moe_num_experts) route whole sequences: "
                    "parallel.sequence_parallel does not compose with them; set it to false (parallel.tensor "
                    "splits the experts without it)");
  router_ = registerModule(
      "router",
      std::make_shared<Linear>(
          LinearConfig{config.hiddenSize, config.numExperts, false, config.initStd, config.device}, gen));
  experts_ = registerModule("experts", std::make_shared<ModuleList>(firstExpert()));
  MlpConfig mlp{config.hiddenSize, config.ffnHiddenSize, config.bias,   0.0,
                config.initStd,    config.outInitStd,    config.device, config.activation};
  mlp.tensorParallel = config.tensorParallel;  // NOTE [Experts under tensor parallelism]
  // NOTE [Expert parallelism]: each expert draws the random numbers it draws in the one-rank model. All
  // experts draw alike, so the draws of one (measured on a first, discarded build) skip the others.
  uint64_t perExpert = 0;
  GeneratorState start = gen.state();
  if (ep.size > 1) {
    Mlp probe(mlp, gen);
    perExpert = gen.state().offset - start.offset;
    gen.setState(start);
    gen.reserve(perExpert * uint64_t(firstExpert()));
  }
  for (int64_t e = 0; e < numLocalExperts(); ++e) experts_->append(std::make_shared<Mlp>(mlp, gen));
  if (ep.size > 1) {
    gen.setState(start);
    gen.reserve(perExpert * uint64_t(config.numExperts));
  }
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
  stats_ = MoEStats{};
  stats_.capacity = capacity;
  stats_.choices = N * K;
  stats_.tokensPerExpert = count;
  // probIndex[j][n]: where token n's choice j's probability lies in the flat [N x E] probabilities.
  std::vector<std::vector<int64_t>> probIndex(static_cast<size_t>(K),
                                              std::vector<int64_t>(static_cast<size_t>(N)));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K; ++j) {
      probIndex[size_t(j)][size_t(n)] = n * E + choice[size_t(n * K + j)];
      if (position[size_t(n * K + j)] < 0) ++stats_.dropped;
    }
  // rowOf[j][n]: the row of expertRows that token n's choice j reads (the last row, zero, when dropped), from
  // the row of slot `at` of expert e in the layout below and the layout's row count.
  std::vector<std::vector<int64_t>> rowOf(static_cast<size_t>(K),
                                          std::vector<int64_t>(static_cast<size_t>(N)));
  auto layRows = [&](const std::function<int64_t(int64_t e, int64_t at)>& rowFor, int64_t rows,
                     std::vector<int64_t>& tokenOfRow) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < K; ++j) {
        int64_t e = choice[size_t(n * K + j)], at = position[size_t(n * K + j)];
        rowOf[size_t(j)][size_t(n)] = at < 0 ? rows : rowFor(e, at);
        if (at >= 0) tokenOfRow[size_t(rowFor(e, at))] = n;
      }
  };
  Tensor expertRows;
  if (config_.expertParallel.size == 1) {
    // Rows of the dispatch buffer: expert by expert, each expert's tokens in slot order; an expert without
    // tokens gets one zero row (NOTE [MoE dispatch]: every expert runs every pass).
    std::vector<int64_t> offset(size_t(E) + 1, 0);
    bool anyIdle = false;
    for (int64_t e = 0; e < E; ++e) {
      offset[size_t(e) + 1] = offset[size_t(e)] + std::max<int64_t>(count[size_t(e)], 1);
      anyIdle |= count[size_t(e)] == 0;
    }
    int64_t rows = offset[size_t(E)];
    std::vector<int64_t> gather(static_cast<size_t>(rows), N);  // N: the zero row an idle expert runs on
    layRows([&](int64_t e, int64_t at) { return offset[size_t(e)] + at; }, rows, gather);
    // Dispatch, the experts, combine.
    std::vector<Tensor> outputs;
    Tensor source = anyIdle ? cat({xf, zeros({1, C}, x.dtype(), device)}, 0) : xf;
    Tensor dispatched = embedding(source, indexTensor(gather, device));  // [rows, C]
    for (int64_t e = 0; e < E; ++e)
      outputs.push_back(expert(size_t(e)).apply(
          dispatched.narrow(0, offset[size_t(e)], offset[size_t(e) + 1] - offset[size_t(e)])));
    outputs.push_back(zeros({1, C}, x.dtype(), device));  // the row a dropped choice gathers
    expertRows = cat(outputs, 0);
  } else {
    // NOTE [Expert parallelism]: the send buffer is E x capacity rows, expert-major; a slot no token took
    // gathers the zero row appended to the tokens.
    std::vector<int64_t> sendRows(static_cast<size_t>(E * capacity), N);
    layRows([&](int64_t e, int64_t at) { return e * capacity + at; }, E * capacity, sendRows);
    Tensor send = embedding(cat({xf, zeros({1, C}, x.dtype(), device)}, 0), indexTensor(sendRows, device));
    Tensor back = exchangeThroughExperts(send, count, capacity);  // [E x capacity, C]
    expertRows = cat({back, zeros({1, C}, x.dtype(), device)}, 0);
  }
  Tensor flatProbs = probs.reshape({N * E, 1});
  std::vector<Tensor> weights;
  for (int64_t j = 0; j < K; ++j)
    weights.push_back(embedding(flatProbs, indexTensor(probIndex[size_t(j)], device)));
  if (K == 2) {
    Tensor total = weights[0] + weights[1];
    weights[0] = weights[0] / total;
    weights[1] = weights[1] / total;
  }
  Tensor y;
  for (int64_t j = 0; j < K; ++j) {
    Tensor part =
        embedding(expertRows, indexTensor(rowOf[size_t(j)], device)) * weights[size_t(j)].to(x.dtype());
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
    stats_.auxLoss = balance.detach();
    stats_.zLoss = z.detach();
    auxLoss_ = balance * config_.auxLossCoef + z * config_.zLossCoef;
  }
  return {y.reshape(x.shape())};
}

double MoEStats::auxLossValue() const {
  return auxLoss.defined() ? auxLoss.to(Device::cpu(), DType::F64).item() : 0.0;
}

double MoEStats::zLossValue() const {
  return zLoss.defined() ? zLoss.to(Device::cpu(), DType::F64).item() : 0.0;
}

namespace {

// The group's all_to_all as a differentiable function: its backward is the all_to_all of the gradient
// (zeros when none reached it, so every rank still takes part).
Tensor allToAll(const Tensor& in, const ExpertParallel& ep) {
  Tensor src = ops::contiguous(in);
  Tensor out = Tensor::empty(src.shape(), src.dtype(), src.device());
  ep.allToAll(out, src);
  auto exchange = ep.allToAll;
  Shape shape = src.shape();
  DType dtype = src.dtype();
  Device device = src.device();
  autograd::recordFunction("AllToAllBackward", {in}, {out}, [=](const autograd::Grads& g) {
    Tensor go = g[0].defined() ? ops::contiguous(g[0]) : ops::zeros(shape, dtype, device);
    Tensor gi = Tensor::empty(shape, go.dtype(), device);
    exchange(gi, go);
    return autograd::Grads{gi};
  });
  return out;
}

}  // namespace

Tensor MoE::exchangeThroughExperts(const Tensor& send, const std::vector<int64_t>& count, int64_t capacity) {
  const ExpertParallel& ep = config_.expertParallel;
  const int64_t P = ep.size, El = numLocalExperts();
  Device device = send.device();
  // How many real rows each rank sends to each of this rank's experts. The counts are on the host already and
  // are needed there: they go through the group's host path (MPI), not through the GPU's comm stream, where
  // reading them back would wait for every collective queued before them.
  std::vector<int64_t> received(static_cast<size_t>(P * El));
  {
    Tensor sendCounts = Tensor::fromVector<int64_t>(count, {int64_t(count.size())});
    Tensor recvCounts = Tensor::empty({P * El}, DType::I64, Device::cpu());
    ep.allToAll(recvCounts, sendCounts);
    received = recvCounts.toVector<int64_t>();
  }
  Tensor recv = allToAll(send, ep);  // [P x El x capacity, C]: block s is rank s's rows for these experts
  // Each local expert's rows from every rank, contiguous; then where each output row goes back. An expert
  // that received none runs on one zero row (rank 0's first slot for it, which no token took), whose output
  // goes nowhere.
  std::vector<int64_t> inRows, backRows(static_cast<size_t>(P * El * capacity), -1);
  std::vector<int64_t> rowsOf(static_cast<size_t>(El), 0);
  for (int64_t l = 0; l < El; ++l) {
    for (int64_t s = 0; s < P; ++s)
      for (int64_t j = 0; j < received[size_t(s * El + l)]; ++j) {
        int64_t at = (s * El + l) * capacity + j;
        backRows[size_t(at)] = int64_t(inRows.size());
        inRows.push_back(at);
        ++rowsOf[size_t(l)];
      }
    if (rowsOf[size_t(l)] == 0) {
      inRows.push_back(l * capacity);
      rowsOf[size_t(l)] = 1;
    }
  }
  Tensor inputs = embedding(recv, indexTensor(inRows, device));
  std::vector<Tensor> outputs;
  int64_t first = 0;
  for (int64_t l = 0; l < El; ++l) {
    outputs.push_back(expert(size_t(l)).apply(inputs.narrow(0, first, rowsOf[size_t(l)])));
    first += rowsOf[size_t(l)];
  }
  int64_t zeroRow = int64_t(inRows.size());
  for (int64_t& r : backRows)
    if (r < 0) r = zeroRow;
  outputs.push_back(zeros({1, send.size(1)}, send.dtype(), device));
  Tensor back = embedding(cat(outputs, 0), indexTensor(backRows, device));  // [P x El x capacity, C]
  return allToAll(back, ep);
}

}  // namespace strata::nn
