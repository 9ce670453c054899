// Stage 3's chunk arena inside the step engine (NOTE [Chunk arena] in zero/ChunkArena.h): the same numbers
// with and without it, and the engine never holds more chunks at once than the arena's slots.
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "TestUtil.h"
#include "strata/train/StepEngine.h"
#include "strata/train/Trainer.h"
#include "strata/zero/ChunkArena.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

fs::path arenaCorpus() {
  fs::path p = fs::temp_directory_path() / "strata-arena-corpus.txt";
  if (!fs::exists(p)) {
    std::ofstream out(p);
    for (int i = 0; i < 400; ++i) out << "a stitch in time saves nine, said the tailor " << i % 7 << "\n";
  }
  return p;
}

struct ArenaRun {
  std::vector<double> losses;  // train losses, then validation losses, in record order
  int64_t gatheredPeak = -1, arenaSlots = -1, arenaGrown = -1;
  double arenaGb = -1;
  size_t chunks = 0;
};

// 8 steps of two micro-batches at stage 3 with evaluations, on small chunks (several per layer).
ArenaRun stage3Run(const std::string& name, const std::vector<std::string>& model, bool arena, int depth) {
  fs::path out = test::freshDir("strata-arena-" + name);
  std::vector<std::string> sets = {"data.path=" + arenaCorpus().string(),
                                   "train.out_dir=" + out.string(),
                                   "train.device=cpu",
                                   "model.num_layers=3",
                                   "model.hidden_size=32",
                                   "model.num_attention_heads=2",
                                   "model.seq_length=32",
                                   "train.micro_batch_size=2",
                                   "train.global_batch_size=4",
                                   "train.train_iters=8",
                                   "train.log_interval=1",
                                   "train.eval_interval=4",
                                   "train.eval_iters=2",
                                   "train.sample_length=0",
                                   "zero_optimization.chunk_size_mb=0.01",
                                   "zero_optimization.stage=3",
                                   "zero_optimization.prefetch_depth=" + std::to_string(depth),
                                   std::string("store.arena=") + (arena ? "true" : "false")};
  sets.insert(sets.end(), model.begin(), model.end());
  train::TrainResult result = train::Trainer(config::parseConfig("", "arena-test", sets)).run();
  ArenaRun run;
  run.chunks = result.chunks;
  std::ifstream in(out / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) run.losses.push_back(j["val_loss"].get<double>());
    if (!j.contains("loss")) continue;
    run.losses.push_back(j["loss"].get<double>());
    run.gatheredPeak = j.value("gathered_peak", int64_t(-1));
    run.arenaSlots = j.value("arena_slots", int64_t(-1));
    run.arenaGrown = j.value("arena_grown", int64_t(-1));
    run.arenaGb = j.value("mem_arena_gb", -1.0);
  }
  return run;
}

}  // namespace

TEST_CASE("stage 3 trains bit for bit alike with and without the chunk arena, inside the arena's slots",
          "[train][stepengine][arena]") {
  std::map<std::string, std::vector<std::string>> models = {
      {"gpt", {"model.dropout=0.1"}},  // tied embedding and head: one chunk held through the backward
      {"bert",
       {"model.arch=bert", "model.vocab_size=260", "model.bert_binary_head=true",
        "model.layer_norm_eps=1e-12"}},
      {"t5",
       {"model.arch=t5", "model.vocab_size=384", "model.bias=false", "model.kv_channels=16",
        "model.ffn_hidden_size=48", "model.decoder_num_layers=1", "model.decoder_seq_length=16",
        "model.activation=gated_gelu", "model.untie_embeddings_and_output_weights=true"}}};
  for (const auto& [arch, sets] : models) {
    for (int depth : {0, 1, 2, 4}) {
      if (arch != "gpt" && depth != 2) continue;
      std::string name = arch + "-depth" + std::to_string(depth);
      ArenaRun with = stage3Run(name + "-arena", sets, true, depth);
      ArenaRun without = stage3Run(name + "-blocks", sets, false, depth);
      INFO(arch << ", prefetch_depth " << depth << ": " << with.chunks << " chunks, at most "
                << with.gatheredPeak << " gathered at once, " << with.arenaSlots << " arena slots");
      REQUIRE(with.losses.size() == 10);  // 8 steps and 2 evaluations
      REQUIRE(with.losses == without.losses);
      // The counter: what the engine held at once, the same either way, and within the arena's first
      // reservation (it never had to grow).
      REQUIRE(with.gatheredPeak > 0);
      REQUIRE(with.gatheredPeak == without.gatheredPeak);
      REQUIRE(without.arenaSlots == -1);
      REQUIRE(without.arenaGb == -1.0);
      REQUIRE(with.arenaGb > 0);
      // One or two slot classes (zero::planChunkArena), each of at most chunkArenaSlots slots, never grown.
      REQUIRE(with.arenaGrown == 0);
      REQUIRE(with.arenaSlots >= int64_t(zero::chunkArenaSlots(with.chunks, depth)) / 2);
      REQUIRE(with.arenaSlots <= 2 * int64_t(zero::chunkArenaSlots(with.chunks, depth)));
      REQUIRE(with.gatheredPeak <= with.arenaSlots);
    }
  }
}
