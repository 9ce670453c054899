// The SentencePiece tokenizer (train/SentencePieceTokenizer.h): a model trained here from tiny Shakespeare by
// SentencePiece's own trainer, loaded and used through Strata; and the error of a build without the library.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "TestUtil.h"
#include "strata/train/SentencePieceTokenizer.h"
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
// A unigram model of `vocab` pieces trained on the first 3000 lines of tiny Shakespeare (once per process).
fs::path trainedModel(int vocab) {
  fs::path dir = fs::temp_directory_path() / "strata-sentencepiece";
  fs::path model = dir / ("shakespeare" + std::to_string(vocab) + ".model");
  if (fs::exists(model)) fs::remove(model);
  fs::create_directories(dir);
  fs::path text = dir / "lines.txt";
  {
    std::ofstream out(text);
    for (const auto& l : shakespeareLines(3000)) out << l << "\n";
  }
  std::string args = "--input=" + text.string() +
                     " --model_prefix=" + (dir / ("shakespeare" + std::to_string(vocab))).string() +
                     " --vocab_size=" + std::to_string(vocab) +
                     " --model_type=unigram --character_coverage=1.0 --minloglevel=2 --num_threads=1";
  auto status = sentencepiece::SentencePieceTrainer::Train(args);
  REQUIRE(status.ok());
  return model;
}
#endif

}  // namespace

TEST_CASE("a build without SentencePiece says how to get it; a bad model file is named",
          "[train][tokenizer]") {
  if (!train::sentencePieceAvailable()) {
    std::string e = test::errorOf([] { train::SentencePieceTokenizer t("/nonexistent/spiece.model"); });
    REQUIRE(e.find("libsentencepiece-dev") != std::string::npos);
    REQUIRE(e.find("/nonexistent/spiece.model") != std::string::npos);
    return;
  }
  fs::path dir = test::freshDir("strata-sentencepiece-bad");
  std::ofstream(dir / "not.model") << "this is not a model";
  std::string e = test::errorOf([&] { train::SentencePieceTokenizer t((dir / "not.model").string()); });
  REQUIRE(e.find("not.model is not a SentencePiece model") != std::string::npos);
  e = test::errorOf([&] { train::SentencePieceTokenizer t((dir / "missing.model").string()); });
  REQUIRE(e.find("cannot open") != std::string::npos);
}

#if STRATA_TEST_SENTENCEPIECE_TRAIN
TEST_CASE("a SentencePiece model encodes as the library does and decodes back to the text",
          "[train][tokenizer]") {
  fs::path model = trainedModel(400);
  train::SentencePieceTokenizer tok(model.string());
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
  train::Config config = train::parseConfig(
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
  train::Config small = config;
  small.model.vocabSize = 256;
  REQUIRE(!test::errorOf([&] { train::Trainer(small).run(); }).empty());
}
#endif
