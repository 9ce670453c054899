// The pipeline schedules: which model chunk runs which micro-batch's forward or backward when, on the ranks
// of a pipeline-parallel group, and the sends and receives between them (NOTE [Pipeline stages] in
// nn/Pipeline.h has the stages themselves).
//
// NOTE [Pipeline schedules]
// One step runs M micro-batches through the P stages. Without virtual stages the schedule is 1F1B
// (PipeDream-flush, Megatron's forward_backward_pipelining_without_interleaving): stage p runs P - p - 1
// warm-up forwards, then alternates one forward and one backward, then runs the remaining backwards, so it
// keeps at most P - p micro-batches' activations. With V virtual stages each rank runs V model chunks and the
// schedule is Megatron's interleaved one (forward_backward_pipelining_with_interleaving): forwards go through
// the rank's chunks in groups of P micro-batches, backwards the other way, with (P - p - 1) x 2 + (V - 1) x P
// warm-up forwards; its bubble is 1/V of 1F1B's, and it needs M to be a multiple of P. Every transfer of one
// moment goes in one Communicator::sendReceive (NOTE [Point-to-point] in distributed/Communicator.h): a
// stage that sends its output forward and waits for a gradient from the next stage posts both together, as
// Megatron's send_forward_recv_backward does, so the neighbours never wait for each other. Activations travel
// with tag 0, gradients with tag 1 (with P = 2 both neighbours are one rank). The sends and receives run on
// the comm stream, ordered with the compute stream (NOTE [Collective ordering and completion]).
// The schedule knows nothing of the model: the engine's forward returns a chunk's output (the last chunk's:
// its scaled loss) and its backward runs from the output's gradient (the loss: none) and returns the input's.
// Every backward pass of the step is an ordinary one; the engine announces the gradients complete after the
// schedule, once the tied embedding's gradients are summed (NOTE [Chunk gradients complete] in
// zero/ChunkManager.h), so under a pipeline the data-parallel reduction does not overlap the last backward.
#pragma once

#include <cstdint>
#include <functional>

#include "strata/core/Tensor.h"
#include "strata/nn/Pipeline.h"

namespace strata::dist {
class Communicator;
}

namespace strata::train {

struct PipelineWork {
  // Model chunk `local` (this rank's) on micro-batch `micro` from `input` (undefined for the first chunk);
  // returns its output, or on the last chunk its loss as the step weighs it.
  std::function<Tensor(int64_t local, int64_t micro, const Tensor& input)> forward;
  // Backward of that forward from `outputGrad` (undefined for the last chunk: from the loss); returns the
  // gradient of `input` (undefined for the first chunk).
  std::function<Tensor(int64_t local, const Tensor& input, const Tensor& output, const Tensor& outputGrad)>
      backward;
  Shape activationShape;  // what travels between chunks
  DType dtype = DType::F32;
  Device device;
};

class PipelineSchedule {
 public:
  // Over `comm`, the pipeline-parallel group (group rank = stage).
  PipelineSchedule(dist::Communicator& comm, const nn::PipelineParallel& pipeline);
  // One step's forwards and backwards of `microBatches` micro-batches (at least P; a multiple of P with
  // virtual stages).
  void run(int64_t microBatches, const PipelineWork& work) const;
  // Forward only of one micro-batch through every chunk in order (evaluation): returns what the last chunk
  // returned on the rank that holds it, undefined elsewhere.
  Tensor forwardOnly(const PipelineWork& work) const;

 private:
  void oneForwardOneBackward(int64_t microBatches, const PipelineWork& work) const;
  void interleaved(int64_t microBatches, const PipelineWork& work) const;

  dist::Communicator& comm_;
  nn::PipelineParallel pipeline_;
};

}  // namespace strata::train
