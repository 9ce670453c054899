// The training configuration: plain structs filled from YAML and validated in one place (Config.cpp).
//
// Keys use Megatron's names in snake_case, plus a DeepSpeed-style `zero_optimization` block. An unknown key,
// a wrong type or an impossible value stops before any work with an error that names the key, the file and
// the line, and suggests the nearest valid key. `--set a.b=v` overrides any key. Every key, with its type,
// default and meaning, is a row of the table in ConfigKeys.h; `strata config --list` prints it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace strata::optim {
struct AdafactorConfig;
}

namespace strata::config {

struct ModelConfig {
  std::string arch = "gpt";
  int64_t numLayers = 4;
  int64_t hiddenSize = 128;
  int64_t numAttentionHeads = 4;
  int64_t ffnHiddenSize = 0;  // 0: 4 * hidden_size
  int64_t seqLength = 128;
  int64_t vocabSize = 256;
  double dropout = 0.0;
  double layerNormEps = 1e-5;
  bool bias = true;
  double initStd = 0.02;
  // Encoder (bert) and encoder-decoder (t5) architectures; see models::ModelSpec for what each means.
  int64_t kvChannels = 0;
  int64_t decoderNumLayers = 0;
  int64_t decoderSeqLength = 0;
  int64_t numTokentypes = 2;
  int64_t relativeAttentionNumBuckets = 32;
  int64_t relativeAttentionMaxDistance = 128;
  std::string activation = "default";
  bool untieEmbeddingsAndOutputWeights = false;
  bool bertBinaryHead = false;
  // BERT in bf16/f16: the residual stream (its LayerNorms' outputs) and the norms in fp32, as autocast runs
  // them; the GEMMs take a 16-bit copy (models/bert/BertLayer.h).
  bool fp32Residual = false;
  // Mixture of experts (gpt; nn/MoE.h): moe_num_experts > 0 replaces the MLP of every moe_every-th block
  // (the last of each group: every other block by default, as Switch) with that many experts.
  int64_t moeNumExperts = 0;
  int64_t moeTopK = 1;
  int64_t moeEvery = 2;
  double moeCapacityFactor = 1.25, moeEvalCapacityFactor = 2.0;
  double moeAuxLossCoef = 0.01, moeZLossCoef = 0.001;
  // Expert parallelism (Megatron's expert_model_parallel_size): the experts of each MoE layer split over
  // groups of this many ranks, tokens exchanged by all_to_all; it divides the world size and the experts.
  int64_t moeExpertParallelSize = 1;
  // What HF checkpoints carry besides the shapes (models::ModelSpec says what each means): the position
  // table's rows (gpt, bert; 0: seq_length), BERT's [PAD] (-1: vocab_size - 4) and whether T5 scales its
  // decoder output before the head (default: when the head is tied).
  int64_t maxPositionEmbeddings = 0;
  int64_t padTokenId = -1;
  std::string scaleDecoderOutputs = "default";
};

struct DataConfig {
  std::string path = "data/tinyshakespeare.txt";
  std::string format = "text";        // text, nanogpt, megatron
  std::string tokenizer = "byte";     // byte, gpt2
  std::string vocabFile, mergesFile;  // GPT-2 BPE
  double valFraction = 0.1;
};

struct TrainLoopConfig {
  std::string device = "auto";  // auto, cpu, cuda, cuda:N
  int64_t microBatchSize = 16;
  int64_t globalBatchSize = 0;      // 0: micro_batch_size x ranks (no accumulation)
  bool globalBatchSizeSet = false;  // whether the config gave it (else the trainer scales it with the ranks)
  int64_t trainIters = 1000;
  int64_t exitInterval = 0;  // stop (after saving) once the iteration count is a multiple of this (0: never)
  uint64_t seed = 1234;
  std::string outDir = "out";
  int64_t logInterval = 10;
  int64_t evalInterval = 200;
  int64_t evalIters = 20;
  int64_t sampleLength = 200;  // characters/tokens sampled at the end of the run (0: none)
  std::string samplePrompt = "\n";
  int64_t threads = 0;  // CPU threads for OpenMP (0: the physical cores this process may run on)
  // What backward computes again instead of keeping: none, selective (the MLP activations) or full (each
  // block; nn::applyRecompute in nn/TransformerBlock.h). The numbers do not change.
  std::string recompute = "auto";  // NOTE [Recompute auto] in plan/Plan.h
  // bf16/fp32: a step whose loss or gradient norm is not finite is skipped; this many in a row stop the run
  // with an error (fp16 skips and lowers the loss scale instead).
  int64_t maxNonfiniteSteps = 5;
};

// Adafactor's options (optimizer.type adafactor; optim/Adafactor.h). The defaults are HF's advice for an
// external learning rate (optimizer.lr and the schedule): no relative step, no parameter scale, no first
// moment.
struct AdafactorOptions {
  bool relativeStep = false;  // min(1e-2, 1/sqrt(t)) instead of optimizer.lr and the schedule
  bool warmupInit = false;
  bool scaleParameter = false;
  double beta1 = -1;  // negative: no first moment
  bool bf16Momentum = false;
  double decayRate = -0.8;
  double eps1 = 1e-30, eps2 = 1e-3;
  double clipThreshold = 1.0;  // 0: no update clipping
};

struct OptimizerConfig {
  std::string type = "adamw";  // adamw, adafactor
  double lr = 1e-3;
  double minLr = 1e-4;
  double weightDecay = 0.1;
  std::vector<double> betas = {0.9, 0.95};
  double eps = 1e-8;
  double clipGrad = 1.0;        // 0: no clipping
  bool pipeline = true;         // the pipelined CPU+GPU update of offloaded state (NOTE [Pipelined update])
  double pipelinePieceMb = 16;  // its pieces: MiB of fp32 state per field (4M elements)
  // AdamW's m and v in every tier: fp32, or bf16 (12 bytes of state per parameter instead of 16).
  std::string momentsDType = "fp32";
  AdafactorOptions adafactor;
};

struct LrScheduleConfig {
  std::string style = "cosine";  // constant, linear, cosine
  int64_t warmupIters = 100;
  int64_t decayIters = 0;  // 0: train_iters
};

struct PrecisionConfig {
  // bf16, fp16, fp32. The CPU computes bf16 configs in fp32; fp16 runs as asked there too (slowly), so
  // dynamic loss scaling can be exercised anywhere.
  std::string dtype = "bf16";
  double initialLossScale = 65536.0;  // fp16 only
  int64_t lossScaleWindow = 1000;     // good steps before the scale doubles
  double minLossScale = 1.0;
  // What the chunks' gradient buffers accumulate in: fp32, or the compute dtype (bf16, fp16; half the
  // gradient memory, and micro-batches then add in 16 bits). Adafactor only: AdamW's kernels read fp32.
  std::string gradAccumDType = "fp32";
  // FP8 training (NOTE [FP8 training] in autograd/Fp8.h; bf16 only): the Linear layers' GEMMs in FP8 with
  // delayed per-tensor scaling from an amax history.
  bool fp8 = false;
  int64_t fp8AmaxHistory = 1024;
  int64_t fp8Margin = 0;
  std::string fp8AmaxCompute = "max";  // max, most_recent
  bool fp8LmHead = false;              // the LM head's GEMMs too
};

struct ZeroConfig {
  int64_t stage = 0;
  double chunkSizeMb = 64;
  int64_t prefetchDepth = 2;
  std::string offloadParamDevice = "none";      // none, cpu, nvme
  std::string offloadOptimizerDevice = "none";  // none, cpu, nvme
  std::string nvmePath;
  bool pinMemory = true;
  int64_t bufferCount = 4;
  int64_t aioBlockSize = 16 << 20;
  int64_t aioQueueDepth = 8;
};

struct StoreConfig {
  std::string gpuBudgetGb = "auto", hostBudgetGb = "auto", nvmeBudgetGb = "auto";
  std::string nvmeStateDType = "fp32";  // how m and v are stored on the SSD: fp32, bf16, fp16
  // Stage 3 gathers chunks into one reservation of fixed-size slots (NOTE [Chunk arena] in
  // zero/ChunkArena.h); false: into blocks of the caching allocator, for comparison.
  bool arena = true;
  // SSD-resident state is updated one step late, overlapped with the next step's forward and backward
  // (NOTE [Delayed SSD update] in optim/AdamW.h). Opt-in: it changes the numbers.
  bool delayedUpdate = false;
  // Where the 16-bit parameter chunks live between their uses (NOTE [Parameter homes] in
  // zero/ParameterGatherer.h): auto (the placement decides, the device first), device, host.
  std::string parameterHome = "auto";
  // Where a chunk's reduced gradients go once complete in the step's last backward, when its optimizer
  // state is off the device (NOTE [Gradient homes] in zero/GradientReducer.h): auto (host memory where the
  // chunk's parameters are homed off the device too), device (they stay until the update), host.
  std::string gradientHome = "auto";
};

struct DistConfig {
  // How long one collective may take before the run stops with an error naming it (all ranks stop).
  double timeoutS = 300;
  // How CUDA tensors travel between ranks: auto, nccl or staged (NOTE [GPU collectives] in
  // distributed/ParallelContext.h).
  std::string gpuCollectives = "auto";
  // PowerSGD (NOTE [PowerSGD] in zero/PowerSgd.h): the data-parallel gradient reduction sends rank-r
  // factors of the 2-D gradients (0: off), after this many steps of exact reduction. ZeRO stages 0 and 1.
  int64_t powersgdRank = 0;
  int64_t powersgdStartIter = 10;
};

// How the ranks split the model (docs/distributed.md). World = pipeline x data x tensor, a tensor group's
// ranks adjacent, the pipeline's stages outermost (rank = p * data * tensor + d * tensor + t).
struct ParallelConfig {
  // Megatron's tensor parallelism over this many ranks: attention split by heads, the MLP by its width, the
  // embedding and the tied head by the vocabulary (NOTE [Tensor parallelism] in nn/TensorParallel.h).
  int64_t tensor = 1;
  // Megatron's sequence parallelism on top: the norms, dropout and residual stream on a part of the sequence
  // each (NOTE [Sequence parallelism] in nn/TensorParallel.h).
  bool sequenceParallel = false;
  // Pipeline parallelism over this many stages, the outermost split: rank = p x (data x tensor) + d x
  // tensor + t (NOTE [Pipeline stages] in nn/Pipeline.h); virtualStages model chunks per stage.
  int64_t pipeline = 1;
  int64_t virtualStages = 1;
  // `parallel: auto` (a scalar in place of the section): the plan chooses the split of the ranks before the
  // trainer allocates (NOTE [Parallel auto] in plan/Plan.h), and sets parallel.tensor and parallel.pipeline.
  bool automatic = false;
};

struct CheckpointConfig {
  std::string save;  // directory to write checkpoints to ("" = out_dir/checkpoints when save_interval > 0)
  std::string load;  // checkpoint directory (or its parent with a `latest` file) to resume from
  int64_t saveInterval = 0;  // 0: only at the end when `save` is set
  int64_t keepLast = 3;      // step directories kept after a successful save (0: all)
  // Load only the model weights from `load` (fine-tuning with another optimizer setup): the step, optimizer
  // state, RNG and data position start fresh. The model's shape must still match.
  bool loadModelOnly = false;

