// A tiny GPT training run on the CPU for the trainer's tests: a small corpus, a config of a few layers and
// iterations, and the metrics a run writes.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/config/Config.h"

namespace strata::test {

inline std::filesystem::path tinyCorpus() {
  std::filesystem::path p = std::filesystem::temp_directory_path() / "strata-trainer-corpus.txt";
  if (!std::filesystem::exists(p)) {
    std::ofstream out(p);
    for (int i = 0; i < 400; ++i) out << "the quick brown fox jumps over the lazy dog " << i % 7 << "\n";
  }
  return p;
}

inline config::Config tinyConfig(const std::filesystem::path& outDir, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"data.path=" + tinyCorpus().string(),
                                "train.out_dir=" + outDir.string(),
                                "train.device=cpu",
                                "model.num_layers=2",
                                "model.hidden_size=32",
                                "model.num_attention_heads=2",
                                "model.seq_length=32",
                                "model.dropout=0.1",
                                "train.micro_batch_size=4",
                                "train.global_batch_size=8",
                                "train.train_iters=20",
                                "train.log_interval=1",
                                "train.eval_interval=10",
                                "train.eval_iters=2",
                                "train.sample_length=0",
                                "lr_schedule.warmup_iters=2",
                                "optimizer.lr=0.003"};
  o.insert(o.end(), extra.begin(), extra.end());
  return config::parseConfig("", "test", o);
}

// The records of <outDir>/metrics.jsonl, in order.
inline std::vector<nlohmann::json> metricsRecords(const std::filesystem::path& outDir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(outDir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace strata::test
