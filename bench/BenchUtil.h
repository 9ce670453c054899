// Timing helpers for the GPU benches: CUDA events around a region, warm-up, median of repeats.
#pragma once

#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "strata/strata.h"

namespace strata::bench {

// Median milliseconds of `fn` over `repeats` timed runs after `warmup` untimed ones, on the current stream.
inline double medianMs(Device device, const std::function<void()>& fn, int warmup = 5, int repeats = 20) {
  return medianEventMs(device, fn, warmup, repeats);
}

// A bench's command line `[--iters K] CASE ...`, each CASE a comma list of integers ("T,D,F").
struct CaseArgs {
  int iters;
  std::vector<std::vector<int64_t>> cases;  // empty when none was given
};

// Reads it; a case must have `minFields` to `maxFields` numbers. On a bad case: says so on stderr, naming
// `want` (the expected form), and gives nullopt.
inline std::optional<CaseArgs> parseCaseArgs(int argc, char** argv, int iters, size_t minFields,
                                             size_t maxFields, const char* want) {
  CaseArgs out{iters, {}};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      out.iters = std::stoi(argv[++i]);
      continue;
    }
    std::vector<int64_t> c;
    std::stringstream in(argv[i]);
    bool numbers = true;
    for (std::string f; std::getline(in, f, ',');) {
      char* end = nullptr;
      c.push_back(std::strtoll(f.c_str(), &end, 10));
      numbers = numbers && !f.empty() && *end == 0;
    }
    if (!numbers || c.size() < minFields || c.size() > maxFields) {
      std::fprintf(stderr, "bad case '%s' (want %s)\n", argv[i], want);
      return std::nullopt;
    }
    out.cases.push_back(std::move(c));
  }
  return out;
}

}  // namespace strata::bench
