// The SentencePiece tokenizer (data/SentencePieceTokenizer.h): a model trained here from tiny Shakespeare by
// SentencePiece's own trainer, loaded and used through Strata; and the error of a build without the library.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "TestUtil.h"
#include "models/Zoo.h"
#include "models/t5/T5.h"
#include "strata/data/SentencePieceTokenizer.h"
#include "strata/data/SpanCorruptionObjective.h"
#include "strata/train/Trainer.h"

#if STRATA_TEST_SENTENCEPIECE_TRAIN
#include <sentencepiece_trainer.h>
#endif

using namespace strata;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> shakespeareLines(size_t count) {
  std::ifstream in(fs::path(STRATA_SOURCE_DIR) / "data" / "tinyshakespeare.txt");
  std::vector<std::string> lines;
  std::string line;
  while (lines.size() < count && std::getline(in, line))
    if (!line.empty()) lines.push_back(line);
  return lines;
}

#if STRATA_TEST_SENTENCEPIECE_TRAIN
// A unigram model of `vocab` pieces trained on the first 3000 lines of tiny Shakespeare (once per process);
// t5Style: with T5's specials (<pad> 0, </s> 1, <unk> 2, no <s>) instead of SentencePiece's defaults.
fs::path trainedModel(int vocab, bool t5Style = false) {
  fs::path dir = fs::temp_directory_path() / "strata-sentencepiece";
  std::string name = (t5Style ? "t5-shakespeare" : "shakespeare") + std::to_string(vocab);
  fs::path model = dir / (name + ".model");
  if (fs::exists(model)) fs::remove(model);
  fs::create_directories(dir);
  fs::path text = dir / (name + ".txt");  // one per model: ctest runs the tests that train them in parallel
  {
    std::ofstream out(text);
    for (const auto& l : shakespeareLines(3000)) out << l << "\n";
  }
  std::string args = "--input=" + text.string() + " --model_prefix=" + (dir / name).string() +
                     " --vocab_size=" + std::to_string(vocab) +
                     " --model_type=unigram --character_coverage=1.0 --minloglevel=2 --num_threads=1" +
                     (t5Style ? " --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1" : "");
  auto status = sentencepiece::SentencePieceTrainer::Train(args);
  REQUIRE(status.ok());
  return model;
}
#endif

}  // namespace

TEST_CASE("a build without SentencePiece says how to get it; a bad model file is named",
          "[train][tokenizer]") {
  if (!data::sentencePieceAvailable()) {
    std::string e = test::errorOf([] { data::SentencePieceTokenizer t("/nonexistent/spiece.model"); });
    REQUIRE(e.find("libsentencepiece-dev") != std::string::npos);
    REQUIRE(e.find("/nonexistent/spiece.model") != std::string::npos);
    return;
  }
  fs::path dir = test::freshDir("strata-sentencepiece-bad");
  std::ofstream(dir / "not.model") << "this is not a model";
  std::string e = test::errorOf([&] { data::SentencePieceTokenizer t((dir / "not.model").string()); });
  REQUIRE(e.find("not.model is not a SentencePiece model") != std::string::npos);
  e = test::errorOf([&] { data::SentencePieceTokenizer t((dir / "missing.model").string()); });
  REQUIRE(e.find("cannot open") != std::string::npos);
}

#if STRATA_TEST_SENTENCEPIECE_TRAIN
TEST_CASE("a SentencePiece model encodes as the library does and decodes back to the text",
          "[train][tokenizer]") {
  fs::path model = trainedModel(400);
  data::SentencePieceTokenizer tok(model.string());
  REQUIRE(tok.vocabSize() == 400);
  REQUIRE(tok.identity().rfind("sentencepiece:", 0) == 0);
  // SentencePiece's default specials: <unk> 0, <s> 1, </s> 2, no padding.
  REQUIRE(tok.unkId() == 0);
  REQUIRE(tok.bosId() == 1);
  REQUIRE(tok.eosId() == 2);
  REQUIRE(tok.padId() == -1);
  // The same ids as the library's own processor on 300 lines, and the lines back from decode (plain ASCII
  // with single spaces: the normalisation leaves it as it is).
  sentencepiece::SentencePieceProcessor reference;
  REQUIRE(reference.Load(model.string()).ok());
  int64_t tokens = 0;
  for (const auto& line : shakespeareLines(300)) {
    std::vector<int> expected;
    REQUIRE(reference.Encode(line, &expected).ok());
    std::vector<int32_t> ids = tok.encode(line);
    REQUIRE(std::vector<int>(ids.begin(), ids.end()) == expected);
    tokens += int64_t(ids.size());
    if (line.find("  ") == std::string::npos && line.front() != ' ' && line.back() != ' ')
      REQUIRE(tok.decode(ids) == line);
  }
  REQUIRE(tokens < 300 * 40);  // pieces, not characters
  // Pieces mark a word start with U+2581; a common word is one piece.
  std::vector<int32_t> the = tok.encode("the");
  REQUIRE(the.size() == 1);
  REQUIRE(tok.piece(the[0]) == "\u2581the");
  REQUIRE(test::errorOf([&] { tok.decode({400}); }).find("outside the vocabulary") != std::string::npos);
}

