#include "strata/data/Corruption.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_set>

#include "strata/core/Error.h"
#include "strata/core/Philox.h"

namespace strata::data {
namespace {

double unit(uint32_t word) {
  return double(word) * (1.0 / 4294967296.0);
}

std::vector<int64_t> hostIds(const Tensor& ids, const char* fn) {
  STRATA_CHECK(ids.dim() == 2 && (ids.dtype() == DType::I64 || ids.dtype() == DType::I32),
               "{}: ids must be an integer [batch, seq] tensor, got {} {}", fn, ids.dtype(),
               toString(ids.shape()));
  return ids.to(Device::cpu(), DType::I64).contiguous().toVector<int64_t>();
}

// Splits numItems into numSegments non-empty runs at random (HF's _random_segmentation: a shuffled row of
// numSegments - 1 run starts among the numItems - 1 inner positions), Fisher-Yates from Philox.
std::vector<int64_t> randomSegmentation(int64_t numItems, int64_t numSegments, uint64_t seed,
                                        uint64_t offset) {
  std::vector<char> starts(size_t(std::max<int64_t>(numItems - 1, 0)), 0);
  for (int64_t i = 0; i < numSegments - 1; ++i) starts[size_t(i)] = 1;
  for (int64_t i = int64_t(starts.size()) - 1; i > 0; --i) {
    auto j = int64_t(philox4x32(offset + uint64_t(i), seed).x[0] % uint32_t(i + 1));
    std::swap(starts[size_t(i)], starts[size_t(j)]);
  }
  std::vector<int64_t> lengths{1};
  for (char s : starts) {
    if (s) lengths.push_back(0);
    ++lengths.back();
  }
  return lengths;
}

}  // namespace

MlmBatch mlmMask(const Tensor& ids, const MlmMaskingOptions& o, uint64_t seed, uint64_t offset) {
  STRATA_CHECK(o.maskTokenId >= 0 && o.vocabSize > 0, "mlmMask: needs maskTokenId and vocabSize");
  STRATA_CHECK(o.maskProbability > 0 && o.maskProbability < 1 && o.maskFraction >= 0 &&
                   o.randomFraction >= 0 && o.maskFraction + o.randomFraction <= 1,
               "mlmMask: bad rates (probability {}, mask {}, random {})", o.maskProbability, o.maskFraction,
               o.randomFraction);
  STRATA_CHECK(!o.wholeWord || int64_t(o.continuation.size()) == o.vocabSize,
               "mlmMask: whole-word masking needs a continuation flag per token id ({} given for {})",
               o.continuation.size(), o.vocabSize);
  std::vector<int64_t> in = hostIds(ids, "mlmMask"), out = in, labels(in.size(), -100);
  std::unordered_set<int64_t> special(o.specialTokenIds.begin(), o.specialTokenIds.end());
  int64_t B = ids.size(0), S = ids.size(1);
  struct Unit {
    uint32_t key;
    int64_t begin, end;  // positions [begin, end)
  };
  std::vector<Unit> units;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* row = in.data() + b * S;
    uint64_t base = offset + uint64_t(b * S);
    units.clear();
    int64_t eligible = 0;
    for (int64_t s = 0; s < S; ++s) {
      if (special.count(row[s])) continue;
      ++eligible;
      bool continues = o.wholeWord && s > 0 && !units.empty() && units.back().end == s && row[s] >= 0 &&
                       row[s] < o.vocabSize && o.continuation[size_t(row[s])];
      if (continues)
        units.back().end = s + 1;
      else
        units.push_back({philox4x32(base + uint64_t(s), seed).x[0], s, s + 1});
    }
    if (eligible == 0) continue;
    auto target = std::max<int64_t>(1, std::llround(double(eligible) * o.maskProbability));
    // Random order by key; ties (vanishingly rare) by position, so the order is a function of the seed alone.
    std::sort(units.begin(), units.end(), [](const Unit& x, const Unit& y) {
      return x.key != y.key ? x.key < y.key : x.begin < y.begin;
    });
    int64_t chosen = 0;
    for (const Unit& u : units) {
      if (chosen >= target) break;
      if (chosen + (u.end - u.begin) > target) continue;
      chosen += u.end - u.begin;
      for (int64_t s = u.begin; s < u.end; ++s) {
        size_t at = size_t(b * S + s);
        labels[at] = in[at];
        PhiloxOut r = philox4x32(base + uint64_t(s), seed);
        double decide = unit(r.x[1]);
        if (decide < o.maskFraction)
          out[at] = o.maskTokenId;
        else if (decide < o.maskFraction + o.randomFraction)
          out[at] = int64_t(r.x[2] % uint32_t(o.vocabSize));
      }
    }
  }
  std::vector<int64_t> positions, positionLabels;
  int64_t unchosen = -1;
  for (int64_t i = 0; i < B * S; ++i) {
    if (labels[size_t(i)] == -100) {
      if (unchosen < 0) unchosen = i;
      continue;
    }
    positions.push_back(i);
    positionLabels.push_back(labels[size_t(i)]);
  }
  int64_t rows = int64_t(positions.size());
  int64_t padded = std::min((rows + kMlmPositionAlign - 1) / kMlmPositionAlign * kMlmPositionAlign, B * S);
  if (unchosen >= 0) {
    positions.resize(size_t(std::max(padded, rows)), unchosen);
    positionLabels.resize(positions.size(), -100);
  }
  Device dev = ids.device();
  int64_t m = int64_t(positions.size());
  return {Tensor::fromVector<int64_t>(out, {B, S}, dev), Tensor::fromVector<int64_t>(labels, {B, S}, dev),
          Tensor::fromVector<int64_t>(positions, {m}, dev),
          Tensor::fromVector<int64_t>(positionLabels, {m}, dev)};
}

