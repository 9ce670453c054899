// Any zoo architecture's side of a parity check against another implementation (tools/hf_parity_zoo.py runs
// it against HF transformers): it builds the config's model and objective as `strata train` does, optionally
// loads a checkpoint's weights (`strata convert --from-hf` writes one from an HF model), and writes
//   --trace OUT.safetensors: one fp32 forward and backward on training micro-batch 0 (train/BatchTrace.h):
//       the model inputs by HF argument names, the logits, "loss" and "grad.<HF name>" of every parameter;
//   --inputs OUT.safetensors --batches N: the model inputs of training micro-batches 0 .. N-1, as
//       "<HF argument>.<i>": what `strata train` with the same config trains on at steps 1 .. N (one rank,
//       no gradient accumulation), so a reference can train on the same corrupted batches.
// Usage: zoo_parity --config C [--set k=v]... [--load CHECKPOINT] [--trace F] [--inputs F --batches N]
#include <cstdio>
#include <string>
#include <vector>

#include "models/ZooHf.h"
#include "strata/strata.h"
#include "strata/train/BatchTrace.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Config.h"
#include "strata/train/Trainer.h"

using namespace strata;

int main(int argc, char** argv) {
  std::string config, load, tracePath, inputsPath;
  std::vector<std::string> overrides;
  int64_t batches = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--config")
      config = v;
    else if (a == "--set")
      overrides.push_back(v);
    else if (a == "--load")
      load = v;
    else if (a == "--trace")
      tracePath = v;
    else if (a == "--inputs")
      inputsPath = v;
    else if (a == "--batches")
      batches = std::stoll(v);
    else {
      std::fprintf(stderr, "zoo_parity: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    STRATA_USER_CHECK(!config.empty(), "zoo_parity: --config is required");
    if (!load.empty()) {
      // The trainer checks that the checkpoint holds this config's model; the weights are copied below.
      overrides.push_back("checkpoint.load=" + load);
      overrides.push_back("checkpoint.load_model_only=true");
    }
    train::Config c = train::loadConfig(config, overrides);
    train::Trainer trainer(c);
    nn::Module& model = trainer.model();
    if (!load.empty()) {
      std::string dir = train::resolveCheckpoint(load);
      auto weights = train::loadModelShards(dir);
      for (auto& [name, p] : model.namedParameters()) {
        auto it = weights.find(name);
        STRATA_USER_CHECK(it != weights.end(), "checkpoint {} has no tensor '{}'", dir, name);
        ops::copy(p, it->second);
      }
    }
    if (!inputsPath.empty()) {
      STRATA_USER_CHECK(batches > 0, "zoo_parity: --inputs needs --batches N");
      train::NamedTensors all;
      for (int64_t i = 0; i < batches; ++i)
        for (auto& [name, t] : trainer.objective().modelInputs(trainer.batch(train::Split::Train, i)))
          all.emplace_back(name + "." + std::to_string(i), t.to(Device::cpu()));
      train::writeSafetensors(inputsPath, all);
      std::printf("wrote the model inputs of %ld training micro-batches to %s\n", long(batches),
                  inputsPath.c_str());
    }
    if (!tracePath.empty()) {
      model.train();  // as training runs it (the parity configs set dropout 0)
      models::HfLayout layout = models::hfLayout(train::modelSpecFrom(trainer.config(), trainer.device()));
      train::BatchTrace trace =
          train::traceBatch(trainer.objective(), trainer.batch(train::Split::Train, 0), DType::F32, layout);
      train::writeSafetensors(tracePath, trace.all());
      std::printf("loss %.6f\n", trace.loss.item());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
