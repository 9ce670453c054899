// `strata plan CONFIG`: where each byte of model state will live, how much memory a micro-batch's
// activations take, and how long a step should take, before any training and without a GPU.
//
// NOTE [Plan model]
// - State: the store's placement (NOTE [Store placement] in zero/Store.h) of the inputs ZeroStepEngine
//   computes (plan/PlacementInputs.h), on the machine a calibration describes (plan/Calibration.h; without
//   a file, the reference H200). store.gpu_budget_gb auto is what the memory tracer is to measure: the
//   device's memory less the step's non-model memory, estimated here (the engine today keeps all state on the
//   device under auto). Optimizer state past the host budget goes to the SSD, in chunk order.
// - Device peak = parameters + the device's optimizer state + stage-3 gather slots + workspace + the
//   larger of (activations of one micro-batch, fp32 gradients of every chunk), or their sum when a step
//   accumulates several micro-batches (the gradient buffers then live through the later forwards). Measured
//   at 6.7B (BENCHMARKS.md, B8 seq 512): state 86.96 GiB, +16.9 after the forward, +25 of gradients after
//   the backward.
// - Activations (compute dtype, e bytes): a transformer block keeps e * tokens * (4h + 4i + 2f) bytes (h the
//   hidden size, i = heads x head dim, f the FFN width, doubled for a gated FFN): LayerNorm inputs and
//   outputs, q, k and v, the attention output, the FFN's input, hidden and activation. At GPT's i = h, f = 4h
//   that is 16 e t h (32 t h in bf16), Korthikanti et al.'s 34 t h less the dropout masks (Strata replays
//   masks, never stores them). Fused attention keeps no S x S scores, with or without dropout; the composed
//   path (T5's relative bias, a head dim other than 64/80/128, dropout under
//   STRATA_ATTENTION_DROPOUT=composed) keeps the probabilities, twice with dropout. train.recompute selective
//   drops the FFN's activation, full keeps only each block's input and one block's activations at a time
//   (NOTE [Recompute auto] picks one). Heads: GPT and T5 compute the loss in row chunks of the logits
//   (linearCrossEntropy); BERT keeps its logits and an fp32 gradient of them.
// - Step time: compute = training FLOPs of the step's tokens / (calibrated GEMM TFLOP/s x the efficiency
//   kComputeEfficiency), plus the device's own update at memory speed; for host and SSD chunks, the fp32
//   gradients out and the 16-bit parameters in over PCIe beside the update's two lanes (the CPU, and the GPU
//   updating host pieces it fetches), and the SSD reading and writing the state back. The engine runs those
//   after the backward, so they add up ("step"); "overlapped" is the step were they to run beside the
//   backward, bound by the largest. Ranks on one machine share its CPU and SSD.
// - Fit: the device peak is held within what the memory tracer allows itself (usableDeviceBytes in
//   plan/PlacementInputs.h), and the activation terms carry a measured allowance for what they do not model
//   (kActivationAllowance).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/Zoo.h"
#include "strata/config/Config.h"
#include "strata/core/DType.h"
#include "strata/plan/Calibration.h"
#include "strata/plan/PlacementInputs.h"
#include "strata/zero/Store.h"

