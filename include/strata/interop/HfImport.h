// HF transformers checkpoints into Strata's (`strata convert --from-hf`) and back (`strata convert --hf`),
// and the model a checkpoint's manifest describes, for the commands that read no data (`strata generate`,
// `strata convert`).
//
// Neither reads data, so neither holds the model to a tokenizer it never meets: an HF model's vocabulary may
// be smaller than the byte tokenizer's 256 (HF's tiny test models have 99 tokens). A command that does encode
// text (generate) checks its tokenizer against the model where it builds the objective.
#pragma once

#include <string>
#include <vector>

#include "models/Zoo.h"
#include "strata/config/Config.h"

namespace strata::interop {

struct HfImportResult {
  std::string checkpointDir;  // the step-0 directory written
  std::string weightsPath;    // the safetensors file read
  std::string modelClass;     // the HF class the config.json describes, as Strata builds it
  models::ModelSpec spec;
  int64_t parameters = 0;
  std::vector<std::string> unused;  // HF tensors no parameter takes (tied copies, buffers)
};

// Reads `hfPath` (a directory with config.json and model.safetensors, or a .safetensors file with
// config.json beside it) and writes it as a checkpoint under `saveDir` (step-0 and `latest`). Every key of
// the config.json that changes what the model computes is read, and one the zoo cannot build is refused
// (models::modelConfigFromHf). The checkpoint's config holds those model.* keys; its model section, which a
// run that loads it is checked against, leaves out the training lengths HF's config.json does not have
// (seq_length, and T5's decoder_seq_length), so a fine-tune picks its own.
HfImportResult importHfCheckpoint(const std::string& hfPath, const std::string& saveDir);

struct HfExportResult {
  std::string weightsPath, configPath;
  std::string modelClass;
  size_t tensors = 0;
  uint64_t bytes = 0;
  uint64_t peakBufferBytes = 0;  // streamed (GPT: a rename of each tensor): the largest buffer held; else 0
  // What the reader of the directory must know (a T5 head that only transformers 5 reads right).
  std::vector<std::string> notes;
};

// Writes the checkpoint `checkpointDir` (a step directory or a save directory with `latest`) as HF's
// from_pretrained reads it: model.safetensors with HF's names and config.json, into the directory `output`,
// or as the file `output` when it ends in .safetensors (config.json beside it). A model with no HF class (a
// GPT with experts) is refused, naming what to use instead.
HfExportResult exportHfCheckpoint(const std::string& checkpointDir, const std::string& output);

// The config saved in the checkpoint directory `dir`'s manifest, parsed for a command that reads no data.
config::Config checkpointConfig(const std::string& dir);

}  // namespace strata::interop
