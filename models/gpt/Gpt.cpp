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
  if (tp.active()) {
    auto divides = [&](const char* key, int64_t n) {
      STRATA_USER_CHECK(n % tp.size == 0, "parallel.tensor ({}) must divide {} ({})", tp.size, key, n);
    };
    divides("model.num_attention_heads", config.numHeads);
    divides("model.ffn_hidden_size (4 x hidden_size when 0)", config.ffn());
    divides("model.vocab_size (pad the vocabulary to a multiple of it)", config.vocabSize);
    if (tp.sequenceParallel)
      divides(
          "the position table's rows (model.max_position_embeddings; 0: model.seq_length) under "
          "parallel.sequence_parallel",
          config.positions());
  }
  Generator gen(config.seed);
  nn::EmbeddingConfig tokens{config.vocabSize, config.hiddenSize, config.initStd, config.device};
  tokens.tensorParallel = tp;
  wte_ = registerModule("wte", std::make_shared<nn::Embedding>(tokens, gen));
  wpe_ = registerModule(
      "wpe",
      std::make_shared<nn::Embedding>(
          nn::EmbeddingConfig{config.positions(), config.hiddenSize, config.initStd, config.device}, gen));
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
    blocks_->append(std::make_shared<nn::TransformerBlock>(b, gen, feedForward));
  }
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

Tensor Gpt::hidden(const Tensor& ids, DType compute) {
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
  {
    // NOTE [Tensor-parallel random streams]: this rank's part of the sequence under sequence parallelism.
    nn::TensorParallelRandom ownPart(config_.tensorParallel, config_.tensorParallel.sequenceParallel);
    x = dropout(x, config_.dropout, isTraining());
  }
  // The residual stream travels as (x, pending) so each block's closing add fuses into the next norm; the
  // first block starts with no pending part.
  std::vector<Tensor> stream = (*blocks_)(std::vector<Tensor>{x, Tensor()});
  return (*lnF_)(stream)[0];
}

// The tied head is a second call of wte (Embedding::unembed*), so wte's hooks fire around this use of its
// table as well as around the lookup.
Tensor Gpt::logitsImpl(const Tensor& ids, DType compute) {
  int64_t S = ids.size(1);
  Tensor logits = wte_->unembed(hidden(padToSplit(ids, config_.tensorParallel, 0), compute), compute);
  return logits.size(1) == S ? logits : logits.narrow(1, 0, S);
}

Tensor Gpt::lossImpl(const Tensor& ids, const Tensor& targets, DType compute) {
  const nn::TensorParallel& tp = config_.tensorParallel;
  Tensor x = hidden(padToSplit(ids, tp, 0), compute);
  Tensor target = padToSplit(targets, tp, -100);  // the padding's targets are ignored
  if (tp.splitsSequence()) {
    // The head takes the ranks' rows in rank order: each rank's part of every sequence.
    int64_t B = target.size(0), S = target.size(1);
    target = target.reshape({B, tp.size, S / tp.size}).permute({1, 0, 2});
  }
  Tensor loss = wte_->unembedCrossEntropy(x.reshape({-1, config_.hiddenSize}), target.reshape({-1}));
  // Training adds the MoE layers' weighted auxiliary losses (load balance, z-loss); evaluation reports the
  // cross-entropy alone.
  if (isTraining())
    for (nn::MoE* moe : moes_) loss = loss + moe->auxLoss().to(loss.dtype());
  return loss;
}

}  // namespace strata::models
