// Multi-tensor Adafactor (ops::adafactor's formulas; CPU twin: src/ops/cpu/CpuAdafactor.cpp).
//
// Layout: every set is a flat fp32 parameter with its gradient, optional first moment (fp32 or bf16), and
// either a full v or, factored, row [R] and column [C] statistics of the parameter read as R x C row-major.
// The launcher cuts each set into blocks of whole rows (factored) or element ranges (ops/AdafactorWork.h)
// and passes descriptor tables, so each pass is one launch over every set:
//  1. adafactorStatsKernel, a CUDA block per work block: the parameter's sum of squares (one partial per
//     block), the row statistics (a warp per row) or v;
//  2. adafactorColumnPartialKernel, a CUDA block per (32 columns, slice of rows): column sums of g^2 + eps1
//     over the slice into a scratch row; adafactorColumnFinishKernel adds the slices in order and updates
//     the column statistics;
//  3. adafactorSetScalarsKernel, a CUDA block per set: the row mean and the step size;
//  4. adafactorUpdateSquaresKernel, per work block: the update's sum of squares (recomputed, never stored);
//  5. adafactorClipKernel, per set: the clipping denominator folded into the update's scale;
//  6. adafactorApplyKernel, per work block: first moment, parameter, 16-bit copy.
// Every sum is taken per block and the partials are added in a fixed order: no atomics, the same result
// on every run. Nothing leaves the device (the step size depends on device-side RMS values).
#pragma once

#include "kernels/Common.cuh"

namespace strata::kernels {

struct AdafactorSetDesc {
  float* param;
  const float* grad;
  void* m;
  float* v;    // unfactored
  float* row;  // factored
  float* col;
  int64_t n, rows, cols;  // rows 0: unfactored
  int64_t firstBlock, numBlocks;
  float weightDecay;
  int mKind;  // 0 none, 1 fp32, 2 bf16
  void* copy;
  int copyKind;  // 0 none, 1 bf16, 2 f16
};

struct AdafactorWorkBlock {
  int64_t set, begin, end;
};

// Columns [colBegin, colEnd) over rows [rowBegin, rowEnd), summed into scratch[slice x cols + column].
struct AdafactorColumnSlice {
  int64_t set, colBegin, colEnd, rowBegin, rowEnd;
  float* scratch;  // the set's [slices, cols] partial sums
  int64_t slice;
};

// Columns [colBegin, colEnd) of a set whose partial sums fill `slices` rows of scratch.
struct AdafactorColumnFinish {
  int64_t set, colBegin, colEnd, slices;
  const float* scratch;
};

struct AdafactorParams {
  float lr, beta1, beta2, eps1, eps2, clipThreshold;
  int scaleParameter;
};

struct AdafactorSetScalars {
  float rowMean, stepSize, updateScale;
};

__device__ __forceinline__ float adafactorGrad(const float* grad, int64_t i, float scale) {
  return grad[i] * scale;
}

// ----

__global__ void adafactorStatsKernel(const AdafactorSetDesc* __restrict__ sets,
                                     const AdafactorWorkBlock* __restrict__ blocks, AdafactorParams h,
                                     const float* __restrict__ gradScale, float* __restrict__ paramPartial) {
  __shared__ float scratch[32];
  AdafactorWorkBlock b = blocks[blockIdx.x];
  AdafactorSetDesc s = sets[b.set];
  float scale = gradScale ? gradScale[0] : 1.0f;
  float keep = h.beta2, take = 1.0f - h.beta2;
  float sq = 0;
  for (int64_t i = b.begin + threadIdx.x; i < b.end; i += blockDim.x) sq += s.param[i] * s.param[i];
  if (s.rows > 0) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int64_t r = b.begin / s.cols + warp; r < b.end / s.cols; r += warps) {
      const float* g = s.grad + r * s.cols;
      float sum = 0;
      for (int64_t c = lane; c < s.cols; c += 32) {
        float x = g[c] * scale;
        sum += x * x + h.eps1;
      }
      sum = warpSum(sum);
      if (lane == 0) s.row[r] = keep * s.row[r] + take * (sum / float(s.cols));
    }
  } else {
    for (int64_t i = b.begin + threadIdx.x; i < b.end; i += blockDim.x) {
      float x = adafactorGrad(s.grad, i, scale);
      s.v[i] = keep * s.v[i] + take * (x * x + h.eps1);
    }
  }
  sq = blockSum(sq, scratch);
  if (threadIdx.x == 0) paramPartial[blockIdx.x] = sq;
}

