#include "strata/interop/SentenceEmbedder.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "models/Zoo.h"
#include "models/ZooHf.h"
#include "models/bert/BertHf.h"
#include "strata/autograd/GradMode.h"
#include "strata/config/Config.h"
#include "strata/config/Resolve.h"
#include "strata/train/Checkpoint.h"

namespace strata::interop {
namespace fs = std::filesystem;
namespace {

std::string readText(const fs::path& path) {
  std::ifstream in(path);
  STRATA_USER_CHECK(in.good(), "embed: cannot read {}", path.string());
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A JSON file of the model directory, or an empty object when it is absent.
nlohmann::json optionalJson(const fs::path& path) {
  if (!fs::is_regular_file(path)) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(readText(path));
  } catch (const nlohmann::json::exception& e) {
    STRATA_USER_FAIL("embed: {} is not JSON: {}", path.string(), e.what());
  }
}

}  // namespace

SentenceEmbedder::SentenceEmbedder(const std::string& modelDir, const SentenceEmbedderOptions& options)
    : options_(options) {
  fs::path dir(modelDir);
  STRATA_USER_CHECK(fs::is_directory(dir), "embed: {} is not a directory", modelDir);
  for (const char* name : {"config.json", "model.safetensors", "vocab.txt"})
    STRATA_USER_CHECK(fs::is_regular_file(dir / name), "embed: {} has no {}", modelDir, name);
  STRATA_USER_CHECK(options_.batchSize > 0, "embed: the batch size must be positive, got {}",
                    options_.batchSize);

  // The model: HF's config.json through the zoo's own reading of it.
  std::string configText = readText(dir / "config.json");
  std::vector<std::string> overrides;
  for (const auto& [key, value] : models::modelConfigFromHf(configText))
    overrides.push_back(key + "=" + value);
  // No data: the vocabulary is vocab.txt's, not the byte tokenizer's the config would otherwise check for.
  overrides.push_back("data.format=random");
  STRATA_USER_CHECK(nlohmann::json::parse(configText).value("model_type", "") == "bert",
                    "embed: {} holds a {} model; sentence embeddings take a BERT", modelDir,
                    nlohmann::json::parse(configText).value("model_type", "?"));
  config::Config config =
      config::parseConfig("", (dir / "config.json").string(), overrides, /*requireData=*/false);
  models::ModelSpec spec = config::modelSpecFrom(config, options_.device);
  spec.bertBinaryHead = false;  // the pooler and NSP head play no part in mean pooling
  models::BertConfig bert = models::bertConfig(spec);
  bert.dropout = 0;
  model_ = std::make_shared<models::Bert>(bert);
  model_->eval();

  // The weights: BertModel's names gain the "bert." of the layout's; only the encoder is read.
  std::map<std::string, Tensor> weights;
  for (auto& [name, t] : train::readSafetensors((dir / "model.safetensors").string(), options_.device)) {
    bool bare =
        name.rfind("embeddings.", 0) == 0 || name.rfind("encoder.", 0) == 0 || name.rfind("pooler.", 0) == 0;
    weights.emplace(bare ? "bert." + name : name, t);
  }
  models::HfLayout encoder;
  for (const models::HfTensor& t : models::bertHfLayout(bert))
    if (t.hfName.rfind("bert.embeddings.", 0) == 0 || t.hfName.rfind("bert.encoder.", 0) == 0)
      encoder.push_back(t);
  models::importHf(*model_, encoder, weights);

  // The tokenizer and the sequence length.
  nlohmann::json tokenizerConfig = optionalJson(dir / "tokenizer_config.json");
  nlohmann::json sentenceConfig = optionalJson(dir / "sentence_bert_config.json");
  data::WordPieceOptions wordPiece;
  // The HF tokenizer's own lower-casing, or sentence-transformers' (applied before it).
  wordPiece.lowerCase =
      tokenizerConfig.value("do_lower_case", true) || sentenceConfig.value("do_lower_case", false);
  tokenizer_ = std::make_unique<data::WordPieceTokenizer>((dir / "vocab.txt").string(), wordPiece);
  cls_ = tokenizer_->tokenId("[CLS]");
  sep_ = tokenizer_->tokenId("[SEP]");
  pad_ = tokenizer_->tokenId("[PAD]");
  STRATA_USER_CHECK(cls_ >= 0 && sep_ >= 0 && pad_ >= 0, "embed: {}/vocab.txt lacks [CLS], [SEP] or [PAD]",
                    modelDir);
  STRATA_USER_CHECK(tokenizer_->vocabSize() <= bert.vocabSize,
                    "embed: {}/vocab.txt has {} tokens but config.json's vocab_size is {}", modelDir,
                    tokenizer_->vocabSize(), bert.vocabSize);
  maxSeqLength_ = options_.maxSeqLength > 0 ? options_.maxSeqLength
                                            : sentenceConfig.value("max_seq_length", bert.positions());
  maxSeqLength_ = std::min(maxSeqLength_, bert.positions());
  STRATA_USER_CHECK(maxSeqLength_ >= 2, "embed: a maximum sequence length of {} leaves no room for a token",
                    maxSeqLength_);

  nlohmann::json pooling = optionalJson(dir / "1_Pooling" / "config.json");
  bool other = pooling.value("pooling_mode_cls_token", false) ||
               pooling.value("pooling_mode_max_tokens", false) ||
               pooling.value("pooling_mode_mean_sqrt_len_tokens", false);
  STRATA_USER_CHECK(pooling.value("pooling_mode_mean_tokens", true) && !other,
                    "embed: {}/1_Pooling/config.json asks for a pooling other than the mean of the tokens, "
                    "the only one strata embed computes",
                    modelDir);
}

std::vector<int64_t> SentenceEmbedder::tokenIds(const std::string& text) const {
  std::vector<int32_t> pieces = tokenizer_->encode(text);
  size_t keep = std::min(pieces.size(), size_t(maxSeqLength_ - 2));
  std::vector<int64_t> ids{cls_};
  ids.insert(ids.end(), pieces.begin(), pieces.begin() + std::ptrdiff_t(keep));
  ids.push_back(sep_);
  return ids;
}

std::vector<std::vector<float>> SentenceEmbedder::embed(const std::vector<std::string>& texts) const {
  NoGradGuard noGrad;
  int64_t C = dimension();
  std::vector<std::vector<float>> out;
  out.reserve(texts.size());
  for (size_t first = 0; first < texts.size(); first += size_t(options_.batchSize)) {
    size_t count = std::min(texts.size() - first, size_t(options_.batchSize));
    std::vector<std::vector<int64_t>> rows;
    size_t S = 0;
    for (size_t i = 0; i < count; ++i) {
      rows.push_back(tokenIds(texts[first + i]));
      S = std::max(S, rows.back().size());
    }
    // Padded to the longest; the mask keeps padding out of the attention and out of the mean.
    std::vector<int64_t> ids(count * S, pad_), mask(count * S, 0);
    for (size_t i = 0; i < count; ++i)
      for (size_t t = 0; t < rows[i].size(); ++t) {
        ids[i * S + t] = rows[i][t];
        mask[i * S + t] = 1;
      }
    int64_t B = int64_t(count), T = int64_t(S);
    Tensor idsTensor = Tensor::fromVector(ids, {B, T}, options_.device);
    Tensor maskTensor = Tensor::fromVector(mask, {B, T}, options_.device);
    Tensor hidden = model_->encode(idsTensor, Tensor(), maskTensor, DType::F32);
    std::vector<float> h = hidden.to(Device::cpu(), DType::F32).contiguous().toVector<float>();
    for (size_t i = 0; i < count; ++i) {
      // sentence-transformers' mean pooling and normalize(), accumulated in double.
      std::vector<double> sum(size_t(C), 0.0);
      for (size_t t = 0; t < rows[i].size(); ++t)
        for (int64_t c = 0; c < C; ++c) sum[size_t(c)] += double(h[(i * S + t) * size_t(C) + size_t(c)]);
      double norm = 0;
      for (double& v : sum) {
        v /= double(rows[i].size());
        norm += v * v;
      }
      norm = std::max(std::sqrt(norm), 1e-12);
      std::vector<float> e(static_cast<size_t>(C));
      for (int64_t c = 0; c < C; ++c) e[size_t(c)] = float(sum[size_t(c)] / norm);
      out.push_back(std::move(e));
    }
  }
  return out;
}

}  // namespace strata::interop