TEST_CASE("a GPT trains on SentencePiece tokens from the config", "[train][tokenizer][trainer]") {
  fs::path model = trainedModel(300);
  fs::path out = test::freshDir("strata-sentencepiece-train");
  config::Config config = config::parseConfig(
      "", "test",
      {"data.path=" + (fs::path(STRATA_SOURCE_DIR) / "data" / "tinyshakespeare.txt").string(),
       "data.tokenizer=sentencepiece", "data.vocab_file=" + model.string(), "train.out_dir=" + out.string(),
       "train.device=cpu", "model.num_layers=1", "model.hidden_size=32", "model.num_attention_heads=2",
       "model.seq_length=32", "model.vocab_size=300", "model.dropout=0", "train.micro_batch_size=4",
       "train.train_iters=30", "train.log_interval=1", "train.eval_interval=0", "train.sample_length=0",
       "lr_schedule.warmup_iters=2", "optimizer.lr=0.01"});
  train::TrainResult r = train::Trainer(config).run();
  REQUIRE(r.steps == 30);
  std::ifstream metrics(out / "metrics.jsonl");
  std::string first;
  std::getline(metrics, first);
  double start = nlohmann::json::parse(first)["loss"].get<double>();
  REQUIRE(start == Approx(std::log(300.0)).margin(0.5));
  REQUIRE(r.trainLoss < start - 0.5);  // measured: 5.73 to 4.98 in 30 steps
  // A vocabulary the model cannot hold is refused before training.
  config::Config small = config;
  small.model.vocabSize = 256;
  REQUIRE(!test::errorOf([&] { train::Trainer(small).run(); }).empty());
}

namespace {

models::ModelSpec tinyT5(int64_t vocab) {
  models::ModelSpec s;
  s.arch = "t5";
  s.numLayers = 1;
  s.hiddenSize = 16;
  s.numHeads = 2;
  s.kvChannels = 8;
  s.ffnHiddenSize = 32;
  s.seqLength = 32;
  s.decoderSeqLength = 16;
  s.vocabSize = vocab;
  s.bias = false;
  return s;
}

// HF's DataCollatorForT5MLM (run_t5_mlm_flax.py) on one row: create_sentinel_ids then filter_input_ids, with
// the sentinels counting down from len(tokenizer) - 1, and </s> appended.
std::vector<int64_t> hfFilterInputIds(const std::vector<int64_t>& ids, const std::vector<bool>& mask,
                                      int64_t tokenizerLength, int64_t eos) {
  std::vector<int64_t> out;
  int64_t spans = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    bool start = mask[i] && (i == 0 || !mask[i - 1]);
    if (start)
      out.push_back(tokenizerLength - ++spans);
    else if (!mask[i])
      out.push_back(ids[i]);
  }
  out.push_back(eos);
  return out;
}

}  // namespace

