// What the trainer trains: a model plus the way a micro-batch of the data's token windows becomes that
// model's inputs and its scalar loss.
//
// NOTE [Training objectives]
// The trainer and the step engine know an nn::Module (whose parameters ZeRO lays out in chunks, gathers and
// releases) and an Objective over it; they never ask which architecture it is. Each objective decides:
// - how many data tokens a sequence takes (windowLength) and which data ids it accepts (dataVocabSize: the
//   ids above belong to its special tokens);
// - how a window becomes the model's inputs: the causal shift (CausalLmObjective), [CLS]/[SEP] and BERT's
//   80/10/10 masking (MaskedLmObjective), T5's span corruption with sentinels (SpanCorruptionObjective);
// - what a prompt makes the model produce (generate): a continuation, the fillers of [MASK], a decoding.
// Corruptions draw their randomness from Philox keyed by the run's seed and the split, at a counter from the
// batch's index in its split. The index is global (rank r's slice of a global batch has the indices a
// single rank would give those windows), so every world size and every ZeRO stage corrupts a window alike,
// and a resumed run continues with the same masks.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/config/Config.h"
#include "strata/data/Data.h"
#include "strata/nn/Module.h"

namespace strata::data {

// A micro-batch as TokenDataset::batch draws it.
struct TokenBatch {
  Tensor ids;         // i64 [B, T]: windows of the data's tokens
  Tensor targets;     // i64 [B, T]: the same windows one token further on
  int64_t index = 0;  // the batch's number in its split (the data's Philox counter; corruptions key on it)
  Split split = Split::Train;
};

struct GenerateOptions {
  int64_t length = 200;     // tokens to produce at most
  double temperature = -1;  // 0: greedy; < 0: the objective's own default (0.8 sampling, T5 greedy)
  int64_t topK = 40;        // sample among the k most likely (0: all)
  uint64_t seed = 1;
};

struct Generation {
  std::string text;
  bool continuesPrompt = false;  // text follows the prompt (a continuation); else it stands on its own
  std::string display(const std::string& prompt) const { return continuesPrompt ? prompt + text : text; }
};

class Objective {
 public:
  virtual ~Objective() = default;

  virtual nn::Module& model() = 0;
  // Data tokens per sequence: the T of TokenDataset::batch.
  virtual int64_t windowLength() const = 0;
  // Data token ids must lie in [0, dataVocabSize()); the model's ids above are the objective's own.
  virtual int64_t dataVocabSize() const = 0;
  // Tokens the model reads per sequence, and training FLOPs per such token (throughput, TFLOP/s, MFU): none
  // (the default) when the model does not count them, and the log says "TFLOP/s unknown".
  virtual int64_t tokensPerSequence() const = 0;
  virtual std::optional<double> flopsPerToken() const { return std::nullopt; }
  // What the model is, for the log: the zoo's architecture ("gpt", "bert", "t5") or a user's model's own
  // name (nn::CausalLM::name); "custom" unless it says.
  virtual std::string modelName() const { return "custom"; }
  // The mean loss of a micro-batch, computed in `compute` (through the model's calls, so ZeRO's hooks run).
  virtual Tensor loss(const TokenBatch& batch, DType compute) = 0;
  // What the model makes of `prompt` (in eval mode, without gradients; the mode is put back), or nothing when
  // this objective produces nothing from such a prompt. Deterministic in options.seed, so ranks that all
  // call it (ZeRO-3's forwards are collectives) agree.
  virtual std::optional<Generation> generate(const std::string& prompt, const GenerateOptions& options,
                                             DType compute) = 0;
  // One line saying what generate() does with a prompt (for `strata generate` and its errors).
  virtual std::string generateUsage() const = 0;

  // The micro-batch as the model sees it, so that another implementation of the same model can be fed
  // exactly what loss() feeds this one (tools/hf_parity_zoo.py; data/BatchTrace.h): the inputs by HF
  // transformers' forward-argument names where the model has one ("input_ids", "token_type_ids", "labels",
  // "next_sentence_label"; a causal LM's "target_ids" are its labels already shifted, which HF's GPT-2 would
  // shift again), i64 on the batch's device. The base class has no such view of a user's objective.
  virtual std::vector<std::pair<std::string, Tensor>> modelInputs(const TokenBatch& batch) const;
  // The model's output logits on modelInputs(batch), by HF's output names ("logits"; BERT with the NSP head
  // "prediction_logits" and "seq_relationship_logits"), in `compute`, through the model's calls.
  virtual std::vector<std::pair<std::string, Tensor>> logits(const TokenBatch& batch, DType compute);
};

// The objective models::objective(arch) names, over `model` as models::buildModule built it for `arch`.
// `tokenizer` encodes prompts and decodes outputs; `seed` keys the corruptions.
std::shared_ptr<Objective> makeObjective(const std::string& arch, std::shared_ptr<nn::Module> model,
                                         std::shared_ptr<const Tokenizer> tokenizer, uint64_t seed);

// The tokenizer a config names (byte, gpt2 from data.vocab_file and data.merges_file, or sentencepiece
// from data.vocab_file).
std::unique_ptr<Tokenizer> makeTokenizer(const config::Config& config);
// The objective of config.model.arch (models::buildModule's model for it, on `device`) with the config's
// tokenizer: what `strata train` trains and `strata generate` runs.
std::shared_ptr<Objective> makeObjective(const config::Config& config, Device device);

// A token from `logits` (one row of the vocabulary): the argmax when temperature is 0, else a draw among the
// topK (0: all) most likely after dividing by the temperature, from Philox(seed) at counter `step`.
int64_t pickToken(const std::vector<float>& logits, double temperature, int64_t topK, uint64_t seed,
                  uint64_t step);
// The key a corruption of `split` draws with, from the run's seed: the splits never share masks.
uint64_t corruptionSeed(uint64_t seed, Split split);

}  // namespace strata::data
