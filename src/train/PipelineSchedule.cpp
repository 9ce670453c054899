#include "strata/train/PipelineSchedule.h"

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#include "strata/core/Error.h"
#include "strata/core/Profiler.h"
#include "strata/core/Stream.h"
#include "strata/distributed/Communicator.h"

namespace strata::train {

namespace {

constexpr int kActivationTag = 0;
constexpr int kGradientTag = 1;

// One moment's transfers with the neighbouring stages (NOTE [Pipeline schedules]): the output forward to the
// next stage and the input's gradient back to the previous one, and what comes the other way.
class Neighbours {
 public:
  Neighbours(dist::Communicator& comm, const nn::PipelineParallel& pp, const PipelineWork& work)
      : comm_(comm), prev_((pp.rank + pp.size - 1) % pp.size), next_((pp.rank + 1) % pp.size), work_(work) {}

  // {input from the previous stage, output gradient from the next}, each undefined unless asked for.
  std::pair<Tensor, Tensor> exchange(const Tensor& toNext, const Tensor& toPrev, bool fromPrev,
                                     bool fromNext) const {
    std::vector<dist::PeerTransfer> sends, receives;
    Tensor input, outputGrad;
    if (toNext.defined()) sends.push_back({toNext.detach().contiguous(), next_, kActivationTag});
    if (toPrev.defined()) sends.push_back({toPrev.detach().contiguous(), prev_, kGradientTag});
    if (fromPrev) {
      input = Tensor::empty(work_.activationShape, work_.dtype, work_.device);
      receives.push_back({input, prev_, kActivationTag});
    }
    if (fromNext) {
      outputGrad = Tensor::empty(work_.activationShape, work_.dtype, work_.device);
      receives.push_back({outputGrad, next_, kGradientTag});
    }
    if (sends.empty() && receives.empty()) return {};
    // NOTE [Collective ordering and completion] in distributed/Communicator.h.
    const Device device = work_.device;
    const Stream& lane = dist::collectiveStream(device, /*gather=*/false);
    streamWaits(lane, currentStream(device), device);
    comm_.sendReceive(sends, receives);
    streamWaits(currentStream(device), lane, device);
    profiler::mark("pipeline send/receive");
    // A chunk's input is a leaf whose gradient goes back to the previous stage.
    if (input.defined()) input.setRequiresGrad(true);
    return {input, outputGrad};
  }