// blockDim (32, 8): threadIdx.x a column, threadIdx.y a stride over the slice's rows.
__global__ void adafactorColumnPartialKernel(const AdafactorSetDesc* __restrict__ sets,
                                             const AdafactorColumnSlice* __restrict__ slices,
                                             AdafactorParams h, const float* __restrict__ gradScale) {
  __shared__ float sums[8][33];
  AdafactorColumnSlice w = slices[blockIdx.x];
  AdafactorSetDesc s = sets[w.set];
  float scale = gradScale ? gradScale[0] : 1.0f;
  int64_t c = w.colBegin + threadIdx.x;
  float sum = 0;
  if (c < w.colEnd)
    for (int64_t r = w.rowBegin + threadIdx.y; r < w.rowEnd; r += blockDim.y) {
      float x = s.grad[r * s.cols + c] * scale;
      sum += x * x + h.eps1;
    }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < w.colEnd) {
    float total = 0;
    for (int y = 0; y < int(blockDim.y); ++y) total += sums[y][threadIdx.x];
    w.scratch[w.slice * s.cols + c] = total;
  }
}

__global__ void adafactorColumnFinishKernel(const AdafactorSetDesc* __restrict__ sets,
                                            const AdafactorColumnFinish* __restrict__ finishes,
                                            AdafactorParams h) {
  AdafactorColumnFinish w = finishes[blockIdx.x];
  AdafactorSetDesc s = sets[w.set];
  for (int64_t c = w.colBegin + threadIdx.x; c < w.colEnd; c += blockDim.x) {
    double total = 0;
    for (int64_t k = 0; k < w.slices; ++k) total += double(w.scratch[k * s.cols + c]);
    s.col[c] = h.beta2 * s.col[c] + (1.0f - h.beta2) * float(total / double(s.rows));
  }
}

__global__ void adafactorSetScalarsKernel(const AdafactorSetDesc* __restrict__ sets,
                                          const float* __restrict__ paramPartial, AdafactorParams h,
                                          AdafactorSetScalars* __restrict__ scalars) {
  __shared__ double scratch[32];
  AdafactorSetDesc s = sets[blockIdx.x];
  double sq = 0;
  for (int64_t k = threadIdx.x; k < s.numBlocks; k += blockDim.x)
    sq += double(paramPartial[s.firstBlock + k]);
  sq = blockSum(sq, scratch);
  double rowSum = 0;
  for (int64_t r = threadIdx.x; r < s.rows; r += blockDim.x) rowSum += double(s.row[r]);
  rowSum = blockSum(rowSum, scratch);
  if (threadIdx.x == 0) {
    float stepSize = h.lr;
    if (h.scaleParameter) stepSize = float(double(h.lr) * fmax(double(h.eps2), sqrt(sq / double(s.n))));
    scalars[blockIdx.x].stepSize = stepSize;
    scalars[blockIdx.x].rowMean = s.rows > 0 ? float(rowSum / double(s.rows)) : 1.0f;
  }
}

