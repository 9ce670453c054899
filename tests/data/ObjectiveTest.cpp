// The training objectives: what a micro-batch of windows becomes for each architecture, and that it is a
// pure function of the windows, the batch's index and split, and the seed.
#include <algorithm>
#include <cmath>
#include <optional>

#include "TestUtil.h"
#include "models/Zoo.h"
#include "strata/data/CausalLmObjective.h"
#include "strata/data/MaskedLmObjective.h"
#include "strata/data/SpanCorruptionObjective.h"
#include "strata/data/WordPieceTokenizer.h"

using namespace strata;

namespace {

models::ModelSpec tinySpec(const std::string& arch, std::vector<std::string> keys = {}) {
  models::ModelSpec s = test::tinyZooSpec(arch, arch == "bert" ? 260 : 384, 16);
  for (const auto& k : keys)
    if (k == "nsp") s.bertBinaryHead = true;
  return s;
}

std::shared_ptr<data::Objective> objectiveFor(const models::ModelSpec& spec, uint64_t seed = 7) {
  return data::makeObjective(spec.arch, models::buildModule(spec), std::make_shared<data::ByteTokenizer>(),
                             seed);
}

// B windows of T bytes of a fixed text.
data::TokenBatch windows(int64_t B, int64_t T, int64_t index, data::Split split = data::Split::Train) {
  std::string text = "to be or not to be, that is the question: whether 'tis nobler in the mind to suffer";
  std::vector<int64_t> ids;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) ids.push_back(static_cast<unsigned char>(text[size_t(3 * b + t)]));
  Tensor x = Tensor::fromVector<int64_t>(ids, {B, T});
  return data::TokenBatch{x, x, index, split};
}

std::vector<int64_t> values(const Tensor& t) {
  return t.contiguous().toVector<int64_t>();
}

}  // namespace

TEST_CASE("pickToken: greedy at temperature 0, among the top k otherwise, deterministic in the seed",
          "[train][objective]") {
  std::vector<float> logits{0.1f, 2.0f, 1.9f, -3.0f};
  REQUIRE(data::pickToken(logits, 0.0, 0, 1, 0) == 1);
  for (uint64_t step = 0; step < 20; ++step) {
    REQUIRE(data::pickToken(logits, 5.0, 1, 3, step) == 1);
    int64_t two = data::pickToken(logits, 5.0, 2, 3, step);
    REQUIRE((two == 1 || two == 2));
    REQUIRE(data::pickToken(logits, 5.0, 0, 3, step) == data::pickToken(logits, 5.0, 0, 3, step));
  }
  REQUIRE(data::corruptionSeed(1, data::Split::Train) != data::corruptionSeed(1, data::Split::Val));
  REQUIRE(data::corruptionSeed(1, data::Split::Train) != data::corruptionSeed(2, data::Split::Train));
}

TEST_CASE("the objectives of the zoo's architectures", "[train][objective]") {
  REQUIRE(dynamic_cast<data::CausalLmObjective*>(objectiveFor(tinySpec("gpt")).get()) != nullptr);
  REQUIRE(dynamic_cast<data::MaskedLmObjective*>(objectiveFor(tinySpec("bert")).get()) != nullptr);
  REQUIRE(dynamic_cast<data::SpanCorruptionObjective*>(objectiveFor(tinySpec("t5")).get()) != nullptr);
  // Each names its architecture for the log and counts the architecture's own FLOPs (strata info's figure).
  models::ModelSpec moe = tinySpec("gpt");
  moe.moeNumExperts = 4;
  moe.moeEvery = 1;
  for (const models::ModelSpec& spec : {tinySpec("gpt"), moe, tinySpec("bert"), tinySpec("t5")}) {
    INFO(spec.arch << " with " << spec.moeNumExperts << " experts");
    auto objective = objectiveFor(spec);
    REQUIRE(objective->modelName() == spec.arch);
    REQUIRE(objective->flopsPerToken().has_value());
    REQUIRE(*objective->flopsPerToken() == models::flopsPerToken(spec));
  }
  REQUIRE(models::flopsPerToken(moe) != models::flopsPerToken(tinySpec("gpt")));
  // BERT's four special tokens take the last ids of the vocabulary: a byte tokenizer needs 260.
  models::ModelSpec small = tinySpec("bert");
  small.vocabSize = 258;
  REQUIRE(test::errorOf([&] { objectiveFor(small); }).find("must be at least 260") != std::string::npos);
}