 private:
  dist::Communicator& comm_;
  int prev_, next_;
  const PipelineWork& work_;
};

}  // namespace

PipelineSchedule::PipelineSchedule(dist::Communicator& comm, const nn::PipelineParallel& pipeline)
    : comm_(comm), pipeline_(pipeline) {
  STRATA_CHECK(pipeline.active() && comm.size() == pipeline.size && comm.rank() == pipeline.rank,
               "PipelineSchedule: stage {} of {} over a group of {} ranks (rank {})", pipeline.rank,
               pipeline.size, comm.size(), comm.rank());
}

void PipelineSchedule::run(int64_t microBatches, const PipelineWork& work) const {
  const int64_t P = pipeline_.size;
  STRATA_CHECK(microBatches >= P, "pipeline: {} micro-batches for {} stages", microBatches, P);
  if (pipeline_.virtualStages == 1) return oneForwardOneBackward(microBatches, work);
  STRATA_CHECK(microBatches % P == 0, "interleaved pipeline: {} micro-batches for {} stages", microBatches,
               P);
  interleaved(microBatches, work);
}

void PipelineSchedule::oneForwardOneBackward(int64_t M, const PipelineWork& work) const {
  const int64_t P = pipeline_.size, p = pipeline_.rank;
  const bool first = p == 0, last = p == P - 1;
  Neighbours link(comm_, pipeline_, work);
  const int64_t warmup = std::min(P - p - 1, M), remaining = M - warmup;
  std::deque<Tensor> inputs, outputs;
  int64_t forwards = 0;
  auto forward = [&](const Tensor& input) {
    Tensor output = work.forward(0, forwards++, input);
    inputs.push_back(input);
    outputs.push_back(output);
    return last ? Tensor() : output;  // the last stage sends nothing on
  };
  auto backward = [&](const Tensor& outputGrad) {
    Tensor input = inputs.front(), output = outputs.front();
    inputs.pop_front();
    outputs.pop_front();
    Tensor inputGrad = work.backward(0, input, output, outputGrad);
    return first ? Tensor() : inputGrad;
  };
  for (int64_t i = 0; i < warmup; ++i) {
    Tensor input = link.exchange({}, {}, !first, false).first;
    link.exchange(forward(input), {}, false, false);
  }
  Tensor input;
  if (remaining > 0) input = link.exchange({}, {}, !first, false).first;
  for (int64_t i = 0; i < remaining; ++i) {
    Tensor outputGrad = link.exchange(forward(input), {}, false, !last).second;
    Tensor inputGrad = backward(outputGrad);
    input = link.exchange({}, inputGrad, !first && i + 1 < remaining, false).first;
  }
  for (int64_t i = 0; i < warmup; ++i) {
    Tensor outputGrad = link.exchange({}, {}, false, !last).second;
    link.exchange({}, backward(outputGrad), false, false);
  }
}

// Megatron's forward_backward_pipelining_with_interleaving, transfer for transfer.
void PipelineSchedule::interleaved(int64_t M, const PipelineWork& work) const {
  const int64_t P = pipeline_.size, p = pipeline_.rank, V = pipeline_.virtualStages;
  const int64_t total = M * V;
  Neighbours link(comm_, pipeline_, work);
  const bool allWarmup = M == P;
  const int64_t warmup = allWarmup ? total : std::min((P - p - 1) * 2 + (V - 1) * P, total);
  const int64_t remaining = total - warmup;
  // The local chunk of forward (or backward) unit k: groups of P micro-batches go through the chunks in
  // order forward, in reverse backward. k may be negative (Python's modulo).
  auto chunkOf = [&](int64_t k, bool forward) {
    int64_t inGroup = ((k % (P * V)) + P * V) % (P * V);
    int64_t chunk = inGroup / P;
    return forward ? chunk : V - 1 - chunk;
  };
  auto isFirstChunk = [&](int64_t c) { return p == 0 && c == 0; };
  auto isLastChunk = [&](int64_t c) { return p == P - 1 && c == V - 1; };
  const size_t chunks = static_cast<size_t>(V);
  std::vector<std::deque<Tensor>> inputs(chunks), outputs(chunks), outputGrads(chunks);
  std::vector<int64_t> forwards(size_t(V), 0);
  auto forward = [&](int64_t k) {
    int64_t c = chunkOf(k, true);
    auto& in = inputs[size_t(c)];
    if (isFirstChunk(c) && in.size() == outputs[size_t(c)].size()) in.push_back(Tensor());
    Tensor output = work.forward(c, forwards[size_t(c)]++, in.back());
    outputs[size_t(c)].push_back(output);
    return isLastChunk(c) ? Tensor() : output;
  };
  auto backward = [&](int64_t k) {
    int64_t c = chunkOf(k, false);
    if (isLastChunk(c) && outputGrads[size_t(c)].empty()) outputGrads[size_t(c)].push_back(Tensor());
    Tensor input = inputs[size_t(c)].front(), output = outputs[size_t(c)].front();
    Tensor outputGrad = outputGrads[size_t(c)].front();
    inputs[size_t(c)].pop_front();
    outputs[size_t(c)].pop_front();
    outputGrads[size_t(c)].pop_front();
    Tensor inputGrad = work.backward(c, input, output, outputGrad);
    return isFirstChunk(c) ? Tensor() : inputGrad;
  };

  inputs[0].push_back(p == 0 ? Tensor() : link.exchange({}, {}, true, false).first);
  for (int64_t k = 0; k < warmup; ++k) {
    Tensor output = forward(k);
    int64_t nextChunk = chunkOf(k + 1, true);
    bool fromPrev = !(p == 0 && nextChunk == 0) && k != total - 1;
    Tensor input;
    if (k == warmup - 1 && !allWarmup) {
      auto [in, outputGrad] = link.exchange(output, {}, fromPrev, p != P - 1);
      input = in;
      outputGrads[size_t(V) - 1].push_back(outputGrad);
    } else {
      input = link.exchange(output, {}, fromPrev, false).first;
    }
    inputs[size_t(nextChunk)].push_back(input);
  }
  for (int64_t k = 0; k < remaining; ++k) {
    int64_t forwardK = k + warmup, backwardK = k;
    Tensor output = forward(forwardK);
    Tensor inputGrad = backward(backwardK);
    // The first stage is P - 1 units ahead of the last, and the last P - 1 behind in backward.
    bool fromPrev = true, fromNext = true;
    int64_t nextForwardChunk, nextBackwardChunk;
    if (p == 0) {
      nextForwardChunk = chunkOf(forwardK - (P - 1), true);
      if (nextForwardChunk == V - 1) fromPrev = false;
      nextForwardChunk += 1;
    } else {
      nextForwardChunk = chunkOf(forwardK + 1, true);
    }
    if (p == P - 1) {
      nextBackwardChunk = chunkOf(backwardK - (P - 1), false);
      if (nextBackwardChunk == 0) fromNext = false;
      nextBackwardChunk -= 1;
    } else {
      nextBackwardChunk = chunkOf(backwardK + 1, false);
    }
    if (k == remaining - 1) fromPrev = false;  // the cool-down receives its own
    auto [input, outputGrad] = link.exchange(output, inputGrad, fromPrev, fromNext);
    if (fromPrev) inputs[size_t(nextForwardChunk)].push_back(input);
    if (fromNext) outputGrads[size_t(nextBackwardChunk)].push_back(outputGrad);
  }
  if (allWarmup) outputGrads[size_t(V) - 1].push_back(link.exchange({}, {}, false, p != P - 1).second);
  for (int64_t k = remaining; k < total; ++k) {
    Tensor inputGrad = backward(k);
    int64_t nextChunk = chunkOf(k + 1, false);
    bool fromNext = !(p == P - 1 && nextChunk == V - 1) && k != total - 1;
    Tensor outputGrad = link.exchange({}, inputGrad, false, fromNext).second;
    outputGrads[size_t(nextChunk)].push_back(outputGrad);
  }
}

Tensor PipelineSchedule::forwardOnly(const PipelineWork& work) const {
  const int64_t P = pipeline_.size, p = pipeline_.rank, chunks = pipeline_.chunks();
  Neighbours link(comm_, pipeline_, work);
  Tensor result;
  for (int64_t k = 0; k < chunks; ++k) {
    if (k % P != p) continue;
    Tensor input = k > 0 ? link.exchange({}, {}, true, false).first : Tensor();
    Tensor output = work.forward(k / P, 0, input);
    if (k + 1 < chunks) {
      link.exchange(output, {}, false, false);
    } else {
      result = output;
    }
  }
  return result;
}

}  // namespace strata::train
