// The training loop: data, model, AdamW with a schedule and clipping, gradient accumulation, evaluation,
// metrics, checkpoints and a text sample at the end. Works with any nn::CausalLM, so a user's own model
// trains through the same loop (see models/custom_example).
#pragma once

#include <memory>
#include <string>

#include "models/Zoo.h"
#include "strata/nn/CausalLM.h"
#include "strata/optim/AdamW.h"
#include "strata/train/Config.h"
#include "strata/train/Data.h"
#include "strata/train/Metrics.h"

namespace strata::train {

struct TrainResult {
  int64_t steps = 0;
  double trainLoss = 0;  // mean loss of the last logged interval
  double valLoss = 0;    // last evaluation (NaN when none ran)
  std::string sample;
  TrainRecord last;  // the last logged interval (speed, memory): what `strata bench` reports
};

// "auto" -> cuda:0 when a GPU is present, else cpu.
Device resolveDevice(const std::string& name);
// The zoo's model spec for a config's model section, built on `device` with the config's seed.
models::ModelSpec modelSpecFrom(const Config& config, Device device);

// Samples `length` tokens after `prompt` from `model` with temperature and top-k (0 = all), decoded to text.
std::string sampleText(nn::CausalLM& model, const Tokenizer& tokenizer, Device device, DType compute,
                       const std::string& prompt, int64_t length, double temperature = 0.8, int64_t topK = 40,
                       uint64_t seed = 1);
// The tokenizer a config names (byte, or gpt2 from data.vocab_file and data.merges_file).
std::unique_ptr<Tokenizer> makeTokenizer(const Config& config);

class Trainer {
 public:
  // Builds config.model.arch from the zoo.
  explicit Trainer(Config config);
  // Trains `model` (already built on the config's device) with the config's data, optimizer and schedule.
  Trainer(Config config, std::shared_ptr<nn::CausalLM> model);

  TrainResult run();
  // Mean loss over `iters` validation batches (deterministic: the same batches every time).
  double evaluate(int64_t iters);
  // Samples `length` tokens after `prompt` with temperature and top-k (0 = all), decoded to text.
  std::string sample(const std::string& prompt, int64_t length, double temperature = 0.8, int64_t topK = 40,
                     uint64_t seed = 1);

  nn::CausalLM& model() { return *model_; }
  const Config& config() const { return config_; }
  Device device() const { return device_; }
  DType computeDType() const { return compute_; }

 private:
  void setup();

  Config config_;
  Device device_;
  DType compute_ = DType::F32;
  std::shared_ptr<nn::CausalLM> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<TokenDataset> data_;
};

}  // namespace strata::train
