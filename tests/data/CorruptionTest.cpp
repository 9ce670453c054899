#include <set>

#include "TestUtil.h"
#include "strata/core/Philox.h"
#include "strata/data/Corruption.h"

using namespace strata;
using namespace strata::data;

namespace {
// Ids 10..99 with [CLS] = 1 at the start and [SEP] = 2 at the end of each row; [MASK] = 3.
Tensor rows(int64_t B, int64_t S, uint64_t seed) {
  std::vector<int64_t> ids(size_t(B * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      ids[size_t(b * S + s)] = s == 0       ? 1
                               : s == S - 1 ? 2
                                            : 10 + int64_t(philox4x32(uint64_t(b * S + s), seed).x[0] % 90);
  return Tensor::fromVector<int64_t>(ids, {B, S});
}
MlmMaskingOptions mlmOptions() {
  MlmMaskingOptions o;
  o.maskTokenId = 3;
  o.vocabSize = 100;
  o.specialTokenIds = {1, 2};
  return o;
}
}  // namespace

TEST_CASE("MLM masking: exact count per row, 80/10/10 over many tokens, specials never chosen",
          "[train][mlm]") {
  const int64_t B = 400, S = 130;  // 128 eligible per row: round(0.15 x 128) = 19 chosen
  Tensor ids = rows(B, S, 1);
  MlmBatch m = mlmMask(ids, mlmOptions(), 42);
  std::vector<int64_t> in = ids.toVector<int64_t>(), out = m.inputIds.toVector<int64_t>(),
                       labels = m.labels.toVector<int64_t>();
  int64_t masked = 0, random = 0, kept = 0;
  for (int64_t b = 0; b < B; ++b) {
    int64_t chosen = 0;
    for (int64_t s = 0; s < S; ++s) {
      size_t i = size_t(b * S + s);
      if (labels[i] == -100) {
        REQUIRE(out[i] == in[i]);
        continue;
      }
      REQUIRE(labels[i] == in[i]);
      REQUIRE(in[i] != 1);
      REQUIRE(in[i] != 2);
      ++chosen;
      if (out[i] == 3)
        ++masked;
      else if (out[i] == in[i])
        ++kept;  // includes the 1 % of random draws that hit the same token
      else
        ++random;
    }
    REQUIRE(chosen == 19);
  }
  double total = double(B * 19);
  // The chosen tokens alone, in order, padded to a multiple of 64 rows with an unchosen token labelled -100.
  std::vector<int64_t> positions = m.positions.toVector<int64_t>(), pl = m.positionLabels.toVector<int64_t>();
  REQUIRE(positions.size() == pl.size());
  REQUIRE(positions.size() == size_t((B * 19 + 63) / 64 * 64));
  for (size_t k = 0; k < positions.size(); ++k) {
    size_t at = size_t(positions[k]);
    if (k < size_t(B * 19)) {
      REQUIRE(labels[at] != -100);
      REQUIRE(pl[k] == labels[at]);
      if (k > 0) REQUIRE(positions[k] > positions[k - 1]);
    } else {
      REQUIRE(labels[at] == -100);
      REQUIRE(pl[k] == -100);
    }
  }
  REQUIRE(double(masked) / total == Approx(0.8).margin(0.015));
  REQUIRE(double(random) / total == Approx(0.1 * 0.99).margin(0.01));
  REQUIRE(double(kept) / total == Approx(0.1 + 0.1 * 0.01).margin(0.01));
  // Deterministic from (seed, offset); another seed or offset gives another draw.
  MlmBatch again = mlmMask(ids, mlmOptions(), 42);
  REQUIRE(again.inputIds.toVector<int64_t>() == out);
  REQUIRE(again.labels.toVector<int64_t>() == labels);
  REQUIRE(mlmMask(ids, mlmOptions(), 43).labels.toVector<int64_t>() != labels);
  REQUIRE(mlmMask(ids, mlmOptions(), 42, 1000).labels.toVector<int64_t>() != labels);
}

TEST_CASE("MLM whole-word masking takes a word's pieces together", "[train][mlm]") {
  MlmMaskingOptions o = mlmOptions();
  o.wholeWord = true;
  o.continuation.assign(100, false);
  for (int64_t id = 50; id < 100; ++id) o.continuation[size_t(id)] = true;  // ids >= 50 are "##" pieces
  const int64_t B = 200, S = 66;
  Tensor ids = rows(B, S, 2);
  MlmBatch m = mlmMask(ids, o, 7);
  std::vector<int64_t> in = ids.toVector<int64_t>(), labels = m.labels.toVector<int64_t>();
  int64_t total = 0;
  for (int64_t b = 0; b < B; ++b) {
    int64_t chosen = 0;
    for (int64_t s = 1; s < S - 1; ++s) {
      size_t i = size_t(b * S + s);
      chosen += labels[i] != -100;
      // A continuation piece is chosen exactly when the token before it (same word) is.
      if (in[i] >= 50 && s > 1) REQUIRE((labels[i] != -100) == (labels[i - 1] != -100));
    }
    REQUIRE(chosen <= 10);  // round(0.15 x 64), never over
    total += chosen;
  }
  REQUIRE(double(total) / double(B * 10) > 0.9);
}

TEST_CASE("T5 noise mask: counts, spans and non-noise start", "[train][t5]") {
  for (int64_t length : {10, 64, 114, 568}) {
    std::vector<bool> mask = randomSpansNoiseMask(length, 0.15, 3.0, 5, 0);
    REQUIRE(int64_t(mask.size()) == length);
    auto noise = std::count(mask.begin(), mask.end(), true);
    REQUIRE(noise == std::max<int64_t>(1, std::llround(double(length) * 0.15)));
    int64_t spans = 0;
    for (int64_t i = 0; i < length; ++i) spans += mask[size_t(i)] && (i == 0 || !mask[size_t(i - 1)]);
    REQUIRE(spans == std::max<int64_t>(1, std::llround(double(noise) / 3.0)));
    REQUIRE_FALSE(mask[0]);
  }
  REQUIRE(randomSpansNoiseMask(568, 0.15, 3.0, 5, 0) == randomSpansNoiseMask(568, 0.15, 3.0, 5, 0));
  REQUIRE(randomSpansNoiseMask(568, 0.15, 3.0, 5, 0) != randomSpansNoiseMask(568, 0.15, 3.0, 6, 0));
  // Over many draws the noise spans average 3 tokens and cover 15 %.
  int64_t noise = 0, spans = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    std::vector<bool> mask = randomSpansNoiseMask(100, 0.15, 3.0, seed, 0);
    for (size_t i = 0; i < mask.size(); ++i) {
      noise += mask[i];
      spans += mask[i] && (i == 0 || !mask[i - 1]);
    }
  }
  REQUIRE(double(noise) / double(spans) == Approx(3.0));
  REQUIRE(double(noise) / 20000.0 == Approx(0.15));
}

TEST_CASE("T5 span corruption: sentinels count down from the vocabulary's end, targets restore the spans",
          "[train][t5]") {
  SpanCorruptionOptions o;
  o.vocabSize = 32128;
  o.eosTokenId = 1;
  const int64_t B = 3, S = 40;
  std::vector<int64_t> raw(size_t(B * S));
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = 100 + int64_t(i);
  Tensor ids = Tensor::fromVector<int64_t>(raw, {B, S});
  SpanCorruptionBatch c = spanCorrupt(ids, o, 11);
  SpanCorruptionLengths lengths = spanCorruptionLengths(S, o);
  REQUIRE(lengths.inputLength == 40 - 6 + 2 + 1);  // 6 noise tokens in 2 spans
  REQUIRE(lengths.targetLength == 6 + 2 + 1);
  REQUIRE(c.inputIds.shape() == Shape({B, lengths.inputLength}));
  REQUIRE(c.labels.shape() == Shape({B, lengths.targetLength}));
  std::vector<int64_t> in = c.inputIds.toVector<int64_t>(), tg = c.labels.toVector<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* x = in.data() + b * lengths.inputLength;
    const int64_t* y = tg.data() + b * lengths.targetLength;
    REQUIRE(x[lengths.inputLength - 1] == 1);
    REQUIRE(y[lengths.targetLength - 1] == 1);
    REQUIRE(y[0] == 32127);  // <extra_id_0> opens the targets
    // Rebuild the sequence: each input sentinel k stands for the tokens after sentinel k in the targets.
    std::vector<std::vector<int64_t>> spans;
    for (int64_t t = 0; t < lengths.targetLength - 1; ++t) {
      if (y[t] >= 32000) {
        REQUIRE(y[t] == 32127 - int64_t(spans.size()));
        spans.emplace_back();
      } else {
        spans.back().push_back(y[t]);
      }
    }
    std::vector<int64_t> rebuilt;
    int64_t next = 0;
    for (int64_t t = 0; t < lengths.inputLength - 1; ++t) {
      if (x[t] >= 32000) {
        REQUIRE(x[t] == 32127 - next);
        rebuilt.insert(rebuilt.end(), spans[size_t(next)].begin(), spans[size_t(next)].end());
        ++next;
      } else {
        rebuilt.push_back(x[t]);
      }
    }
    REQUIRE(next == int64_t(spans.size()));
    REQUIRE(rebuilt == std::vector<int64_t>(raw.begin() + b * S, raw.begin() + (b + 1) * S));
  }
  // Rows differ from one another (each has its own counters) and the batch is deterministic.
  REQUIRE(spanCorrupt(ids, o, 11).inputIds.toVector<int64_t>() == in);
}
