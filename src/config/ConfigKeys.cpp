// The config key table (ConfigKeys.h): one row per key, and what is derived from it (value text, the nearest
// key to a typo, the Markdown reference).
#include "strata/config/ConfigKeys.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "strata/config/Config.h"
#include "strata/core/Error.h"

namespace strata::config {
namespace {

// What a row states besides its name, member and meaning (ConfigKey's fields of the same names), built by
// the functions below: `atLeast(1)`, `oneOf({"gpt", "bert"})`, `derived("= seq_length")`, chained as
// `within(0, 64).derived(...)`.
struct Rules {
  std::vector<std::string> choices;
  double min = 0, max = kConfigNoMax;
  std::string derivedDefault;
  std::string type;

  Rules derived(std::string text) && {
    derivedDefault = std::move(text);
    return std::move(*this);
  }
};

Rules atLeast(double min) {
  Rules r;
  r.min = min;
  return r;
}
Rules within(double min, double max) {
  Rules r;
  r.min = min;
  r.max = max;
  return r;
}
Rules oneOf(std::vector<std::string> choices) {
  Rules r;
  r.choices = std::move(choices);
  return r;
}
Rules derived(std::string text) {
  return Rules().derived(std::move(text));
}
Rules shownAs(std::string type) {
  Rules r;
  r.type = std::move(type);
  return r;
}

// A row: `get` is a captureless lambda returning a pointer to the member, `[](Config& c) { return &c.x.y; }`.
template <class Get>
ConfigKey key(std::string name, Get, std::string doc, Rules rules = {}) {
  return ConfigKey{std::move(name),
                   [](Config& c) -> ConfigMember { return Get{}(c); },
                   std::move(doc),
                   std::move(rules.choices),
                   rules.min,
                   rules.max,
                   std::move(rules.derivedDefault),
                   std::move(rules.type)};
}

const std::vector<std::string> kDTypes = {"fp32", "bf16", "fp16"};
const std::vector<std::string> kOffloadDevices = {"none", "cpu", "nvme"};
const char* kBudgetType = "GiB, or `auto`";

std::vector<ConfigKey> makeTable() {
  return {
      // model
      key(
          "model.arch", [](Config& c) { return &c.model.arch; },
          "the architecture: gpt (next token), bert (masked LM), t5 (span corruption, encoder-decoder)",
          oneOf({"gpt", "bert", "t5"})),
      key(
          "model.num_layers", [](Config& c) { return &c.model.numLayers; },
          "transformer blocks (t5: the encoder's)", atLeast(1)),
      key(
          "model.hidden_size", [](Config& c) { return &c.model.hiddenSize; }, "the model's width",
          atLeast(1)),
      key(
          "model.num_attention_heads", [](Config& c) { return &c.model.numAttentionHeads; },
          "attention heads per block; they divide hidden_size (except in t5)", atLeast(1)),
      key(
          "model.ffn_hidden_size", [](Config& c) { return &c.model.ffnHiddenSize; }, "the MLP's inner width",
          derived("= 4 x hidden_size")),
      key(
          "model.seq_length", [](Config& c) { return &c.model.seqLength; },
          "tokens per training window (t5: the encoder's input)", atLeast(1)),
      key(
          "model.vocab_size", [](Config& c) { return &c.model.vocabSize; },
          "rows of the token embedding; at least 256 with the byte tokenizer", atLeast(1)),
      key(
          "model.dropout", [](Config& c) { return &c.model.dropout; }, "dropout probability",
          within(0, 0.999)),
      key(
          "model.layer_norm_eps", [](Config& c) { return &c.model.layerNormEps; }, "the norms' epsilon",
          within(0, 1)),
      key(
          "model.bias", [](Config& c) { return &c.model.bias; },
          "whether the linear layers and norms have biases"),
      key(
          "model.init_std", [](Config& c) { return &c.model.initStd; },
          "standard deviation of the weights' normal initialisation", within(0, 10)),
      key(
          "model.kv_channels", [](Config& c) { return &c.model.kvChannels; },
          "t5: each attention head's width (d_kv); the other architectures take hidden_size / heads",
          derived("= 64 in t5")),
      key(
          "model.decoder_num_layers", [](Config& c) { return &c.model.decoderNumLayers; },
          "t5: the decoder's blocks", derived("= num_layers")),
      key(
          "model.decoder_seq_length", [](Config& c) { return &c.model.decoderSeqLength; },
          "t5: target tokens per window", derived("= seq_length / 4")),
      key(
          "model.num_tokentypes", [](Config& c) { return &c.model.numTokentypes; },
          "bert: segment (token type) embeddings", atLeast(1)),
      key(
          "model.relative_attention_num_buckets",
          [](Config& c) { return &c.model.relativeAttentionNumBuckets; }, "t5: relative position buckets",
          atLeast(4)),
      key(
          "model.relative_attention_max_distance",
          [](Config& c) { return &c.model.relativeAttentionMaxDistance; },
          "t5: the distance from which relative positions share one bucket", atLeast(1)),
      key(
          "model.activation", [](Config& c) { return &c.model.activation; },
          "the MLP's activation; gated_gelu is T5 v1.1's gated MLP",
          oneOf({"default", "gelu", "gelu_tanh", "relu", "gated_gelu"})
              .derived("= gelu_tanh in gpt, gelu in bert, relu in t5")),
      key(
          "model.untie_embeddings_and_output_weights",
          [](Config& c) { return &c.model.untieEmbeddingsAndOutputWeights; },
          "an output head of its own instead of the token embedding (T5 v1.1)"),
      key(
          "model.bert_binary_head", [](Config& c) { return &c.model.bertBinaryHead; },
          "bert: the pooler and next-sentence-prediction head, trained with the masked LM"),
      key(
          "model.fp32_residual", [](Config& c) { return &c.model.fp32Residual; },
          "bert in bf16/fp16: the residual stream and its norms in fp32, as autocast runs them"),
      key(
          "model.moe_num_experts", [](Config& c) { return &c.model.moeNumExperts; },
          "mixture of experts (gpt; t5 as Switch Transformers): experts replacing the MLP of every "
          "moe_every-th block; 0: dense",
          within(0, 4096)),
      key(
          "model.moe_top_k", [](Config& c) { return &c.model.moeTopK; },
          "experts per token: 1 (Switch) or 2 (GShard)", within(1, 2)),
      key(
          "model.moe_every", [](Config& c) { return &c.model.moeEvery; },
          "the last block of every group of this many gets experts (2: every other block)", within(1, 1024)),
      key(
          "model.moe_capacity_factor", [](Config& c) { return &c.model.moeCapacityFactor; },
          "tokens an expert takes in training, as a multiple of an even share; one past its expert's "
          "capacity is dropped and rides the residual",
          within(0.01, 1e6)),
      key(
          "model.moe_eval_capacity_factor", [](Config& c) { return &c.model.moeEvalCapacityFactor; },
          "the same in evaluation", within(0.01, 1e6)),
      key(
          "model.moe_aux_loss_coef", [](Config& c) { return &c.model.moeAuxLossCoef; },
          "weight of Switch's load-balancing loss, added to the training loss", within(0, 1e6)),
      key(
          "model.moe_z_loss_coef", [](Config& c) { return &c.model.moeZLossCoef; },
          "weight of ST-MoE's router z-loss, added to the training loss", within(0, 1e6)),
      key(
          "model.moe_expert_parallel_size", [](Config& c) { return &c.model.moeExpertParallelSize; },
          "ranks each MoE layer's experts are split over (tokens exchanged by all_to_all); it divides the "
          "ranks and the experts",
          within(1, 4096)),
      key(
          "model.max_position_embeddings", [](Config& c) { return &c.model.maxPositionEmbeddings; },
          "gpt, bert: rows of the learned position table (may exceed seq_length: bert-base has 512)",
          derived("= seq_length")),
      key(
          "model.pad_token_id", [](Config& c) { return &c.model.padTokenId; },
          "bert: the [PAD] token, whose embedding row takes no gradient from its lookups (HF's padding_idx)",
          atLeast(-1).derived("= vocab_size - 4")),
      key(
          "model.scale_decoder_outputs", [](Config& c) { return &c.model.scaleDecoderOutputs; },
          "t5: the decoder output times d_model^-0.5 before the head",
          oneOf({"default", "true", "false"}).derived("= true when the head is tied")),
      // data
      key(
          "data.path", [](Config& c) { return &c.data.path; },
          "the corpus file (megatron: its .bin, beside the .idx); relative to the config file first"),
      key(
          "data.format", [](Config& c) { return &c.data.format; },
          "text (tokenized once, cached under out_dir/cache), nanogpt (a .bin of uint16 ids), megatron "
          "(an indexed dataset), random (uniform token ids, no file)",
          oneOf({"text", "nanogpt", "megatron", "random"})),
      key(
          "data.tokenizer", [](Config& c) { return &c.data.tokenizer; },
          "byte (a token per byte), gpt2 (BPE from vocab_file and merges_file), sentencepiece (vocab_file)",
          oneOf({"byte", "gpt2", "sentencepiece"})),
      key(
          "data.vocab_file", [](Config& c) { return &c.data.vocabFile; },
          "gpt2: GPT-2's vocab.json; sentencepiece: the .model file"),
      key(
          "data.merges_file", [](Config& c) { return &c.data.mergesFile; }, "gpt2: GPT-2's merges.txt"),
      key(
          "data.val_fraction", [](Config& c) { return &c.data.valFraction; },
          "the corpus's share held out for evaluation", within(0, 0.9)),
      // train
      key(
          "train.device", [](Config& c) { return &c.train.device; },
          "where to train; auto: the first GPU when there is one, else the CPU",
          shownAs("`auto`, `cpu`, `cuda`, `cuda:N`")),
      key(
          "train.micro_batch_size", [](Config& c) { return &c.train.microBatchSize; },
          "sequences per forward and backward on each rank", atLeast(1)),
      key(
          "train.global_batch_size", [](Config& c) { return &c.train.globalBatchSize; },
          "sequences per optimizer step over all ranks: a multiple of micro_batch_size, the rest "
          "accumulated",
          derived("= micro_batch_size x ranks")),
      key(
          "train.train_iters", [](Config& c) { return &c.train.trainIters; }, "optimizer steps to train",
          atLeast(1)),
      key(
          "train.exit_interval", [](Config& c) { return &c.train.exitInterval; },
          "stop (after saving) once the iteration count is a multiple of this; 0: never"),
      key(
          "train.seed", [](Config& c) { return &c.train.seed; },
          "seed of the initialisation, the data order, dropout and the final sample", within(0, 1.8e19)),
      key(
          "train.out_dir", [](Config& c) { return &c.train.outDir; },
          "where the run writes metrics.jsonl, its events and the token cache"),
      key(
          "train.log_interval", [](Config& c) { return &c.train.logInterval; },
          "iterations between log lines (and metrics records)", atLeast(1)),
      key(
          "train.eval_interval", [](Config& c) { return &c.train.evalInterval; },
          "iterations between evaluations on the held-out data; 0: none"),
      key(
          "train.eval_iters", [](Config& c) { return &c.train.evalIters; }, "micro-batches per evaluation",
          atLeast(1)),
      key(
          "train.sample_length", [](Config& c) { return &c.train.sampleLength; },
          "tokens sampled from the model at the end of the run; 0: none"),
      key(
          "train.threads", [](Config& c) { return &c.train.threads; }, "CPU threads (OpenMP)",
          within(0, 4096).derived("= OMP_NUM_THREADS, else the physical cores this process may use")),
      key(
          "train.recompute", [](Config& c) { return &c.train.recompute; },
          "what backward computes again instead of keeping: selective the MLP activations, full each block "
          "(the numbers do not change); auto: the fastest that fits, as strata plan predicts",
          oneOf({"auto", "none", "selective", "full"})),
      key(
          "train.max_nonfinite_steps", [](Config& c) { return &c.train.maxNonfiniteSteps; },
          "bf16/fp32: steps in a row with a non-finite loss or gradient norm (each skipped) that stop the "
          "run",
          atLeast(1)),
      key(
          "train.sample_prompt", [](Config& c) { return &c.train.samplePrompt; },
          "the text the end-of-run sample continues"),
      // optimizer
      key(
          "optimizer.type", [](Config& c) { return &c.optimizer.type; }, "the optimizer",
          oneOf({"adamw", "adafactor"})),
      key(
          "optimizer.lr", [](Config& c) { return &c.optimizer.lr; },
          "the peak learning rate, reached after the warm-up", within(0, 10)),
      key(
          "optimizer.min_lr", [](Config& c) { return &c.optimizer.minLr; },
          "the learning rate at the end of the decay; at most lr", within(0, 10)),
      key(
          "optimizer.weight_decay", [](Config& c) { return &c.optimizer.weightDecay; },
          "decoupled weight decay", within(0, 10)),
      key(
          "optimizer.betas", [](Config& c) { return &c.optimizer.betas; }, "AdamW's beta1 and beta2",
          within(0, 0.999999)),
      key(
          "optimizer.eps", [](Config& c) { return &c.optimizer.eps; }, "AdamW's epsilon", within(0, 1)),
      key(
          "optimizer.moments_dtype", [](Config& c) { return &c.optimizer.momentsDType; },
          "AdamW's m and v on the GPU, in host memory and on the SSD: bf16 keeps 4 bytes of them per "
          "parameter instead of 8 (the update computes in fp32 and rounds them to nearest even)",
          oneOf({"fp32", "bf16"})),
      key(
          "optimizer.clip_grad", [](Config& c) { return &c.optimizer.clipGrad; },
          "the global gradient norm is clipped to this; 0: no clipping"),
      key(
          "optimizer.pipeline", [](Config& c) { return &c.optimizer.pipeline; },
          "offloaded state is updated in pieces by the CPU and, streamed over PCIe, the GPU at once (the "
          "same bits as false: a chunk at a time on the CPU)"),
      key(
          "optimizer.pipeline_piece_mb", [](Config& c) { return &c.optimizer.pipelinePieceMb; },
          "the pipelined update's pieces, in MiB of fp32 state per field", within(0.0001, 4096)),
      key(
          "optimizer.adafactor_relative_step", [](Config& c) { return &c.optimizer.adafactor.relativeStep; },
          "Adafactor: the step size min(1e-2, 1/sqrt(t)) instead of lr and the schedule"),
      key(
          "optimizer.adafactor_warmup_init", [](Config& c) { return &c.optimizer.adafactor.warmupInit; },
          "Adafactor: the relative step is min(1e-6 t, 1/sqrt(t))"),
      key(
          "optimizer.adafactor_scale_parameter",
          [](Config& c) { return &c.optimizer.adafactor.scaleParameter; },
          "Adafactor: the step times max(adafactor_eps2, the parameter's RMS)"),
      key(
          "optimizer.adafactor_beta1", [](Config& c) { return &c.optimizer.adafactor.beta1; },
          "Adafactor: the first moment's decay; negative: no first moment", within(-1, 0.999999)),
      key(
          "optimizer.adafactor_bf16_momentum", [](Config& c) { return &c.optimizer.adafactor.bf16Momentum; },
          "Adafactor: the first moment in bf16"),
      key(
          "optimizer.adafactor_decay_rate", [](Config& c) { return &c.optimizer.adafactor.decayRate; },
          "Adafactor: the second moment's decay is 1 - t^adafactor_decay_rate", within(-10, -1e-6)),
      key(
          "optimizer.adafactor_eps1", [](Config& c) { return &c.optimizer.adafactor.eps1; },
          "Adafactor: added to the squared gradient", within(1e-45, 1)),
      key(
          "optimizer.adafactor_eps2", [](Config& c) { return &c.optimizer.adafactor.eps2; },
          "Adafactor: the least parameter scale", within(0, 1)),
      key(
          "optimizer.adafactor_clip_threshold",
          [](Config& c) { return &c.optimizer.adafactor.clipThreshold; },
          "Adafactor: the update's RMS is clipped to this; 0: no clipping", within(0, 1e6)),
      // lr_schedule
      key(
          "lr_schedule.style", [](Config& c) { return &c.lrSchedule.style; },
          "how the learning rate decays after the warm-up", oneOf({"constant", "linear", "cosine"})),
      key(
          "lr_schedule.warmup_iters", [](Config& c) { return &c.lrSchedule.warmupIters; },
          "iterations of linear warm-up to optimizer.lr"),
      key(
          "lr_schedule.decay_iters", [](Config& c) { return &c.lrSchedule.decayIters; },
          "the iteration at which the decay reaches optimizer.min_lr", derived("= train_iters")),
      // precision
      key(
          "precision.dtype", [](Config& c) { return &c.precision.dtype; },
          "the compute dtype of parameters and activations; the CPU computes bf16 configs in fp32",
          oneOf({"bf16", "fp16", "fp32"})),
      key(
          "precision.initial_loss_scale", [](Config& c) { return &c.precision.initialLossScale; },
          "fp16: the first loss scale", within(1, 1e30)),
      key(
          "precision.loss_scale_window", [](Config& c) { return &c.precision.lossScaleWindow; },
          "fp16: good steps before the scale doubles (an overflow skips the step and halves it)", atLeast(1)),
      key(
          "precision.min_loss_scale", [](Config& c) { return &c.precision.minLossScale; },
          "fp16: the scale never drops below this", within(1e-30, 1e30)),
      key(
          "precision.grad_accum_dtype", [](Config& c) { return &c.precision.gradAccumDType; },
          "what gradient buffers accumulate in: fp32, or the compute dtype (half the memory; micro-batches "
          "then add in 16 bits)",
          oneOf(kDTypes)),
      key(
          "precision.fp8", [](Config& c) { return &c.precision.fp8; },
          "bf16 only: every Linear layer's GEMMs in FP8 (E4M3 forward, E5M2 gradients) with delayed "
          "per-tensor scaling; the CPU emulates it"),
      key(
          "precision.fp8_amax_history", [](Config& c) { return &c.precision.fp8AmaxHistory; },
          "fp8: steps of amax history each scale is computed from", within(1, 16777216)),
      key(
          "precision.fp8_margin", [](Config& c) { return &c.precision.fp8Margin; },
          "fp8: powers of two of headroom below the format's largest value", within(0, 64)),
      key(
          "precision.fp8_amax_compute", [](Config& c) { return &c.precision.fp8AmaxCompute; },
          "fp8: the amax a scale is computed from: the history's max, or its most recent entry",
          oneOf({"max", "most_recent"})),
      key(
          "precision.fp8_lm_head", [](Config& c) { return &c.precision.fp8LmHead; },
          "fp8: the LM head's GEMMs (the fused head and loss over the embedding table) in FP8 too"),
      // zero_optimization
      key(
          "zero_optimization.stage", [](Config& c) { return &c.zero.stage; },
          "ZeRO stage: 1 shards the optimizer state over the ranks, 2 also the gradients, 3 also the "
          "parameters; 0: none",
          within(0, 3)),
      key(
          "zero_optimization.chunk_size_mb", [](Config& c) { return &c.zero.chunkSizeMb; },
          "MiB per parameter chunk (state is placed and sharded by chunks)", within(1e-3, 65536)),
      key(
          "zero_optimization.prefetch_depth", [](Config& c) { return &c.zero.prefetchDepth; },
          "stage 3: chunks gathered ahead of the module that needs them", within(0, 64)),
      key(
          "zero_optimization.offload_param.device", [](Config& c) { return &c.zero.offloadParamDevice; },
          "not read: store.parameter_home says where the parameters live", oneOf(kOffloadDevices)),
      key(
          "zero_optimization.offload_optimizer.device",
          [](Config& c) { return &c.zero.offloadOptimizerDevice; },
          "all optimizer state to host memory (cpu) or the SSD (nvme); none: where the store budgets put it",
          oneOf(kOffloadDevices)),
      key(
          "zero_optimization.nvme_path", [](Config& c) { return &c.zero.nvmePath; },
          "the SSD tier's directory"),
      key(
          "zero_optimization.pin_memory", [](Config& c) { return &c.zero.pinMemory; },
          "host-resident optimizer state is page-locked when there is a GPU (the pipelined update needs it)"),
      key(
          "zero_optimization.buffer_count", [](Config& c) { return &c.zero.bufferCount; },
          "the pipelined update's page-locked staging slots", within(1, 64)),
      key(
          "zero_optimization.aio.block_size", [](Config& c) { return &c.zero.aioBlockSize; },
          "bytes per SSD transfer", atLeast(4096)),
      key(
          "zero_optimization.aio.queue_depth", [](Config& c) { return &c.zero.aioQueueDepth; },
          "SSD transfers in flight", within(1, 4096)),
      // store
      key(
          "store.gpu_budget_gb", [](Config& c) { return &c.store.gpuBudgetGb; },
          "optimizer state kept on the GPU; auto: all of it when it takes under 80% of the device, else "
          "what the memory tracer finds room for after the first step",
          shownAs(kBudgetType)),
      key(
          "store.host_budget_gb", [](Config& c) { return &c.store.hostBudgetGb; },
          "optimizer state in host memory; auto: what is available at start less the system's reserve, "
          "the store's staging and the process (NOTE [Host headroom]), at most 90%",
          shownAs(kBudgetType)),
      key(
          "store.nvme_budget_gb", [](Config& c) { return &c.store.nvmeBudgetGb; },
          "optimizer state on the SSD; auto: 90% of the free space under zero_optimization.nvme_path",
          shownAs(kBudgetType)),
      key(
          "store.nvme_state_dtype", [](Config& c) { return &c.store.nvmeStateDType; },
          "how the moments are stored on the SSD: AdamW's m and v (bf16 with optimizer.moments_dtype: bf16, "
          "which takes fp32 or bf16 here), Adafactor's first moment (masters and Adafactor's factored second "
          "moment always in fp32)",
          oneOf(kDTypes)),
      key(
          "store.arena", [](Config& c) { return &c.store.arena; },
          "stage 3 gathers chunks into one reservation of fixed-size slots; false: into the caching "
          "allocator's blocks"),
      key(
          "store.parameter_home", [](Config& c) { return &c.store.parameterHome; },
          "where the parameter chunks live between uses: auto (the GPU while store.gpu_budget_gb lasts, "
          "then host memory while store.host_budget_gb lasts, then the SSD), device, host, or nvme (each "
          "chunk off the GPU is copied into a GPU slot ahead of its use; from the SSD through a read ahead)",
          oneOf({"auto", "device", "host", "nvme"})),
      key(
          "store.gradient_home", [](Config& c) { return &c.store.gradientHome; },
          "where a chunk's gradients go once complete in the step's last backward, when its optimizer state "
          "is off the GPU: host (copied to host memory and the GPU buffer freed at once; ZeRO stages 0 and "
          "3), device (kept on the GPU until the update), or auto (host where the chunk's parameters are "
          "homed off the GPU too)",
          oneOf({"auto", "device", "host"})),
      key(
          "store.delayed_update", [](Config& c) { return &c.store.delayedUpdate; },
          "SSD-resident state is updated one step late, overlapped with the next step (it changes the "
          "numbers: those parameters are one step stale)"),
      // dist
      key(
          "dist.timeout_s", [](Config& c) { return &c.dist.timeoutS; },
          "seconds a collective may take before every rank stops with an error naming it", within(0.1, 1e7)),
      key(
          "dist.gpu_collectives", [](Config& c) { return &c.dist.gpuCollectives; },
          "how CUDA tensors travel between ranks: nccl, or staged through host memory; auto picks",
          oneOf({"auto", "nccl", "staged"})),
      key(
          "dist.powersgd_rank", [](Config& c) { return &c.dist.powersgdRank; },
          "PowerSGD: the data-parallel gradient reduction sends rank-r factors of each matrix gradient, with "
          "error feedback (0: exact all-reduce); ZeRO stages 0 and 1",
          within(0, 1 << 20)),
      key(
          "dist.powersgd_start_iter", [](Config& c) { return &c.dist.powersgdStartIter; },
          "with dist.powersgd_rank > 0: steps reduced exactly before PowerSGD starts", within(0, 1e15)),
      // parallel
      key(
          "parallel.tensor", [](Config& c) { return &c.parallel.tensor; },
          "ranks each layer is split over (Megatron's tensor parallelism; adjacent ranks); it divides the "
          "ranks, the attention heads, the MLP width and the vocabulary; gpt (MoE too), bert and t5",
          within(1, 4096)),
      key(
          "parallel.sequence_parallel", [](Config& c) { return &c.parallel.sequenceParallel; },
          "with parallel.tensor > 1: the norms, dropout and residual stream run on 1/tensor of the sequence "
          "each (reduce-scatter and all-gather in place of the all-reduces); gpt without MoE layers only"),
      key(
          "parallel.pipeline", [](Config& c) { return &c.parallel.pipeline; },
          "pipeline stages the blocks are split into, balanced by cost (the outermost split: rank = stage x "
          "data x tensor + ...); 1F1B over the step's micro-batches, at least this many; gpt only, ZeRO "
          "stages 0 to 2",
          within(1, 4096)),
      key(
          "parallel.virtual_stages", [](Config& c) { return &c.parallel.virtualStages; },
          "with parallel.pipeline > 1: model chunks per stage (Megatron's interleaved 1F1B; stage p holds "
          "chunks p, p + pipeline, ...); the micro-batches must divide by parallel.pipeline",
          within(1, 1024)),
      // checkpoint
      key(
          "checkpoint.save", [](Config& c) { return &c.checkpoint.save; },
          "the directory checkpoints are written to",
          derived("= train.out_dir/checkpoints when save_interval > 0, else none")),
      key(
          "checkpoint.load", [](Config& c) { return &c.checkpoint.load; },
          "a checkpoint (or a save directory with `latest`) to start from; latest: the save directory's"),
      key(
          "checkpoint.save_interval", [](Config& c) { return &c.checkpoint.saveInterval; },
          "iterations between checkpoints; 0: only at the end, when save is set"),
      key(
          "checkpoint.keep_last", [](Config& c) { return &c.checkpoint.keepLast; },
          "step directories kept after each save; 0: all"),
      key(
          "checkpoint.load_model_only", [](Config& c) { return &c.checkpoint.loadModelOnly; },
          "only the model's weights from load (fine-tuning): step, optimizer state, RNG and data position "
          "start fresh"),
      key(
          "checkpoint.resume", [](Config& c) { return &c.checkpoint.resume; },
          "continue the run from the save directory's latest checkpoint, or start it (what --resume sets)"),
      key(
          "checkpoint.allow_changes", [](Config& c) { return &c.checkpoint.allowChanges; },
          "a resume may change any setting but the model's shape"),
  };
}

const std::vector<ConfigSection> kSections = {
    {"model", "The architecture and its shape, with Megatron's names in snake_case."},
    {"data", "The corpus and its tokenizer."},
    {"train", "The training loop: device, batches, iterations, logging, evaluation and the final sample."},
    {"optimizer",
     "AdamW or Adafactor. `betas` and `eps` are AdamW's; the `adafactor_*` keys are Adafactor's, whose "
     "defaults "
     "are HF's advice for an external learning rate."},
    {"lr_schedule", "A linear warm-up to `optimizer.lr`, then a decay to `optimizer.min_lr`."},
    {"precision", "The compute dtype, fp16's dynamic loss scaling and FP8 training."},
    {"zero_optimization", "DeepSpeed-style keys: ZeRO over chunks, offloading and the SSD tier's transfers."},
    {"store",
     "Where model state lives: each chunk's optimizer state stays on the GPU while its budget lasts, then "
     "goes "
     "to host memory, then to the SSD under `zero_optimization.nvme_path`."},
    {"dist", "Several ranks (`mpirun -np N`)."},
    {"parallel",
     "How the ranks split the model: the world is data x tensor ranks ([distributed.md](distributed.md)). "
     "`parallel: auto` in place of the section lets the plan choose the fastest split that fits "
     "([cli.md](cli.md#parallel-auto))."},
    {"checkpoint", "Saving, loading and resuming runs ([checkpoints.md](checkpoints.md))."},
};

std::string lastComponent(const std::string& name) {
  return name.substr(name.rfind('.') + 1);
}

std::string numberText(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// The shortest text that reads back as `v` (0.1, not 0.10000000000000001; 1e-5), for the reference.
std::string shortNumberText(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  STRATA_CHECK(ec == std::errc(), "cannot print {}", v);
  std::string text(buf, end);
  // 1e-5 rather than 1e-05, 1e6 rather than 1e+06.
  size_t e = text.find('e');
  if (e == std::string::npos) return text;
  std::string exponent = text.substr(e + 1), sign;
  if (exponent[0] == '-' || exponent[0] == '+') {
    sign = exponent[0] == '-' ? "-" : "";
    exponent.erase(0, 1);
  }
  exponent.erase(0, std::min(exponent.find_first_not_of('0'), exponent.size() - 1));
  return text.substr(0, e + 1) + sign + exponent;
}

std::string escapeCell(const std::string& text) {
  std::string out;
  for (char ch : text) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return out;
}

// A string as YAML would need it quoted to read back (empty, or holding control characters), else as it is.
std::string quotedString(const std::string& s) {
  bool plain = !s.empty() && std::none_of(s.begin(), s.end(), [](char ch) {
    return static_cast<unsigned char>(ch) < 0x20 || ch == '"' || ch == '\\';
  });
  if (plain) return s;
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '\n')
      out += "\\n";
    else if (ch == '\t')
      out += "\\t";
    else if (ch == '"' || ch == '\\')
      out += std::string("\\") + ch;
    else
      out += ch;
  }
  return out + "\"";
}

std::string rangeText(const ConfigKey& k) {
  auto bound = [](double v) { return shortNumberText(v); };
  if (k.max >= kConfigNoMax) return " ≥ " + bound(k.min);
  return " in [" + bound(k.min) + ", " + bound(k.max) + "]";
}

// The reference's type column.
std::string typeColumn(const ConfigKey& k) {
  if (!k.type.empty()) return k.type;
  if (!k.choices.empty()) {
    std::string out;
    for (const auto& c : k.choices) out += (out.empty() ? "" : ", ") + ("`" + c + "`");
    return out;
  }
  Config defaults;
  return std::visit(
      [&](auto* member) -> std::string {
        using T = std::remove_pointer_t<decltype(member)>;
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>)
          return "integer" + rangeText(k);
        if constexpr (std::is_same_v<T, double>) return "number" + rangeText(k);
        if constexpr (std::is_same_v<T, bool>) return "`true`, `false`";
        if constexpr (std::is_same_v<T, std::string>) return "string";
        if constexpr (std::is_same_v<T, std::vector<double>>) return "list of numbers, each" + rangeText(k);
      },
      k.member(defaults));
}