  // Runs across restarts (train/Run.h: NOTE [Run lineage], NOTE [Resume is a property of the run]).
  // Continue from <save>/latest when the save directory has one, else start (`--resume`; `load: latest`).
  bool resume = false;
  // A resume may take settings that differ from the checkpoint's beyond the ones that may always change.
  bool allowChanges = false;
  // `strata train --overwrite` only (no config key, so no config file can make every rerun start over):
  // remove other runs' metrics, events and checkpoints from train.out_dir and the save directory before
  // starting.
  bool overwrite = false;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainLoopConfig train;
  OptimizerConfig optimizer;
  LrScheduleConfig lrSchedule;
  PrecisionConfig precision;
  ZeroConfig zero;
  StoreConfig store;
  DistConfig dist;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  std::string sourcePath;  // the YAML file it came from
  // Problems that do not stop a run (e.g. a warm-up longer than the run); the trainer logs them.
  std::vector<std::string> warnings;
  // Every key as it was finally set, "a.b" -> YAML text (for the checkpoint manifest and `strata info`).
  std::map<std::string, std::string> values;
};

// Loads and validates `path`, then applies `overrides` ("a.b=v"). A relative data path is resolved against
// the config file's directory first, then against the current directory. Throws strata::Error on any problem.
// With requireData (training), a missing data file is an error too.
Config loadConfig(const std::string& path, const std::vector<std::string>& overrides = {},
                  bool requireData = true);
// The same from YAML text (tests); `origin` names it in errors.
Config parseConfig(const std::string& yaml, const std::string& origin,
                   const std::vector<std::string>& overrides = {}, bool requireData = true);
// All valid keys, dotted (configKeyTable()'s names).
std::vector<std::string> configKeys();
// The effective value of every key under `prefix` ("model." for the model section), defaults included, as
// YAML text: what a checkpoint's manifest records to check a resume against.
std::map<std::string, std::string> effectiveValues(const Config& config, const std::string& prefix = "");
// optimizer.* as Adafactor's config (optim/Adafactor.h): the adafactor_* keys, optimizer.lr (unless the
// relative step is on) and optimizer.weight_decay.
optim::AdafactorConfig adafactorConfigFrom(const Config& config);
// Levenshtein distance, for "did you mean" suggestions (config keys, subcommands).
size_t editDistance(const std::string& a, const std::string& b);
// Whether two YAML texts of one key denote the same value (numbers compare as numbers).
bool sameConfigValue(const std::string& a, const std::string& b);

// Resuming (train/Run.h). A config made from the effective values a checkpoint's manifest recorded
// (effectiveValues' text, key by key), on top of the defaults, and validated like a loaded one; `origin`
// names it in errors. A recorded key this version no longer has is left out with a warning.
Config configFromValues(const std::map<std::string, std::string>& values, const std::string& origin,
                        bool requireData = true);

}  // namespace strata::config
