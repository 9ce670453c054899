// `strata plan CONFIG`: where each byte of model state will live, how much memory a micro-batch's
// activations take, and how long a step should take, before any training and without a GPU.
//
// NOTE [Plan model]
// - State: the store's placement (NOTE [Store placement] in zero/Store.h) of the inputs ZeroStepEngine
//   computes (plan/PlacementInputs.h), on the machine a calibration describes (plan/Calibration.h; without
//   a file, DESIGN.md's H200). store.gpu_budget_gb auto is what the memory tracer is to measure: the device's
//   memory less the step's non-model memory, estimated here (the engine today keeps all state on the device
//   under auto). Optimizer state past the host budget goes to the SSD, in chunk order.
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
//   STRATA_ATTENTION_DROPOUT=composed) keeps the probabilities, twice with dropout. No activation
//   checkpointing: no config key turns it on for the zoo. Heads: GPT and T5 compute the loss in row chunks of
//   the logits (linearCrossEntropy); BERT keeps its logits and an fp32 gradient of them.
// - Step time: compute = training FLOPs of the step's tokens / (calibrated GEMM TFLOP/s x the efficiency
//   kComputeEfficiency), plus the device's own update at memory speed; for host and SSD chunks, the fp32
//   gradients out and the 16-bit parameters in over PCIe, the CPU AdamW, and the SSD reading and writing
//   the state back. Today's engine runs those after backward, so they add up; the pipelined optimizer
//   overlaps them, and the step is then bound by the largest. Ranks on one machine share its CPU and SSD.
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

// Achieved share of the calibrated GEMM rate over a whole training step: Strata's GPT-6.7B step measured
// 490-510 TFLOP/s against 734-799 for bf16 GEMMs (BENCHMARKS.md).
constexpr double kComputeEfficiency = 0.65;
// The device's fused AdamW: 28 bytes per element at 3.6 TB/s (BENCHMARKS.md: 10 ms per step at 1.3B).
constexpr double kDeviceUpdateBytesPerElem = 28, kDeviceUpdateGBs = 3600;
// NCCL bus bandwidth between the GPUs of one machine (DESIGN.md, 2-GPU machine: all_reduce of 1 GiB).
constexpr double kCollectiveBusGBs = 331;
// CUDA context, cuBLASLt workspace and allocator slack on the device (6.7B measured 1.5 GiB over the state,
// gradients and activations).
constexpr uint64_t kDeviceWorkspaceBytes = 2ull << 30;

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
ActivationEstimate estimateActivations(const models::ModelSpec& spec, int64_t microBatch, DType compute,
                                       bool onGpu, const std::string& recompute = "none");

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
  // The optimizer's bytes per parameter on this rank's share: fp32 masters (where separate) and state.
  double optimizerBytesPerParameter = 0;
  ActivationEstimate activations;
  uint64_t gradientPeakBytes = 0, workspaceBytes = 0, deviceCapacityBytes = 0, devicePeakBytes = 0;
  std::vector<StepTerm> terms;
  double serialSeconds = 0, overlappedSeconds = 0;
  std::string bound;        // the largest term once overlapped
  double flopsPerStep = 0;  // per rank
  bool fits = true;
  std::string refusal;  // why not, when !fits
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
ModelStatePlan planModelState(const config::Config& config, const PlanOptions& options);

// The config's model scaled like the GPT-3 family (the hidden size in steps of the head width, the layers in
// proportion to it, heads and FFN width likewise; every other key kept): the largest that fits, or nullopt.
std::optional<config::Config> largestFittingModel(const config::Config& config, const PlanOptions& options);

// The plan as the text `strata plan` prints.
std::string formatPlan(const ModelStatePlan& plan);

}  // namespace strata::plan
