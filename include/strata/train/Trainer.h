// The training loop: data, model, AdamW with a schedule and clipping, gradient accumulation, evaluation,
// metrics, checkpoints and a text sample at the end. Before any work it checks that the output and save
// directories are writable and that the data holds a batch of each split it will read. It trains an
// Objective (NOTE [Training objectives] in data/Objective.h): the zoo architecture's (next tokens, masked LM,
// span corruption), or next tokens for any nn::CausalLM, so a user's own model trains through the same loop
// (see models/custom_example).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "models/Zoo.h"
#include "strata/config/Config.h"
#include "strata/config/Resolve.h"
#include "strata/data/CausalLmObjective.h"
#include "strata/data/Data.h"
#include "strata/data/Objective.h"
#include "strata/distributed/ParallelContext.h"
#include "strata/nn/CausalLM.h"
#include "strata/nn/MoE.h"
#include "strata/optim/AdamW.h"
#include "strata/train/Interrupts.h"
#include "strata/train/Metrics.h"
#include "strata/train/Run.h"

namespace strata::train {

struct TrainResult {
  int64_t steps = 0;
  double trainLoss = 0;  // mean loss of the last logged interval
  double valLoss = 0;    // last evaluation (NaN when none ran, or when the loss was not finite)
  int64_t evaluations = 0;
  int64_t skippedSteps = 0;  // steps not applied: fp16 overflows and non-finite bf16/fp32 steps
  std::string sample;
  TrainRecord last;              // the last logged interval (speed, memory): what `strata bench` reports
  std::string checkpoint;        // the last checkpoint written ("" when none)
  int interruptSignal = 0;       // SIGINT or SIGTERM when the run stopped early on one, else 0
  bool stoppedByMpirun = false;  // it was mpirun's notice that the job is ending (train/Interrupts.h)
  size_t chunks = 0;             // parameter chunks the step engine laid out
  // Bytes of gradients one step sends over the data-parallel group (fp32), exactly and as PowerSGD sends
  // them (dist.powersgd_rank; equal when off); 0 on one rank.
  int64_t reducedBytes = 0, reducedBytesPowerSgd = 0;
  // The checkpoint resumed was at or past train.train_iters already: nothing was trained (nor sampled).
  bool alreadyComplete = false;
};

// Thrown when bf16/fp32 training meets train.max_nonfinite_steps non-finite steps in a row. No checkpoint is
// written from that state.
class DivergedError : public Error {
 public:
  using Error::Error;
};

// Thrown on every rank but rank 0 when a check before training failed on some rank: rank 0 reports the
// failure once for the job (with the rank it happened on), so `strata` prints nothing for this one.
class ReportedByRankZero : public Error {
 public:
  using Error::Error;
};

// The ParallelContext groups of expert parallelism over groups of `size` ranks
// (model.moe_expert_parallel_size) among the data-parallel ranks of one tensor rank (all ranks when `tensor`,
// parallel.tensor, is 1): the ranks that split the experts between them (consecutive data-parallel ranks),
// and the ranks that hold the same experts (every size-th one), over which ZeRO shards and reduces them.
std::string expertGroupName(int64_t size, int64_t tensor = 1);
std::string expertDataGroupName(int64_t size, int64_t tensor = 1);
// The ParallelContext groups of tensor parallelism over `size` ranks (parallel.tensor): the adjacent ranks
// that split the layers, and the ranks that hold the same slices (every size-th rank), over which the batch,
// ZeRO and the gradients' reduction go.
std::string tensorGroupName(int64_t size);
// Under pipeline parallelism over `pipelineSize` stages (parallel.pipeline) the data-parallel ranks are those
// of one stage with the same tensor rank; the pipeline-parallel group is the ranks of one data and tensor
// rank, one per stage (the group rank is the stage); the embedding group the first and the last of them,
// which hold the tied embedding (the other stages are alone in theirs). NOTE [Pipeline stages] in
// nn/Pipeline.h.
std::string dataGroupName(int64_t tensorSize, int64_t pipelineSize = 1);
std::string pipelineGroupName(int64_t size);
std::string embeddingGroupName(int64_t size);

// Training runs on the ranks of a dist::ParallelContext: one made from the process environment (mpirun's, or
// a single rank; dist.timeout_s) unless one is given. Every rank trains its slice of each global batch
// (train.global_batch_size = micro_batch_size x accumulation steps x ranks; the data-parallel ranks under
// parallel.tensor, whose tensor-parallel groups train on the same slice) through a ZeroStepEngine at
// zero_optimization.stage; rank 0 alone logs, writes metrics and checkpoints; memory figures are the
// maximum over the ranks.
//
// A run starts as planRunStart decides (train/Run.h): fresh, or resumed with its checkpoint's settings.
// Before any work the trainer claims its out_dir and save directory for its run id (NOTE [Run lineage]).
// Under several ranks the checks before training are agreed: when one fails on any rank, every rank throws,
// rank 0 with the message and the others ReportedByRankZero.
class Trainer {
 public:
  // Builds config.model.arch from the zoo and trains it on its objective.
  explicit Trainer(config::Config config, std::shared_ptr<dist::ParallelContext> parallel = nullptr);
  // Trains `model` (already built on the config's device) on next tokens with the config's data, optimizer
  // and schedule.
  Trainer(config::Config config, std::shared_ptr<nn::CausalLM> model,
          std::shared_ptr<dist::ParallelContext> parallel = nullptr);
  // Trains an objective of the user's own (its model already built on the config's device).
  Trainer(config::Config config, std::shared_ptr<data::Objective> objective,
          std::shared_ptr<dist::ParallelContext> parallel = nullptr);

