// FP8 kernels (NOTE [FP8 training] in autograd/Fp8.h): the cast with its amax, and delayed scaling's update.
//
// fp8CastKernel: x [rows, cols] (T) -> codes of x * scale (core/Fp8.h's conversion, the CPU's too), written
// [rows, cols] (`plain`) and/or [cols, rows] (`transposed`). Each block of 256 threads (8 warps) takes 32 x
// 32 tiles, striding over the tile rows of the grid: a warp reads 32 consecutive columns of a row, the tile
// of codes goes through shared memory so the transposed writes are consecutive too. The block's largest |x|
// goes into *amax with one atomicMax on the float's bits (amax >= 0, so the integer order is the float
// order); NaNs and infinities are passed over (NOTE [FP8 training]).
//
// fp8UpdateScalesKernel: one block per (state, tensor role): the amax over the history (or its entry at
// `position`), the next scale and its inverse, and the entry at position + 1 zeroed for the next step.
#pragma once

#include "kernels/Common.cuh"
#include "strata/core/Fp8.h"

namespace strata::kernels {

constexpr int kFp8Tile = 32;

template <class T>
__global__ void fp8CastKernel(const T* __restrict__ x, int64_t rows, int64_t cols, Fp8Format format,
                              const float* __restrict__ scale, float* __restrict__ amax,
                              uint8_t* __restrict__ plain, uint8_t* __restrict__ transposed) {
  __shared__ uint8_t tile[kFp8Tile][kFp8Tile + 4];
  __shared__ float scratch[32];
  int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  float s = *scale, largest = 0.0f;
  int64_t col0 = int64_t(blockIdx.x) * kFp8Tile;
  int64_t tilesY = (rows + kFp8Tile - 1) / kFp8Tile;
  for (int64_t tileY = blockIdx.y; tileY < tilesY; tileY += gridDim.y) {
    int64_t row0 = tileY * kFp8Tile;
    for (int j = ty; j < kFp8Tile; j += 8) {
      int64_t r = row0 + j, c = col0 + tx;
      if (r < rows && c < cols) {
        float v = toAcc(x[r * cols + c]);
        if (isfinite(v)) largest = fmaxf(largest, fabsf(v));
        uint8_t code = floatToFp8(v * s, format);
        if (plain) plain[r * cols + c] = code;
        tile[j][tx] = code;
      }
    }
    if (transposed) {
      __syncthreads();
      for (int j = ty; j < kFp8Tile; j += 8) {
        int64_t c = col0 + j, r = row0 + tx;
        if (r < rows && c < cols) transposed[c * rows + r] = tile[tx][j];
      }
      __syncthreads();  // the tile is rewritten by the next tile row
    }
  }
  largest = blockMax(largest, scratch);
  if (threadIdx.x == 0 && largest > 0.0f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(largest));
}

// ----

__global__ void fp8UpdateScalesKernel(float* const* __restrict__ states, int64_t history, int64_t position,
                                      int margin, bool mostRecent) {
  __shared__ float scratch[32];
  float* s = states[blockIdx.x];
  int role = blockIdx.y;
  float* h = s + fp8HistorySlot(role, history);
  float amax = 0.0f;
  if (mostRecent) {
    amax = h[position];
  } else {
    for (int64_t i = threadIdx.x; i < history; i += blockDim.x) amax = fmaxf(amax, h[i]);
  }
  amax = blockMax(amax, scratch);
  __syncthreads();
  if (threadIdx.x == 0) {
    float& scale = s[fp8ScaleSlot(role)];
    scale = fp8NextScale(amax, scale, role == 2 ? Fp8Format::E5M2 : Fp8Format::E4M3, margin);
    s[fp8InverseSlot(role)] = 1.0f / scale;
    h[(position + 1) % history] = 0.0f;
  }
}

}  // namespace strata::kernels
