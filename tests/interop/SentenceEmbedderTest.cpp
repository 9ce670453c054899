// `strata embed`'s embedder on a tiny random BERT written the way sentence-transformers saves one
// (BertModel's tensor names without "bert.", vocab.txt, the pooling and tokenizer configs). The real
// all-MiniLM-L6-v2 (90 MB, too big for a fixture) is checked by tools/embed_check.py against a numpy BERT
// forward and HF's tokenizer.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "models/HfLayout.h"
#include "models/bert/BertHf.h"
#include "strata/autograd/GradMode.h"
#include "strata/interop/SentenceEmbedder.h"
#include "strata/train/Checkpoint.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kVocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat",
                                         "on",    "mat",   "a",     "dog",   "##s",    "run", ".",   "hello",
                                         "world", "!",     "cafe",  "big",   "red",    "sun", "is",  "up"};

models::BertConfig tinyBert() {
  models::BertConfig c;
  c.numLayers = 2;
  c.hiddenSize = 32;
  c.numHeads = 4;
  c.ffnHiddenSize = 64;
  c.seqLength = 16;
  c.vocabSize = int64_t(kVocab.size());
  c.dropout = 0;
  c.initStd = 0.2;  // larger than BERT's 0.02, so the layers move the states far from the embeddings
  c.seed = 77;
  return c;
}

// The directory sentence-transformers would save for `model` (its encoder as BertModel's tensors).
fs::path writeModelDir(const fs::path& dir, models::Bert& model, int64_t maxSeqLength,
                       const std::string& pooling = "pooling_mode_mean_tokens") {
  fs::create_directories(dir / "1_Pooling");
  const models::BertConfig& c = model.config();
  std::ofstream(dir / "config.json") << "{\"architectures\": [\"BertModel\"], \"model_type\": \"bert\", "
                                     << "\"vocab_size\": " << c.vocabSize
                                     << ", \"hidden_size\": " << c.hiddenSize
                                     << ", \"num_hidden_layers\": " << c.numLayers
                                     << ", \"num_attention_heads\": " << c.numHeads
                                     << ", \"intermediate_size\": " << c.ffn()
                                     << ", \"max_position_embeddings\": " << c.seqLength
                                     << ", \"type_vocab_size\": 2, \"hidden_act\": \"gelu\", "
                                     << "\"hidden_dropout_prob\": 0.1, \"layer_norm_eps\": 1e-12, "
                                     << "\"pad_token_id\": 0, \"position_embedding_type\": \"absolute\"}\n";
  std::ofstream(dir / "sentence_bert_config.json")
      << "{\"max_seq_length\": " << maxSeqLength << ", \"do_lower_case\": false}\n";
  std::ofstream(dir / "tokenizer_config.json") << "{\"do_lower_case\": true}\n";
  std::ofstream(dir / "1_Pooling" / "config.json")
      << "{\"word_embedding_dimension\": " << c.hiddenSize << ", \"" << pooling << "\": true}\n";
  std::ofstream vocab(dir / "vocab.txt");
  for (const auto& t : kVocab) vocab << t << "\n";
  vocab.close();
  train::NamedTensors tensors;
  for (auto& [name, t] : models::exportHf(model, models::bertHfLayout(c)))
    if (name.rfind("bert.", 0) == 0) tensors.emplace_back(name.substr(5), t);  // BertModel's names
  tensors.emplace_back("embeddings.position_ids",
                       ops::arange(0, double(c.seqLength), 1, DType::I64, Device::cpu()).reshape({1, -1}));
  train::writeSafetensors((dir / "model.safetensors").string(), tensors);
  return dir;
}