  // Trains. SIGINT and SIGTERM during run() (and mpirun ending the job) finish the current step on every
  // rank, save a checkpoint when saving is configured, and return with interruptSignal set; a second SIGINT
  // aborts at once (exit status 130). NOTE [Interrupts] in train/Interrupts.h. A resume of a checkpoint at or
  // past train.train_iters returns at once with alreadyComplete.
  TrainResult run();
  // The command that resumes this run, for the messages that name the last good checkpoint.
  void setResumeCommand(std::string command) { resumeCommand_ = std::move(command); }
  // How the run started (fresh, or resumed from which checkpoint, with which notes) and its id.
  const RunStart& start() const { return start_; }
  const std::string& runId() const { return runId_; }
  // Called after each completed iteration with its number (1-based), before checkpoints and interrupts are
  // looked at: progress reporting, tests.
  void onIteration(std::function<void(int64_t)> callback) { onIteration_ = std::move(callback); }
  // Mean loss over `iters` validation batches (deterministic: the same batches every time).
  double evaluate(int64_t iters);
  // What the objective makes of `prompt` (Objective::generate: a continuation of `length` tokens sampled
  // with temperature and top-k, 0 = all; T5's decoding, BERT's mask fillers); "" when it makes nothing.
  // temperature < 0: the objective's default.
  std::string sample(const std::string& prompt, int64_t length, double temperature = 0.8, int64_t topK = 40,
                     uint64_t seed = 1);

  // A model the trainer built from the config is laid out by run() without ever existing whole in fp32 (NOTE
  // [Deferred parameters] in nn/DeferredInit.h); asked for here before that, its values are made first.
  nn::Module& model() {
    materializeModel();
    return objective_->model();
  }
  data::Objective& objective() {
    materializeModel();
    return *objective_;
  }
  const dist::ParallelContext& parallel() const { return *parallel_; }
  const config::Config& config() const { return config_; }
  Device device() const { return device_; }
  DType computeDType() const { return compute_; }
  // Where checkpoints go: checkpoint.save, else <out_dir>/checkpoints when save_interval is set, else "".
  std::string saveDirectory() const;
  // The micro-batch number `index` of a split, as run() and evaluate() draw it (one rank's micro-batches of
  // global batch g are g x accumulation x ranks + rank x accumulation + 0, 1, ...): what a check against
  // another implementation feeds it (data/BatchTrace.h).
  data::TokenBatch batch(data::Split split, int64_t index) const;

 private:
  DType modelDType();
  // Gives a model built with deferred parameters its values where it is used before the engine lays it out.
  void materializeModel();
  bool mayBeDeferred_ = false;  // the model was built with deferred parameters and may not be laid out yet
  // Resolves the device and makes the parallel context (errors before it exists are rank 0's to print).
  void begin(const config::Config& config);
  // How the run starts (planRunStart): the config it trains with. For a model built from the config, the
  // memory plan of this machine (plan/Plan.h) before anything is allocated: a config that cannot fit is
  // refused with the plan's message, and train.recompute auto becomes the plan's choice.
  void plan(const config::Config& config);
  // Runs a part of the checks and construction before training on every rank and agrees on the outcome
  // (see above); also shares rank 0's run id and every rank's process, for the interrupt monitor.
  void agreeOnSetup(const std::function<void()>& work);
  // The batch and expert-parallel settings against the ranks; makes the expert-parallel groups
  // (model.moe_expert_parallel_size > 1), once per context and size.
  void connect();
  // The MoE layers' place in the "expert" group and its all_to_all (NOTE [Expert parallelism] in nn/MoE.h).
  nn::ExpertParallel expertParallel() const;
  // The layers' place in the tensor-parallel group and its collectives (NOTE [Tensor parallelism] in
  // nn/TensorParallel.h); size 1 without parallel.tensor.
  nn::TensorParallel tensorParallel() const;
  // parallel.tensor > 1 and parallel.pipeline > 1 are refused for a model the trainer did not build: `what`
  // names it.
  void refuseTensorParallel(const std::string& what) const;
  // This rank's pipeline stage (size 1 without parallel.pipeline), and the groups of the stages and of the
  // tied embedding (null without a pipeline).
  nn::PipelineParallel pipelineParallel() const;
  dist::ProcessGroup* pipelineGroup() const;
  dist::ProcessGroup* embeddingGroup() const;
  // Under a pipeline: the mean loss of one micro-batch through every stage (forward only), on the last
  // stage; undefined on the others.
  Tensor pipelineLoss(const data::TokenBatch& batch);
  // The group that splits the batch and over which ZeRO and the gradients' reduction go: the world, or the
  // data-parallel group under tensor parallelism; null when it has one rank.
  dist::ProcessGroup* dataGroup() const;
  void setup();

  config::Config config_;
  Device device_;
  DType compute_ = DType::F32;
  std::shared_ptr<data::Objective> objective_;
  std::shared_ptr<dist::ParallelContext> parallel_;
  std::shared_ptr<const data::Tokenizer> tokenizer_;
  std::unique_ptr<data::TokenDataset> data_;
  std::function<void(int64_t)> onIteration_;
  RunStart start_;
  bool buildsModel_ = false;  // the model comes from config_ (the zoo), so the memory plan describes it
  // The plan's activations, gradient buffers and gather slots on the device (0: no plan), and the step that
  // compared them with the measured ones.
  uint64_t plannedWorkingBytes_ = 0;
  uint64_t plannedDeviceBudget_ = 0;  // the plan's store budget on the device (RankShares)
  std::string runId_, resumeCommand_;
  std::vector<RankProcess> rankProcesses_;  // every rank's process (train/Interrupts.h)
};

}  // namespace strata::train
