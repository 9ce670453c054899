// The `strata` command: train, bench, info, generate, convert.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/Zoo.h"
#include "models/gpt/Gpt.h"
#include "models/gpt/GptHf.h"
#include "strata/strata.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Config.h"
#include "strata/train/Trainer.h"

using namespace strata;

namespace {

int runTrain(const std::string& configPath, const std::vector<std::string>& overrides) {
  train::Config config = train::loadConfig(configPath, overrides);
  train::Trainer trainer(config);
  train::TrainResult r = trainer.run();
  if (std::isnan(r.valLoss))
    std::printf("\nfinished %ld iterations: train loss %.4f\n", long(r.steps), r.trainLoss);
  else
    std::printf("\nfinished %ld iterations: train loss %.4f, val loss %.4f\n", long(r.steps), r.trainLoss,
                r.valLoss);
  return 0;
}

// Trains `iters` measured steps after as many warm-up steps on random tokens (data.format: random), with no
// evaluation, sample or checkpoint, and reports the measured interval.
int runBench(const std::string& configPath, std::vector<std::string> overrides, int64_t iters, bool profile) {
  STRATA_CHECK(iters > 0, "bench: --iters must be positive, got {}", iters);
  std::string out = (std::filesystem::temp_directory_path() / "strata-bench").string();
  std::filesystem::remove_all(out);
  // Later --set values win, so the bench's own settings go last.
  for (std::string kv :
       {std::string("data.format=random"), "train.train_iters=" + std::to_string(2 * iters),
        "train.log_interval=" + std::to_string(iters), std::string("train.eval_interval=0"),
        std::string("train.sample_length=0"), std::string("lr_schedule.warmup_iters=0"),
        std::string("checkpoint.save="), std::string("checkpoint.save_interval=0"), "train.out_dir=" + out})
    overrides.push_back(kv);
  if (profile) setenv("STRATA_PROFILE", "1", 1);
  train::Config config = train::loadConfig(configPath, overrides, /*requireData=*/false);
  train::Trainer trainer(config);
  train::TrainResult r = trainer.run();
  const train::TrainRecord& m = r.last;
  std::string memory;
  for (const auto& [tier, gib] : m.memoryGb) memory += fmt::format(" | {} {:.2f} GiB", tier, gib);
  std::printf(
      "\nbench %s: %ld measured iterations after %ld warm-up | %.1f ms/iter | %.0f tokens/s | %.2f TFLOP/s | "
      "MFU %.1f%%%s\n",
      configPath.c_str(), long(iters), long(iters), m.msPerIter, m.tokensPerSec, m.tflops, 100.0 * m.mfu,
      memory.c_str());
  return 0;
}

std::string humanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s", b, units[u]);
  return buf;
}

int runInfo(const std::string& configPath, const std::vector<std::string>& overrides) {
  train::Config c = train::loadConfig(configPath, overrides, /*requireData=*/false);
  // Counted from the architecture's formula, so `info` answers instantly even for models that would not fit
  // here.
  models::GptConfig g = models::gptConfig(train::modelSpecFrom(c, Device::cpu()));
  int64_t L = g.numLayers, C = g.hiddenSize, F = g.ffn();
  int64_t params = g.numParameters();
  double flops = g.flopsPerToken();
  bool lowPrecision = c.precision.dtype != "fp32";
  std::printf("model          %s: %ld layers, hidden %ld, %ld heads, ffn %ld, seq %ld, vocab %ld\n",
              c.model.arch.c_str(), long(L), long(C), long(c.model.numAttentionHeads), long(F),
              long(c.model.seqLength), long(c.model.vocabSize));
  std::printf("parameters     %ld (%.3f B)\n", long(params), double(params) / 1e9);
  std::printf("FLOPs/token    %.4g (6N + 12 L d s, training)\n", flops);
  std::printf("tokens/iter    %ld\n", long(c.train.globalBatchSize * c.model.seqLength));
  std::printf("bytes by component:\n");
  std::printf("  fp32 master weights     %s\n", humanBytes(4.0 * double(params)).c_str());
  // Kept for the whole run with precision.weight_copies (rewritten by AdamW), else cast in each forward and
  // alive until the backward: either way they are part of the peak.
  if (lowPrecision)
    std::printf("  %s weight copies      %s (%s)\n", c.precision.dtype.c_str(),
                humanBytes(2.0 * double(params)).c_str(),
                c.precision.weightCopies ? "kept, precision.weight_copies" : "cast per forward");
  std::printf("  fp32 gradients          %s\n", humanBytes(4.0 * double(params)).c_str());
  std::printf("  AdamW state (m, v)      %s\n", humanBytes(8.0 * double(params)).c_str());
  double total = (16.0 + (lowPrecision ? 2.0 : 0.0)) * double(params);
  std::printf("  model state total       %s\n", humanBytes(total).c_str());
  return 0;
}