// The reference's default column: the default Config's value, and what it stands for when derived.
std::string defaultColumn(const ConfigKey& k) {
  Config defaults;
  std::string value = std::visit(
      [](auto* member) -> std::string {
        using T = std::remove_pointer_t<decltype(member)>;
        if constexpr (std::is_same_v<T, double>) return shortNumberText(*member);
        if constexpr (std::is_same_v<T, std::string>) return quotedString(*member);
        if constexpr (std::is_same_v<T, std::vector<double>>) {
          std::string text;
          for (double v : *member) text += (text.empty() ? "" : ", ") + shortNumberText(v);
          return "[" + text + "]";
        }
        if constexpr (std::is_same_v<T, bool>) return *member ? "true" : "false";
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>)
          return std::to_string(*member);
      },
      k.member(defaults));
  std::string out = "`" + value + "`";
  if (!k.derivedDefault.empty()) out += " (" + k.derivedDefault + ")";
  return out;
}

}  // namespace

const std::vector<ConfigKey>& configKeyTable() {
  static const std::vector<ConfigKey> table = makeTable();
  return table;
}

const std::vector<ConfigSection>& configSections() {
  return kSections;
}

const ConfigKey* findConfigKey(const std::string& name) {
  for (const auto& k : configKeyTable())
    if (k.name == name) return &k;
  return nullptr;
}