TEST_CASE("T5's span corruption on a SentencePiece model uses its ids, as HF's T5 tokenizer and collator do",
          "[train][tokenizer][t5]") {
  fs::path model = trainedModel(500, /*t5Style=*/true);
  auto tok = std::make_shared<data::SentencePieceTokenizer>(model.string());
  REQUIRE(tok->padId() == 0);
  REQUIRE(tok->eosId() == 1);
  REQUIRE(tok->unkId() == 2);
  // 500 pieces and 100 sentinels (len(T5Tokenizer) = 600), in a vocabulary padded to 608 as t5-small's 32128
  // pads 32100.
  const uint64_t seed = 7;
  auto objective = std::dynamic_pointer_cast<data::SpanCorruptionObjective>(
      data::makeObjective("t5", models::buildModule(tinyT5(608)), tok, seed));
  REQUIRE(objective != nullptr);
  const data::T5TokenIds& ids = objective->tokenIds();
  REQUIRE(ids.pad == 0);
  REQUIRE(ids.eos == 1);
  REQUIRE(ids.unk == 2);
  REQUIRE(ids.firstDataId == 0);
  REQUIRE(ids.sentinelEnd == 600);  // <extra_id_0> = 599, as HF's T5Tokenizer over this model has it
  REQUIRE(objective->dataVocabSize() == 500);
  REQUIRE(objective->corruption().eosTokenId == 1);

  // Windows of real pieces; the inputs and labels equal HF's collator on the same noise masks.
  std::vector<int64_t> stream;
  for (const auto& line : shakespeareLines(200))
    for (int32_t id : tok->encode(line)) stream.push_back(id);
  const int64_t B = 3, T = objective->windowLength(), index = 2;
  REQUIRE(int64_t(stream.size()) > B * T);
  std::vector<int64_t> window(stream.begin(), stream.begin() + B * T);
  Tensor x = Tensor::fromVector<int64_t>(window, {B, T});
  data::TokenBatch batch{x, x, index, data::Split::Train};
  data::SpanCorruptionBatch in = objective->inputs(batch);
  int64_t Si = in.inputIds.size(1), Sd = in.labels.size(1);
  std::vector<int64_t> inputs = in.inputIds.contiguous().toVector<int64_t>();
  std::vector<int64_t> labels = in.labels.contiguous().toVector<int64_t>();
  uint64_t key = data::corruptionSeed(seed, data::Split::Train);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> row(window.begin() + b * T, window.begin() + (b + 1) * T);
    // The objective's noise mask: two Philox counters per token of the batch
    // (SpanCorruptionObjective::inputs).
    std::vector<bool> noise =
        data::randomSpansNoiseMask(T, 0.15, 3.0, key, uint64_t(2 * (index * B + b) * T));
    std::vector<bool> kept(noise.size());
    for (size_t i = 0; i < noise.size(); ++i) kept[i] = !noise[i];
    std::vector<int64_t> hfInputs = hfFilterInputIds(row, noise, 600, 1);
    std::vector<int64_t> hfLabels = hfFilterInputIds(row, kept, 600, 1);
    REQUIRE(std::vector<int64_t>(inputs.begin() + b * Si, inputs.begin() + (b + 1) * Si) == hfInputs);
    REQUIRE(std::vector<int64_t>(labels.begin() + b * Sd, labels.begin() + (b + 1) * Sd) == hfLabels);
    REQUIRE(labels[size_t(b * Sd)] == 599);
  }
  // The loss is the model's on those inputs, the decoder reading the labels shifted right after <pad>.
  auto& t5 = static_cast<models::T5&>(objective->model());
  REQUIRE(
      objective->loss(batch, DType::F32).item() ==
      t5.loss(in.inputIds, Tensor(), models::t5ShiftRight(in.labels, 0, 0), in.labels, DType::F32).item());

  // A prompt's marker is its sentinel; greedy decoding is deterministic.
  std::optional<data::Generation> g = objective->generate("to be <extra_id_0> be", {3, 0, 1, 1}, DType::F32);
  REQUIRE(g.has_value());
  REQUIRE(objective->generate("to be <extra_id_0> be", {3, 0, 1, 2}, DType::F32)->text == g->text);

  // A vocabulary without room for the 100 sentinels, and a model without <pad>, are refused.
  std::string e =
      test::errorOf([&] { data::makeObjective("t5", models::buildModule(tinyT5(599)), tok, seed); });
  REQUIRE(e.find("model.vocab_size 600 at least") != std::string::npos);
  auto plain = std::make_shared<data::SentencePieceTokenizer>(trainedModel(320).string());
  e = test::errorOf([&] { data::makeObjective("t5", models::buildModule(tinyT5(400)), plain, seed); });
  REQUIRE(e.find("no <pad> piece") != std::string::npos);
}
#endif
