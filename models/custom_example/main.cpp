// Trains example::BigramMlp with Strata's trainer on a YAML config (data, optimizer, schedule, logging).
//   custom_example [CONFIG] [--set key=value ...]
#include <cstdio>
#include <string>
#include <vector>

#include <strata/config/Config.h>
#include <strata/nn/DeferredInit.h>
#include <strata/train/Trainer.h>
#include "BigramMlp.h"

int main(int argc, char** argv) {
  std::string config = argc > 1 && std::string(argv[1]).rfind("--", 0) != 0 ? argv[1] : STRATA_EXAMPLE_CONFIG;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--set" && i + 1 < argc) overrides.push_back(argv[++i]);
  try {
    strata::config::Config c = strata::config::loadConfig(config, overrides);
    strata::Device device = strata::config::resolveDevice(c.train.device);
    // Built with deferred parameters: the trainer makes each value where it lays the parameter out, and a
    // ZeRO rank only its shards (strata/nn/DeferredInit.h). Every rank draws from the same seed.
    std::shared_ptr<example::BigramMlp> model;
    {
      strata::nn::DeferParameters defer;
      model = std::make_shared<example::BigramMlp>(c.model.vocabSize, c.model.hiddenSize, c.model.seqLength,
                                                   device);
    }
    strata::train::Trainer trainer(c, model);
    strata::train::TrainResult r = trainer.run();
    std::printf("bigram MLP: %ld iterations, train loss %.3f, val loss %.3f\n", long(r.steps), r.trainLoss,
                r.valLoss);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
