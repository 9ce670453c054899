// Tokenizing a text file into a nanoGPT .bin (headerless little-endian uint16), on every core.
//
// The input is memory-mapped and cut into blocks of about blockBytes at positions where the tokenizer's
// encoding splits (Tokenizer::encodeSplitsAt; NOTE [Pre-token split points] in Gpt2Tokenizer.cpp). The
// blocks are encoded in parallel and written in order, so the output is exactly tokenizer.encode(whole
// file) whatever the thread count. `strata tokenize` and the text token cache (TokenDataset::open) run it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "strata/data/Data.h"

namespace strata::data {

struct TokenizeOptions {
  int threads = 0;                 // 0: omp_get_max_threads()
  int64_t blockBytes = 4ll << 20;  // a block ends at the first split point at least this far from its start
  // Called from the calling thread now and then, and once at the end, with bytes of input done and total.
  std::function<void(int64_t bytesDone, int64_t bytesTotal)> progress;
};

struct TokenizeResult {
  int64_t bytes = 0, tokens = 0;
  double seconds = 0;
  uint32_t inputCrc32c = 0;  // of the bytes that were tokenized (the token cache checks it against its key)
};

// Tokenizes the text file `input` with `tokenizer` into `output`, a nanoGPT .bin (headerless little-endian
// uint16), written atomically. Refuses a vocabulary larger than 65536. The output equals
// tokenizer.encode(whole file) exactly, whatever the thread count.
TokenizeResult tokenizeFile(const std::string& input, const std::string& output, const Tokenizer& tokenizer,
                            const TokenizeOptions& options = {});

}  // namespace strata::data
