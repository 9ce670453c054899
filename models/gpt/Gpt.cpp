#include "models/gpt/Gpt.h"

#include <cmath>

#include "models/MoESpec.h"
#include "strata/autograd/Functions.h"
#include "strata/ops/Ops.h"

namespace strata::models {

namespace {
// Parameters with `experts` MLPs in each MoE block (all of them, or the top-k a token runs through).
int64_t gptParameters(const GptConfig& g, int64_t experts) {
  int64_t C = g.hiddenSize, F = g.ffn(), L = g.numLayers;
  int64_t b = g.bias ? 1 : 0;
  int64_t mlp = (C * F + b * F) + (F * C + b * C);
  int64_t block = 2 * (2 * C) + (C * 3 * C + b * 3 * C) + (C * C + b * C);
  int64_t total = g.vocabSize * C + g.positions() * C + L * block + 2 * C;
  for (int64_t i = 0; i < L; ++i) total += g.isMoeLayer(i) ? C * g.moeNumExperts + experts * mlp : mlp;
  return total;
}
}  // namespace

int64_t GptConfig::numParameters() const {
  return gptParameters(*this, moeNumExperts);
}

int64_t GptConfig::activeParameters() const {
  return gptParameters(*this, moeTopK);
}

double GptConfig::flopsPerToken() const {
  return 6.0 * double(activeParameters()) + 12.0 * double(numLayers) * double(hiddenSize) * double(seqLength);
}

double GptConfig::blockFlopsPerToken() const {
  double C = double(hiddenSize), F = double(ffn());
  // q|k|v, the output projection, fc and proj; and the attention scores and their weighted sum.
  return 6.0 * (4.0 * C * C + 2.0 * C * F) + 12.0 * C * double(seqLength);
}

double GptConfig::embeddingFlopsPerToken() const {
  // Two row lookups and their sum forward, the rows' gradients added into both tables backward.
  return 4.0 * double(hiddenSize);
}

double GptConfig::headFlopsPerToken() const {
  double V = double(vocabSize);
  // The tied head's product (forward, and the input's and the table's gradients), and the softmax
  // cross-entropy over the vocabulary (exponentials, sums, the gradient), about 10 per logit.
  return 6.0 * V * double(hiddenSize) + 10.0 * V;
}

std::vector<nn::BlockRange> GptConfig::pipelineSplit() const {
  std::vector<double> blocks(size_t(numLayers), blockFlopsPerToken());
  return nn::balancedSplit(blocks, embeddingFlopsPerToken(), headFlopsPerToken(), pipeline.chunks());
}

Gpt::Gpt(const GptConfig& config) : config_(config) {
  STRATA_CHECK(config.numLayers > 0, "model.num_layers must be positive, got {}", config.numLayers);
  STRATA_USER_CHECK(config.positions() >= config.seqLength,
                    "model.max_position_embeddings ({}) is shorter than model.seq_length ({}): the position "
                    "table needs a row for every position of a window",
                    config.maxPositionEmbeddings, config.seqLength);
  STRATA_CHECK(config.hiddenSize % config.numHeads == 0,
               "model.hidden_size ({}) must be divisible by model.num_attention_heads ({})",
               config.hiddenSize, config.numHeads);
  const nn::TensorParallel& tp = config.tensorParallel;
  nn::checkTensorSplit(tp, "gpt", config.numHeads, config.ffn(),
                       "model.ffn_hidden_size (4 x hidden_size when 0)", config.vocabSize, true);
  STRATA_USER_CHECK(
      !tp.splitsSequence() || config.positions() % tp.size == 0,
      "parallel.tensor ({}) must divide the position table's rows (model.max_position_embeddings; "
      "0: model.seq_length) under parallel.sequence_parallel ({})",
      tp.size, config.positions());
  const nn::PipelineParallel& pp = config.pipeline;
  if (pp.active()) {
    STRATA_USER_CHECK(config.moeNumExperts == 0,
                      "parallel.pipeline ({}) with mixture-of-experts layers (model.moe_num_experts) is not "
                      "supported: train MoE models with parallel.pipeline: 1",
                      pp.size);
    STRATA_CHECK(pp.rank >= 0 && pp.rank < pp.size && pp.virtualStages >= 1,
                 "gpt: pipeline stage {} of {} x {}", pp.rank, pp.size, pp.virtualStages);
  }
  split_ = pp.active() ? config.pipelineSplit() : std::vector<nn::BlockRange>{{0, config.numLayers}};
  // The model chunk (this rank's local index) each block belongs to; -1: another rank's.
  std::vector<int64_t> localChunkOf(size_t(config.numLayers), -1);
  for (int64_t v = 0; v < (pp.active() ? pp.virtualStages : 1); ++v) {
    const nn::BlockRange& r = split_[size_t(pp.active() ? pp.chunkOf(v) : 0)];
    for (int64_t i = r.begin; i < r.end; ++i) localChunkOf[size_t(i)] = v;
  }
  chunkBlocks_.resize(pp.active() ? size_t(pp.virtualStages) : 1);
  const bool first = !pp.active() || pp.holdsFirst(), last = !pp.active() || pp.holdsLast();
  // Every rank draws every parameter from one generator in the one-rank model's order, so what it keeps has
  // the one-rank model's numbers (the tied table's two copies alike); what another stage holds is made and
  // dropped at once, one module at a time.
  Generator gen(config.seed);
  nn::EmbeddingConfig tokens{config.vocabSize, config.hiddenSize, config.initStd, config.device};
  tokens.tensorParallel = tp;
  auto wte = std::make_shared<nn::Embedding>(tokens, gen);
  if (first || last) wte_ = registerModule("wte", wte);
  wte.reset();
  auto wpe = std::make_shared<nn::Embedding>(
      nn::EmbeddingConfig{config.positions(), config.hiddenSize, config.initStd, config.device}, gen);
  if (first) wpe_ = registerModule("wpe", wpe);
  wpe.reset();
  blocks_ = registerModule("h", std::make_shared<nn::ModuleList>());
  // GPT-2: residual projections start smaller, by 1/sqrt(2 * layers), so the residual stream's variance stays
  // put.
  double outStd = config.initStd / std::sqrt(2.0 * double(config.numLayers));
  for (int64_t i = 0; i < config.numLayers; ++i) {
    nn::TransformerBlockConfig b;
    b.attention = nn::AttentionConfig{config.hiddenSize, config.numHeads, true,   false,        config.bias,
                                      config.dropout,    config.initStd,  outStd, config.device};
    b.mlp = nn::MlpConfig{config.hiddenSize, config.ffn(), config.bias,  config.dropout,
                          config.initStd,    outStd,       config.device};
    b.attention.tensorParallel = tp;
    b.mlp.tensorParallel = tp;
    b.layerNormEps = config.layerNormEps;
    std::shared_ptr<nn::Module> feedForward;
    if (config.isMoeLayer(i)) {
      auto moe = std::make_shared<nn::MoE>(moeLayerConfig(config, b.mlp), gen);
      moes_.push_back(moe.get());
      feedForward = moe;
    }
    auto block = std::make_shared<nn::TransformerBlock>(b, gen, feedForward);
    if (localChunkOf[size_t(i)] < 0) continue;
    chunkBlocks_[size_t(localChunkOf[size_t(i)])].push_back(block.get());
    blocks_->appendNamed(i, block);
  }
  if (last)
    lnF_ = registerModule("ln_f", std::make_shared<nn::LayerNorm>(nn::NormConfig{
                                      config.hiddenSize, config.layerNormEps, true, config.device, tp}));
}

namespace {
// NOTE [Sequence parallelism] in nn/TensorParallel.h: t [B, S] padded at the end to a multiple of the
// group's size with `value`, when the sequence is split.
Tensor padToSplit(const Tensor& t, const nn::TensorParallel& tp, double value) {
  int64_t pad = (tp.size - t.size(1) % tp.size) % tp.size;
  if (!tp.splitsSequence() || pad == 0) return t;
  return ops::cat({t, ops::full({t.size(0), pad}, value, t.dtype(), t.device())}, 1);
}
}  // namespace

void Gpt::refuseStage(const char* what) const {
  STRATA_USER_CHECK(!config_.pipeline.active(),
                    "gpt: {} needs the whole model, and this rank holds pipeline stage {} of {} "
                    "(parallel.pipeline): join the stages' checkpoint with `strata convert` and use that",
                    what, config_.pipeline.rank, config_.pipeline.size);
}

Tensor Gpt::embed(const Tensor& ids, DType compute) {
  STRATA_CHECK(ids.dim() == 2, "gpt: token ids must be [batch, seq], got {}", toString(ids.shape()));
  int64_t T = ids.size(1);
  STRATA_CHECK(T <= config_.positions(),
               "gpt: sequence of {} tokens exceeds the {} positions (model.max_position_embeddings, 0: "
               "model.seq_length)",
               T, config_.positions());
  Tensor pos = ops::arange(0, double(T), 1, DType::I64, ids.device());
  // Two statements, not one sum: the operands of + are evaluated in an unspecified order (g++ takes wpe
  // first), and the chunk layout follows the order of first use, which models::parameterShapes lists as wte,
  // then wpe.
  Tensor x = wte_->apply(ids, compute);
  // Under sequence parallelism x is this rank's part of the sequence, and so are its positions' rows.
  Tensor positions = wpe_->apply(pos, compute);
  if (config_.tensorParallel.splitsSequence())
    positions = nn::splitSequence(positions, config_.tensorParallel, 0);
  x = x + positions;
  // NOTE [Tensor-parallel random streams]: this rank's part of the sequence under sequence parallelism.
  nn::TensorParallelRandom ownPart(config_.tensorParallel, config_.tensorParallel.sequenceParallel);
  return dropout(x, config_.dropout, isTraining());
}

Tensor Gpt::hidden(const Tensor& ids, DType compute) {
  Tensor x = embed(ids, compute);
  // The residual stream travels as (x, pending) so each block's closing add fuses into the next norm; the
  // first block starts with no pending part.
  std::vector<Tensor> stream = (*blocks_)(std::vector<Tensor>{x, Tensor()});
  return (*lnF_)(stream)[0];
}

// The tied head is a second call of wte (Embedding::unembed*), so wte's hooks fire around this use of its
// table as well as around the lookup.
Tensor Gpt::logitsImpl(const Tensor& ids, DType compute) {
  refuseStage("generation (the logits)");
  int64_t S = ids.size(1);
  Tensor logits = wte_->unembed(hidden(padToSplit(ids, config_.tensorParallel, 0), compute), compute);
  return logits.size(1) == S ? logits : logits.narrow(1, 0, S);
}

Tensor Gpt::headLoss(const Tensor& x, const Tensor& targets) {
  const nn::TensorParallel& tp = config_.tensorParallel;
  Tensor target = padToSplit(targets, tp, -100);  // the padding's targets are ignored
  if (tp.splitsSequence()) {
    // The head takes the ranks' rows in rank order: each rank's part of every sequence.
    int64_t B = target.size(0), S = target.size(1);
    target = target.reshape({B, tp.size, S / tp.size}).permute({1, 0, 2});
  }
  return wte_->unembedCrossEntropy(x.reshape({-1, config_.hiddenSize}), target.reshape({-1}));
}

Tensor Gpt::lossImpl(const Tensor& ids, const Tensor& targets, DType compute) {
  refuseStage("the whole model's loss");
  Tensor loss = headLoss(hidden(padToSplit(ids, config_.tensorParallel, 0), compute), targets);
  // Training adds the MoE layers' weighted auxiliary losses (load balance, z-loss); evaluation reports the
  // cross-entropy alone.
  if (isTraining())
    for (nn::MoE* moe : moes_) loss = loss + moe->auxLoss().to(loss.dtype());
  return loss;
}

Tensor Gpt::stageForward(int64_t local, const Tensor& input, const Tensor& ids, const Tensor& targets,
                         DType compute) {
  const nn::PipelineParallel& pp = config_.pipeline;
  STRATA_CHECK(pp.active() && local >= 0 && local < pp.virtualStages,
               "gpt: stageForward of local chunk {} on stage {} of {} x {}", local, pp.rank, pp.size,
               pp.virtualStages);
  const int64_t chunk = pp.chunkOf(local);
  const bool first = chunk == 0, last = chunk == pp.chunks() - 1;
  STRATA_CHECK(first != input.defined(), "gpt: model chunk {} {} an input from the previous chunk", chunk,
               first ? "takes no" : "needs");
  std::vector<Tensor> inputs{ids, targets};
  if (!first) inputs.push_back(input);
  return call(inputs, [&](const std::vector<Tensor>& in) {
    Tensor x = first ? embed(padToSplit(in[0], config_.tensorParallel, 0), compute) : in[2];
    std::vector<Tensor> stream{x, Tensor()};
    for (nn::TransformerBlock* block : chunkBlocks_[size_t(local)]) stream = (*block)(stream);
    if (last) return std::vector<Tensor>{headLoss((*lnF_)(stream)[0], in[1])};
    // What travels to the next chunk is the stream itself: the pending add is made here.
    return std::vector<Tensor>{stream[1].defined() ? stream[0] + stream[1] : stream[0]};
  })[0];
}

Shape Gpt::stageActivationShape(const Shape& ids) const {
  const nn::TensorParallel& tp = config_.tensorParallel;
  int64_t S = ids[1];
  if (tp.splitsSequence()) S = (S + tp.size - 1) / tp.size;  // padded to a multiple, then this rank's part
  return Shape{ids[0], S, config_.hiddenSize};
}

std::vector<std::string> Gpt::tiedParameters() const {
  if (!config_.pipeline.active()) return {};
  return {"wte.weight"};
}

}  // namespace strata::models
