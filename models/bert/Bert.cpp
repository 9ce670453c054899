#include "models/bert/Bert.h"

#include "strata/autograd/Functions.h"
#include "strata/ops/Ops.h"

namespace strata::models {

std::vector<std::pair<std::string, Shape>> BertConfig::parameterShapes(int64_t T) const {
  int64_t C = hiddenSize, F = ffn() / T, V = vocabSize / T;
  std::vector<std::pair<std::string, Shape>> out{{"embeddings.word.weight", {V, C}},
                                                 {"embeddings.position.weight", {positions(), C}},
                                                 {"embeddings.token_type.weight", {typeVocabSize, C}},
                                                 {"embeddings.ln.weight", {C}},
                                                 {"embeddings.ln.bias", {C}}};
  auto linear = [&](const std::string& name, int64_t in, int64_t n) {
    out.emplace_back(name + ".weight", Shape{in, n});
    out.emplace_back(name + ".bias", Shape{n});
  };
  auto norm = [&](const std::string& name) {
    out.emplace_back(name + ".weight", Shape{C});
    out.emplace_back(name + ".bias", Shape{C});
  };
  for (int64_t i = 0; i < numLayers; ++i) {
    std::string l = "layer." + std::to_string(i) + ".";
    linear(l + "attn.qkv", C, 3 * C / T);
    linear(l + "attn.proj", C / T, C);
    norm(l + "ln_1");
    linear(l + "mlp.fc", C, F);
    linear(l + "mlp.proj", F, C);
    norm(l + "ln_2");
  }
  // The head's own bias is registered before its submodules, so namedParameters() lists it first.
  out.emplace_back("cls.bias", Shape{V});
  linear("cls.transform", C, C);
  norm("cls.ln");
  if (nspHead) {
    linear("pooler", C, C);
    linear("nsp", C, 2);
  }
  return out;
}

int64_t BertConfig::numParameters() const {
  int64_t n = 0;
  for (auto& [name, shape] : parameterShapes()) n += numelOf(shape);
  return n;
}

double BertConfig::flopsPerToken() const {
  double C = double(hiddenSize), F = double(ffn()), V = double(vocabSize), L = double(numLayers);
  double layer = 4 * C * C + 2 * C * F;  // qkv, proj, fc, proj (biases and norms are negligible)
  double perToken = L * layer + C * C + V * C;
  double perSequence = nspHead ? C * C + 2 * C : 0.0;
  return 6.0 * (perToken + perSequence / double(seqLength)) + 12.0 * L * C * double(seqLength);
}

Bert::Bert(const BertConfig& config) : config_(config) {
  STRATA_USER_CHECK(config.numLayers > 0, "model.num_layers must be positive, got {}", config.numLayers);
  STRATA_USER_CHECK(config.numHeads > 0 && config.hiddenSize % config.numHeads == 0,
                    "model.hidden_size ({}) must be divisible by model.num_attention_heads ({})",
                    config.hiddenSize, config.numHeads);
  STRATA_USER_CHECK(config.typeVocabSize > 0, "model.num_tokentypes must be positive, got {}",
                    config.typeVocabSize);
  STRATA_USER_CHECK(config.positions() >= config.seqLength,
                    "model.max_position_embeddings ({}) is shorter than model.seq_length ({}): the position "
                    "table needs a row for every position of a sequence",
                    config.maxPositionEmbeddings, config.seqLength);
  STRATA_USER_CHECK(config.padId() >= 0 && config.padId() < config.vocabSize,
                    "model.pad_token_id ({}) is not an id of the vocabulary (model.vocab_size {})",
                    config.padId(), config.vocabSize);
  const nn::TensorParallel& tp = config.tensorParallel;
  nn::checkTensorSplit(tp, "bert", config.numHeads, config.ffn(),
                       "model.ffn_hidden_size (4 x hidden_size when 0)", config.vocabSize, false);
  Generator gen(config.seed);
  int64_t C = config.hiddenSize;
  auto embedding = [&](int64_t n, int64_t paddingIdx = -1, nn::TensorParallel split = {}) {
    nn::EmbeddingConfig e{n, C, config.initStd, config.device, paddingIdx};
    e.tensorParallel = std::move(split);
    return std::make_shared<nn::Embedding>(e, gen);
  };
  // Registration order is first-use order (the chunk layout packs parameters in it).
  words_ = registerModule("embeddings.word", embedding(config.vocabSize, config.padId(), tp));
  positions_ = registerModule("embeddings.position", embedding(config.positions()));
  tokenTypes_ = registerModule("embeddings.token_type", embedding(config.typeVocabSize));
  embeddingLn_ = registerModule("embeddings.ln", std::make_shared<nn::LayerNorm>(nn::NormConfig{
                                                     C, config.layerNormEps, true, config.device}));
  layers_ = registerModule("layer", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < config.numLayers; ++i) {
    BertLayerConfig l;
    l.attention = nn::AttentionConfig{C,
                                      config.numHeads,
                                      false,
                                      false,
                                      true,
                                      config.dropout,
                                      config.initStd,
                                      config.initStd,
                                      config.device};
    l.mlp = nn::MlpConfig{C,
                          config.ffn(),
                          true,
                          config.dropout,
                          config.initStd,
                          config.initStd,
                          config.device,
                          config.activation};
    l.attention.tensorParallel = tp;
    l.mlp.tensorParallel = tp;
    l.layerNormEps = config.layerNormEps;
    l.fp32Residual = config.fp32Residual;
    layers_->append(std::make_shared<BertLayer>(l, gen));
  }
  mlm_ = registerModule("cls", std::make_shared<BertMlmHead>(
                                   BertMlmHeadConfig{C, config.vocabSize, config.activation,
                                                     config.layerNormEps, config.initStd, config.device, tp},
                                   words_, gen));
  if (config.nspHead) {
    auto linear = [&](int64_t out) {
      return std::make_shared<nn::Linear>(nn::LinearConfig{C, out, true, config.initStd, config.device}, gen);
    };
    pooler_ = registerModule("pooler", linear(C));
    nsp_ = registerModule("nsp", linear(2));
  }
}

Tensor Bert::hidden(const Tensor& ids, const Tensor& tokenTypes, const Tensor& attentionMask, DType compute) {
  STRATA_CHECK(ids.dim() == 2, "bert: token ids must be [batch, seq], got {}", toString(ids.shape()));
  int64_t B = ids.size(0), S = ids.size(1);
  STRATA_USER_CHECK(S <= config_.positions(),
                    "bert: sequence of {} tokens exceeds the {} positions (model.max_position_embeddings, 0: "
                    "model.seq_length)",
                    S, config_.positions());
  for (const Tensor* t : {&tokenTypes, &attentionMask})
    STRATA_CHECK(!t->defined() || t->shape() == ids.shape(),
                 "bert: token types and attention mask must be shaped like the ids {}, got {}",
                 toString(ids.shape()), toString(t->shape()));
  Device dev = ids.device();
  Tensor types = tokenTypes.defined() ? tokenTypes : ops::zeros({B, S}, DType::I64, dev);
  Tensor pos = ops::arange(0, double(S), 1, DType::I64, dev);
  Tensor x =
      words_->apply(ids, compute) + positions_->apply(pos, compute) + tokenTypes_->apply(types, compute);
  // NOTE [BERT's fp32 residual stream] in BertLayer.h: the stream starts at the embeddings' norm.
  if (config_.fp32Residual && dtypeSize(compute) == 2) x = x.to(DType::F32);
  x = dropout(embeddingLn_->apply(x), config_.dropout, isTraining());
  // HF's 1 = token, 0 = padding becomes the attention's non-zero = ignore.
  Tensor keyPadding;
  if (attentionMask.defined())
    keyPadding = ops::eq(attentionMask.to(DType::F32), ops::zeros({}, DType::F32, attentionMask.device()));
  for (size_t i = 0; i < layers_->size(); ++i)
    x = static_cast<BertLayer&>(layers_->at(i)).apply(x, keyPadding);
  return x.to(compute);
}

Tensor Bert::nspFromHidden(const Tensor& hidden) {
  STRATA_CHECK(config_.nspHead, "bert: the NSP head needs model.bert_binary_head = true");
  return nsp_->apply(tanh(pooler_->apply(hidden.select(1, 0))));
}

Tensor Bert::encode(const Tensor& ids, const Tensor& tokenTypes, const Tensor& attentionMask, DType compute) {
  return call({ids, tokenTypes, attentionMask}, [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{hidden(in[0], in[1], in[2], compute)};
  })[0];
}

Tensor Bert::mlmLogits(const Tensor& ids, const Tensor& tokenTypes, const Tensor& attentionMask,
                       DType compute) {
  return call({ids, tokenTypes, attentionMask}, [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{mlm_->apply(hidden(in[0], in[1], in[2], compute))};
  })[0];
}

namespace {
// The hidden states of the chosen tokens [M, C] (positions defined), or all of them [B, S, C].
Tensor mlmRows(const Tensor& hidden, const Tensor& positions) {
  if (!positions.defined()) return hidden;
  return embedding(hidden.reshape({-1, hidden.size(-1)}), positions);
}

}  // namespace

Tensor Bert::mlmLoss(const Tensor& ids, const Tensor& tokenTypes, const Tensor& attentionMask,
                     const Tensor& labels, DType compute, const Tensor& positions) {
  return call({ids, tokenTypes, attentionMask, labels, positions}, [&](const std::vector<Tensor>& in) {
    Tensor h = mlmRows(hidden(in[0], in[1], in[2], compute), in[4]);
    return std::vector<Tensor>{mlm_->loss(h, in[3])};
  })[0];
}

Tensor Bert::nspLogits(const Tensor& ids, const Tensor& tokenTypes, const Tensor& attentionMask,
                       DType compute) {
  return call({ids, tokenTypes, attentionMask}, [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{nspFromHidden(hidden(in[0], in[1], in[2], compute))};
  })[0];
}

Tensor Bert::pretrainingLoss(const Tensor& ids, const Tensor& tokenTypes, const Tensor& attentionMask,
                             const Tensor& mlmLabels, const Tensor& nspLabels, DType compute,
                             const Tensor& positions) {
  return call({ids, tokenTypes, attentionMask, mlmLabels, nspLabels, positions},
              [&](const std::vector<Tensor>& in) {
                Tensor h = hidden(in[0], in[1], in[2], compute);
                Tensor mlm = mlm_->loss(mlmRows(h, in[5]), in[3]);
                Tensor nsp = crossEntropy(nspFromHidden(h), in[4].reshape({-1}), -100);
                return std::vector<Tensor>{mlm + nsp};
              })[0];
}

std::vector<Tensor> Bert::forwardImpl(const std::vector<Tensor>& inputs) {
  auto at = [&](size_t i) { return i < inputs.size() ? inputs[i] : Tensor(); };
  Tensor h = hidden(inputs.at(0), at(1), at(2), words_->weight.dtype());
  if (inputs.size() > 3 && inputs[3].defined()) return {mlm_->loss(h, inputs[3])};
  return {h};
}

}  // namespace strata::models
