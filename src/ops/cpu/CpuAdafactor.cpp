// CPU Adafactor (ops::adafactor): five passes over the sets, each an OpenMP loop over fixed blocks
// (ops/AdafactorWork.h) whose inner loops run along contiguous memory and vectorise (omp simd):
//  1. per block of whole rows: the parameter's sum of squares, the factored sets' row statistics and the
//     unfactored sets' v;
//  2. per group of 64 columns of a factored set: the column statistics, summed down every row;
//  3. per set (serial): the mean of the row statistics and the step size (parameter scale);
//  4. per block: the update's sum of squares (the update is recomputed, never stored);
//  5. per block: the update, clipped and scaled, the first moment, the parameter and its 16-bit copy.
// Sums are taken in double, per block, and added block by block in order, so the result does not depend on
// the thread count. The work lists and per-block sums live in thread-local buffers that are reused from
// step to step (no allocation once they have grown).
#include <omp.h>

#include <cmath>
#include <vector>

#include "../AdafactorWork.h"
#include "CpuAdafactor.h"
#include "CpuKernels.h"
#include "strata/core/Half.h"

namespace strata::ops::cpu {
namespace {

constexpr int64_t kBlockElems = 32768;
constexpr int64_t kColumnGroup = 64;

struct SetScalars {
  float rowMean = 1;      // mean of the row statistics (factored)
  float stepSize = 0;     // lr x parameter scale
  float updateScale = 0;  // stepSize / clipping denominator
};

struct Scratch {
  std::vector<AdafactorBlock> blocks;
  std::vector<int64_t> firstBlock;
  std::vector<AdafactorColumns> groups;
  std::vector<double> partial;  // per block
  std::vector<SetScalars> scalars;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

const float* f32(const Tensor& t) {
  return static_cast<const float*>(t.data());
}
float* f32Mut(const Tensor& t) {
  return static_cast<float*>(t.data());
}

// The unscaled update of elements [begin, end) of a set, written to `out`.
// Factored: u = g / sqrt(row_i / rowMean) / sqrt(col_j); unfactored: u = g / sqrt(v).
inline void updateOf(const AdafactorTensors& s, const SetScalars& k, float scale, int64_t begin, int64_t end,
                     float* out) {
  const float* grad = f32(s.grad);
  if (adafactorFactored(s)) {
    const float* row = f32(s.row);
    const float* col = f32(s.col);
    int64_t cols = s.col.numel();
    for (int64_t r = begin / cols; r * cols < end; ++r) {
      float rowFactor = 1.0f / std::sqrt(row[r] / k.rowMean);
      int64_t lo = std::max(begin, r * cols), hi = std::min(end, (r + 1) * cols);
      const float* g = grad + lo;
      const float* c = col + (lo - r * cols);
      float* o = out + (lo - begin);
#pragma omp simd
      for (int64_t j = 0; j < hi - lo; ++j) o[j] = (g[j] * scale) * rowFactor / std::sqrt(c[j]);
    }
  } else {
    const float* v = f32(s.v) + begin;
    const float* g = grad + begin;
#pragma omp simd
    for (int64_t j = 0; j < end - begin; ++j) out[j] = (g[j] * scale) / std::sqrt(v[j]);
  }
}

// Pass 1 for one block: returns the parameter's sum of squares over it.
double statsBlock(const AdafactorTensors& s, const AdafactorHyper& h, float scale, const AdafactorBlock& b) {
  const float* p = f32(s.param) + b.begin;
  const float* g = f32(s.grad) + b.begin;
  int64_t n = b.end - b.begin;
  double paramSquares = 0;
#pragma omp simd reduction(+ : paramSquares)
  for (int64_t j = 0; j < n; ++j) paramSquares += double(p[j]) * double(p[j]);
  float keep = h.beta2, take = 1.0f - h.beta2;
  if (adafactorFactored(s)) {
    int64_t cols = s.col.numel();
    float* row = f32Mut(s.row);
    for (int64_t r = b.begin / cols; r < b.end / cols; ++r) {
      const float* gr = g + (r * cols - b.begin);
      double sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < cols; ++j) {
        float x = gr[j] * scale;
        sum += double(x * x + h.eps1);
      }
      row[r] = keep * row[r] + take * float(sum / double(cols));
    }
  } else {
    float* v = f32Mut(s.v) + b.begin;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      float x = g[j] * scale;
      v[j] = keep * v[j] + take * (x * x + h.eps1);
    }
  }
  return paramSquares;
}

// Pass 2 for one group of columns.
void columnGroup(const AdafactorTensors& s, const AdafactorHyper& h, float scale, const AdafactorColumns& c) {
  int64_t cols = s.col.numel(), rows = s.row.numel(), width = c.end - c.begin;
  double sum[kColumnGroup] = {};
  const float* grad = f32(s.grad) + c.begin;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = grad + r * cols;
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) {
      float x = g[j] * scale;
      sum[j] += double(x * x + h.eps1);
    }
  }
  float* col = f32Mut(s.col) + c.begin;
  float keep = h.beta2, take = 1.0f - h.beta2;
  for (int64_t j = 0; j < width; ++j) col[j] = keep * col[j] + take * float(sum[j] / double(rows));
}

// Pass 4 for one block: the unscaled update's sum of squares.
double updateSquaresBlock(const AdafactorTensors& s, const SetScalars& k, float scale,
                          const AdafactorBlock& b) {
  constexpr int64_t kPiece = 2048;
  float u[kPiece];
  double total = 0;
  for (int64_t lo = b.begin; lo < b.end; lo += kPiece) {
    int64_t hi = std::min(b.end, lo + kPiece);
    updateOf(s, k, scale, lo, hi, u);
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < hi - lo; ++j) sum += double(u[j]) * double(u[j]);
    total += sum;
  }
  return total;
}