// The mean of `model`'s final states over one unpadded sequence, normalised: the definition, by hand.
std::vector<double> reference(models::Bert& model, const std::vector<int64_t>& ids) {
  NoGradGuard noGrad;
  int64_t S = int64_t(ids.size()), C = model.config().hiddenSize;
  std::vector<float> h =
      model.encode(Tensor::fromVector(ids, {1, S}, Device::cpu()), Tensor(), Tensor(), DType::F32)
          .contiguous()
          .toVector<float>();
  std::vector<double> mean(size_t(C), 0.0);
  for (int64_t t = 0; t < S; ++t)
    for (int64_t c = 0; c < C; ++c) mean[size_t(c)] += double(h[size_t(t * C + c)]) / double(S);
  double norm = 0;
  for (double v : mean) norm += v * v;
  for (double& v : mean) v /= std::sqrt(norm);
  return mean;
}

}  // namespace

TEST_CASE("SentenceEmbedder: mean-pooled, normalised BERT states from a sentence-transformers directory",
          "[train][embed]") {
  models::Bert source(tinyBert());
  source.eval();
  fs::path dir = writeModelDir(test::freshDir("strata-embed-model"), source, 10);
  interop::SentenceEmbedderOptions options;
  options.batchSize = 3;  // two batches, each padded to its longest text
  interop::SentenceEmbedder embedder(dir.string(), options);
  REQUIRE(embedder.dimension() == 32);
  REQUIRE(embedder.maxSeqLength() == 10);

  // Lower-cased WordPiece between [CLS] and [SEP]; truncated to max_seq_length with both kept.
  REQUIRE(embedder.tokenIds("The CAT sat.") == std::vector<int64_t>{2, 5, 6, 7, 14, 3});
  REQUIRE(embedder.tokenIds("dogs run") == std::vector<int64_t>{2, 11, 12, 13, 3});
  std::vector<int64_t> longest = embedder.tokenIds("the cat sat on the mat the dog is up and away");
  REQUIRE(longest.size() == 10);
  REQUIRE(longest.front() == 2);
  REQUIRE(longest.back() == 3);
  REQUIRE(longest[8] == 11);  // "dog" is the 8th piece kept

  std::vector<std::string> texts = {
      "The cat sat on the mat.", "hello world!", "dogs run",
      "a big red sun is up",     "cafe",         "the cat sat on the mat the dog is up"};
  auto embeddings = embedder.embed(texts);
  REQUIRE(embeddings.size() == texts.size());
  double worst = 0, minDistance = 2;
  for (size_t i = 0; i < texts.size(); ++i) {
    INFO(texts[i]);
    REQUIRE(embeddings[i].size() == 32);
    double norm = 0;
    for (float v : embeddings[i]) norm += double(v) * double(v);
    REQUIRE(std::abs(std::sqrt(norm) - 1.0) < 1e-6);
    // Batched and padded equals the definition on the text alone, from the exporting model's weights.
    std::vector<double> want = reference(source, embedder.tokenIds(texts[i]));
    for (size_t c = 0; c < want.size(); ++c)
      worst = std::max(worst, std::abs(want[c] - double(embeddings[i][c])));
    if (i > 0) {
      double d = 0;
      for (size_t c = 0; c < want.size(); ++c)
        d += std::abs(double(embeddings[i][c]) - double(embeddings[0][c]));
      minDistance = std::min(minDistance, d);
    }
  }
  INFO("worst |diff| " << worst << ", smallest L1 distance to the first text " << minDistance);
  REQUIRE(worst < 1e-5);
  REQUIRE(minDistance > 1e-2);  // different texts, different vectors
}

TEST_CASE("SentenceEmbedder: refuses what it cannot compute, naming the file", "[train][embed]") {
  models::Bert source(tinyBert());
  fs::path dir = writeModelDir(test::freshDir("strata-embed-cls"), source, 10, "pooling_mode_cls_token");
  std::string error = test::errorOf([&] { interop::SentenceEmbedder e(dir.string()); });
  INFO(error);
  REQUIRE(error.find("1_Pooling/config.json") != std::string::npos);
  fs::remove(dir / "vocab.txt");
  REQUIRE(test::errorOf([&] { interop::SentenceEmbedder e(dir.string()); }).find("vocab.txt") !=
          std::string::npos);
}
