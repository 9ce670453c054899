// The pre-training corruptions of the encoder architectures, as pure functions of token ids and a seed:
// - BERT's masked LM: choose 15% of the (non-special) tokens, replace 80% of those with [MASK], 10% with a
//   random token and keep 10%; optionally whole words at a time;
// - T5's span corruption: noise spans of mean length 3 covering 15% of the tokens, each replaced by one
//   sentinel in the input (<extra_id_0> = vocabSize - 1, then counting down, as HF's run_t5_mlm_flax), the
//   targets holding the spans after their sentinels.
// Randomness is Philox(seed) at counters from `offset` (one counter per token): the same (seed, offset) gives
// the same result on every machine, and a data loader passes its batch index times the batch's tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/core/Tensor.h"

namespace strata::data {

struct MlmMaskingOptions {
  double maskProbability = 0.15;
  double maskFraction = 0.8;    // of the chosen tokens: [MASK]
  double randomFraction = 0.1;  // of the chosen tokens: a uniform token from [0, vocabSize); the rest stay
  int64_t maskTokenId = -1;
  int64_t vocabSize = 0;
  std::vector<int64_t> specialTokenIds;  // never chosen ([CLS], [SEP], [PAD], ...)
  // Whole-word masking: a word (a token and the continuation tokens after it) is chosen or not as one.
  bool wholeWord = false;
  std::vector<bool> continuation;  // per token id: a "##" piece continuing the word before it
};

struct MlmBatch {
  Tensor inputIds;  // i64 [B, S]: the corrupted ids
  Tensor labels;    // i64 [B, S]: the original id where chosen, -100 elsewhere
  // The chosen tokens alone, for a loss that runs the MLM head on them only: their flat indices b * S + s
  // (i64 [M]) in order and their labels (i64 [M]). M is the count rounded up to a multiple of
  // kMlmPositionAlign rows (at most B x S; fewer distinct GEMM shapes), the extra rows pointing at an
  // unchosen token with label -100.
  Tensor positions;
  Tensor positionLabels;
};
constexpr int64_t kMlmPositionAlign = 64;

// ids [B, S] (i32/i64, any device; results on the same device). Each row gets exactly
// max(1, round(maskProbability x its eligible tokens)) chosen tokens (0 when none is eligible); with
// wholeWord, whole words are taken in random order while they fit, so a row may get fewer. The 80/10/10
// split is drawn per chosen token.
MlmBatch mlmMask(const Tensor& ids, const MlmMaskingOptions& options, uint64_t seed, uint64_t offset = 0);

struct SpanCorruptionOptions {
  double noiseDensity = 0.15;
  double meanNoiseSpanLength = 3.0;
  int64_t vocabSize = 0;  // sentinels are vocabSize - 1, vocabSize - 2, ... (HF's len(tokenizer))
  int64_t eosTokenId = 1;
};

// HF's random_spans_noise_mask: length booleans, true for noise. round(length x density) noise tokens (at
// least 1, at most length - 1) in round(min(noise, non-noise) / mean span) spans (at least 1), each span
// and each gap between them at least one token long, the sequence starting with non-noise.
std::vector<bool> randomSpansNoiseMask(int64_t length, double noiseDensity, double meanNoiseSpanLength,
                                       uint64_t seed, uint64_t offset = 0);

struct SpanCorruptionLengths {
  int64_t inputLength = 0, targetLength = 0;
};
// The lengths span corruption gives a sequence of `length` tokens (EOS included in both).
SpanCorruptionLengths spanCorruptionLengths(int64_t length, const SpanCorruptionOptions& options);

struct SpanCorruptionBatch {
  Tensor inputIds;  // i64 [B, spanCorruptionLengths(S).inputLength]
  Tensor labels;    // i64 [B, spanCorruptionLengths(S).targetLength]
};
// ids [B, S] -> inputs with each noise span replaced by its sentinel, then EOS; labels with each non-noise
// span replaced by its sentinel (so every noise span follows the sentinel that stands for it), then EOS.
SpanCorruptionBatch spanCorrupt(const Tensor& ids, const SpanCorruptionOptions& options, uint64_t seed,
                                uint64_t offset = 0);

}  // namespace strata::data