TEST_CASE("masked LM: [CLS] window [SEP], 15% chosen, keyed by the batch index and split",
          "[train][objective][bert]") {
  auto objective = std::dynamic_pointer_cast<data::MaskedLmObjective>(objectiveFor(tinySpec("bert")));
  const data::BertSpecialTokens& special = objective->specialTokens();
  REQUIRE(special.pad == 256);
  REQUIRE(special.cls == 257);
  REQUIRE(special.sep == 258);
  REQUIRE(special.mask == 259);
  REQUIRE(objective->windowLength() == 14);
  REQUIRE(objective->dataVocabSize() == 256);
  const int64_t B = 6, T = 14, S = 16;
  data::TokenBatch batch = windows(B, T, 5);
  data::MlmInputs in = objective->inputs(batch);
  REQUIRE(in.ids.shape() == Shape{B, S});
  REQUIRE(!in.tokenTypes.defined());
  std::vector<int64_t> ids = values(in.ids), labels = values(in.labels), original = values(batch.ids);
  int64_t masked = 0, changed = 0;
  for (int64_t b = 0; b < B; ++b) {
    REQUIRE(ids[size_t(b * S)] == special.cls);
    REQUIRE(labels[size_t(b * S)] == -100);
    REQUIRE(ids[size_t(b * S + S - 1)] == special.sep);
    REQUIRE(labels[size_t(b * S + S - 1)] == -100);
    int64_t chosen = 0;
    for (int64_t s = 1; s < S - 1; ++s) {
      int64_t label = labels[size_t(b * S + s)], id = ids[size_t(b * S + s)];
      int64_t token = original[size_t(b * T + s - 1)];
      if (label == -100) {
        REQUIRE(id == token);  // untouched
        continue;
      }
      ++chosen;
      REQUIRE(label == token);
      masked += id == special.mask;
      changed += id != token;
    }
    REQUIRE(chosen == 2);  // round(0.15 x 14)
  }
  REQUIRE(masked >= 6);  // 80% of 12 chosen, give or take
  REQUIRE(changed >= masked);
  // The same batch gives the same masks; another index or the other split gives others.
  REQUIRE(values(objective->inputs(batch).labels) == labels);
  REQUIRE(values(objective->inputs(windows(B, T, 6)).labels) != labels);
  REQUIRE(values(objective->inputs(windows(B, T, 5, data::Split::Val)).labels) != labels);
  // The loss runs through the model.
  Tensor loss = objective->loss(batch, DType::F32);
  REQUIRE(loss.numel() == 1);
  REQUIRE(loss.item() == Approx(std::log(260.0)).margin(1.0));
}

TEST_CASE("masked LM with the NSP head: [CLS] A [SEP] B [SEP], B another row's half the time",
          "[train][objective][bert]") {
  auto objective =
      std::dynamic_pointer_cast<data::MaskedLmObjective>(objectiveFor(tinySpec("bert", {"nsp"})));
  REQUIRE(objective->windowLength() == 13);
  const int64_t B = 8, T = 13, S = 16, half = 6;
  data::TokenBatch batch = windows(B, T, 2);
  data::MlmInputs in = objective->inputs(batch);
  std::vector<int64_t> types = values(in.tokenTypes), nsp = values(in.nspLabels),
                       original = values(batch.ids);
  // The true token at each position: the masks' labels where chosen, else the ids.
  std::vector<int64_t> ids = values(in.ids), labels = values(in.labels);
  int64_t random = 0;
  for (int64_t b = 0; b < B; ++b) {
    auto at = [&](int64_t s) {
      size_t i = size_t(b * S + s);
      return labels[i] != -100 ? labels[i] : ids[i];
    };
    REQUIRE(at(0) == 257);
    REQUIRE(at(half + 1) == 258);
    REQUIRE(at(S - 1) == 258);
    for (int64_t s = 0; s < S; ++s) REQUIRE(types[size_t(b * S + s)] == (s < half + 2 ? 0 : 1));
    for (int64_t s = 0; s < half; ++s) REQUIRE(at(s + 1) == original[size_t(b * T + s)]);
    bool own = true;
    for (int64_t s = half; s < T; ++s) own = own && at(s + 2) == original[size_t(b * T + s)];
    REQUIRE(own == (nsp[size_t(b)] == 0));
    random += nsp[size_t(b)];
  }
  REQUIRE(random > 0);
  REQUIRE(random < B);
  REQUIRE(std::isfinite(objective->loss(batch, DType::F32).item()));
}