int runGenerate(const std::string& checkpoint, const std::string& prompt, int64_t tokens, double temperature,
                int64_t topK, uint64_t seed, const std::string& deviceName) {
  std::string dir = train::resolveCheckpoint(checkpoint);
  std::ifstream in(std::filesystem::path(dir) / "manifest.json");
  auto manifest = nlohmann::json::parse(in);
  std::vector<std::string> overrides;
  for (auto& [key, value] : manifest["config"].items())
    overrides.push_back(key + "=" + value.get<std::string>());
  train::Config c = train::parseConfig("", dir + "/manifest.json", overrides, /*requireData=*/false);
  Device device = train::resolveDevice(deviceName);
  auto model = models::buildModel(train::modelSpecFrom(c, device));
  auto weights = train::loadModelShards(dir);
  for (auto& [name, p] : model->namedParameters()) {
    auto it = weights.find(name);
    STRATA_CHECK(it != weights.end(), "checkpoint {} has no tensor '{}'", dir, name);
    ops::copy(p, it->second);
  }
  DType compute = device.isCpu() || c.precision.dtype == "fp32" ? DType::F32 : DType::BF16;
  auto tokenizer = train::makeTokenizer(c);
  std::string text =
      train::sampleText(*model, *tokenizer, device, compute, prompt, tokens, temperature, topK, seed);
  std::printf("%s%s\n", prompt.c_str(), text.c_str());
  return 0;
}

int runConvert(const std::string& checkpoint, const std::string& output, bool hf) {
  std::string dir = train::resolveCheckpoint(checkpoint);
  std::ifstream in(std::filesystem::path(dir) / "manifest.json");
  auto manifest = nlohmann::json::parse(in);
  std::string arch = manifest["config"].value("model.arch", std::string("gpt"));
  train::NamedTensors out;
  for (auto& [name, t] : train::loadModelShards(dir)) {
    if (!hf) {
      out.emplace_back(name, t);
      continue;
    }
    STRATA_CHECK(arch == "gpt", "--hf export knows the gpt architecture, not '{}'", arch);
    out.emplace_back(models::gptNameToHf(name), t);
  }
  train::writeSafetensors(output, out, {{"format", "pt"}, {"source", dir}});
  std::printf("wrote %zu tensors from %s to %s%s\n", out.size(), dir.c_str(), output.c_str(),
              hf ? " (HF GPT-2 names; lm_head is tied to transformer.wte)" : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Strata: train large Transformer models on few GPUs"};
  app.require_subcommand(1);
  spdlog::set_pattern("[%H:%M:%S] %v");

  std::string config;
  std::vector<std::string> overrides;
  auto* train = app.add_subcommand("train", "train a model from a YAML config");
  train->add_option("config", config, "YAML config file")->required();
  train->add_option("--set", overrides, "override a config key: --set train.train_iters=100");

  int64_t benchIters = 20;
  bool benchProfile = false;
  auto* bench = app.add_subcommand("bench", "training speed of a config on random tokens (no data needed)");
  bench->add_option("config", config, "YAML config file")->required();
  bench->add_option("--set", overrides, "override a config key: --set train.micro_batch_size=16");
  bench->add_option("--iters", benchIters, "measured iterations (after as many warm-up iterations)");
  bench->add_flag("--profile", benchProfile, "also print the step profile (STRATA_PROFILE)");

  auto* info = app.add_subcommand("info", "parameters, FLOPs per token and bytes per component of a config");
  info->add_option("config", config, "YAML config file")->required();
  info->add_option("--set", overrides, "override a config key");

  std::string checkpoint, prompt = "\n", device = "auto";
  int64_t tokens = 200, topK = 40;
  double temperature = 0.8;
  uint64_t seed = 1;
  auto* generate = app.add_subcommand("generate", "sample text from a checkpoint");
  generate->add_option("checkpoint", checkpoint, "checkpoint directory (or a save directory with `latest`)")
      ->required();
  generate->add_option("--prompt", prompt, "text to continue");
  generate->add_option("--tokens", tokens, "tokens to sample");
  generate->add_option("--temperature", temperature, "sampling temperature");
  generate->add_option("--top-k", topK, "sample among the k most likely tokens (0: all)");
  generate->add_option("--seed", seed, "sampling seed");
  generate->add_option("--device", device, "auto, cpu or cuda[:N]");

  std::string output;
  bool hf = false;
  auto* convert =
      app.add_subcommand("convert", "merge a checkpoint's model shards into one safetensors file");
  convert->add_option("checkpoint", checkpoint, "checkpoint directory (or a save directory with `latest`)")
      ->required();
  convert->add_option("output", output, "the .safetensors file to write")->required();
  convert->add_flag("--hf", hf, "use HF transformers names (GPT2LMHeadModel layout)");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*train) return runTrain(config, overrides);
    if (*info) return runInfo(config, overrides);
    if (*bench) return runBench(config, overrides, benchIters, benchProfile);
    if (*generate) return runGenerate(checkpoint, prompt, tokens, temperature, topK, seed, device);
    if (*convert) return runConvert(checkpoint, output, hf);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
