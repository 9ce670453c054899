// HF transformers checkpoints into Strata's (`strata convert --from-hf`), and the model a checkpoint's
// manifest describes, for the commands that read no data (`strata generate`, `strata convert`).
//
// Neither reads data, so neither holds the model to a tokenizer it never meets: an HF model's vocabulary may
// be smaller than the byte tokenizer's 256 (HF's tiny test models have 99 tokens). A command that does encode
// text (generate) checks its tokenizer against the model where it builds the objective.
#pragma once

#include <string>
#include <vector>

#include "models/Zoo.h"
#include "strata/train/Config.h"

namespace strata::train {

struct HfImportResult {
  std::string checkpointDir;  // the step-0 directory written
  std::string weightsPath;    // the safetensors file read
  models::ModelSpec spec;
  int64_t parameters = 0;
  std::vector<std::string> unused;  // HF tensors no parameter takes (tied copies, buffers)
};

// Reads `hfPath` (a directory with config.json and model.safetensors, or a .safetensors file with
// config.json beside it) and writes it as a checkpoint under `saveDir` (step-0 and `latest`), whose config
// holds the model.* keys HF's config.json gives (models::modelConfigFromHf).
HfImportResult importHfCheckpoint(const std::string& hfPath, const std::string& saveDir);

// The config saved in the checkpoint directory `dir`'s manifest, parsed for a command that reads no data.
Config checkpointConfig(const std::string& dir);

}  // namespace strata::train