TEST_CASE("span corruption: the longest window that fits, ids as ByT5's, keyed by the batch index",
          "[train][objective][t5]") {
  models::ModelSpec spec = tinySpec("t5");
  spec.seqLength = 32;
  spec.decoderSeqLength = 32;
  auto objective = std::dynamic_pointer_cast<data::SpanCorruptionObjective>(objectiveFor(spec));
  // 34 bytes: 5 noise in 2 spans -> 29 kept + 2 sentinels + EOS = 32 inputs; 5 + 2 + 1 = 8 targets.
  REQUIRE(objective->windowLength() == 34);
  REQUIRE(objective->dataVocabSize() == 384 - 3 - 2);
  const int64_t B = 3, T = 34, Si = 32, Sd = 8;
  data::TokenBatch batch = windows(B, T, 4);
  data::SpanCorruptionBatch in = objective->inputs(batch);
  REQUIRE(in.inputIds.shape() == Shape{B, Si});
  REQUIRE(in.labels.shape() == Shape{B, Sd});
  std::vector<int64_t> inputs = values(in.inputIds), labels = values(in.labels), original = values(batch.ids);
  for (int64_t b = 0; b < B; ++b) {
    REQUIRE(inputs[size_t(b * Si + Si - 1)] == 1);  // EOS
    REQUIRE(labels[size_t(b * Sd + Sd - 1)] == 1);
    REQUIRE(labels[size_t(b * Sd)] == 383);  // <extra_id_0>: each span follows its sentinel
    // Merging inputs and targets at their sentinels gives the window back, each byte shifted by 3.
    std::vector<std::vector<int64_t>> spans(3);
    for (int64_t s = 0, k = -1; s < Sd - 1; ++s) {
      int64_t id = labels[size_t(b * Sd + s)];
      if (id >= 382)
        k = 383 - id;
      else
        spans[size_t(k)].push_back(id);
    }
    std::vector<int64_t> merged;
    for (int64_t s = 0; s < Si - 1; ++s) {
      int64_t id = inputs[size_t(b * Si + s)];
      if (id >= 382)
        merged.insert(merged.end(), spans[size_t(383 - id)].begin(), spans[size_t(383 - id)].end());
      else
        merged.push_back(id);
    }
    REQUIRE(merged.size() == size_t(T));
    for (int64_t t = 0; t < T; ++t) REQUIRE(merged[size_t(t)] == original[size_t(b * T + t)] + 3);
  }
  REQUIRE(values(objective->inputs(batch).inputIds) == inputs);
  REQUIRE(values(objective->inputs(windows(B, T, 5)).inputIds) != inputs);
  REQUIRE(values(objective->inputs(windows(B, T, 4, data::Split::Val)).inputIds) != inputs);
  REQUIRE(std::isfinite(objective->loss(batch, DType::F32).item()));
}

TEST_CASE("generate: BERT fills masks, T5 decodes, both leave the mode as it was", "[train][objective]") {
  auto bert = objectiveFor(tinySpec("bert"));
  REQUIRE(!bert->generate("no mask here", {}, DType::F32).has_value());
  std::optional<data::Generation> filled = bert->generate("ab[MASK]c[MASK]", {4, -1, 3, 1}, DType::F32);
  REQUIRE(filled.has_value());
  REQUIRE(!filled->continuesPrompt);
  REQUIRE(filled->text.find("\n[MASK] 1: '") != std::string::npos);
  REQUIRE(filled->text.find("\n[MASK] 2: '") != std::string::npos);
  REQUIRE(filled->text.rfind("ab", 0) == 0);
  REQUIRE(bert->model().isTraining());
  auto t5 = objectiveFor(tinySpec("t5"));
  t5->model().eval();
  std::optional<data::Generation> decoded = t5->generate("to be <extra_id_0> be", {5, -1, 40, 1}, DType::F32);
  REQUIRE(decoded.has_value());
  REQUIRE(!t5->model().isTraining());
  // Greedy by default: the same text every time.
  REQUIRE(t5->generate("to be <extra_id_0> be", {5, -1, 40, 2}, DType::F32)->text == decoded->text);
}

TEST_CASE("masked LM's [PAD] is the model's: model.pad_token_id, or a WordPiece vocabulary's that agrees",
          "[train][objective][mlm]") {
  models::ModelSpec spec = tinySpec("bert");
  spec.padTokenId = 0;  // an HF checkpoint's pad_token_id
  auto objective = std::dynamic_pointer_cast<data::MaskedLmObjective>(objectiveFor(spec));
  REQUIRE(objective->specialTokens().pad == 0);
  REQUIRE(objective->specialTokens().cls == 257);
  // The byte with the [PAD] id is never chosen for masking, as HF's collator leaves its pad token alone.
  REQUIRE(std::find(objective->masking().specialTokenIds.begin(), objective->masking().specialTokenIds.end(),
                    0) != objective->masking().specialTokenIds.end());
  REQUIRE(std::dynamic_pointer_cast<data::MaskedLmObjective>(objectiveFor(tinySpec("bert")))
              ->specialTokens()
              .pad == 256);
  // A WordPiece vocabulary's [PAD] must be the model's: that row is the one that takes no gradient.
  auto wordPiece = std::make_shared<data::WordPieceTokenizer>(
      std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "##s"});
  spec.vocabSize = 16;
  spec.padTokenId = -1;  // 12
  std::string e =
      test::errorOf([&] { data::makeObjective("bert", models::buildModule(spec), wordPiece, 7); });
  REQUIRE(e.find("set model.pad_token_id to 0") != std::string::npos);
  spec.padTokenId = 0;
  auto agreed = data::makeObjective("bert", models::buildModule(spec), wordPiece, 7);
  REQUIRE(std::dynamic_pointer_cast<data::MaskedLmObjective>(agreed)->specialTokens().pad == 0);
}