bool isConfigSection(const std::string& name) {
  for (const auto& k : configKeyTable())
    if (k.name.rfind(name + ".", 0) == 0) return true;
  return false;
}

std::string configValueText(const ConfigKey& key, const Config& config) {
  return std::visit(
      [](auto* member) -> std::string {
        using T = std::remove_pointer_t<decltype(member)>;
        if constexpr (std::is_same_v<T, double>) return numberText(*member);
        if constexpr (std::is_same_v<T, std::string>) return *member;
        if constexpr (std::is_same_v<T, std::vector<double>>) {
          std::string text;
          for (double v : *member) text += (text.empty() ? "" : ", ") + numberText(v);
          return "[" + text + "]";
        }
        if constexpr (std::is_same_v<T, bool>) return *member ? "true" : "false";
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>)
          return std::to_string(*member);
      },
      key.member(const_cast<Config&>(config)));
}

std::string configTypeName(const ConfigKey& key) {
  Config scratch;
  return std::visit(
      [](auto* member) -> std::string {
        using T = std::remove_pointer_t<decltype(member)>;
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>) return "an integer";
        if constexpr (std::is_same_v<T, double>) return "a number";
        if constexpr (std::is_same_v<T, bool>) return "true or false";
        if constexpr (std::is_same_v<T, std::string>) return "a string";
        if constexpr (std::is_same_v<T, std::vector<double>>) return "a list of numbers";
      },
      key.member(scratch));
}

