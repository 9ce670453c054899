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
      return adafactor ? "Adafactor m" : "AdamW m (fp32)";
    case kSecondMoments:
      return adafactor ? "Adafactor v (factored)" : "AdamW v (fp32)";
    default:
      return "?";
  }
}

ActivationEstimate estimateActivations(const models::ModelSpec& spec, int64_t b, DType compute, bool onGpu,
                                       const std::string& recompute) {
  ActivationEstimate a;
  uint64_t e = dtypeSize(compute);
  a.assumptions.push_back(
      fmt::format("{} activations, micro-batch {}, train.recompute {}", dtypeName(compute), b, recompute));
  // L blocks' kept activations: whole; without the MLP activation's output (selective); or each block's
  // inputs (the stream's two parts) plus one block recomputed at a time (full).
  // `stream`: the bytes of one element of the stream between blocks (e, or 4 for BERT's fp32 stream).
  auto blocks = [&](int64_t layers, uint64_t layer, int64_t tokens, int64_t hidden, int64_t ffn,
                    uint64_t stream = 0) {
    if (recompute == "full")
      return uint64_t(layers) * 2 * (stream > 0 ? stream : e) * uint64_t(tokens * hidden) + layer;
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
      a.terms.push_back({fmt::format("{} blocks x {}", g.numLayers, gib(layer + scores)),
                         blocks(g.numLayers, layer + scores, t, g.hiddenSize, g.ffn())});
      a.terms.push_back({"final norm, chunked LM head and loss",
                         e * uint64_t(t * g.hiddenSize) + chunkedHeadBytes(e, t, g.hiddenSize, g.vocabSize)});
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
          {fmt::format("MLM head on {} chosen tokens", chosen),
           4 * e * uint64_t(chosen * c.hiddenSize) + (e + 4) * uint64_t(chosen) * uint64_t(c.vocabSize)});
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
      a.terms.push_back(
          {fmt::format("{} encoder blocks x {}", c.numLayers, gib(enc)), uint64_t(c.numLayers) * enc});
      a.terms.push_back({fmt::format("{} decoder blocks x {}", c.decoderLayers(), gib(dec)),
                         uint64_t(c.decoderLayers()) * dec});
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

ModelStatePlan planModelState(const config::Config& c, const PlanOptions& options) {
  ModelStatePlan p;
  p.ranks = std::max(1, options.ranks);
  p.machineSource = options.calibration ? options.calibrationSource : "DESIGN.md";
  p.ranksPerNode = options.ranksPerNode > 0 ? std::min(options.ranksPerNode, p.ranks) : p.ranks;
  // The machine: the calibration's figures, DESIGN.md's H200 for any it lacks.
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
          fmt::format("{}: not in {}; DESIGN.md's H200 figure", what, options.calibrationSource));
  };
  if (p.onGpu) {
    fill(p.machine.deviceName, h200.deviceName, "device");
    fill(p.machine.deviceMemoryBytes, h200.deviceMemoryBytes, "device memory");
    fill(p.machine.h2dGBs, h200.h2dGBs, "H2D bandwidth");
    fill(p.machine.d2hGBs, h200.d2hGBs, "D2H bandwidth");
    fill(p.machine.gemmTflops, h200.gemmTflops, "GEMM rate");
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
  p.globalBatch = c.train.globalBatchSizeSet ? c.train.globalBatchSize : c.train.microBatchSize * p.ranks;
  if (p.globalBatch % (p.microBatch * p.ranks) != 0) {
    p.fits = false;
    p.refusal = fmt::format("train.global_batch_size {} is not a multiple of micro_batch_size {} x {} ranks",
                            p.globalBatch, p.microBatch, p.ranks);
  }
  p.accumulation = std::max<int64_t>(1, p.globalBatch / (p.microBatch * p.ranks));

  p.inputs = modelStateInputs(c, p.ranks, p.compute);
  const ModelStateInputs& in = p.inputs;
  p.optimizer = c.optimizer.type;
  p.activations = estimateActivations(p.spec, p.microBatch, p.compute, p.onGpu, c.train.recompute);
  // Gradient buffers: every chunk's while backward accumulates; after the last backward's reduce-scatter
  // (stage >= 2, several ranks) only the shards and two chunks in flight.
  bool shardedGrads = in.stage >= 2 && p.ranks > 1;
  uint64_t inFlight = std::min<uint64_t>(2, in.layout.chunks.size()) * uint64_t(in.largestChunkElems) * 4;
  uint64_t gradientsAtUpdate = shardedGrads ? in.gradientShardBytes + inFlight : in.gradientBytes;
  // NOTE [Plan model]: with accumulation the gradients of earlier micro-batches live through later forwards.
  uint64_t working = p.accumulation > 1 ? p.activations.bytes + in.gradientBytes
                                        : std::max(p.activations.bytes, gradientsAtUpdate);
  p.gradientPeakBytes = p.accumulation > 1 ? in.gradientBytes : gradientsAtUpdate;
  p.workspaceBytes = (p.onGpu ? kDeviceWorkspaceBytes : 0) + in.gatherBytes;
  uint64_t nonModel = working + p.workspaceBytes;
  p.deviceCapacityBytes = p.onGpu ? *m.deviceMemoryBytes : m.hostAvailableBytes.value_or(*m.hostMemoryBytes);

  // Budgets, as the engine reads them (storeBudgets), with auto on the device being what the memory tracer
  // will measure: the device less the step's non-model memory.
  uint64_t deviceAuto = p.deviceCapacityBytes > nonModel ? p.deviceCapacityBytes - nonModel : 0;
  // The ranks on one machine split its memory, disk and cores (NOTE [Per-node shares] in
  // distributed/Launch.h).
  uint64_t hostAvailable = m.hostAvailableBytes.value_or(*m.hostMemoryBytes);
  p.hostShareBytes = dist::perRankShare(hostAvailable, p.ranksPerNode);
  p.nvmeShareBytes = dist::perRankShare(c.zero.nvmePath.empty() ? 0 : *m.nvmeFreeBytes, p.ranksPerNode);
  p.cpuThreadShare = m.cpuThreads > 0 ? int(dist::perRankShare(uint64_t(m.cpuThreads), p.ranksPerNode)) : 0;
  p.budgets = storeBudgets(c, in.parameterBytes, p.onGpu ? deviceAuto : zero::kUnlimited, p.hostShareBytes,
                           p.nvmeShareBytes);
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
        "store.gpu_budget_gb auto: the device's {} less {} of non-model memory (estimated here; the engine's "
        "memory tracer measures it in the first step, then brings the SSD's and the host's state onto the "
        "device while it fits; store.gpu_budget_gb={:.1f} fixes this placement)",
        gib(p.deviceCapacityBytes), gib(nonModel), double(p.budgets.device) / double(1ull << 30)));
  }
  p.notes.push_back(fmt::format(
      "host budget: {} (store.host_budget_gb {}; auto is 90% of the {} available{})", gib(p.budgets.host),
      c.store.hostBudgetGb, gib(p.hostShareBytes), p.ranksPerNode > 1 ? " to this rank" : ""));
  if (p.budgets.nvme > 0)
    p.notes.push_back(fmt::format("SSD budget: {} in {} (store.nvme_budget_gb {})", gib(p.budgets.nvme),
                                  c.zero.nvmePath, c.store.nvmeBudgetGb));

  // The placement: the store's own function, as the engine calls it (m and v on the SSD in
  // store.nvme_state_dtype).
  uint64_t nvmeMomentBytes = dtypeSize(nvmeStateDType(c));
  uint64_t hostBudget = p.budgets.host;
  try {
    std::vector<uint64_t> nvmeBytes;
    // (Adafactor's state has no SSD form yet: its bytes as they are.)
    for (size_t i = 0; i < in.rangeElems.size(); ++i)
      nvmeBytes.push_back(p.optimizer == "adafactor"
                              ? in.optimizerBytes[i]
                              : uint64_t(in.rangeElems[i]) * (4 + 2 * nvmeMomentBytes));
    p.placement =
        placeWithDelayedReserve(c, p.compute, in.rangeElems, p.budgets, [&](const zero::StoreBudgets& b) {
          return zero::placeModelState(in.parameterBytes, in.optimizerBytes, b, nvmeBytes);
        });
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
  p.kindBytes[kParameters][int(zero::Tier::Device)] = in.parameterBytes;
  for (size_t i = 0; i < p.placement.optimizerTier.size(); ++i) {
    int tier = int(p.placement.optimizerTier[i]);
    uint64_t range = uint64_t(in.rangeElems[i]) * 4;
    bool onSsd = p.placement.optimizerTier[i] == zero::Tier::Nvme && p.optimizer != "adafactor";
    uint64_t moments = range / 4 * nvmeMomentBytes;
    bool master = p.compute != DType::F32 || p.placement.optimizerTier[i] != zero::Tier::Device;
    if (master) p.kindBytes[kMasters][tier] += range;
    p.kindBytes[kFirstMoments][tier] += onSsd ? moments : in.firstMomentBytes[i];
    p.kindBytes[kSecondMoments][tier] += onSsd ? moments : in.secondMomentBytes[i];
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
  if (p.onGpu && p.fits && p.devicePeakBytes > p.deviceCapacityBytes) {
    p.fits = false;
    p.refusal = fmt::format(
        "the device needs {} at its peak (parameters {}, optimizer state {}, activations {}, gradient "
        "buffers "
        "{}, workspace {}), over its {}",
        gib(p.devicePeakBytes), gib(in.parameterBytes),
        gib(p.placement.bytes[int(zero::Tier::Device)] - in.parameterBytes), gib(p.activations.bytes),
        gib(p.gradientPeakBytes), gib(p.workspaceBytes), gib(p.deviceCapacityBytes));
  }

  // Step time.
  double tokens = double(p.globalBatch) * double(p.spec.seqLength);
  p.flopsPerStep = models::flopsPerToken(p.spec) * tokens / double(p.ranks);
  if (!p.onGpu) return p;
  double gemm = *m.gemmTflops * 1e12;
  p.terms.push_back({"compute", p.flopsPerStep / (gemm * kComputeEfficiency),
                     fmt::format("{:.3g} FLOP / ({:.0f} TFLOP/s GEMM x {:.2f} efficiency)", p.flopsPerStep,
                                 *m.gemmTflops, kComputeEfficiency),
                     false});
  int64_t deviceElems = 0, offElems = 0;
  for (size_t i = 0; i < p.placement.optimizerTier.size(); ++i)
    (p.placement.optimizerTier[i] == zero::Tier::Device ? deviceElems : offElems) += in.rangeElems[i];
  if (deviceElems > 0)
    p.terms.push_back({"device update",
                       double(deviceElems) * kDeviceUpdateBytesPerElem / (kDeviceUpdateGBs * 1e9),
                       fmt::format("{:.3g} elements x {:.0f} B at {:.1f} TB/s", double(deviceElems),
                                   kDeviceUpdateBytesPerElem, kDeviceUpdateGBs / 1000),
                       false});
  if (p.ranks > 1) {
    // Per rank, a ring moves (N-1)/N of the buffer per pass: all-reduce two passes of fp32 gradients (stage
    // 0); reduce-scatter of fp32 gradients and all-gather of the 16-bit parameters (1 and 2); stage 3 also
    // gathers the parameters in each micro-batch's forward and backward.
    double share = double(p.ranks - 1) / double(p.ranks), paramBytes = 0;
    for (int64_t padded : in.paddedElems) paramBytes += double(padded) * double(dtypeSize(p.compute));
    double gradBytes = double(in.gradientBytes);
    double moved = in.stage == 0 ? 2 * gradBytes : gradBytes + paramBytes;
    if (in.stage == 3) moved += 2 * paramBytes * double(p.accumulation);
    p.terms.push_back(
        {"collectives", moved * share / (kCollectiveBusGBs * 1e9),
         fmt::format("{:.3g} B over NVLink at {:.0f} GB/s bus bandwidth", moved * share, kCollectiveBusGBs),
         true});
  }
  if (offElems > 0 && p.optimizer == "adafactor") {
    // NOTE [Adafactor host chunks] in optim/Adafactor.h: the masters and the state cross the link both ways
    // and the GPU updates them.
    double bytes = 0;
    for (size_t i = 0; i < p.placement.optimizerTier.size(); ++i)
      if (p.placement.optimizerTier[i] != zero::Tier::Device)
        bytes += double(in.rangeElems[i]) * 4 + double(in.firstMomentBytes[i] + in.secondMomentBytes[i]);
    p.terms.push_back({"PCIe", bytes / (*m.h2dGBs * 1e9) + bytes / (*m.d2hGBs * 1e9),
                       fmt::format("masters and state in and out {} at {:.0f} / {:.0f} GB/s",
                                   gib(uint64_t(bytes)), *m.h2dGBs, *m.d2hGBs),
                       true});
  } else if (offElems > 0) {
    // The gradients cross as they accumulate (fp32, or 16-bit: precision.grad_accum_dtype).
    double down = double(offElems) * double(dtypeSize(in.gradientDType)),
           up = double(offElems) * double(dtypeSize(p.compute));
    p.terms.push_back({"PCIe", down / (*m.d2hGBs * 1e9) + up / (*m.h2dGBs * 1e9),
                       fmt::format("{} gradients out {} at {:.0f} GB/s, parameters in {} at {:.0f} GB/s",
                                   in.gradientDType == DType::F32 ? "fp32" : dtypeName(in.gradientDType),
                                   gib(uint64_t(down)), *m.d2hGBs, gib(uint64_t(up)), *m.h2dGBs),
                       true});
    // Ranks on one machine share its cores.
    double elems = double(offElems) * double(p.ranksPerNode);
    p.terms.push_back({"CPU AdamW", elems / *m.cpuAdamwElemsPerS,
                       fmt::format("{:.3g} elements at {:.2f} G/s{}", elems, *m.cpuAdamwElemsPerS / 1e9,
                                   p.ranksPerNode > 1 ? " (the machine's ranks share the CPU)" : ""),
                       true});
  }
  if (uint64_t nvme = p.placement.bytes[int(zero::Tier::Nvme)]; nvme > 0) {
    double bytes = double(nvme) * double(p.ranksPerNode);
    p.terms.push_back(
        {"SSD", bytes / (*m.nvmeReadGBs * 1e9) + bytes / (*m.nvmeWriteGBs * 1e9),
         fmt::format("read and write back {} at {:.2f} / {:.2f} GB/s{}", gib(uint64_t(bytes)), *m.nvmeReadGBs,
                     *m.nvmeWriteGBs, p.ranksPerNode > 1 ? " (the machine's ranks share it)" : ""),
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
                     p.machine.host == "DESIGN.md" ? " (DESIGN.md's measured H200)"
                     : p.machineSource == "this machine"
                         ? fmt::format(" ({}, read now)", p.machine.host)
                         : fmt::format(" (calibrated on {} {})", p.machine.host, p.machine.date));
  out << fmt::format(
      "run            {} on {}, {} rank{}, ZeRO stage {}, micro-batch {} x {} accumulation = global batch "
      "{}\n",
      dtypeName(p.compute), p.onGpu ? "the GPU" : "the CPU", p.ranks, p.ranks == 1 ? "" : "s", p.inputs.stage,
      p.microBatch, p.accumulation, p.globalBatch);
  if (p.ranksPerNode > 1)
    out << fmt::format(
        "per rank       {} of host memory, {} of SSD space, {} CPU threads ({} ranks on one machine)\n",
        gib(p.hostShareBytes), p.nvmeShareBytes ? gib(p.nvmeShareBytes) : std::string("-"), p.cpuThreadShare,
        p.ranksPerNode);
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
      p.optimizer == "adafactor" ? "; the second moment factored per matrix" : "");

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
  out << fmt::format("  {:<22} {:>12}  {}, {}\n", "gradient buffers", gib(p.gradientPeakBytes),
                     dtypeName(p.inputs.gradientDType),
                     p.accumulation > 1                   ? "every chunk, kept across the micro-batches"
                     : p.inputs.stage >= 2 && p.ranks > 1 ? "this rank's shards and two chunks in flight"
                                                          : "every chunk, from backward to the update");
  out << fmt::format("  {:<22} {:>12}  one micro-batch of {}\n", "activations", gib(p.activations.bytes),
                     p.microBatch);
  for (const ActivationTerm& t : p.activations.terms)
    out << fmt::format("    {:<44} {:>12}\n", t.what, gib(t.bytes));
  if (p.workspaceBytes > 0)
    out << fmt::format("  {:<22} {:>12}  {}\n", "workspace", gib(p.workspaceBytes),
                       p.inputs.gatherBytes > 0
                           ? "CUDA context, cuBLASLt, allocator slack, stage-3 gather slots"
                           : "CUDA context, cuBLASLt, allocator slack");
  if (p.onGpu)
    out << fmt::format(
        "  {:<22} {:>12}  of {} ({:.0f}%)\n", "device peak", gib(p.devicePeakBytes),
        gib(p.deviceCapacityBytes),
        100.0 * double(p.devicePeakBytes) / double(std::max<uint64_t>(1, p.deviceCapacityBytes)));
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
      return fmt::format("{:.0f} tokens/s, {:.0f} TFLOP/s per GPU", tokens / s, p.flopsPerStep / s / 1e12);
    };
    bool offloaded = p.serialSeconds > p.overlappedSeconds * 1.0001;
    out << fmt::format("  step           {:>10}  {}{}\n", seconds(p.serialSeconds), rate(p.serialSeconds),
                       offloaded ? " (today's engine: the host update follows the backward)" : "");
    if (offloaded)
      out << fmt::format("  overlapped     {:>10}  {} (a pipelined optimizer: bound by {})\n",
                         seconds(p.overlappedSeconds), rate(p.overlappedSeconds), p.bound);
    else
      out << "  bound by       compute\n";
  }
  notes();
  return out.str();
}

}  // namespace strata::plan