// Calls fn(i, u) for every element i of work block b with its unscaled update u.
template <class Fn>
__device__ __forceinline__ void adafactorForEachUpdate(const AdafactorSetDesc& s, const AdafactorWorkBlock& b,
                                                       float rowMean, float scale, Fn&& fn) {
  if (s.rows > 0) {
    for (int64_t r = b.begin / s.cols; r < b.end / s.cols; ++r) {
      float rowFactor = 1.0f / sqrtf(s.row[r] / rowMean);
      const float* g = s.grad + r * s.cols;
      for (int64_t c = threadIdx.x; c < s.cols; c += blockDim.x)
        fn(r * s.cols + c, (g[c] * scale) * rowFactor / sqrtf(s.col[c]));
    }
  } else {
    for (int64_t i = b.begin + threadIdx.x; i < b.end; i += blockDim.x)
      fn(i, (s.grad[i] * scale) / sqrtf(s.v[i]));
  }
}

__global__ void adafactorUpdateSquaresKernel(const AdafactorSetDesc* __restrict__ sets,
                                             const AdafactorWorkBlock* __restrict__ blocks,
                                             const AdafactorSetScalars* __restrict__ scalars,
                                             const float* __restrict__ gradScale,
                                             float* __restrict__ updatePartial) {
  __shared__ float scratch[32];
  AdafactorWorkBlock b = blocks[blockIdx.x];
  AdafactorSetDesc s = sets[b.set];
  float scale = gradScale ? gradScale[0] : 1.0f;
  float sq = 0;
  adafactorForEachUpdate(s, b, scalars[b.set].rowMean, scale, [&](int64_t, float u) { sq += u * u; });
  sq = blockSum(sq, scratch);
  if (threadIdx.x == 0) updatePartial[blockIdx.x] = sq;
}

__global__ void adafactorClipKernel(const AdafactorSetDesc* __restrict__ sets,
                                    const float* __restrict__ updatePartial, AdafactorParams h,
                                    AdafactorSetScalars* __restrict__ scalars) {
  __shared__ double scratch[32];
  AdafactorSetDesc s = sets[blockIdx.x];
  double sq = 0;
  for (int64_t k = threadIdx.x; k < s.numBlocks; k += blockDim.x)
    sq += double(updatePartial[s.firstBlock + k]);
  sq = blockSum(sq, scratch);
  if (threadIdx.x == 0) {
    double rms = sqrt(sq / double(s.n));
    double denominator = h.clipThreshold > 0 ? fmax(1.0, rms / double(h.clipThreshold)) : 1.0;
    scalars[blockIdx.x].updateScale = float(double(scalars[blockIdx.x].stepSize) / denominator);
  }
}

__global__ void adafactorApplyKernel(const AdafactorSetDesc* __restrict__ sets,
                                     const AdafactorWorkBlock* __restrict__ blocks,
                                     const AdafactorSetScalars* __restrict__ scalars, AdafactorParams h,
                                     const float* __restrict__ gradScale) {
  AdafactorWorkBlock b = blocks[blockIdx.x];
  AdafactorSetDesc s = sets[b.set];
  AdafactorSetScalars k = scalars[b.set];
  float scale = gradScale ? gradScale[0] : 1.0f;
  float decay = 1.0f - k.stepSize * s.weightDecay, oneMinusBeta1 = 1.0f - h.beta1;
  adafactorForEachUpdate(s, b, k.rowMean, scale, [&](int64_t i, float u) {
    u *= k.updateScale;
    if (s.mKind == 1) {
      float* m = static_cast<float*>(s.m);
      m[i] = h.beta1 * m[i] + oneMinusBeta1 * u;
      u = m[i];
    } else if (s.mKind == 2) {
      __nv_bfloat16* m = static_cast<__nv_bfloat16*>(s.m);
      float next = h.beta1 * __bfloat162float(m[i]) + oneMinusBeta1 * u;
      m[i] = __float2bfloat16_rn(next);
      u = next;  // this step uses the moment before its rounding (as the CPU kernel)
    }
    float p = s.param[i] * decay - u;
    s.param[i] = p;
    if (s.copyKind == 1)
      static_cast<__nv_bfloat16*>(s.copy)[i] = __float2bfloat16_rn(p);
    else if (s.copyKind == 2)
      static_cast<__half*>(s.copy)[i] = __float2half_rn(p);
  });
}

}  // namespace strata::kernels