std::string nearestConfigKey(const std::string& name) {
  // Candidates: every key and every section. Two distances: the whole dotted name's, and its last component's
  // against each candidate's last component plus one (a key under the wrong section: "model.micro_batch_size"
  // is train.micro_batch_size). A match is near when at most a third of the compared text changes, or two
  // characters of a short one.
  std::vector<std::string> candidates;
  for (const auto& k : configKeyTable()) {
    candidates.push_back(k.name);
    for (size_t dot = k.name.find('.'); dot != std::string::npos; dot = k.name.find('.', dot + 1)) {
      std::string section = k.name.substr(0, dot);
      if (std::find(candidates.begin(), candidates.end(), section) == candidates.end())
        candidates.push_back(section);
    }
  }
  std::string leaf = lastComponent(name);
  size_t leafPenalty = name.find('.') == std::string::npos ? 0 : 1;
  auto near = [](size_t distance, size_t length) { return distance <= 2 || 3 * distance <= length; };
  std::string best;
  size_t bestDistance = SIZE_MAX;
  for (const auto& c : candidates) {
    size_t whole = editDistance(name, c);
    if (near(whole, name.size()) && whole < bestDistance) {
      bestDistance = whole;
      best = c;
    }
    size_t part = editDistance(leaf, lastComponent(c)) + leafPenalty;
    if (near(part, leaf.size() + leafPenalty) && part < bestDistance) {
      bestDistance = part;
      best = c;
    }
  }
  return best;
}

