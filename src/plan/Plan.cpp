#include "strata/plan/Plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "models/bert/Bert.h"
#include "models/gpt/Gpt.h"
#include "models/t5/T5.h"
#include "strata/autograd/Functions.h"
#include "strata/config/Resolve.h"
#include "strata/core/Error.h"
#include "strata/data/Corruption.h"
#include "strata/distributed/Launch.h"

namespace strata::plan {

namespace {

std::string gib(uint64_t bytes) {
  if (bytes == zero::kUnlimited) return "unlimited";
  if (bytes < (1ull << 30)) return fmt::format("{:.1f} MiB", double(bytes) / double(1ull << 20));
  return fmt::format("{:.2f} GiB", double(bytes) / double(1ull << 30));
}

std::string seconds(double s) {
  if (s < 1e-3) return fmt::format("{:.0f} us", s * 1e6);
  if (s < 1) return fmt::format("{:.1f} ms", s * 1e3);
  return fmt::format("{:.2f} s", s);
}

bool flashHeadDim(int64_t d) {
  return d == 64 || d == 80 || d == 128;
}

// One transformer block's kept activations over `tokens` tokens (NOTE [Plan model]).
uint64_t blockBytes(uint64_t e, int64_t tokens, int64_t hidden, int64_t inner, int64_t ffn) {
  return e * uint64_t(tokens) * uint64_t(4 * hidden + 4 * inner + 2 * ffn);
}

// The S_q x S_k probabilities the composed attention keeps, per layer: once, twice with dropout.
uint64_t scoresBytes(uint64_t e, int64_t batch, int64_t heads, int64_t sq, int64_t sk, bool dropout) {
  return e * uint64_t(batch * heads) * uint64_t(sq) * uint64_t(sk) * (dropout ? 2 : 1);
}

// linearCrossEntropy: the head's input and its gradient, the fp32 weight gradient formed in the forward, and
// one chunk of logits (the softmax gradient is written over them).
uint64_t chunkedHeadBytes(uint64_t e, int64_t tokens, int64_t hidden, int64_t vocab) {
  uint64_t rows = uint64_t(tokens);
  uint64_t chunkLogits = std::min<uint64_t>(uint64_t(kLinearCrossEntropyChunkLogits), rows * uint64_t(vocab));
  return 2 * e * rows * uint64_t(hidden) + 4 * uint64_t(vocab) * uint64_t(hidden) + chunkLogits * e;
}

}  // namespace

std::string stateKindName(StateKind kind, DType compute, const std::string& optimizer) {
  bool adafactor = optimizer == "adafactor";
  switch (kind) {
    case kParameters:
      return compute == DType::F32 ? "fp32 parameters" : "16-bit parameters";
    case kMasters:
      return "fp32 masters";
    case kFirstMoments:
      return adafactor ? "Adafactor m" : "AdamW m";
    case kSecondMoments:
      return adafactor ? "Adafactor v (factored)" : "AdamW v";
    default:
      return "?";
  }
}

ActivationEstimate estimateActivations(const models::ModelSpec& spec, int64_t b, DType compute, bool onGpu,
                                       const std::string& recompute, int tensor, bool sequenceParallel,
                                       int pipeline, int virtualStages, int64_t microBatches) {
  ActivationEstimate a;
  uint64_t e = dtypeSize(compute);
  a.assumptions.push_back(
      fmt::format("{} activations, micro-batch {}, train.recompute {}", dtypeName(compute), b, recompute));
  // L blocks' kept activations: whole; without the MLP activation's output (selective); or each block's
  // inputs (the stream's two parts) plus one block recomputed at a time (full).
  // `stream`: the bytes of one element of the stream between blocks (e, or 4 for BERT's fp32 stream).
  auto blocks = [&](int64_t layers, uint64_t layer, int64_t tokens, int64_t hidden, int64_t ffn,
                    uint64_t stream = 0) {
    // Under tensor parallelism a rank keeps its part of the stream (the sequence's part with sequence
    // parallelism) and its columns of the MLP's activation (over the whole sequence).
    int64_t streamTokens = tensor > 1 && sequenceParallel ? tokens / tensor : tokens;
    if (tensor > 1) ffn /= tensor;
    if (recompute == "full")
      return uint64_t(layers) * 2 * (stream > 0 ? stream : e) * uint64_t(streamTokens * hidden) + layer;
    if (recompute == "selective") return uint64_t(layers) * (layer - e * uint64_t(tokens * ffn));
    return uint64_t(layers) * layer;
  };
  auto attentionNote = [&](bool fused, const std::string& why) {
    a.assumptions.push_back(fused ? "fused attention: no S x S scores kept"
                                  : "composed attention keeps the S x S probabilities (" + why + ")");
  };
  auto composedReason = [&](double dropout, int64_t headDim, const char* extra) {
    std::string why;
    if (!onGpu)
      why = "CPU";
    else if (dropout > 0 && !fusedAttentionDropout())
      why = fmt::format("dropout {} while training under STRATA_ATTENTION_DROPOUT=composed", dropout);
    else if (!flashHeadDim(headDim))
      why = fmt::format("head dim {}", headDim);
    if (extra != nullptr) why += std::string(why.empty() ? "" : ", ") + extra;
    return why;
  };
  switch (models::objective(spec.arch)) {
    case models::Objective::CausalLM: {
      models::GptConfig g = models::gptConfig(spec);
      int64_t t = b * g.seqLength, headDim = g.hiddenSize / g.numHeads;
      bool fused = onGpu && (g.dropout == 0 || fusedAttentionDropout()) && flashHeadDim(headDim);
      uint64_t layer = blockBytes(e, t, g.hiddenSize, g.hiddenSize, g.ffn());
      uint64_t scores = fused ? 0 : scoresBytes(e, b, g.numHeads, g.seqLength, g.seqLength, g.dropout > 0);
      int64_t T = std::max(1, tensor);
      if (T > 1) {
        // The heads' part (q, k, v, attention's output, 4 x inner) and the MLP's (2 x ffn) split; the
        // stream's (4 x hidden: the norms' inputs and outputs) split too under sequence parallelism.
        uint64_t whole = e * uint64_t(t) * uint64_t(4 * g.hiddenSize);
        layer = (sequenceParallel ? whole / uint64_t(T) : whole) + (layer - whole) / uint64_t(T);
        scores /= uint64_t(T);
        a.assumptions.push_back(fmt::format("parallel.tensor {}{}: a rank's share", T,
                                            sequenceParallel ? " with sequence parallelism" : ""));
      }
      int P = std::max(1, pipeline);
      if (P > 1) {
        // NOTE [Layouts]: the first stage's blocks for the micro-batches in flight, or the last's for one
        // beside the head, whichever is more, the blocks as the trainer splits them (NOTE [Pipeline stages]
        // in nn/Pipeline.h). Full recomputation keeps each micro-batch's block inputs and recomputes one
        // block at a time.
        std::vector<std::vector<int64_t>> rankBlocks = pipelineRankBlocks(spec, P, virtualStages);
        int64_t firstBlocks = int64_t(rankBlocks.front().size()),
                lastBlocks = int64_t(rankBlocks.back().size());
        uint64_t one = blocks(firstBlocks, layer + scores, t, g.hiddenSize, g.ffn());
        uint64_t lastOne = blocks(lastBlocks, layer + scores, t, g.hiddenSize, g.ffn());
        uint64_t shared = recompute == "full" ? layer + scores : 0;
        double inFlight = double(std::min<int64_t>(P, std::max<int64_t>(1, microBatches)));
        int V = std::max(1, virtualStages);
        if (V > 1) inFlight *= 1.0 + double(P - 1) / double(P * V);
        uint64_t firstStage = uint64_t(double(one - shared) * inFlight) + shared;
        uint64_t head =
            T > 1 ? 3 * e * uint64_t(t * g.hiddenSize) + 4 * uint64_t(g.vocabSize / T * g.hiddenSize) +
                        e * uint64_t(t) * uint64_t(g.vocabSize / T)
                  : e * uint64_t(t * g.hiddenSize) + chunkedHeadBytes(e, t, g.hiddenSize, g.vocabSize);
        if (firstStage >= lastOne + head) {
          a.terms.push_back(
              {fmt::format("first of {} stages: {} blocks x {} x {:.2f} micro-batches in flight{}", P,
                           firstBlocks, gib(layer + scores), inFlight,
                           V > 1 ? fmt::format(" ({} virtual stages)", V) : std::string()),
               firstStage});
          a.assumptions.push_back(
              fmt::format("pipeline {}: the first stage's 1F1B micro-batches in flight (NOTE [Layouts])", P));
        } else {
          a.terms.push_back(
              {fmt::format("last of {} stages: {} blocks x {}", P, lastBlocks, gib(layer + scores)),
               lastOne});
          a.terms.push_back({"final norm, LM head and loss", head});
          a.assumptions.push_back(
              fmt::format("pipeline {}: the last stage, one micro-batch and the head", P));
        }
        attentionNote(fused, composedReason(g.dropout, headDim, nullptr));
        break;
      }
      a.terms.push_back({fmt::format("{} blocks x {}", g.numLayers, gib(layer + scores)),
                         blocks(g.numLayers, layer + scores, t, g.hiddenSize, g.ffn())});
      if (T > 1) {
        // The vocabulary-parallel head: the final norm's output gathered whole, its gradient, the fp32
        // gradient of this rank's rows of the table, and the [tokens, V/T] logits its loss keeps.
        int64_t vocabRows = g.vocabSize / T;
        a.terms.push_back({"final norm, vocabulary-parallel LM head and loss",
                           3 * e * uint64_t(t * g.hiddenSize) + 4 * uint64_t(vocabRows * g.hiddenSize) +
                               e * uint64_t(t) * uint64_t(vocabRows)});
      } else {
        a.terms.push_back(
            {"final norm, chunked LM head and loss",
             e * uint64_t(t * g.hiddenSize) + chunkedHeadBytes(e, t, g.hiddenSize, g.vocabSize)});
      }
      attentionNote(fused, composedReason(g.dropout, headDim, nullptr));
      break;
    }
    case models::Objective::MaskedLM: {
      models::BertConfig c = models::bertConfig(spec);
      int64_t t = b * c.seqLength, headDim = c.hiddenSize / c.numHeads;
      bool fused = onGpu && (c.dropout == 0 || fusedAttentionDropout()) && flashHeadDim(headDim);
      uint64_t layer = blockBytes(e, t, c.hiddenSize, c.hiddenSize, c.ffn());
      // NOTE [BERT's fp32 residual stream]: each norm keeps an fp32 sum and each sublayer a 16-bit copy of
      // the stream, 4 more bytes per element for each of the two.
      bool wideStream = c.fp32Residual && e == 2;
      if (wideStream) {
        layer += 8 * uint64_t(t * c.hiddenSize);
        a.assumptions.push_back("model.fp32_residual: the stream between the layers in fp32");
      }
      uint64_t scores = fused ? 0 : scoresBytes(e, b, c.numHeads, c.seqLength, c.seqLength, c.dropout > 0);
      int64_t T = std::max(1, tensor);
      if (T > 1) {
        // As GPT's: the heads' and the MLP's part split, the stream's (and its fp32 copies) whole.
        uint64_t whole =
            e * uint64_t(t) * uint64_t(4 * c.hiddenSize) + (wideStream ? 8 * uint64_t(t * c.hiddenSize) : 0);
        layer = whole + (layer - whole) / uint64_t(T);
        scores /= uint64_t(T);
        a.assumptions.push_back(fmt::format("parallel.tensor {}: a rank's share", T));
      }
      a.terms.push_back({fmt::format("{} blocks x {}", c.numLayers, gib(layer + scores)),
                         blocks(c.numLayers, layer + scores, t, c.hiddenSize, c.ffn(), wideStream ? 4 : e)});
      // Training runs the MLM head on the chosen tokens only (data::mlmMask: 15% of each row, the count
      // rounded up to kMlmPositionAlign rows): its transform (dense, GELU, LayerNorm) and their logits, kept
      // by the loss, with the fp32 gradient its backward forms.
      double share = data::MlmMaskingOptions{}.maskProbability;
      int64_t chosen =
          std::min<int64_t>(t, (int64_t(std::ceil(share * double(t))) + data::kMlmPositionAlign - 1) /
                                   data::kMlmPositionAlign * data::kMlmPositionAlign);
      a.terms.push_back(
          {fmt::format("MLM head on {} chosen tokens{}", chosen,
                       T > 1 ? ", its logits split by the vocabulary" : ""),
           4 * e * uint64_t(chosen * c.hiddenSize) + (e + 4) * uint64_t(chosen) * uint64_t(c.vocabSize / T)});
      attentionNote(fused, composedReason(c.dropout, headDim, nullptr));
      break;
    }
    case models::Objective::SpanCorruption: {
      models::T5Config c = models::t5Config(spec);
      int64_t te = b * c.seqLength, td = b * c.decoderSeqLength, inner = c.innerSize();
      int64_t ffn = c.gatedGelu ? 2 * c.ffnHiddenSize : c.ffnHiddenSize;
      bool dropout = c.dropout > 0;
      bool crossFused = onGpu && (!dropout || fusedAttentionDropout()) && flashHeadDim(c.headDim);
      // Self-attention carries the relative position bias: always the composed path.
      uint64_t enc = blockBytes(e, te, c.hiddenSize, inner, ffn) +
                     scoresBytes(e, b, c.numHeads, c.seqLength, c.seqLength, dropout);
      uint64_t dec =
          blockBytes(e, td, c.hiddenSize, inner, ffn) +
          scoresBytes(e, b, c.numHeads, c.decoderSeqLength, c.decoderSeqLength, dropout) +
          // cross-attention: its norm and q input, q, the encoder's k and v, the output
          e * uint64_t(td * (2 * c.hiddenSize + 2 * inner) + 2 * te * inner) +
          (crossFused ? 0 : scoresBytes(e, b, c.numHeads, c.decoderSeqLength, c.seqLength, dropout));
      int64_t T = std::max(1, tensor);
      if (T > 1) {
        // The heads' and the feed-forward's parts split T ways (the relative bias by heads too); the stream's
        // (4 x hidden a block, and the cross-attention's norm and q input) whole.
        uint64_t encWhole = e * uint64_t(te) * uint64_t(4 * c.hiddenSize);
        uint64_t decWhole = e * uint64_t(td) * uint64_t(6 * c.hiddenSize);
        enc = encWhole + (enc - encWhole) / uint64_t(T);
        dec = decWhole + (dec - decWhole) / uint64_t(T);
        a.assumptions.push_back(fmt::format("parallel.tensor {}: a rank's share", T));
      }
      a.terms.push_back(
          {fmt::format("{} encoder blocks x {}", c.numLayers, gib(enc)), uint64_t(c.numLayers) * enc});
      a.terms.push_back({fmt::format("{} decoder blocks x {}", c.decoderLayers(), gib(dec)),
                         uint64_t(c.decoderLayers()) * dec});
      if (T > 1)
        // The vocabulary-parallel head, as GPT's.
        a.terms.push_back({"final norms, vocabulary-parallel LM head and loss",
                           e * uint64_t(te * c.hiddenSize) + 3 * e * uint64_t(td * c.hiddenSize) +
                               4 * uint64_t(c.vocabSize / T * c.hiddenSize) +
                               e * uint64_t(td) * uint64_t(c.vocabSize / T)});
      else
        a.terms.push_back(
            {"final norms, chunked LM head and loss",
             e * uint64_t((te + td) * c.hiddenSize) + chunkedHeadBytes(e, td, c.hiddenSize, c.vocabSize)});
      a.assumptions.push_back(
          "self-attention with T5's relative position bias runs composed: S x S probabilities kept");
      if (!crossFused)
        attentionNote(false, "cross-attention: " + composedReason(c.dropout, c.headDim, nullptr));
      break;
    }
  }
  for (const ActivationTerm& t : a.terms) a.bytes += t.bytes;
  return a;
}

namespace {

// The plan at the config's own train.recompute (none, selective or full).
ModelStatePlan planAtRecompute(const config::Config& c, const PlanOptions& options) {
  ModelStatePlan p;
  p.recompute = c.train.recompute;
  p.ranks = std::max(1, options.ranks);
  p.machineSource = options.calibration ? options.calibrationSource : "the reference H200";
  p.ranksPerNode = options.ranksPerNode > 0 ? std::min(options.ranksPerNode, p.ranks) : p.ranks;
  // The layout (NOTE [Layouts]): data x tensor x pipeline ranks, over machines of ranksPerNode.
  int tensor = int(std::max<int64_t>(1, c.parallel.tensor));
  p.tensor = tensor;
  p.pipeline = int(std::max<int64_t>(1, c.parallel.pipeline));
  p.virtualStages = p.pipeline > 1 ? int(std::max<int64_t>(1, c.parallel.virtualStages)) : 1;
  p.data = std::max(1, p.ranks / (tensor * p.pipeline));
  p.nodes = (p.ranks + p.ranksPerNode - 1) / p.ranksPerNode;
  // The machine: the calibration's figures, the reference H200 for any it lacks.
  Calibration h200 = measuredH200();
  p.machine = options.calibration.value_or(h200);
  // The device training runs on: train.device, with auto meaning the machine's GPU when it has one (a
  // machine described without a GPU plans the CPU run that `strata train` would make there).
  bool machineHasGpu = p.machine.deviceMemoryBytes.has_value();
  p.onGpu = c.train.device == "auto" ? machineHasGpu : Device::parse(c.train.device).isCuda();
  auto fill = [&](auto& field, const auto& fallback, const char* what) {
    if (field) return;
    field = fallback;
    if (options.calibration)
      p.notes.push_back(
          fmt::format("{}: not in {}; the reference H200's figure", what, options.calibrationSource));
  };
  if (p.onGpu) {
    fill(p.machine.deviceName, h200.deviceName, "device");
    fill(p.machine.deviceMemoryBytes, h200.deviceMemoryBytes, "device memory");
    fill(p.machine.h2dGBs, h200.h2dGBs, "H2D bandwidth");
    fill(p.machine.d2hGBs, h200.d2hGBs, "D2H bandwidth");
    fill(p.machine.gemmTflops, h200.gemmTflops, "GEMM rate");
  }
  if (p.onGpu && p.ranks > 1) fill(p.machine.nvlinkBusGBs, h200.nvlinkBusGBs, "NVLink bus bandwidth");
  if (p.onGpu && p.nodes > 1 && !p.machine.networkGBs) {
    p.machine.networkGBs = kNetworkGBs;
    p.notes.push_back(fmt::format(
        "network between machines: not in {}; {:.0f} GB/s a GPU (8 x 400 Gb/s NICs for 8 GPUs)",
        options.calibration ? options.calibrationSource : std::string("the reference H200's figures"),
        kNetworkGBs));
  }
  fill(p.machine.hostMemoryBytes, h200.hostMemoryBytes, "host memory");
  fill(p.machine.cpuAdamwElemsPerS, h200.cpuAdamwElemsPerS, "CPU AdamW rate");
  fill(p.machine.nvmeWriteGBs, h200.nvmeWriteGBs, "SSD write bandwidth");
  fill(p.machine.nvmeReadGBs, h200.nvmeReadGBs, "SSD read bandwidth");
  if (c.zero.nvmePath.empty())
    p.machine.nvmeFreeBytes = p.machine.nvmeFreeBytes.value_or(0);  // no SSD tier: its space is not asked
  fill(p.machine.nvmeFreeBytes, h200.nvmeFreeBytes, "SSD free space");
  const Calibration& m = p.machine;

  p.compute = config::computeDTypeFor(c, p.onGpu ? Device::cuda(0) : Device::cpu());
  p.spec = config::modelSpecFrom(c, Device::cpu());
  p.parameters = models::numParameters(p.spec);
  p.microBatch = c.train.microBatchSize;
  // The ranks that split the batch: all of them, or the data-parallel ones under tensor and pipeline
  // parallelism.
  int dataRanks = p.data;
  p.globalBatch = c.train.globalBatchSizeSet ? c.train.globalBatchSize : c.train.microBatchSize * dataRanks;
  if (p.globalBatch % (p.microBatch * dataRanks) != 0) {
    p.fits = false;
    p.refusal =
        fmt::format("train.global_batch_size {} is not a multiple of micro_batch_size {} x {} {}ranks",
                    p.globalBatch, p.microBatch, dataRanks, p.ranks > dataRanks ? "data-parallel " : "");
  }
  p.accumulation = std::max<int64_t>(1, p.globalBatch / (p.microBatch * dataRanks));

  p.inputs = modelStateInputs(c, p.ranks, p.compute);
  const ModelStateInputs& in = p.inputs;
  p.optimizer = c.optimizer.type;
  p.momentsDType = momentsDType(c);
  p.activations =
      estimateActivations(p.spec, p.microBatch, p.compute, p.onGpu, c.train.recompute, tensor,
                          c.parallel.sequenceParallel, p.pipeline, p.virtualStages, p.accumulation);
  // Gradient buffers: every chunk's while backward accumulates; after the last backward's reduce-scatter
  // (stage >= 2, several ranks) only the shards and two chunks in flight.
  bool shardedGrads = in.stage >= 2 && in.ranks > 1;
  uint64_t inFlight = std::min<uint64_t>(2, in.layout.chunks.size()) * uint64_t(in.largestChunkElems) * 4;
  uint64_t gradientsAtUpdate = shardedGrads ? in.gradientShardBytes + inFlight : in.gradientBytes;
  // NOTE [Plan model]: with accumulation the gradients of earlier micro-batches live through later forwards.
  // NOTE [Plan model]: the backward's own buffers beside what the forward kept (kBackwardAllowance).
  p.transientBytes = uint64_t(kBackwardAllowance * double(p.activations.bytes));
  uint64_t working =
      p.transientBytes + (p.accumulation > 1 ? p.activations.bytes + in.gradientBytes
                                             : std::max(p.activations.bytes, gradientsAtUpdate));
  p.gradientPeakBytes = p.accumulation > 1 ? in.gradientBytes : gradientsAtUpdate;
  p.workspaceBytes = (p.onGpu ? kDeviceWorkspaceBytes : 0) + in.gatherBytes;
  uint64_t nonModel = working + p.workspaceBytes + in.powerSgdBytes;
  // A CPU run's device is this rank's share of the host (NOTE [Per-node shares] in distributed/Launch.h).
  p.deviceCapacityBytes =
      p.onGpu ? *m.deviceMemoryBytes
              : dist::perRankShare(m.hostAvailableBytes.value_or(*m.hostMemoryBytes), p.ranksPerNode);

  // What the step may take of the device: the memory tracer's own limit.
  p.usableBytes = p.onGpu ? usableDeviceBytes(p.deviceCapacityBytes) : p.deviceCapacityBytes;
  // Budgets, as the engine reads them (storeBudgets), with auto on the device being what the memory tracer
  // will measure: the usable device less the step's non-model memory.
  uint64_t deviceAuto = p.usableBytes > nonModel ? p.usableBytes - nonModel : 0;
  // The ranks on one machine split its memory, disk and cores (NOTE [Per-node shares] in
  // distributed/Launch.h).
  uint64_t hostAvailable = m.hostAvailableBytes.value_or(*m.hostMemoryBytes);
  p.hostShareBytes = dist::perRankShare(hostAvailable, p.ranksPerNode);
  p.nvmeShareBytes = dist::perRankShare(c.zero.nvmePath.empty() ? 0 : *m.nvmeFreeBytes, p.ranksPerNode);
  p.cpuThreadShare = m.cpuThreads > 0 ? int(dist::perRankShare(uint64_t(m.cpuThreads), p.ranksPerNode)) : 0;
  // NOTE [Host headroom]: the system's reserve and the store's working memory stay out of the host budget.
  uint64_t headroom =
      dist::perRankShare(hostHeadroomBytes(c, in.largestChunkElems, *m.hostMemoryBytes), p.ranksPerNode);
  p.budgets = storeBudgets(c, in.parameterBytes, p.onGpu ? deviceAuto : zero::kUnlimited, p.hostShareBytes,
                           p.nvmeShareBytes, headroom);
  if (p.ranksPerNode > 1)
    p.notes.push_back(fmt::format(
        "{} ranks on one machine: each plans with its share of the host's {} available, the SSD's {} free "
        "and "
        "{} CPU threads{}",
        p.ranksPerNode, gib(hostAvailable), gib(c.zero.nvmePath.empty() ? 0 : *m.nvmeFreeBytes), m.cpuThreads,
        p.ranks > p.ranksPerNode
            ? fmt::format(" ({} machines)", (p.ranks + p.ranksPerNode - 1) / p.ranksPerNode)
            : std::string()));
  if (!p.onGpu) {
    p.notes.push_back("a CPU run: the device tier is host memory too; no step time is predicted");
  } else if (c.zero.offloadOptimizerDevice == "none" &&
             (c.store.gpuBudgetGb.empty() || c.store.gpuBudgetGb == "auto")) {
    p.notes.push_back(fmt::format(
        "store.gpu_budget_gb auto: the {} a step may use of the device's {} less {} of non-model memory "
        "(estimated here; the engine starts from this placement, and where its memory tracer runs, it "
        "measures the first step and brings more state onto the device while it fits; "
        "store.gpu_budget_gb={:.1f} fixes this placement)",
        gib(p.usableBytes), gib(p.deviceCapacityBytes), gib(nonModel),
        double(p.budgets.device) / double(1ull << 30)));
  }
  p.notes.push_back(fmt::format(
      "host budget: {} (store.host_budget_gb {}; auto is the {} available{} less {} of headroom for the "
      "system and the store's staging, at most 90%)",
      gib(p.budgets.host), c.store.hostBudgetGb, gib(p.hostShareBytes),
      p.ranksPerNode > 1 ? " to this rank" : "", gib(headroom)));
  if (p.budgets.nvme > 0)
    p.notes.push_back(fmt::format("SSD budget: {} in {} (store.nvme_budget_gb {})", gib(p.budgets.nvme),
                                  c.zero.nvmePath, c.store.nvmeBudgetGb));

  // The placement: the store's own function, as the engine calls it (m and v on the SSD in
  // store.nvme_state_dtype, or bf16 with optimizer.moments_dtype bf16).
  uint64_t hostBudget = p.budgets.host;
  GradientBuffers gradientBuffers{in.paddedElems, in.rangeElems,  in.gradientDType, in.stage,
                                  in.ranks,       p.pipeline > 1, p.onGpu};
  zero::ParameterHome home = zero::parseParameterHome(c.store.parameterHome);
  bool autoDeviceBudget = c.store.gpuBudgetGb.empty() || c.store.gpuBudgetGb == "auto";
  try {
    p.placement =
        placeWithHostReserves(c, p.compute, gradientBuffers, p.budgets, [&](const zero::StoreBudgets& b) {
          zero::StorePlacement placed =
              zero::placeModelState(in.parameterChunkBytes, home, in.optimizerBytes, b, in.nvmeBytes);
          // NOTE [Parameter homes]: below stage 3, homed chunks are copied into an arena of their own,
          // which the automatic device budget then leaves room for.
          bool homes = placed.parameterHostBytes + placed.parameterNvmeBytes > 0;
          if (in.stage == 3 || !homes || !autoDeviceBudget || !p.onGpu) return placed;
          zero::StoreBudgets less = b;
          if (less.device != zero::kUnlimited)
            less.device = less.device > in.homeGatherBytes ? less.device - in.homeGatherBytes : 0;
          return zero::placeModelState(in.parameterChunkBytes, home, in.optimizerBytes, less, in.nvmeBytes);
        });
    uint64_t homedBytes = p.placement.parameterHostBytes + p.placement.parameterNvmeBytes;
    if (in.stage < 3 && homedBytes > 0) p.workspaceBytes += in.homeGatherBytes;
    // What the engine refuses with parameters homed off the device (train/ModelState.cpp, homeParameters).
    if (homedBytes > 0) {
      std::string refused = in.stage == 1 || in.stage == 2 ? "zero_optimization.stage 1 and 2"
                            : c.store.delayedUpdate        ? "store.delayed_update"
                            : p.pipeline > 1               ? "parallel.pipeline"
                                                           : "";
      if (!refused.empty())
        STRATA_USER_FAIL(
            "{} of parameters would be homed off the device (store.parameter_home {}), which {} does not "
            "support: use zero_optimization.stage 0 or 3, or store.parameter_home: device with "
            "room for them in store.gpu_budget_gb",
            gib(homedBytes), c.store.parameterHome, refused);
    }
    uint64_t reserve = delayedUpdateReserveBytes(c, p.compute, in.rangeElems, p.placement);
    if (reserve > 0)
      p.notes.push_back(fmt::format(
          "store.delayed_update: {} of host memory for the pending update of the SSD chunks (their "
          "gradients and new parameters), so the host budget for state is {}",
          gib(reserve), gib(p.budgets.host)));
  } catch (const Error& e) {
    if (p.budgets.host < hostBudget)
      p.notes.push_back(fmt::format(
          "store.delayed_update: the host budget for state was lowered to {} to leave room for the pending "
          "update of the SSD chunks (their gradients and new parameters)",
          gib(p.budgets.host)));
    p.placement = zero::StorePlacement{};
    p.placement.parameterBytes = in.parameterBytes;
    if (p.fits) {
      p.fits = false;
      p.refusal = e.message();
    }
  }
  // State off the device with fp32 gradient buffers for 16-bit parameters: 16-bit buffers would leave half of
  // them to optimizer state on the device.
  bool offDevice = p.placement.chunksOn(zero::Tier::Host) > 0 || p.placement.chunksOn(zero::Tier::Nvme) > 0;
  if (p.fits && offDevice && dtypeSize(p.compute) == 2 && in.gradientDType == DType::F32)
    p.notes.push_back(
        fmt::format("precision.grad_accum_dtype: {} would keep the gradient buffers in 16 bits, {} less on "
                    "the device for more of the optimizer state there (micro-batches then add in 16 bits)",
                    dtypeName(p.compute), gib(in.gradientBytes / 2)));
  // Bytes by kind and tier: an fp32 chunk whose state stays on the device has no separate master (the engine
  // counts it so too).
  p.kindBytes[kParameters][int(zero::Tier::Device)] = p.placement.parameterBytes;
  p.kindBytes[kParameters][int(zero::Tier::Host)] = p.placement.parameterHostBytes;
  p.kindBytes[kParameters][int(zero::Tier::Nvme)] = p.placement.parameterNvmeBytes;
  for (size_t i = 0; i < p.placement.optimizerTier.size(); ++i) {
    int tier = int(p.placement.optimizerTier[i]);
    uint64_t range = uint64_t(in.rangeElems[i]) * 4;
    bool onSsd = p.placement.optimizerTier[i] == zero::Tier::Nvme;
    bool master = p.compute != DType::F32 || p.placement.optimizerTier[i] != zero::Tier::Device;
    if (master) p.kindBytes[kMasters][tier] += range;
    p.kindBytes[kFirstMoments][tier] += onSsd ? in.nvmeFirstMomentBytes[i] : in.firstMomentBytes[i];
    p.kindBytes[kSecondMoments][tier] += onSsd ? in.nvmeSecondMomentBytes[i] : in.secondMomentBytes[i];
    if (!master) {
      p.placement.bytes[tier] -= range;
      p.placement.optimizerBytes[i] -= range;
    }
  }

  uint64_t optimizerBytes = 0;
  for (int k : {kMasters, kFirstMoments, kSecondMoments})
    for (int t = 0; t < zero::kNumTiers; ++t) optimizerBytes += p.kindBytes[k][t];
  if (in.rangeElemsTotal() > 0)
    p.optimizerBytesPerParameter = double(optimizerBytes) / double(in.rangeElemsTotal());

  // NOTE [Gradient homes] in zero/GradientReducer.h: the gradients of chunks whose optimizer state is off the
  // device (store.gradient_home host; auto: those whose parameters are homed off it too) leave the device as
  // they complete in the last backward. With one micro-batch a step the device then holds at the update the
  // other chunks' buffers and those still accumulating; with several, every buffer lives through the last
  // forward anyway. The placement above assumed every buffer on the device: what they free is headroom.
  const std::string& gradientHome = c.store.gradientHome;
  std::string gradientsStay = in.stage != 0 && in.stage != 3
                                  ? fmt::format("zero_optimization.stage {}", in.stage)
                              : p.pipeline > 1          ? std::string("parallel.pipeline")
                              : c.dist.powersgdRank > 0 ? std::string("dist.powersgd_rank")
                                                        : std::string();
  if (gradientHome == "host" && !gradientsStay.empty() && p.fits) {
    p.fits = false;
    p.refusal = fmt::format(
        "store.gradient_home is host, but gradients cannot leave the GPU with {}: set store.gradient_home "
        "to auto or device",
        gradientsStay);
  }
  if (gradientHome != "device" && gradientsStay.empty() && p.onGpu) {
    GradientHomes homes = gradientHomes(c, gradientBuffers, p.placement);
    p.gradientHomeElems = homes.elems;
    p.gradientHomeBytes = homes.bytes;
    if (p.gradientHomeBytes > 0 && p.accumulation == 1) {
      uint64_t stay = gradientsAtUpdate > p.gradientHomeBytes ? gradientsAtUpdate - p.gradientHomeBytes : 0;
      if (!shardedGrads) stay = std::min(in.gradientBytes, stay + inFlight);
      p.gradientPeakBytes = stay;
      working = p.transientBytes + std::max(p.activations.bytes, stay);
    }
    if (p.gradientHomeBytes > 0)
      p.notes.push_back(fmt::format(
          "store.gradient_home {}: {} of gradients go to host memory as their chunks complete in backward "
          "(page-locked buffers kept across steps{}){}",
          gradientHome, gib(p.gradientHomeBytes),
          c.store.hostBudgetGb.empty() || c.store.hostBudgetGb == "auto"
              ? fmt::format(", which the automatic host budget leaves room for: {} for state",
                            gib(p.budgets.host))
              : std::string(),
          p.accumulation > 1 ? "; with gradient accumulation every buffer is on the device through the last "
                               "micro-batch's forward, so the peak keeps them"
                             : "; the device no longer holds them at the update"));
  }
  nonModel = working + p.workspaceBytes + in.powerSgdBytes;
  p.devicePeakBytes = p.placement.bytes[int(zero::Tier::Device)] + nonModel;
  if (p.placement.optimizerTier.empty()) p.devicePeakBytes = in.parameterBytes + nonModel;
  if (!p.onGpu && p.fits &&
      p.devicePeakBytes + p.placement.bytes[int(zero::Tier::Host)] > p.deviceCapacityBytes) {
    // A CPU run keeps everything in host memory: its state, activations and gradient buffers.
    p.fits = false;
    p.refusal = fmt::format(
        "the CPU run needs {} of host memory (model state {}, activations {}, gradient buffers {}), over the "
        "{} "
        "available",
        gib(p.devicePeakBytes + p.placement.bytes[int(zero::Tier::Host)]), gib(p.placement.total()),
        gib(p.activations.bytes), gib(p.gradientPeakBytes), gib(p.deviceCapacityBytes));
  }
  if (p.onGpu && p.fits && p.devicePeakBytes > p.usableBytes) {
    p.fits = false;
    p.refusal = fmt::format(
        "the device needs {} at its peak (parameters {}, optimizer state {}, activations {} and the "
        "backward's {}, gradient buffers {}, workspace {}), over the {} a step may use of its {}",
        gib(p.devicePeakBytes), gib(p.placement.parameterBytes),
        gib(p.placement.bytes[int(zero::Tier::Device)] - p.placement.parameterBytes),
        gib(p.activations.bytes), gib(p.transientBytes), gib(p.gradientPeakBytes), gib(p.workspaceBytes),
        gib(p.usableBytes), gib(p.deviceCapacityBytes));
  }

  // NOTE [Masters at layout] in plan/PlacementInputs.h: each rank makes its shard of the masters (stages 1
  // to 3) beside its 16-bit chunks (at stage 3 its shard of them) while the model is laid out.
  if (p.onGpu) {
    uint64_t modelElems = 0;
    for (const zero::ChunkSlot& slot : in.layout.slots) modelElems += uint64_t(slot.numel);
    if (dtypeSize(p.compute) == 2) {
      // This rank's own figures, padding and expert families included: its ranges' masters at stages 1 to
      // 3 (every padded chunk's at stage 0), and its 16-bit chunks (their shards at stage 3).
      LayoutElems elems{uint64_t(in.rangeElemsTotal()), in.parameterBytes / dtypeSize(p.compute)};
      MasterLayout ml =
          mastersAtLayout(c, elems, p.deviceCapacityBytes, hostAvailable, *m.hostMemoryBytes, p.ranksPerNode);
      if (p.data > 1 && c.zero.stage >= 1)
        p.notes.push_back(fmt::format(
            "at start each rank makes only what it keeps (NOTE [Sharded layout] in zero/ChunkManager.h): {} "
            "of "
            "fp32 masters, its 1/{} of the model's {}, beside {} of 16-bit chunks ({})",
            gib(elems.masters * 4), p.data, gib(modelElems * 4), gib(elems.chunks * 2),
            c.zero.stage == 3 ? fmt::format("its 1/{} of them", p.data)
                              : std::string("every chunk: zero_optimization.stage 3 shards them too")));
      if (p.fits && !ml.fits) {
        p.fits = false;
        p.refusal = fmt::format(
            "the fp32 masters ({}) fit neither host memory ({} free beyond the headroom) nor the device "
            "beside the 16-bit chunks ({} of room), nor the two together, while the model is laid out in "
            "chunks",
            gib(ml.masters), gib(ml.hostRoom), gib(ml.deviceRoom));
      } else if (ml.hostBytes > 0 && ml.hostBytes < ml.masters) {
        p.notes.push_back(fmt::format(
            "the fp32 masters ({}) outgrow host memory ({} free beyond the headroom) while the model is laid "
            "out: {} are made there and {} on the device, until the optimizer takes each to its tier",
            gib(ml.masters), gib(ml.hostRoom), gib(ml.hostBytes), gib(ml.masters - ml.hostBytes)));
      }
    }
  }

  // Step time.
  double tokens = double(p.globalBatch) * double(p.spec.seqLength);
  p.flopsPerStep = models::flopsPerToken(p.spec) * tokens / double(p.ranks);
  if (!p.onGpu) return p;
  double gemm = *m.gemmTflops * 1e12;
  double memoryGBs = m.deviceMemoryGBs.value_or(kDeviceUpdateGBs);
  double nvlink = m.nvlinkBusGBs.value_or(kCollectiveBusGBs);
  // NOTE [Layouts]: the slowest pipeline stage's FLOPs, its blocks as the trainer splits them and on the
  // last stage the LM head (6 V h a token), over its tensor-parallel ranks; without a pipeline, the step's
  // over the ranks.
  double headFlops = p.pipeline > 1 ? 6.0 * double(p.spec.vocabSize) * double(p.spec.hiddenSize) : 0;
  double blockFlops = (models::flopsPerToken(p.spec) - headFlops) / double(p.spec.numLayers);
  int64_t stageBlocks = p.spec.numLayers;  // the most blocks a rank holds
  double slowest = models::flopsPerToken(p.spec);
  if (p.pipeline > 1) {
    std::vector<std::vector<int64_t>> rankBlocks = pipelineRankBlocks(p.spec, p.pipeline, p.virtualStages);
    slowest = 0;
    stageBlocks = 0;
    for (size_t r = 0; r < rankBlocks.size(); ++r) {
      double flops = double(rankBlocks[r].size()) * blockFlops + (r + 1 == rankBlocks.size() ? headFlops : 0);
      slowest = std::max(slowest, flops);
      stageBlocks = std::max(stageBlocks, int64_t(rankBlocks[r].size()));
    }
  }
  double stageFlops = slowest * tokens / double(p.data * tensor);
  // NOTE [Recompute auto]: full recomputation runs each block's forward again (a third more FLOPs, the head's
  // included); selective reads and writes the MLP's activation once more, at memory speed.
  double computed = stageFlops * (p.recompute == "full" ? 4.0 / 3.0 : 1.0);
  double computeSeconds = computed / (gemm * kComputeEfficiency);
  p.terms.push_back(
      {"compute", computeSeconds,
       fmt::format("{:.3g} FLOP{}{} / ({:.0f} TFLOP/s GEMM x {:.2f} efficiency)", computed,
                   p.pipeline > 1 ? fmt::format(" (the slowest of {} stages)", p.pipeline) : std::string(),
                   p.recompute == "full" ? " (the blocks' forward twice: train.recompute full)" : "",
                   *m.gemmTflops, kComputeEfficiency),
       false});
  if (p.pipeline > 1) {
    // NOTE [Layouts]: the 1F1B schedule idles (P-1) / (V M) of the compute (Narayanan et al. 2021).
    double share = double(p.pipeline - 1) / (double(p.virtualStages) * double(p.accumulation));
    p.terms.push_back(
        {"bubble", computeSeconds * share,
         fmt::format("(P-1)/(V x M) = {}/({} x {}) = {:.3f} of the compute: the 1F1B schedule's "
                     "fill and drain",
                     p.pipeline - 1, p.virtualStages, p.accumulation, share),
         false});
  }
  if (p.recompute == "selective") {
    double bytes = 2.0 * double(dtypeSize(p.compute)) * tokens / double(p.ranks) * double(p.spec.numLayers) *
                   double(p.spec.ffnHiddenSize > 0 ? p.spec.ffnHiddenSize : 4 * p.spec.hiddenSize);
    p.terms.push_back({"recompute", bytes / (memoryGBs * 1e9),
                       fmt::format("the MLP activations again: {} read and written at {:.1f} TB/s",
                                   gib(uint64_t(bytes / 2)), memoryGBs / 1000),
                       false});
  }
  int64_t deviceElems = 0, offElems = 0;
  for (size_t i = 0; i < p.placement.optimizerTier.size(); ++i)
    (p.placement.optimizerTier[i] == zero::Tier::Device ? deviceElems : offElems) += in.rangeElems[i];
  const DType moments = momentsDType(c);
  if (deviceElems > 0)
    p.terms.push_back({"device update",
                       double(deviceElems) * deviceUpdateBytesPerElem(moments) / (memoryGBs * 1e9),
                       fmt::format("{:.3g} elements x {:.0f} B at {:.1f} TB/s", double(deviceElems),
                                   deviceUpdateBytesPerElem(moments), memoryGBs / 1000),
                       false});
  if (tensor > 1) {
    // Megatron's tensor parallelism: per block one all-reduce of the micro-batch's [B, S, hidden] stream
    // after attention and one after the MLP, in the forward and (f) in the backward, and the forward's again
    // under full recomputation; sequence parallelism swaps each for an all-gather and a reduce-scatter of
    // the same volume. A ring moves 2 (T-1)/T of the buffer per all-reduce; the steps wait for them.
    double buffer = double(dtypeSize(p.compute)) * double(p.microBatch) * double(p.spec.seqLength) *
                    double(p.spec.hiddenSize);
    double perBlock = p.recompute == "full" ? 6 : 4;
    double moved = 2.0 * double(tensor - 1) / double(tensor) * buffer * perBlock * double(stageBlocks) *
                   double(p.accumulation);
    p.terms.push_back(
        {"TP collectives", moved / (nvlink * 1e9),
         fmt::format("{:.3g} B over NVLink at {:.0f} GB/s bus bandwidth, {} all-reduces a block "
                     "per micro-batch",
                     moved, nvlink, int(perBlock)),
         false});
  }
  if (p.pipeline > 1) {
    // NOTE [Layouts]: each micro-batch's activations forward and their gradients back, V times interleaved,
    // 1/T of [b, s, h] a rank; inside a machine when the whole pipeline fits one.
    double buffer = double(dtypeSize(p.compute)) * double(p.microBatch) * double(p.spec.seqLength) *
                    double(p.spec.hiddenSize) / double(tensor);
    double moved = 2.0 * double(p.virtualStages) * buffer * double(p.accumulation);
    bool inside = p.ranks <= p.ranksPerNode;
    double rate = inside ? nvlink : *m.networkGBs;
    p.terms.push_back(
        {"pipeline p2p", moved / (rate * 1e9),
         fmt::format("{:.3g} B of activations and their gradients between stages, {} at {:.0f} GB/s", moved,
                     inside ? "over NVLink" : "over the network", rate),
         false});
  }
  if (in.ranks > 1) {
    // Per rank, a ring moves (N-1)/N of the buffer per pass: all-reduce two passes of fp32 gradients (stage
    // 0); reduce-scatter of fp32 gradients and all-gather of the 16-bit parameters (1 and 2); stage 3 also
    // gathers the parameters in each micro-batch's forward and backward. N: the data-parallel ranks.
    // NOTE [Layouts]: hierarchically, the group's g members on a machine in a ring at NVLink speed, then
    // rings across its n machines on 1/g of the buffer each at the network's rate a GPU.
    double paramBytes = 0;
    for (int64_t padded : in.paddedElems) paramBytes += double(padded) * double(dtypeSize(p.compute));
    double gradBytes = double(in.gradientBytes);
    double moved = in.stage == 0 ? 2 * gradBytes : gradBytes + paramBytes;
    if (in.stage == 3) moved += 2 * paramBytes * double(p.accumulation);
    int D = in.ranks;
    int onMachine = std::max(1, std::min(D, p.ranksPerNode / tensor));
    int machines = std::max(1, D / onMachine);
    double inside = double(onMachine - 1) / double(onMachine),
           across = double(machines - 1) / double(machines);
    double seconds = moved * inside / (nvlink * 1e9) +
                     (machines > 1 ? moved * across / double(onMachine) / (*m.networkGBs * 1e9) : 0.0);
    p.terms.push_back(
        {"collectives", seconds,
         machines == 1
             ? fmt::format("{:.3g} B over NVLink at {:.0f} GB/s bus bandwidth", moved * inside, nvlink)
             : fmt::format("{}{:.3g} B over the network at {:.0f} GB/s a GPU across {} machines",
                           onMachine > 1 ? fmt::format("{:.3g} B over NVLink at {:.0f} GB/s among {} ranks a "
                                                       "machine, then ",
                                                       moved * inside, nvlink, onMachine)
                                         : std::string("one rank a machine: "),
                           moved * across / double(onMachine), *m.networkGBs, machines),
         true});
  }
  if (offElems > 0 && p.optimizer == "adafactor") {
    // NOTE [Adafactor host chunks] in optim/Adafactor.h: the masters and the state cross the link both ways
    // and the GPU updates them (the SSD chunks' too, read from the SSD into host memory first); the new
    // 16-bit parameters of the chunks homed off the device go back to their homes (NOTE [Parameter homes]).
    // Gradients homed in host memory (NOTE [Gradient homes]) left during backward and come back in with
    // the state.
    double bytes = 0, homed = 0;
    for (size_t i = 0; i < p.placement.optimizerTier.size(); ++i) {
      if (p.placement.optimizerTier[i] == zero::Tier::Device) continue;
      bytes += double(in.rangeElems[i]) * 4 + double(in.firstMomentBytes[i] + in.secondMomentBytes[i]);
      if (p.placement.parameterHome(i) != zero::Tier::Device)
        homed += double(in.rangeElems[i]) * double(dtypeSize(p.compute));
    }
    double gradients = double(p.gradientHomeBytes);
    std::string extra;
    if (homed > 0) extra += fmt::format(", the homed parameters out {}", gib(uint64_t(homed)));
    if (gradients > 0) extra += fmt::format(", the homed gradients in {}", gib(uint64_t(gradients)));
    p.terms.push_back({"PCIe", (bytes + gradients) / (*m.h2dGBs * 1e9) + (bytes + homed) / (*m.d2hGBs * 1e9),
                       fmt::format("masters and state in and out {} at {:.0f} / {:.0f} GB/s{}",
                                   gib(uint64_t(bytes)), *m.h2dGBs, *m.d2hGBs, extra),
                       true});
  } else if (offElems > 0) {
    // NOTE [Plan model]: the host update after the backward. The gradients cross as they accumulate (fp32, or
    // 16-bit: precision.grad_accum_dtype) and the new 16-bit parameters come back; the pipelined update's two
    // lanes share the chunks (NOTE [Pipelined update] in optim/AdamW.h): the CPU takes the SSD chunks and
    // pieces of the host chunks from the front, the GPU lane pieces from the back, their master, m and v
    // crossing the link both ways. Ranks on one machine share its cores.
    int64_t ssdElems = 0;
    for (size_t i = 0; i < p.placement.optimizerTier.size(); ++i)
      if (p.placement.optimizerTier[i] == zero::Tier::Nvme) ssdElems += in.rangeElems[i];
    double hostElems = double(offElems - ssdElems), ssd = double(ssdElems);
    // Parameters homed in host memory take their new values there: they do not cross back.
    int64_t homedElems = 0;
    for (size_t i = 0; i < p.placement.parameterTier.size(); ++i)
      if (p.placement.parameterTier[i] != zero::Tier::Device) homedElems += in.rangeElems[i];
    // Gradients homed in host memory crossed during backward (NOTE [Gradient homes]).
    double down = double(offElems - p.gradientHomeElems) * double(dtypeSize(in.gradientDType)),
           up = double(offElems - homedElems) * double(dtypeSize(p.compute));
    double pcie = down / (*m.d2hGBs * 1e9) + up / (*m.h2dGBs * 1e9);
    double cpu = *m.cpuAdamwElemsPerS / double(p.ranksPerNode);
    // The GPU lane writes parameters on the device: none where parameters are homed in host memory.
    double gpuLane = c.optimizer.pipeline && homedElems == 0 && p.gradientHomeElems == 0
                         ? std::min(*m.h2dGBs, *m.d2hGBs) * 1e9 / gpuLaneBytesPerElem(moments)
                         : 0;
    double lanes = (ssd + hostElems) / (cpu + gpuLane);                      // the lanes finish together
    if (gpuLane > 0 && ssd / cpu >= hostElems / gpuLane) lanes = ssd / cpu;  // the GPU lane ran out of pieces
    p.terms.push_back(
        {"host update", c.optimizer.pipeline ? std::max(pcie, lanes) : pcie + lanes,
         fmt::format("{:.3g} elements: the CPU at {:.2f} G/s{}{}; {} gradients out {} at {:.0f} GB/s, "
                     "parameters in {} at {:.0f} GB/s",
                     double(offElems), cpu / 1e9, p.ranksPerNode > 1 ? " (this rank's share)" : "",
                     gpuLane > 0 ? fmt::format(", the GPU lane at {:.2f} G/s", gpuLane / 1e9) : std::string(),
                     in.gradientDType == DType::F32 ? "fp32" : dtypeName(in.gradientDType),
                     gib(uint64_t(down)), *m.d2hGBs, gib(uint64_t(up)), *m.h2dGBs),
         true});
  }
  // NOTE [Gradient homes]: the homed gradients cross on the comm stream as their chunks complete, beside the
  // rest of backward.
  if (p.gradientHomeBytes > 0)
    p.terms.push_back({"gradient homes", double(p.gradientHomeBytes) / (*m.d2hGBs * 1e9),
                       fmt::format("gradients out during backward {} at {:.0f} GB/s (store.gradient_home)",
                                   gib(p.gradientHomeBytes), *m.d2hGBs),
                       true});
  uint64_t onSsd = p.placement.parameterNvmeBytes;
  if (uint64_t homed = p.placement.parameterHostBytes + onSsd; homed > 0) {
    // NOTE [Parameter homes]: each homed chunk is copied into a slot for the forward and again for the
    // backward of every micro-batch, on the gather stream ahead of its use. A chunk homed on the SSD is read
    // as often (its staging does not keep it between forward and backward), ahead of its copy: the slower
    // of the two bounds the term.
    double bytes = double(homed) * 2.0 * double(p.accumulation);
    double seconds = bytes / (*m.h2dGBs * 1e9);
    std::string ssd;
    if (onSsd > 0) {
      double reads = double(onSsd) * 2.0 * double(p.accumulation) * double(p.ranksPerNode);
      seconds = std::max(seconds, reads / (*m.nvmeReadGBs * 1e9));
      ssd = fmt::format(" ({} of them on the SSD, read as often at {:.2f} GB/s{})", gib(onSsd),
                        *m.nvmeReadGBs, p.ranksPerNode > 1 ? ", the machine's ranks sharing it" : "");
    }
    p.terms.push_back({"parameter homes", seconds,
                       fmt::format("{} of parameters homed off the device{}, in {} times a step (forward and "
                                   "backward of {} micro-batch{}) at {:.0f} GB/s",
                                   gib(homed), ssd, 2 * p.accumulation, p.accumulation,
                                   p.accumulation == 1 ? "" : "es", *m.h2dGBs),
                       true});
  }
  if (uint64_t nvme = p.placement.bytes[int(zero::Tier::Nvme)]; nvme > 0) {
    // The update reads the state and writes it back with the new parameters of the chunks homed there.
    double written = double(nvme) * double(p.ranksPerNode),
           read = double(nvme - onSsd) * double(p.ranksPerNode);
    p.terms.push_back({"SSD", read / (*m.nvmeReadGBs * 1e9) + written / (*m.nvmeWriteGBs * 1e9),
                       fmt::format("read {} and write back {} at {:.2f} / {:.2f} GB/s{}", gib(uint64_t(read)),
                                   gib(uint64_t(written)), *m.nvmeReadGBs, *m.nvmeWriteGBs,
                                   p.ranksPerNode > 1 ? " (the machine's ranks share it)" : ""),
                       true});
  }
  if (p.terms.front().seconds < 0.05)
    p.notes.push_back(
        "a step this short is bound by kernel launches and small GEMMs, which the plan does not "
        "model: read its compute time as a lower bound");
  double gpu = 0;
  for (const StepTerm& t : p.terms) {
    p.serialSeconds += t.seconds;
    if (!t.overlappable) gpu += t.seconds;
  }
  p.overlappedSeconds = gpu;
  p.bound = "compute";
  for (const StepTerm& t : p.terms)
    if (t.overlappable && t.seconds > p.overlappedSeconds) {
      p.overlappedSeconds = t.seconds;
      p.bound = t.name;
    }
  return p;
}

// The modes train.recompute auto weighs, least recomputation first.
constexpr const char* kRecomputeModes[] = {"none", "selective", "full"};

}  // namespace

ModelStatePlan planModelState(const config::Config& c, const PlanOptions& options) {
  if (c.train.recompute != "auto") return planAtRecompute(c, options);
  // NOTE [Recompute auto]: every mode that fits, the fastest predicted step; on the CPU (no step time) the
  // least recomputation that fits.
  std::vector<ModelStatePlan> plans;
  for (const char* mode : kRecomputeModes) {
    config::Config m = c;
    m.train.recompute = mode;
    plans.push_back(planAtRecompute(m, options));
  }
  auto time = [](const ModelStatePlan& p) { return p.terms.empty() ? 0.0 : p.serialSeconds; };
  int best = -1;
  for (int i = 0; i < int(plans.size()); ++i)
    if (plans[size_t(i)].fits && (best < 0 || time(plans[size_t(i)]) < time(plans[size_t(best)]) * 0.999))
      best = i;
  std::vector<std::string> weighed;
  for (const ModelStatePlan& p : plans)
    weighed.push_back(!p.fits && p.devicePeakBytes > p.usableBytes
                          ? fmt::format("{} does not fit (peak {})", p.recompute, gib(p.devicePeakBytes))
                      : !p.fits ? fmt::format("{} peaks at {}, within the device, but is refused",
                                              p.recompute, gib(p.devicePeakBytes))
                      : p.terms.empty()
                          ? fmt::format("{} fits (peak {})", p.recompute, gib(p.devicePeakBytes))
                          : fmt::format("{} {} a step, peak {}", p.recompute, seconds(p.serialSeconds),
                                        gib(p.devicePeakBytes)));
  ModelStatePlan chosen = plans[size_t(best < 0 ? plans.size() - 1 : size_t(best))];
  chosen.recomputeAuto = true;
  chosen.recomputeWhy =
      best < 0 ? fmt::format("train.recompute auto: no mode fits ({})", fmt::join(weighed, "; "))
               : fmt::format("train.recompute auto chose {}: {}", chosen.recompute, fmt::join(weighed, "; "));
  chosen.notes.insert(chosen.notes.begin(), chosen.recomputeWhy);
  return chosen;
}

std::optional<config::Config> largestFittingModel(const config::Config& c, const PlanOptions& options) {
  const config::ModelConfig& m0 = c.model;
  int64_t h0 = m0.hiddenSize,
          headWidth = std::max<int64_t>(1, h0 / std::max<int64_t>(1, m0.numAttentionHeads));
  for (int64_t h = h0 / headWidth * headWidth; h >= headWidth; h -= headWidth) {
    double scale = double(h) / double(h0);
    config::Config s = c;
    s.model.hiddenSize = h;
    s.model.numAttentionHeads = std::max<int64_t>(1, h / headWidth);
    s.model.numLayers = std::max<int64_t>(1, std::llround(double(m0.numLayers) * scale));
    if (m0.decoderNumLayers > 0)
      s.model.decoderNumLayers = std::max<int64_t>(1, std::llround(double(m0.decoderNumLayers) * scale));
    if (m0.ffnHiddenSize > 0)
      s.model.ffnHiddenSize = std::max<int64_t>(1, std::llround(double(m0.ffnHiddenSize) * scale));
    if (planModelState(s, options).fits) return s;
  }
  return std::nullopt;
}

std::vector<std::string> fitAdvice(const config::Config& c, const PlanOptions& options) {
  std::vector<std::string> out;
  auto fits = [&](const config::Config& s, const PlanOptions& o) { return planModelState(s, o).fits; };
  int ranks = std::max(1, options.ranks);
  int64_t global = c.train.globalBatchSizeSet ? c.train.globalBatchSize : c.train.microBatchSize * ranks;
  // A smaller micro-batch, the same global batch by accumulation.
  for (int64_t b = c.train.microBatchSize / 2; b >= 1; b /= 2) {
    if (global % (b * ranks) != 0) continue;
    config::Config s = c;
    s.train.microBatchSize = b;
    s.train.globalBatchSize = global;
    s.train.globalBatchSizeSet = true;
    if (!fits(s, options)) continue;
    out.push_back(fmt::format("--set train.micro_batch_size={} (the global batch stays {}, by accumulation)",
                              b, global));
    break;
  }
  // Budgets fixed by hand that automatic ones would beat.
  if (c.store.gpuBudgetGb != "auto" || c.store.hostBudgetGb != "auto") {
    config::Config s = c;
    s.store.gpuBudgetGb = s.store.hostBudgetGb = "auto";
    if (fits(s, options)) out.push_back("--set store.gpu_budget_gb=auto --set store.host_budget_gb=auto");
  }
  // AdamW's m and v in bf16 (NOTE [AdamW moments dtype] in optim/AdamW.h): 4 bytes of state less per
  // parameter in every tier.
  if (c.optimizer.type != "adafactor" && c.optimizer.momentsDType != "bf16" &&
      c.store.nvmeStateDType != "fp16") {
    config::Config s = c;
    s.optimizer.momentsDType = "bf16";
    if (fits(s, options))
      out.push_back(
          "--set optimizer.moments_dtype=bf16: AdamW's m and v in bf16 in every tier (8 bytes of optimizer "
          "state per parameter with the fp32 master instead of 12)");
  }
  // The SSD tier.
  if (c.zero.nvmePath.empty()) {
    config::Config s = c;
    s.zero.nvmePath = "ssd";
    PlanOptions o = options;
    if (o.calibration) o.calibration->nvmeFreeBytes.reset();  // the plan's figure for an SSD's free space
    ModelStatePlan p = planModelState(s, o);
    if (p.fits)
      out.push_back(fmt::format(
          "--set zero_optimization.nvme_path=DIR: a directory on an SSD with {} free for the optimizer state "
          "(planned with {} free)",
          gib(p.placement.bytes[int(zero::Tier::Nvme)]), gib(p.machine.nvmeFreeBytes.value_or(0))));
  }
  // More ranks, each with its own GPU on this machine, the state sharded over them.
  for (int r : {2, 4, 8}) {
    if (r <= ranks) continue;
    config::Config s = c;
    s.zero.stage = std::max<int64_t>(c.zero.stage, 3);
    if (c.train.globalBatchSizeSet && c.train.globalBatchSize % (c.train.microBatchSize * r) != 0)
      s.train.globalBatchSize = c.train.microBatchSize * r;
    PlanOptions o = options;
    o.ranks = r;
    // GPUs: one machine with r of them; the CPU: r machines (ranks on one host would share its memory).
    bool gpu = planModelState(c, options).onGpu;
    o.ranksPerNode = gpu ? r : 1;
    if (!fits(s, o)) continue;
    out.push_back(
        fmt::format("mpirun -np {} {}{}", r,
                    gpu ? fmt::format("on a machine with {} GPUs", r) : fmt::format("over {} machines", r),
                    c.zero.stage < 3 ? " (--set zero_optimization.stage=3)" : ""));
    break;
  }
  if (std::optional<config::Config> largest = largestFittingModel(c, options)) {
    models::ModelSpec spec = config::modelSpecFrom(*largest, Device::cpu());
    std::string line = fmt::format(
        "a smaller model: the largest of its family that fits here has {:.2f} B parameters ({}): --set "
        "model.num_layers={} --set model.hidden_size={} --set model.num_attention_heads={}",
        double(models::numParameters(spec)) / 1e9, models::describeShape(spec), largest->model.numLayers,
        largest->model.hiddenSize, largest->model.numAttentionHeads);
    if (largest->model.decoderNumLayers > 0)
      line += fmt::format(" --set model.decoder_num_layers={}", largest->model.decoderNumLayers);
    if (largest->model.ffnHiddenSize > 0)
      line += fmt::format(" --set model.ffn_hidden_size={}", largest->model.ffnHiddenSize);
    out.push_back(line);
  } else if (out.empty()) {
    out.push_back(
        "no model of its family fits at this micro-batch and sequence length: lower train.micro_batch_size "
        "or model.seq_length");
  }
  return out;
}

std::string refusalMessage(const std::string& what, const config::Config& c, const ModelStatePlan& plan,
                           const PlanOptions& options) {
  std::string message = fmt::format("{} does not fit: {}.", what, plan.refusal);
  if (plan.recomputeAuto) message += fmt::format("\n{}.", plan.recomputeWhy);
  std::vector<std::string> advice = fitAdvice(c, options);
  message += "\nWhat would fit:";
  for (const std::string& a : advice) message += "\n  - " + a;
  return message;
}

std::string formatPlan(const ModelStatePlan& p) {
  std::ostringstream out;
  out << fmt::format("model          {}: {}, {:.3f} B parameters\n", p.spec.arch,
                     models::describeShape(p.spec), double(p.parameters) / 1e9);
  out << fmt::format("machine        {}, {} host memory{}\n",
                     p.machine.deviceMemoryBytes
                         ? fmt::format("{}, {} device memory", p.machine.deviceName.value_or("GPU"),
                                       gib(*p.machine.deviceMemoryBytes))
                         : std::string("no GPU"),
                     gib(*p.machine.hostMemoryBytes),
                     p.machine.host == "reference H200"  ? " (the reference H200, measured; docs/memory.md)"
                     : p.machineSource == "this machine" ? fmt::format(" ({}, read now)", p.machine.host)
                     : p.machine.date == "published specifications"
                         ? fmt::format(" ({}: published specifications)", p.machine.host)
                         : fmt::format(" (calibrated on {} {})", p.machine.host, p.machine.date));
  out << fmt::format(
      "run            {} on {}, {} rank{}, ZeRO stage {}, micro-batch {} x {} accumulation = global batch "
      "{}, recompute {}{}\n",
      dtypeName(p.compute), p.onGpu ? "the GPU" : "the CPU", p.ranks,
      p.inputs.ranks == p.ranks
          ? std::string(p.ranks == 1 ? "" : "s")
          : fmt::format("s ({} data-parallel x {} tensor-parallel{})", p.data, p.tensor,
                        p.pipeline > 1 ? fmt::format(" x {} pipeline stages{}", p.pipeline,
                                                     p.virtualStages > 1
                                                         ? fmt::format(", {} virtual a rank", p.virtualStages)
                                                         : std::string())
                                       : std::string()),
      p.inputs.stage, p.microBatch, p.accumulation, p.globalBatch, p.recompute,
      p.recomputeAuto ? " (auto)" : "");
  if (p.ranksPerNode > 1)
    out << fmt::format(
        "per rank       {} of host memory, {} of SSD space, {} CPU threads ({} ranks on one machine{})\n",
        gib(p.hostShareBytes), p.nvmeShareBytes ? gib(p.nvmeShareBytes) : std::string("-"), p.cpuThreadShare,
        p.ranksPerNode, p.nodes > 1 ? fmt::format(", {} machines", p.nodes) : std::string());
  out << fmt::format("chunks         {} of {} (zero_optimization.chunk_size_mb; the largest {})\n",
                     p.inputs.layout.chunks.size(),
                     gib(uint64_t(p.inputs.layout.chunkElems) * dtypeSize(p.compute)),
                     gib(uint64_t(p.inputs.largestChunkElems) * dtypeSize(p.compute)));

  auto orDash = [](uint64_t b) { return b ? gib(b) : std::string("-"); };
  auto budgetRow = [&] {
    out << fmt::format("  {:<22} {:>12} {:>12} {:>12}\n", "budget", orDash(p.budgets.device),
                       orDash(p.budgets.host), orDash(p.budgets.nvme));
  };
  auto notes = [&] {
    if (p.notes.empty()) return;
    out << "\nnotes:\n";
    for (const std::string& n : p.notes) out << "  - " << n << "\n";
  };
  // A refusal before any placement (the state does not fit the budgets) has no tables of where state lives
  // or of the step: they would show an empty placement. The caller prints the refusal.
  if (!p.fits && p.placement.optimizerTier.empty()) {
    out << fmt::format("optimizer      {}\n", p.optimizer);
    out << "\nmodel state per rank: no placement within the budgets (the error below says why)\n";
    out << fmt::format("  {:<22} {:>12} {:>12} {:>12}\n", "", "device", "host", "ssd");
    budgetRow();
    notes();
    return out.str();
  }
  out << fmt::format(
      "optimizer      {}: {:.3f} bytes of optimizer state per parameter (fp32 masters included{})\n",
      p.optimizer, p.optimizerBytesPerParameter,
      p.optimizer == "adafactor"      ? "; the second moment factored per matrix"
      : p.momentsDType == DType::BF16 ? "; m and v in bf16, optimizer.moments_dtype"
                                      : "");

  out << "\nmodel state per rank, by tier:\n";
  out << fmt::format("  {:<22} {:>12} {:>12} {:>12}\n", "", "device", "host", "ssd");
  uint64_t total[zero::kNumTiers] = {};
  for (int k = 0; k < kNumStateKinds; ++k) {
    out << fmt::format("  {:<22}", stateKindName(StateKind(k), p.compute, p.optimizer));
    for (int t = 0; t < zero::kNumTiers; ++t) {
      out << fmt::format(" {:>12}", p.kindBytes[k][t] ? gib(p.kindBytes[k][t]) : "-");
      total[t] += p.kindBytes[k][t];
    }
    out << "\n";
  }
  out << fmt::format("  {:<22} {:>12} {:>12} {:>12}\n", "model state", orDash(total[0]), orDash(total[1]),
                     orDash(total[2]));
  budgetRow();
  size_t chunksOn[zero::kNumTiers] = {};
  for (zero::Tier t : p.placement.optimizerTier) ++chunksOn[int(t)];
  out << fmt::format("  {:<22} {:>12} {:>12} {:>12}\n", "optimizer chunks", chunksOn[0], chunksOn[1],
                     chunksOn[2]);
  out << "working memory on the " << (p.onGpu ? "device" : "host") << " (not model state):\n";
  // Several ranks reduce into fp32 shards whatever the buffers' dtype (PlacementInputs.cpp).
  bool shardsAtPeak = p.accumulation == 1 && p.inputs.stage >= 2 && p.inputs.ranks > 1;
  out << fmt::format("  {:<22} {:>12}  {}, {}\n", "gradient buffers", gib(p.gradientPeakBytes),
                     dtypeName(shardsAtPeak ? DType::F32 : p.inputs.gradientDType),
                     p.accumulation > 1        ? "every chunk, kept across the micro-batches"
                     : p.gradientHomeBytes > 0 ? "the chunks whose gradients stay on the device, and two "
                                                 "chunks in flight (store.gradient_home)"
                     : shardsAtPeak            ? "this rank's shards and two chunks in flight"
                                               : "every chunk, from backward to the update");
  if (p.inputs.powerSgdBytes > 0)
    out << fmt::format(
        "  {:<22} {:>12}  fp32 error feedback and Q matrices (dist.powersgd_rank), across steps\n",
        "PowerSGD state", gib(p.inputs.powerSgdBytes));
  out << fmt::format("  {:<22} {:>12}  {} of {}\n", "activations", gib(p.activations.bytes),
                     p.pipeline > 1 ? "the most loaded stage's micro-batches" : "one micro-batch",
                     p.microBatch);
  for (const ActivationTerm& t : p.activations.terms)
    out << fmt::format("    {:<44} {:>12}\n", t.what, gib(t.bytes));
  out << fmt::format("  {:<22} {:>12}  {:.0f}% of the activations (measured allowance)\n", "backward buffers",
                     gib(p.transientBytes), 100 * kBackwardAllowance);
  if (p.workspaceBytes > 0)
    out << fmt::format("  {:<22} {:>12}  {}\n", "workspace", gib(p.workspaceBytes),
                       p.inputs.gatherBytes > 0
                           ? "CUDA context, cuBLASLt, allocator slack, stage-3 gather slots"
                           : "CUDA context, cuBLASLt, allocator slack");
  if (p.onGpu)
    out << fmt::format("  {:<22} {:>12}  of the {} a step may use ({:.0f}%; the device has {})\n",
                       "device peak", gib(p.devicePeakBytes), gib(p.usableBytes),
                       100.0 * double(p.devicePeakBytes) / double(std::max<uint64_t>(1, p.usableBytes)),
                       gib(p.deviceCapacityBytes));
  out << "  assumptions: ";
  for (size_t i = 0; i < p.activations.assumptions.size(); ++i)
    out << (i ? "; " : "") << p.activations.assumptions[i];
  out << "\n";

  if (!p.terms.empty()) {
    out << "\npredicted step time per rank:\n";
    for (const StepTerm& t : p.terms)
      out << fmt::format("  {:<14} {:>10}  {}\n", t.name, seconds(t.seconds), t.detail);
    double tokens = double(p.globalBatch) * double(p.spec.seqLength);
    auto rate = [&](double s) {
      return fmt::format(
          "{:.0f} tokens/s, {:.0f} TFLOP/s per GPU{}", tokens / s, p.flopsPerStep / s / 1e12,
          p.machine.peakTflops
              ? fmt::format(" ({:.0f}% MFU)", 100 * p.flopsPerStep / s / 1e12 / *p.machine.peakTflops)
              : std::string());
    };
    bool offloaded = p.serialSeconds > p.overlappedSeconds * 1.0001;
    out << fmt::format("  step           {:>10}  {}{}\n", seconds(p.serialSeconds), rate(p.serialSeconds),
                       offloaded ? " (the host update follows the backward)" : "");
    if (offloaded)
      out << fmt::format(
          "  overlapped     {:>10}  {} (were the update to run beside the backward: bound by {})\n",
          seconds(p.overlappedSeconds), rate(p.overlappedSeconds), p.bound);
    else
      out << "  bound by       compute\n";
  }
  notes();
  return out.str();
}

double ModelStatePlan::mfu() const {
  if (serialSeconds <= 0 || !machine.peakTflops) return 0;
  return flopsPerStep / serialSeconds / (*machine.peakTflops * 1e12);
}

const StepTerm* LayoutPlan::longest() const {
  const StepTerm* out = nullptr;
  for (const StepTerm& t : plan.terms)
    if (out == nullptr || t.seconds > out->seconds) out = &t;
  return out;
}

std::string LayoutPlan::name() const {
  std::string out = fmt::format("data {} x tensor {}", data, tensor);
  if (pipeline > 1) out += fmt::format(" x pipeline {}", pipeline);
  if (virtualStages > 1) out += fmt::format(" ({} virtual stages)", virtualStages);
  return out;
}

std::vector<LayoutPlan> planLayouts(const config::Config& c, const PlanOptions& options) {
  int ranks = std::max(1, options.ranks);
  int perMachine = options.ranksPerNode > 0 ? std::min(options.ranksPerNode, ranks) : ranks;
  models::ModelSpec spec = config::modelSpecFrom(c, Device::cpu());
  int64_t layers = c.model.numLayers;
  // The global batch as configured, or one micro-batch per data-parallel rank of the configured split.
  int64_t global = c.train.globalBatchSizeSet
                       ? c.train.globalBatchSize
                       : c.train.microBatchSize * std::max(1, ranks / std::max(1, int(c.parallel.tensor)));
  std::vector<LayoutPlan> out;
  for (int t = 1; t <= perMachine; ++t) {
    if (perMachine % t != 0 || ranks % t != 0) continue;
    for (int pp = 1; pp <= ranks / t; ++pp) {
      if ((ranks / t) % pp != 0 || (pp > 1 && layers % pp != 0)) continue;
      int d = ranks / (t * pp);
      int64_t micro = int64_t(d) * c.train.microBatchSize;
      int64_t microBatches = global % micro == 0 ? global / micro : 0;
      // V: 1, and every divisor of a stage's layers above it when P divides the micro-batches.
      std::vector<int> virtuals{1};
      if (pp > 1 && microBatches > 0 && microBatches % pp == 0)
        for (int v = 2; v <= layers / pp; ++v)
          if ((layers / pp) % v == 0) virtuals.push_back(v);
      for (int v : virtuals) {
        LayoutPlan l;
        l.tensor = t;
        l.pipeline = pp;
        l.virtualStages = v;
        l.data = d;
        if (t > 1) {
          if (spec.numHeads % t != 0 || spec.ffnHiddenSize % t != 0 || spec.vocabSize % t != 0)
            l.invalid = fmt::format("{} heads, MLP width {} and vocabulary {} do not all split {} ways",
                                    spec.numHeads, spec.ffnHiddenSize, spec.vocabSize, t);
        }
        if (l.invalid.empty() && pp > 1) {
          if (c.model.arch != "gpt")
            l.invalid = fmt::format("pipeline stages are planned for gpt only, not {}", c.model.arch);
          else if (c.model.moeNumExperts > 0)
            l.invalid = "pipeline stages with mixture-of-experts layers are not supported";
          else if (c.zero.stage == 3)
            l.invalid = "pipeline stages run at ZeRO stages 0 to 2, not 3";
          else if (microBatches < pp)
            l.invalid = fmt::format("{} micro-batches a step, fewer than the {} stages", microBatches, pp);
        }
        if (l.invalid.empty()) {
          config::Config layout = c;
          layout.parallel.tensor = t;
          layout.parallel.sequenceParallel = t > 1 && c.parallel.sequenceParallel;
          layout.train.globalBatchSize = global;
          layout.train.globalBatchSizeSet = true;
          layout.parallel.pipeline = pp;
          layout.parallel.virtualStages = v;
          l.plan = planModelState(layout, options);
        }
        out.push_back(std::move(l));
      }
    }
  }
  auto rank = [](const LayoutPlan& l) {
    if (!l.invalid.empty()) return 2;
    return l.plan.fits ? 0 : 1;
  };
  std::stable_sort(out.begin(), out.end(), [&](const LayoutPlan& a, const LayoutPlan& b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    // Those that fit, the fastest first; those that do not, the nearest to fitting (the smallest device
    // peak) first.
    if (rank(a) == 0) return a.plan.serialSeconds < b.plan.serialSeconds;
    return rank(a) == 1 && a.plan.devicePeakBytes < b.plan.devicePeakBytes;
  });
  return out;
}

std::string formatLayouts(const std::vector<LayoutPlan>& layouts, size_t maxFitting, size_t maxOther) {
  std::ostringstream out;
  out << "layouts (NOTE [Layouts] in plan/Plan.h; ranks = data x tensor x pipeline):\n";
  out << fmt::format("  {:<4} {:>5} {:>6} {:>5} {:>4} {:>10} {:>10} {:>6} {:>9} {:>9}  {}\n", "", "data",
                     "tensor", "pipe", "virt", "recompute", "step", "MFU", "TFLOP/s", "peak GiB",
                     "bound (the longest terms)");
  size_t fitting = 0, other = 0, hiddenFitting = 0, hiddenOther = 0;
  auto head = [](const LayoutPlan& l) {
    return fmt::format("{:>5} {:>6} {:>5} {:>4}", l.data, l.tensor, l.pipeline, l.virtualStages);
  };
  for (const LayoutPlan& l : layouts) {
    bool fits = l.invalid.empty() && l.plan.fits;
    if (!fits && ++other > maxOther) {
      ++hiddenOther;
      continue;
    }
    if (!l.invalid.empty()) {
      out << fmt::format("  {:<4} {}  cannot split: {}\n", "", head(l), l.invalid);
      continue;
    }
    const ModelStatePlan& p = l.plan;
    if (!p.fits) {
      out << fmt::format("  {:<4} {}  does not fit (peak {:.1f} GiB): {}\n", "", head(l),
                         double(p.devicePeakBytes) / double(1ull << 30), p.refusal);
      continue;
    }
    if (++fitting > maxFitting) {
      ++hiddenFitting;
      continue;
    }
    std::string mark = fitting <= 3 ? fmt::format("#{}", fitting) : "";
    // The two longest terms.
    std::vector<const StepTerm*> terms;
    for (const StepTerm& t : p.terms) terms.push_back(&t);
    std::stable_sort(terms.begin(), terms.end(),
                     [](const StepTerm* a, const StepTerm* b) { return a->seconds > b->seconds; });
    std::string bound;
    for (size_t i = 0; i < std::min<size_t>(2, terms.size()); ++i)
      bound += fmt::format("{}{} {}", i ? ", " : "", terms[i]->name, seconds(terms[i]->seconds));
    double tflops = p.serialSeconds > 0 ? p.flopsPerStep / p.serialSeconds / 1e12 : 0;
    out << fmt::format("  {:<4} {} {:>10} {:>9.2f}s {:>6} {:>9.0f} {:>9.1f}  {}\n", mark, head(l),
                       p.recompute, p.serialSeconds,
                       p.mfu() > 0 ? fmt::format("{:.1f}%", 100 * p.mfu()) : "-", tflops,
                       double(p.devicePeakBytes) / double(1ull << 30), bound);
  }
  if (hiddenFitting > 0) out << fmt::format("  ... and {} more layouts that fit, slower\n", hiddenFitting);
  if (hiddenOther > 0) out << fmt::format("  ... and {} more that do not fit or cannot split\n", hiddenOther);
  return out.str();
}

LayoutChoice chooseLayout(const config::Config& c, const PlanOptions& options) {
  LayoutChoice choice;
  choice.layouts = planLayouts(c, options);
  int fitting = 0;
  for (size_t i = 0; i < choice.layouts.size(); ++i) {
    const LayoutPlan& l = choice.layouts[i];
    if (!l.invalid.empty() || !l.plan.fits) continue;
    ++fitting;
    if (choice.chosen < 0) choice.chosen = int(i);
  }
  if (choice.chosen < 0) {
    choice.why = fmt::format(
        "parallel: auto: no layout of {} rank{} fits; `strata plan --layouts` shows the "
        "nearest",
        std::max(1, options.ranks), options.ranks > 1 ? "s" : "");
    return choice;
  }
  const LayoutPlan& l = choice.layouts[size_t(choice.chosen)];
  auto step = [](const LayoutPlan& x) {
    return x.plan.terms.empty() ? fmt::format("peak {}", gib(x.plan.devicePeakBytes))
                                : fmt::format("{} a step", seconds(x.plan.serialSeconds));
  };
  choice.why = fmt::format(
      "parallel: auto chose {} (parallel.tensor {}, parallel.pipeline {}, parallel.virtual_stages {}): {}, "
      "recompute {}, the fastest of {} layout{} that fit",
      l.name(), l.tensor, l.pipeline, l.virtualStages, step(l), l.plan.recompute, fitting,
      fitting == 1 ? "" : "s");
  return choice;
}

}  // namespace strata::plan