std::vector<bool> randomSpansNoiseMask(int64_t length, double noiseDensity, double meanNoiseSpanLength,
                                       uint64_t seed, uint64_t offset) {
  STRATA_CHECK(length >= 2, "span corruption needs sequences of at least 2 tokens, got {}", length);
  STRATA_CHECK(noiseDensity > 0 && noiseDensity < 1 && meanNoiseSpanLength >= 1,
               "span corruption: bad noise density {} or mean span length {}", noiseDensity,
               meanNoiseSpanLength);
  // np.round rounds half to even, as std::nearbyint does in the default rounding mode.
  auto noise = int64_t(std::nearbyint(double(length) * noiseDensity));
  noise = std::min(std::max<int64_t>(noise, 1), length - 1);
  int64_t nonNoise = length - noise;
  auto spans = int64_t(std::nearbyint(double(std::min(noise, nonNoise)) / meanNoiseSpanLength));
  spans = std::max<int64_t>(spans, 1);
  // Two independent segmentations: the noise runs, then the gaps, at separate counter ranges.
  std::vector<int64_t> noiseLengths = randomSegmentation(noise, spans, seed, offset);
  std::vector<int64_t> gapLengths = randomSegmentation(nonNoise, spans, seed, offset + uint64_t(length));
  std::vector<bool> mask;
  mask.reserve(size_t(length));
  for (int64_t i = 0; i < spans; ++i) {
    mask.insert(mask.end(), size_t(gapLengths[size_t(i)]), false);
    mask.insert(mask.end(), size_t(noiseLengths[size_t(i)]), true);
  }
  return mask;
}

SpanCorruptionLengths spanCorruptionLengths(int64_t length, const SpanCorruptionOptions& o) {
  STRATA_CHECK(length >= 2, "span corruption needs sequences of at least 2 tokens, got {}", length);
  auto noise = int64_t(std::nearbyint(double(length) * o.noiseDensity));
  noise = std::min(std::max<int64_t>(noise, 1), length - 1);
  auto spans = std::max<int64_t>(
      1, int64_t(std::nearbyint(double(std::min(noise, length - noise)) / o.meanNoiseSpanLength)));
  return {length - noise + spans + 1, noise + spans + 1};
}

SpanCorruptionBatch spanCorrupt(const Tensor& ids, const SpanCorruptionOptions& o, uint64_t seed,
                                uint64_t offset) {
  STRATA_CHECK(o.vocabSize > 0, "spanCorrupt: needs vocabSize (the sentinels count down from its end)");
  std::vector<int64_t> in = hostIds(ids, "spanCorrupt");
  int64_t B = ids.size(0), S = ids.size(1);
  SpanCorruptionLengths lengths = spanCorruptionLengths(S, o);
  std::vector<int64_t> inputs, targets;
  inputs.reserve(size_t(B * lengths.inputLength));
  targets.reserve(size_t(B * lengths.targetLength));
  for (int64_t b = 0; b < B; ++b) {
    // Two counters per token (the two segmentations) per row.
    std::vector<bool> noise =
        randomSpansNoiseMask(S, o.noiseDensity, o.meanNoiseSpanLength, seed, offset + uint64_t(2 * b * S));
    // HF's create_sentinel_ids + filter_input_ids, for the input (noise -> sentinel) and the target
    // (non-noise -> sentinel) at once: the k-th run of either kind becomes vocabSize - k.
    int64_t inputSpans = 0, targetSpans = 0;
    for (int64_t s = 0; s < S; ++s) {
      int64_t token = in[size_t(b * S + s)];
      bool starts = s == 0 || noise[size_t(s)] != noise[size_t(s - 1)];
      std::vector<int64_t>& keep = noise[size_t(s)] ? targets : inputs;
      std::vector<int64_t>& replace = noise[size_t(s)] ? inputs : targets;
      int64_t& count = noise[size_t(s)] ? inputSpans : targetSpans;
      if (starts) replace.push_back(o.vocabSize - ++count);
      keep.push_back(token);
    }
    inputs.push_back(o.eosTokenId);
    targets.push_back(o.eosTokenId);
    STRATA_CHECK(int64_t(inputs.size()) == (b + 1) * lengths.inputLength &&
                     int64_t(targets.size()) == (b + 1) * lengths.targetLength,
                 "spanCorrupt: row {} came out with other lengths than spanCorruptionLengths says", b);
  }
  Device dev = ids.device();
  return {Tensor::fromVector<int64_t>(inputs, {B, lengths.inputLength}, dev),
          Tensor::fromVector<int64_t>(targets, {B, lengths.targetLength}, dev)};
}

}  // namespace strata::data