std::string configReference() {
  std::string out =
      "# Configuration\n\n"
      "<!-- Generated by `build/strata config --list > docs/configuration.md` from the key table in "
      "src/config/ConfigKeys.cpp; edit the table, not this file. -->\n\n"
      "Every key of a YAML config, by section. In a file a key `a.b` is written `b:` under `a:`; on the "
      "command line `--set a.b=VALUE` overrides it. An unknown key, a key given twice, a wrong type or a "
      "value "
      "out of range stops before any work, naming the file, the line and the nearest valid key. A default in "
      "parentheses stands for what another key or the architecture decides.\n";
  size_t listed = 0;
  for (const auto& section : configSections()) {
    out += "\n## " + section.name + "\n\n" + section.doc + "\n\n";
    out += "| key | type | default | meaning |\n|---|---|---|---|\n";
    for (const auto& k : configKeyTable()) {
      if (k.name.rfind(section.name + ".", 0) != 0) continue;
      out += "| `" + k.name + "` | " + escapeCell(typeColumn(k)) + " | " + escapeCell(defaultColumn(k)) +
             " | " + escapeCell(k.doc) + " |\n";
      ++listed;
    }
  }
  STRATA_CHECK(listed == configKeyTable().size(),
               "the config reference lists {} of {} keys: a key's section is missing from configSections()",
               listed, configKeyTable().size());
  return out;
}

}  // namespace strata::config