namespace strata::plan {

// Achieved share of the calibrated GEMM rate (799 TFLOP/s on the H200) over a whole in-GPU training step,
// measured by tools/bench_configs.py (BENCHMARKS.md, "Every shipped config"): 0.74 at 1.3B, 0.71 at 2.7B,
// 0.79 at 13B with full recomputation (its FLOPs counted with the second forward).
constexpr double kComputeEfficiency = 0.72;
// The pipelined update's GPU lane (NOTE [Pipelined update] in optim/AdamW.h): an element's fp32 master, m
// and v cross the link in and out, 24 bytes at the slower direction's rate (13B measured the two lanes
// together at 4.3 G elements/s beside a CPU of 2.3-2.6).
constexpr double kGpuLaneBytesPerElem = 24;
// The device's fused AdamW: 28 bytes per element at 3.6 TB/s (BENCHMARKS.md: 10 ms per step at 1.3B).
constexpr double kDeviceUpdateBytesPerElem = 28, kDeviceUpdateGBs = 3600;
// The same two with AdamW's m and v in `moments` (optimizer.moments_dtype): each read and written, or sent
// both ways, at its own width (bf16: 16 bytes through the GPU lane, 20 through the device's update).
inline double gpuLaneBytesPerElem(DType moments) {
  return kGpuLaneBytesPerElem - 4.0 * double(4 - dtypeSize(moments));
}
inline double deviceUpdateBytesPerElem(DType moments) {
  return kDeviceUpdateBytesPerElem - 4.0 * double(4 - dtypeSize(moments));
}
// NCCL bus bandwidth between the GPUs of one machine (measured on a 2-GPU H200 machine: all_reduce of 1 GiB):
// what a calibration without nvlink_bus_gb_s is planned with.
constexpr double kCollectiveBusGBs = 331;
// The network between machines, GB/s a GPU, for a calibration without network_gb_s: 8 x 400 Gb/s NICs for 8
// GPUs (the H200 cluster node's line rate).
constexpr double kNetworkGBs = 50;
// CUDA context, cuBLASLt workspace and allocator slack on the device (6.7B measured 1.5 GiB over the state,
// gradients and activations).
constexpr uint64_t kDeviceWorkspaceBytes = 2ull << 30;
// The backward's own buffers (gradients of activations, attention's and the GEMMs' scratch) beside what the
// forward kept, as a share of the activation estimate: the first steps of gpt2-124m, 1.3B, BERT-large and
// Switch-base-8 held 11-19% more than the activations, gradient buffers and slots (tools/bench_configs.py).
constexpr double kBackwardAllowance = 0.15;

struct ActivationTerm {
  std::string what;
  uint64_t bytes = 0;
};
struct ActivationEstimate {
  uint64_t bytes = 0;  // one micro-batch
  std::vector<ActivationTerm> terms;
  std::vector<std::string> assumptions;
};
// The activations one micro-batch of `microBatch` sequences keeps for its backward (NOTE [Plan model]),
// with train.recompute `recompute` (none, selective, full; GPT and BERT blocks: T5's are counted whole).
// `tensor` > 1 (parallel.tensor): a rank's share under tensor parallelism (NOTE [Tensor parallelism] in
// nn/TensorParallel.h): the heads' and the MLP's activations split T ways, the stream and the norms' whole,
// or split along the sequence too with `sequenceParallel`; the vocabulary-parallel head keeps its [tokens,
// V/T] logits. `pipeline` > 1 (GPT): the most loaded stage of P under the 1F1B schedule with
// `virtualStages` V and `microBatches` M a step (NOTE [Layouts]): the first stage's blocks for min(P, M)
// micro-batches in flight (x (1 + (P-1)/(P V)) interleaved), or the last's blocks and the head for one.
ActivationEstimate estimateActivations(const models::ModelSpec& spec, int64_t microBatch, DType compute,
                                       bool onGpu, const std::string& recompute = "none", int tensor = 1,
                                       bool sequenceParallel = false, int pipeline = 1, int virtualStages = 1,
                                       int64_t microBatches = 1);

struct StepTerm {
  std::string name;
  double seconds = 0;
  std::string detail;
  bool overlappable = false;  // runs beside compute once the optimizer is pipelined
};

// The kinds of model state, per tier.
enum StateKind { kParameters, kMasters, kFirstMoments, kSecondMoments, kNumStateKinds };
// The names `strata plan` prints; `optimizer`: optimizer.type (adamw, adafactor).
std::string stateKindName(StateKind kind, DType compute, const std::string& optimizer = "adamw");

struct ModelStatePlan {
  models::ModelSpec spec;
  int64_t parameters = 0;
  DType compute = DType::BF16;
  bool onGpu = true;
  int ranks = 1;
  int ranksPerNode = 1;
  // The layout: data x tensor x pipeline ranks (NOTE [Layouts]), V virtual stages a rank; the machines.
  int data = 1, tensor = 1, pipeline = 1, virtualStages = 1, nodes = 1;
  // This rank's share of its machine (NOTE [Per-node shares] in distributed/Launch.h): the host memory and
  // SSD space the automatic budgets start from, and the CPU threads.
  uint64_t hostShareBytes = 0, nvmeShareBytes = 0;
  int cpuThreadShare = 0;
  int64_t microBatch = 1, accumulation = 1, globalBatch = 1;
  Calibration machine;             // every figure the plan used
  std::string machineSource;       // where they came from (PlanOptions::calibrationSource)
  std::vector<std::string> notes;  // where each figure came from, and what differs from today's engine
  ModelStateInputs inputs;
  zero::StoreBudgets budgets;
  zero::StorePlacement placement;
  uint64_t kindBytes[kNumStateKinds][zero::kNumTiers] = {};
  std::string optimizer = "adamw";  // optimizer.type
  DType momentsDType = DType::F32;  // AdamW's m and v (optimizer.moments_dtype)
  // The optimizer's bytes per parameter on this rank's share: fp32 masters (where separate) and state.
  double optimizerBytesPerParameter = 0;
  ActivationEstimate activations;
  uint64_t gradientPeakBytes = 0, workspaceBytes = 0, deviceCapacityBytes = 0, devicePeakBytes = 0;
  uint64_t transientBytes = 0;  // the backward's buffers (kBackwardAllowance)
  // NOTE [Gradient homes] in zero/GradientReducer.h: the device bytes of the gradients that go to host
  // memory as they complete (store.gradient_home), and their elements; 0 where they all stay.
  uint64_t gradientHomeBytes = 0;
  int64_t gradientHomeElems = 0;
  uint64_t usableBytes = 0;  // what a step may take of the device (usableDeviceBytes), or the CPU's share
  std::vector<StepTerm> terms;
  double serialSeconds = 0, overlappedSeconds = 0;
  std::string bound;        // the largest term once overlapped
  double flopsPerStep = 0;  // per rank: the model's FLOPs of the step's tokens over the ranks
  // Model FLOPs utilization: flopsPerStep / the step / the device's peak (0 without a step or a peak).
  double mfu() const;
  bool fits = true;
  std::string refusal;  // why not, when !fits
  // train.recompute as planned: the config's, or what auto chose (NOTE [Recompute auto]) and why.
  std::string recompute = "none";
  bool recomputeAuto = false;
  std::string recomputeWhy;
};

struct PlanOptions {
  int ranks = 1;
  // Ranks on each machine, which split its host memory, SSD space and CPU cores (NOTE [Per-node shares] in
  // distributed/Launch.h); 0: every rank on one machine.
  int ranksPerNode = 0;
  // The machine; nullopt: measuredH200(). Fields it lacks come from measuredH200() too.
  std::optional<Calibration> calibration;
  std::string calibrationSource;  // named in the notes
};

// The plan of `config` (never throws for a model that does not fit: fits is false and refusal says why).
//
// NOTE [Recompute auto]
// train.recompute auto (the default) plans none, selective and full and takes, of those that fit, the one
// with the fastest predicted step (recomputation costs time: full runs the blocks' forward twice, a third
// more FLOPs; selective rereads the MLP's activations), or on the CPU, where no step time is predicted, the
// least recomputation that fits. Less activation memory can buy a faster step: the device's room left over
// holds more optimizer state, which then needs no host update. `strata plan` prints the choice and the
// figures it weighed; the trainer runs the same plan before it allocates anything and applies the choice.
ModelStatePlan planModelState(const config::Config& config, const PlanOptions& options);

// For a config that does not fit: the settings that would make it fit, each checked by a plan (a smaller
// micro-batch with the same global batch, the SSD tier, more ranks at ZeRO stage 3, automatic budgets), and
// the largest model of its family that fits. One line each.
std::vector<std::string> fitAdvice(const config::Config& config, const PlanOptions& options);

// "`what` does not fit: <the plan's refusal>." with fitAdvice's lines below it: what `strata plan` and the
// trainer print when they refuse a config.
std::string refusalMessage(const std::string& what, const config::Config& config, const ModelStatePlan& plan,
                           const PlanOptions& options);

// The config's model scaled like the GPT-3 family (the hidden size in steps of the head width, the layers in
// proportion to it, heads and FFN width likewise; every other key kept): the largest that fits, or nullopt.
std::optional<config::Config> largestFittingModel(const config::Config& config, const PlanOptions& options);

// The plan as the text `strata plan` prints.
std::string formatPlan(const ModelStatePlan& plan);

// NOTE [Layouts]
// `strata plan --layouts` weighs the ways `options.ranks` ranks, `ranksPerNode` G to a machine, can split a
// GPT: data D x tensor T x pipeline P (x V virtual stages). T divides G and the ranks, and the model's heads,
// MLP width and vocabulary (tensor-parallel groups stay inside a machine, on NVLink); P divides the ranks / T
// and the layers; V > 1 divides the layers of a stage, with the micro-batches a step M = global batch /
// (micro-batch x D) a multiple of P (Megatron's interleaved schedule); D is the rest. Ranks are ordered
// tensor fastest, then data, then pipeline (Megatron's order). Each layout is planned in full (placement,
// recomputation, step time), a rank planned as the most loaded pipeline stage:
// - State: ZeRO (zero_optimization.stage) over the D ranks of the parameters of a stage's blocks, split as
//   the trainer splits them (balanced by FLOPs: NOTE [Pipeline stages] in nn/Pipeline.h), with the
//   embeddings on the first stage and the final norm and the tied head's copy of the token table on the
//   last, whichever stage holds more.
// - Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
//   after Narayanan et al. 2021's 1F1B schedule): the first stage keeps min(P, M) micro-batches of its
//   blocks in flight, L blocks' worth at M >= P whatever P is; the interleaved schedule keeps (1 + (P-1) /
//   (P V)) times that. The last stage keeps one micro-batch and the head's; the larger is planned.
// - Compute: the slowest stage's FLOPs (its blocks and, on the last, the LM head), and the bubble of
//   the 1F1B schedule, (P-1) / (V M) of it (Narayanan et al. 2021, "Efficient Large-Scale Language Model
//   Training on GPU Clusters Using Megatron-LM", SC'21).
// - Links: a machine's GPUs talk at its NCCL bus bandwidth (Calibration::nvlinkBusGBs), machines at the
//   network's rate a GPU (Calibration::networkGBs). Tensor-parallel collectives stay on NVLink. The data-
//   parallel collectives of the stage's gradients (and parameters at stages 1-3) run hierarchically: a ring
//   inside each machine over its members of the group at NVLink speed, then across machines on 1/(members)
//   of the buffer each at the network's. Pipeline stages send each micro-batch's activations forward and
//   their gradients back, V times a micro-batch interleaved, 1/T of the [b, s, h] tensor a rank (Megatron's
//   scatter/gather), inside a machine when the whole pipeline fits one, else at the network's rate; counted
//   on the step's critical path.
// The layouts that fit come first, fastest predicted step first, then those that do not fit, the smallest
// device peak (the nearest to fitting) first, then those the model or the trainer cannot split that way
// (pipeline stages: GPT without experts, ZeRO stages 0 to 2, at least P micro-batches a step).
struct LayoutPlan {
  int tensor = 1, data = 1, pipeline = 1, virtualStages = 1;
  std::string invalid;  // why the model cannot split this way (then `plan` is empty)
  ModelStatePlan plan;
  // The longest term of the predicted step: what bounds the layout.
  const StepTerm* longest() const;
  std::string name() const;  // "data 4 x tensor 2", with " x pipeline P (x V virtual)" when P > 1
};
std::vector<LayoutPlan> planLayouts(const config::Config& config, const PlanOptions& options);
// The table `strata plan --layouts` prints: one row a layout, the best three marked. Long tables show the
// first `maxFitting` layouts that fit and `maxOther` of the rest, and count the others.
std::string formatLayouts(const std::vector<LayoutPlan>& layouts, size_t maxFitting = 12,
                          size_t maxOther = 6);

// NOTE [Parallel auto]
// `parallel: auto` in a config (a scalar in place of the section) lets the plan choose the layout: of
// planLayouts' layouts that fit, the first, i.e. the fastest predicted step. The trainer applies it
// (parallel.tensor, parallel.pipeline, parallel.virtual_stages) before it allocates anything and logs why;
// `strata plan` of such a config prints the choice and the table it came from.
struct LayoutChoice {
  std::vector<LayoutPlan> layouts;  // planLayouts'
  int chosen = -1;                  // into layouts; -1: none fits
  std::string why;
};
LayoutChoice chooseLayout(const config::Config& config, const PlanOptions& options);

}  // namespace strata::plan
