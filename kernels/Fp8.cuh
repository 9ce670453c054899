// FP8 kernels (NOTE [FP8 training] in autograd/Fp8.h): the cast with its amax, and delayed scaling's update.
//
// fp8CastKernel: x [rows, cols] (T) -> codes of x * scale (core/Fp8.h's conversion, the CPU's too), written
// [rows, cols] (`plain`) and/or [cols, rows] (`transposed`). Each block of 256 threads (8 warps) takes 32 x
// 32 tiles, striding over the tile rows of the grid: a warp reads 32 consecutive columns of a row, the tile
// of codes goes through shared memory so the transposed writes are consecutive too. The block's largest |x|
// goes into *amax with one atomicMax on the float's bits (amax >= 0, so the integer order is the float
// order); NaNs and infinities are passed over (NOTE [FP8 training]).
//
// fp8CastWideKernel: the same cast where rows and cols are multiples of 8 and every row starts 16-byte
// aligned (the FP8 GEMMs' shapes): each thread converts 8 consecutive elements of a row from one or two
// 16-byte loads and writes their 8 codes at once; a block of 256 threads takes 64 x 64 tiles, and its
// transposed tile goes out as 8 codes (8 consecutive rows of one column) a thread. The grid is a few blocks
// per SM striding over the tiles, so the amax costs one atomicMax per block, not per tile. The codes and the
// amax are fp8CastKernel's, bit for bit. It may first apply an operation to each element (a GELU, or a
// GELU's backward with aux) and add the cast values up by column (NOTE [FP8 fused casts] in autograd/Fp8.h).
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

constexpr int kFp8WideTile = 64;

// The 8 elements at p (16-byte aligned) as floats.
__device__ __forceinline__ void fp8Load8(const float* p, float v[8]) {
  float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
template <class T>
__device__ __forceinline__ void fp8Load8(const T* p, float v[8]) {
  static_assert(sizeof(T) == 2, "fp8Load8: 16-bit elements");
  uint4 u = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = toAcc(e[k]);
}

// The value a wide cast converts, from the element x (and aux's element a): P::operator()(x, a), rounded to
// the tensor's dtype where it is computed (NOTE [FP8 fused casts] in autograd/Fp8.h). P::kAux: whether it
// reads aux.
struct Fp8AsIs {
  static constexpr bool kAux = false;
  __device__ __forceinline__ float operator()(float x, float) const { return x; }
};

template <class T, Fp8Format Format, class P>
__global__ void __launch_bounds__(256)
    fp8CastWideKernel(const T* __restrict__ x, const T* __restrict__ aux, int64_t rows, int64_t cols,
                      P prologue, const float* __restrict__ scale, float* __restrict__ amax,
                      uint8_t* __restrict__ plain, uint8_t* __restrict__ transposed,
                      float* __restrict__ partials) {
  constexpr int kTile = kFp8WideTile;
  // Rows of 72 bytes: 8-byte aligned for the packed stores, and the transposed reads of one warp spread
  // over two banks' worth of rows.
  __shared__ __align__(16) uint8_t tile[kTile][kTile + 8];
  __shared__ float values[kTile][kTile + 1];  // the cast values, for the column sums
  __shared__ float scratch[32];
  float s = *scale, largest = 0.0f;
  int group = threadIdx.x & 7;  // which 8 columns (or, transposed, 8 rows) of the tile
  int line = threadIdx.x >> 3;  // 0..31: a row of the tile (or, transposed, a column) per pass
  int64_t tilesX = (cols + kTile - 1) / kTile, tiles = tilesX * ((rows + kTile - 1) / kTile);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    int64_t tileY = t / tilesX, row0 = tileY * kTile, col0 = (t % tilesX) * kTile;
#pragma unroll
    for (int pass = 0; pass < kTile / 32; ++pass) {
      int j = pass * 32 + line;
      int64_t r = row0 + j, c = col0 + group * 8;
      if (r < rows && c < cols) {  // cols % 8 == 0: the 8 are all inside or all outside
        float v[8], a[8];
        fp8Load8(x + r * cols + c, v);
        if constexpr (P::kAux) fp8Load8(aux + r * cols + c, a);
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          v[k] = prologue(v[k], P::kAux ? a[k] : 0.0f);
          if (isfinite(v[k])) largest = fmaxf(largest, fabsf(v[k]));
          if (partials) values[j][group * 8 + k] = v[k];
          uint32_t code = floatToFp8(v[k] * s, Format);
          if (k < 4)
            lo |= code << (8 * k);
          else
            hi |= code << (8 * (k - 4));
        }
        uint2 packed = make_uint2(lo, hi);
        if (plain) *reinterpret_cast<uint2*>(plain + r * cols + c) = packed;
        if (transposed) *reinterpret_cast<uint2*>(&tile[j][group * 8]) = packed;
      }
    }
    if (transposed || partials) __syncthreads();
    if (transposed) {
#pragma unroll
      for (int pass = 0; pass < kTile / 32; ++pass) {
        int jc = pass * 32 + line;
        int64_t c = col0 + jc, r = row0 + group * 8;
        if (c < cols && r < rows) {  // rows % 8 == 0
          uint32_t lo = 0, hi = 0;
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            lo |= uint32_t(tile[group * 8 + k][jc]) << (8 * k);
            hi |= uint32_t(tile[group * 8 + 4 + k][jc]) << (8 * k);
          }
          *reinterpret_cast<uint2*>(transposed + c * rows + r) = make_uint2(lo, hi);
        }
      }
    }
    // The tile's column sums, row after row (NOTE [FP8 fused casts]): partials [tile rows, cols].
    if (partials && threadIdx.x < kTile && col0 + threadIdx.x < cols) {
      float sum = 0.0f;
      int64_t last = rows - row0 < kTile ? rows - row0 : kTile;
      for (int64_t j = 0; j < last; ++j) sum += values[j][threadIdx.x];
      partials[tileY * cols + col0 + threadIdx.x] = sum;
    }
    if (transposed || partials) __syncthreads();  // the tile is rewritten by the next one
  }
  largest = blockMax(largest, scratch);
  if (threadIdx.x == 0 && largest > 0.0f) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(largest));
}

// out[c] = the partial sums of column c summed in tile-row order (NOTE [FP8 fused casts]).
__global__ void fp8ColumnSumsKernel(const float* __restrict__ partials, int64_t tileRows, int64_t cols,
                                    float* __restrict__ out) {
  int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float sum = 0.0f;
  for (int64_t t = 0; t < tileRows; ++t) sum += partials[t * cols + c];
  out[c] = sum;
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