// Pass 5 for one block.
void applyBlock(const AdafactorTensors& s, const AdafactorHyper& h, const SetScalars& k, float scale,
                const AdafactorBlock& b) {
  constexpr int64_t kPiece = 2048;
  float u[kPiece];
  float decay = 1.0f - k.stepSize * s.weightDecay, beta1 = h.beta1, oneMinusBeta1 = 1.0f - h.beta1;
  float updateScale = k.updateScale;
  bool hasM = s.m.defined(), mBf16 = hasM && s.m.dtype() == DType::BF16;
  DType copyType = s.copy.defined() ? s.copy.dtype() : DType::U8;
  for (int64_t lo = b.begin; lo < b.end; lo += kPiece) {
    int64_t hi = std::min(b.end, lo + kPiece), n = hi - lo;
    updateOf(s, k, scale, lo, hi, u);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) u[j] *= updateScale;
    if (hasM && !mBf16) {
      float* m = f32Mut(s.m) + lo;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        m[j] = beta1 * m[j] + oneMinusBeta1 * u[j];
        u[j] = m[j];
      }
    } else if (hasM) {
      uint16_t* m = static_cast<uint16_t*>(s.m.data()) + lo;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        float next = beta1 * bitsFloat(uint32_t(m[j]) << 16) + oneMinusBeta1 * u[j];
        m[j] = BFloat16::fromFloat(next);
        u[j] = next;  // the update uses the moment before its rounding, as torch's would in fp32
      }
    }
    float* p = f32Mut(s.param) + lo;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) p[j] = p[j] * decay - u[j];
    if (copyType == DType::BF16) {
      uint16_t* c = static_cast<uint16_t*>(s.copy.data()) + lo;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) c[j] = BFloat16::fromFloat(p[j]);
    } else if (copyType == DType::F16) {
      uint16_t* c = static_cast<uint16_t*>(s.copy.data()) + lo;
      for (int64_t j = 0; j < n; ++j) c[j] = Half::fromFloat(p[j]);
    } else if (copyType == DType::F32) {
      float* c = f32Mut(s.copy) + lo;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) c[j] = p[j];
    }
  }
}

// Runs fn(i) for i in [0, n) on OpenMP's threads when the work is large enough.
template <class Fn>
void forEach(int64_t n, int64_t elements, Fn&& fn) {
  bool parallel = elements > kParallelGrain && n > 1 && !omp_in_parallel();
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace

void adafactor(const std::vector<AdafactorTensors>& sets, const AdafactorHyper& h, const Tensor& gradScale) {
  float scale = gradScale.defined() ? f32(gradScale)[0] : 1.0f;
  Scratch& w = scratch();
  adafactorBlocks(sets, kBlockElems, w.blocks, w.firstBlock);
  adafactorColumnGroups(sets, kColumnGroup, w.groups);
  int64_t total = 0;
  for (const auto& s : sets) total += s.param.numel();
  int64_t numBlocks = int64_t(w.blocks.size());
  w.partial.resize(size_t(numBlocks));
  w.scalars.resize(sets.size());
  // 1 and 2: statistics.
  forEach(numBlocks, total, [&](int64_t i) {
    const AdafactorBlock& b = w.blocks[size_t(i)];
    w.partial[size_t(i)] = statsBlock(sets[size_t(b.set)], h, scale, b);
  });
  forEach(int64_t(w.groups.size()), total, [&](int64_t i) {
    const AdafactorColumns& c = w.groups[size_t(i)];
    columnGroup(sets[size_t(c.set)], h, scale, c);
  });
  // 3: per set, the row mean and the step size.
  auto sumOfBlocks = [&](size_t k) {
    double sum = 0;
    for (int64_t i = w.firstBlock[k]; i < w.firstBlock[k + 1]; ++i) sum += w.partial[size_t(i)];
    return sum;
  };
  for (size_t k = 0; k < sets.size(); ++k) {
    const AdafactorTensors& s = sets[k];
    SetScalars& sc = w.scalars[k];
    double n = double(s.param.numel());
    sc.stepSize = h.lr;
    if (h.scaleParameter)
      sc.stepSize = float(double(h.lr) * std::max(double(h.eps2), std::sqrt(sumOfBlocks(k) / n)));
    if (adafactorFactored(s)) {
      const float* row = f32(s.row);
      double sum = 0;
      for (int64_t r = 0; r < s.row.numel(); ++r) sum += row[r];
      sc.rowMean = float(sum / double(s.row.numel()));
    }
  }
  // 4: the update's RMS, then the clipping.
  forEach(numBlocks, total, [&](int64_t i) {
    const AdafactorBlock& b = w.blocks[size_t(i)];
    w.partial[size_t(i)] = updateSquaresBlock(sets[size_t(b.set)], w.scalars[size_t(b.set)], scale, b);
  });
  for (size_t k = 0; k < sets.size(); ++k) {
    SetScalars& sc = w.scalars[k];
    double rms = std::sqrt(sumOfBlocks(k) / double(sets[k].param.numel()));
    double denominator = h.clipThreshold > 0 ? std::max(1.0, rms / double(h.clipThreshold)) : 1.0;
    sc.updateScale = float(double(sc.stepSize) / denominator);
  }
  // 5: the update.
  forEach(numBlocks, total, [&](int64_t i) {
    const AdafactorBlock& b = w.blocks[size_t(i)];
    applyBlock(sets[size_t(b.set)], h, w.scalars[size_t(b.set)], scale, b);
  });
}

}  // namespace strata::ops::cpu
