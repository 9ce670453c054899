// Fused attention (FlashAttention-2 style) for sm_80+: softmax(scale * Q K^T + causal mask) V without writing
// the S x S scores to memory, and its backward.
//
// Operands are [B, S, H, D] views with a contiguous last dim and any batch/seq/head strides, so Q, K and V
// can be read straight out of a packed qkv projection and the output lands in [B, S, H*D] for the next GEMM.
// Tensor cores through mma.sync m16n8k16 (bf16 or f16 in, fp32 accumulate); tiles move global -> shared with
// cp.async (double-buffered) and shared -> registers with ldmatrix, on a 16-byte-chunk XOR swizzle that keeps
// ldmatrix free of bank conflicts.
//
// Forward: one CTA per (64 queries, batch*head); each warp owns 16 query rows and streams 64-key tiles,
// keeping the running max/sum of its rows (online softmax) in registers. It stores the output and, per row,
// lse2 = log2(sum_j exp2(scale*log2(e)*s_ij)), the log2-domain log-sum-exp that the backward replays P from.
// Backward: delta = rowsum(dO * O) first; then one kernel per key tile accumulates dK and dV over query
// tiles, and one per query tile accumulates dQ over key tiles. Recomputing P in both kernels costs two extra
// tile GEMMs but needs no atomics and keeps every accumulator in registers.
// Dropout (the DROP instances; NOTE [Fused attention dropout] in ops/Ops.h): each kernel replays the mask of
// probability (b, h, i, j) from its Philox counter. The forward sums the row's softmax before dropping and
// multiplies the kept values by 1 / (1 - p) once, at the end; the backward feeds P z to dV and z dP to dS.
//
// NOTE [Biased fused attention]
// An additive bias on the scores (T5's relative positions): softmax(scale * Q K^T + bias [+ causal mask]) V
// with the bias [Bb, H, Sq, Sk], Bb 1 (one bias for the whole batch, T5's case) or B, its last dim
// contiguous, in the BIAS instances (the others are the kernels as they were without one). Each kernel reads
// the bias of the score tile it holds straight from global memory, one element per score in the accumulator
// layout; the forward and dQ kernels issue the loads into registers before the tile's Q K^T so they overlap
// the tensor-core work (the dK/dV kernel, short of registers, reads them where it uses them). The bias of
// one head is Sq x Sk and shared by the batch, so after the first CTA it comes from L2. With a bias the tile
// is turned into log2-domain logits (scale log2(e) s + log2(e) bias) before the running max, so lse2 includes
// the bias and the backward replays P the same way. The bias's gradient is dS = P (z dP - delta) itself (the
// scores' gradient before the softmax scale): the dQ kernel, which holds dS in the bias's own row-major
// layout, adds it into an fp32 [Bb, H, Sq, Sk] accumulator. Where the batch shares one bias, B CTAs add into
// each element: with atomics (two-float vector reductions where Sk is even) rather than a [B, H, Sq, Sk]
// partial and a reduction, since the partial would cost B times the bias's memory (T5-base: 200 MB a layer at
// batch 16) and the atomics meet only B-way contention, spread over the CTAs' run. The price is that the
// batch sum's order, and so its last fp32 bit, can change between runs. Causally hidden scores (dS = 0) are
// skipped. The composed path (nn::Attention on the CPU, key padding) is the reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/Common.cuh"
#include "strata/core/Philox.h"

namespace strata::kernels::flash {

struct Operand {
  const void* data = nullptr;
  int64_t b = 0, s = 0, h = 0;  // element strides of batch, sequence and head
};

struct Params {
  Operand q, k, v, o, dout;
  void* out = nullptr;  // forward output, strides of `o`
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  Operand dqS, dkS, dvS;   // strides of dq/dk/dv (data unused)
  float* lse2 = nullptr;   // [B * H, Sq]
  float* delta = nullptr;  // [B * H, Sq]
  int B = 0, H = 0, Sq = 0, Sk = 0;
  float scaleLog2 = 0;  // softmax scale * log2(e)
  float scale = 0;
  bool causal = false;
  int shift = 0;               // causal: key j is hidden from query i when j > i + shift (shift = Sk - Sq)
  uint32_t dropThreshold = 0;  // DROP instances: dropThreshold(p) (NOTE [Dropout bits] in core/Philox.h)
  float dropScale = 1;         // 1 / (1 - p)
  bool dropGroups = false;     // offset and Sk are multiples of 8: each 8-key group is one Philox evaluation
  uint64_t seed = 0, offset = 0;
  // NOTE [Biased fused attention]: element (b, h, i, j) of the bias at bias + b * biasB + h * biasH + i *
  // biasS
  // + j (biasB 0: shared by the batch); null for none. dbias: fp32 contiguous, batch stride dbiasB (0:
  // shared).
  const void* bias = nullptr;
  int64_t biasB = 0, biasH = 0, biasS = 0;
  float* dbias = nullptr;
  int64_t dbiasB = 0;
};

// Whether probability (query i, key j) of head bh survives dropout: ops::dropout's test on element
// ((bh * Sq + i) * Sk + j) of the [B, H, Sq, Sk] probabilities.
__device__ __forceinline__ bool dropKeeps(const Params& p, int bh, int i, int j) {
  uint64_t index = p.offset + (uint64_t(bh) * uint64_t(p.Sq) + uint64_t(i)) * uint64_t(p.Sk) + uint64_t(j);
  return dropKeep(p.seed, index, p.dropThreshold);
}

constexpr int kBlockN = 64;  // keys per tile (forward, dQ); queries per tile (dK/dV)
constexpr float kLog2e = 1.4426950408889634f;

// Where p.dropGroups: the keep bits of keys [8 j8, 8 j8 + 8) for query i of head bh (bit l: key 8 j8 + l).
__device__ __forceinline__ uint32_t dropGroupBits(const Params& p, int bh, int i, int j8) {
  uint64_t group =
      (p.offset >> 3) + (uint64_t(bh) * uint64_t(p.Sq) + uint64_t(i)) * uint64_t(p.Sk >> 3) + uint64_t(j8);
  return dropKeepByte(p.seed, group, p.dropThreshold);
}

// The keep bits of a warp's 16 x 64 tile in the accumulator layout (queries row0 + g and row0 + g + 8, keys
// col0 + 8 nt + 2t + {0, 1}; g = lane / 4, t = lane % 4; col0 a multiple of 64). Element (half, nt, e) lands
// on bit 16 half + 2 nt + e for the forward (one word for both rows) and 4 nt + 2 half + e otherwise (as the
// dQ kernel's s[nt][e]). Where p.dropGroups each 8-key group is one Philox evaluation and the four threads of
// a quad share their rows, so thread t evaluates the groups of tiles nt = t and t + 4 for both rows (one byte
// each) and the quad trades them by shuffles: 4 evaluations per thread where one per element takes 32.
// Bits of elements past Sq or Sk are left clear (they are masked or never stored either way).
template <bool FORWARD>
__device__ __forceinline__ uint32_t dropRowTile(const Params& p, int bh, int row0, int col0, int lane) {
  static_assert(kBlockN == 64, "two groups of four 8-key tiles per row");
  int g = lane >> 2, t = lane & 3;
  if (!p.dropGroups) {
    uint32_t keep = 0;
    // Not unrolled: one Philox evaluation live at a time keeps the registers for the tiles.
#pragma unroll 1
    for (int bit = 0; bit < 32; ++bit) {
      int half = FORWARD ? bit >> 4 : (bit & 3) >> 1, nt = FORWARD ? (bit & 15) >> 1 : bit >> 2;
      int row = row0 + g + 8 * half, col = col0 + 8 * nt + 2 * t + (bit & 1);
      if (row < p.Sq && col < p.Sk && dropKeeps(p, bh, row, col)) keep |= 1u << bit;
    }
    return keep;
  }
  uint32_t mine = 0;  // byte k = 2 half + q: the group of tile 4 q + t in row g + 8 half
#pragma unroll 1
  for (int k = 0; k < 4; ++k)
    mine |= dropGroupBits(p, bh, row0 + g + (k >> 1) * 8, (col0 >> 3) + 4 * (k & 1) + t) << (8 * k);
  uint32_t keep = 0;
#pragma unroll
  for (int src = 0; src < 4; ++src) {
    uint32_t w = __shfl_sync(0xffffffffu, mine, (lane & ~3) | src);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      int half = k >> 1, nt = 4 * (k & 1) + src;
      keep |= ((w >> (8 * k + 2 * t)) & 3u) << (FORWARD ? 16 * half + 2 * nt : 4 * nt + 2 * half);
    }
  }
  return keep;
}

// The dK/dV kernel's keep bits for a warp's transposed 16 x 64 tile (keys key0 + g and key0 + g + 8, key0 a
// multiple of 16; queries q0 + 8 nt + 2t + {0, 1}), bit 4 nt + e as its s[nt][e]. Where p.dropGroups a
// query's 8-key group spans the 8 threads g = 0..7 of one t: thread g evaluates the 4 groups of tile nt = g
// (2 queries x 2 key groups) and the 8 threads trade them by shuffles.
__device__ __forceinline__ uint32_t dropColTile(const Params& p, int bh, int key0, int q0, int lane) {
  static_assert(kBlockN == 64, "8 query tiles, one per row of the quad layout");
  int g = lane >> 2, t = lane & 3;
  if (!p.dropGroups) {
    uint32_t keep = 0;
    // Not unrolled: one Philox evaluation live at a time keeps the registers for the tiles.
#pragma unroll 1
    for (int bit = 0; bit < 32; ++bit) {
      int key = key0 + g + 8 * ((bit & 3) >> 1), query = q0 + 8 * (bit >> 2) + 2 * t + (bit & 1);
      if (key < p.Sk && query < p.Sq && dropKeeps(p, bh, query, key)) keep |= 1u << bit;
    }
    return keep;
  }
  uint32_t mine = 0;  // byte e: query q0 + 8 g + 2t + (e & 1), key group key0 / 8 + (e >> 1)
#pragma unroll 1
  for (int e = 0; e < 4; ++e)
    mine |= dropGroupBits(p, bh, q0 + 8 * g + 2 * t + (e & 1), (key0 >> 3) + (e >> 1)) << (8 * e);
  uint32_t keep = 0;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    uint32_t w = __shfl_sync(0xffffffffu, mine, 4 * nt + t);
#pragma unroll
    for (int e = 0; e < 4; ++e) keep |= ((w >> (8 * e + g)) & 1u) << (4 * nt + e);
  }
  return keep;
}

// ---- PTX wrappers
// ---------------------------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cpAsync16(uint32_t dst, const void* src, bool valid) {
  int bytes = valid ? 16 : 0;  // 0: zero-fill, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a (16x16, row) * b (16x8, col).
template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// ---- shared-memory tiles: [rows][D] elements of 2 bytes, 16-byte chunks XOR-swizzled by row
// ----------------------------------------------------------

template <int D>
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return uint32_t(row * D * 2 + ((chunk ^ (row & 7)) << 4));
}

// Loads rows [0, ROWS) of a tile whose row r starts at g + r * ld; rows >= valid are zero-filled.
// Shared-memory row stride (elements) for head dim D: a multiple of 64 so the XOR swizzle stays inside the
// row.
template <int D>
constexpr int kSmemStride = D <= 64 ? 64 : 128;

template <int ROWS, int D, int DS, int THREADS, class T>
__device__ __forceinline__ void loadTile(uint32_t dst, const T* g, int64_t ld, int valid) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < ROWS * kChunks; i += THREADS) {
    int r = i / kChunks, c = i % kChunks;
    bool ok = r < valid;
    cpAsync16(dst + swz<DS>(r, c), ok ? g + r * ld + c * 8 : g, ok);
  }
}

// ldmatrix lane addresses. A operand (16x16 at rows r0, k chunk pair kc) and the transposed B operand (16 k
// rows at r0, two n-tiles at chunk pair nc) share one pattern; the plain B operand (two n-tiles of 8 rows at
// r0, k chunk pair kc) has another.
template <int D>
__device__ __forceinline__ uint32_t addrA(uint32_t base, int r0, int kc, int lane) {
  return base + swz<D>(r0 + (lane & 7) + ((lane >> 3) & 1) * 8, kc * 2 + (lane >> 4));
}
template <int D>
__device__ __forceinline__ uint32_t addrB(uint32_t base, int r0, int kc, int lane) {
  return base + swz<D>(r0 + (lane & 7) + (lane >> 4) * 8, kc * 2 + ((lane >> 3) & 1));
}

// acc[16 x 8*NT] += A (16 x D, rows r0 of tile a) * B^T, B = rows [0, 8*NT) of tile b ([n][D]).
template <class T, int D, int DS, int NT>
__device__ __forceinline__ void gemmABt(float (&acc)[NT][4], uint32_t a, int r0, uint32_t b, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t af[4];
    ldsm4(af, addrA<DS>(a, r0, kk, lane));
#pragma unroll
    for (int nn = 0; nn < NT / 2; ++nn) {
      uint32_t bf[4];
      ldsm4(bf, addrB<DS>(b, nn * 16, kk, lane));
      mma<T>(acc[2 * nn], af, bf[0], bf[1]);
      mma<T>(acc[2 * nn + 1], af, bf[2], bf[3]);
    }
  }
}

// acc[16 x D] += P (16 x 16*KT, accumulator layout, converted to A fragments) * B, B = rows [0, 16*KT) of
// tile b ([k][D]). MASK: element e of p[nt] counts only where bit nt * 4 + e of `keep` is set.
template <class T, int D, int DS, int KT, bool MASK = false>
__device__ __forceinline__ void gemmPB(float (&acc)[D / 8][4], const float (&p)[2 * KT][4], uint32_t b,
                                       int lane, uint32_t keep = 0) {
  auto at = [&](int nt, int e) { return !MASK || ((keep >> (nt * 4 + e)) & 1u) ? p[nt][e] : 0.0f; };
#pragma unroll
  for (int kk = 0; kk < KT; ++kk) {
    uint32_t af[4] = {pack2<T>(at(2 * kk, 0), at(2 * kk, 1)), pack2<T>(at(2 * kk, 2), at(2 * kk, 3)),
                      pack2<T>(at(2 * kk + 1, 0), at(2 * kk + 1, 1)),
                      pack2<T>(at(2 * kk + 1, 2), at(2 * kk + 1, 3))};
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t bf[4];
      ldsm4t(bf, addrA<DS>(b, kk * 16, dn, lane));
      mma<T>(acc[2 * dn], af, bf[0], bf[1]);
      mma<T>(acc[2 * dn + 1], af, bf[2], bf[3]);
    }
  }
}

// Writes a warp's 16 x D accumulator rows (scaled by rowScale[0] for row g, rowScale[1] for row g + 8) to
// global rows [row0, row0 + 16) below `valid`, staging through the warp's own 16 rows of smem tile `stage`.
template <class T, int D, int DS>
__device__ __forceinline__ void storeRows(const float (&acc)[D / 8][4], const float (&rowScale)[2],
                                          uint32_t stage, char* stageGeneric, int wr0, T* g, int64_t ld,
                                          int row0, int valid, int lane) {
  int gRow = lane >> 2, t = lane & 3;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int r = wr0 + gRow + half * 8;
      uint32_t off = swz<DS>(r, dt) + t * 4;
      *reinterpret_cast<uint32_t*>(stageGeneric + off) =
          pack2<T>(acc[dt][2 * half] * rowScale[half], acc[dt][2 * half + 1] * rowScale[half]);
    }
  }
  (void)stage;
  __syncwarp();
  constexpr int kChunks = D / 8;
  for (int i = lane; i < 16 * kChunks; i += 32) {
    int r = i / kChunks, c = i % kChunks;
    if (row0 + r < valid)
      *reinterpret_cast<uint4*>(g + int64_t(r) * ld + c * 8) =
          *reinterpret_cast<const uint4*>(stageGeneric + swz<DS>(wr0 + r, c));
  }
}

template <class T>
__device__ __forceinline__ const T* at(const Operand& op, int b, int h, int s) {
  return static_cast<const T*>(op.data) + b * op.b + h * op.h + int64_t(s) * op.s;
}

// Applies the causal / key-bound mask to a 16 x 64 score tile (rows: queries row0 + g, + 8; cols: keys col0 +
// 8 nt + 2t, +1).
__device__ __forceinline__ void maskTile(float (&s)[kBlockN / 8][4], int row0, int col0, int Sk, bool causal,
                                         int shift, int lane) {
#pragma unroll
  for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int row = row0 + (lane >> 2) + (e >> 1) * 8;
      int col = col0 + nt * 8 + 2 * (lane & 3) + (e & 1);
      if (col >= Sk || (causal && col > row + shift)) s[nt][e] = -INFINITY;
    }
  }
}

// NOTE [Biased fused attention]: the bias of a warp's 16 x 64 score tile in the accumulator layout (rows row0
// + g and + 8, keys col0 + 8 nt + 2t + {0, 1}), times log2(e); 0 past Sq or Sk (those scores are masked or
// never stored).
template <class T>
__device__ __forceinline__ void loadBiasTile(const Params& p, int b, int h, float (&bias)[kBlockN / 8][4],
                                             int row0, int col0, int lane) {
  const T* base = static_cast<const T*>(p.bias) + b * p.biasB + h * p.biasH;
#pragma unroll
  for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int row = row0 + (lane >> 2) + (e >> 1) * 8;
      int col = col0 + nt * 8 + 2 * (lane & 3) + (e & 1);
      bias[nt][e] = row < p.Sq && col < p.Sk ? toAcc(base[int64_t(row) * p.biasS + col]) * kLog2e : 0.0f;
    }
  }
}

// s <- scaleLog2 s + bias: a score tile as log2-domain logits (masked -inf stays -inf).
__device__ __forceinline__ void addBiasTile(const Params& p, float (&s)[kBlockN / 8][4],
                                            const float (&bias)[kBlockN / 8][4]) {
#pragma unroll
  for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = s[nt][e] * p.scaleLog2 + bias[nt][e];
}

// Adds a warp's 16 x 64 tile of dS (accumulator layout, as loadBiasTile) into p.dbias for batch b, head h:
// where Sk is even the two neighbouring keys of a thread go as one two-float reduction.
__device__ __forceinline__ void addBiasGradTile(const Params& p, int b, int h,
                                                const float (&ds)[kBlockN / 8][4], int row0, int col0,
                                                int lane) {
  float* base = p.dbias + b * p.dbiasB + int64_t(h) * p.Sq * p.Sk;
#pragma unroll
  for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int row = row0 + (lane >> 2) + half * 8;
      int col = col0 + nt * 8 + 2 * (lane & 3);
      if (row >= p.Sq || col >= p.Sk || (p.causal && col > row + p.shift)) continue;
      float* dst = base + int64_t(row) * p.Sk + col;
      float lo = ds[nt][2 * half], hi = ds[nt][2 * half + 1];
      bool hiValid = col + 1 < p.Sk && !(p.causal && col + 1 > row + p.shift);
#if __CUDA_ARCH__ >= 900
      if ((p.Sk & 1) == 0 && hiValid) {
        atomicAdd(reinterpret_cast<float2*>(dst), make_float2(lo, hi));
        continue;
      }
#endif
      atomicAdd(dst, lo);
      if (hiValid) atomicAdd(dst + 1, hi);
    }
  }
}

// ---- forward
// ---------------------------------------------------------------------------------------------------------

template <class T, int D, int WARPS, bool DROP, bool BIAS>
__global__ void __launch_bounds__(WARPS * 32) forwardKernel(Params p) {
  constexpr int BM = 16 * WARPS, BN = kBlockN, THREADS = WARPS * 32, DS = kSmemStride<D>;
  extern __shared__ __align__(128) char smem[];
  uint32_t sQ = smemAddr(smem), sK = sQ + BM * DS * 2, sV = sK + 2 * BN * DS * 2;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int mBlock = int(gridDim.x) - 1 - int(blockIdx.x);  // the longest causal rows first
  int bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  int m0 = mBlock * BM;
  int nEnd = p.causal ? min(p.Sk, m0 + BM + p.shift) : p.Sk;
  int nBlocks = (nEnd + BN - 1) / BN;

  const T* q = at<T>(p.q, b, h, m0);
  const T* k = at<T>(p.k, b, h, 0);
  const T* v = at<T>(p.v, b, h, 0);
  loadTile<BM, D, DS, THREADS>(sQ, q, p.q.s, p.Sq - m0);
  if (nBlocks > 0) loadTile<BN, D, DS, THREADS>(sK, k, p.k.s, p.Sk);
  cpAsyncCommit();
  if (nBlocks > 0) loadTile<BN, D, DS, THREADS>(sV, v, p.v.s, p.Sk);
  cpAsyncCommit();

  float o[D / 8][4] = {};
  float mRow[2] = {-INFINITY, -INFINITY}, lRow[2] = {0.0f, 0.0f};
  const float toLog2 = BIAS ? 1.0f : p.scaleLog2;  // a biased tile is already in the log2 domain
  uint32_t qf[D / 16][4];
  const int wr0 = warp * 16;

  for (int j = 0; j < nBlocks; ++j) {
    int buf = j & 1;
    uint32_t kT = sK + buf * BN * DS * 2, vT = sV + buf * BN * DS * 2;
    cpAsyncWait<1>();  // K_j (and Q) landed
    __syncthreads();
    if (j + 1 < nBlocks)
      loadTile<BN, D, DS, THREADS>(sK + (buf ^ 1) * BN * DS * 2, k + int64_t(j + 1) * BN * p.k.s, p.k.s,
                                   p.Sk - (j + 1) * BN);
    cpAsyncCommit();
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) ldsm4(qf[kk], addrA<DS>(sQ, wr0, kk, lane));
    }
    int col0 = j * BN;
    float bias[BN / 8][4];  // NOTE [Biased fused attention]: loaded before the GEMM, added after it
    if constexpr (BIAS) loadBiasTile<T>(p, b, h, bias, m0 + wr0, col0, lane);
    float s[BN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nn = 0; nn < BN / 16; ++nn) {
        uint32_t bf[4];
        ldsm4(bf, addrB<DS>(kT, nn * 16, kk, lane));
        mma<T>(s[2 * nn], qf[kk], bf[0], bf[1]);
        mma<T>(s[2 * nn + 1], qf[kk], bf[2], bf[3]);
      }
    }
    if constexpr (BIAS) addBiasTile(p, s, bias);
    if (col0 + BN > p.Sk || (p.causal && col0 + BN - 1 > m0 + p.shift))
      maskTile(s, m0 + wr0, col0, p.Sk, p.causal, p.shift, lane);
    uint32_t keepBoth = 0;  // DROP: bit 16 half + 2 nt + e set where element (nt, 2 half + e) survives
    if constexpr (DROP) keepBoth = dropRowTile<true>(p, bh, m0 + wr0, col0, lane);
      // Online softmax over this tile, rows g (half 0) and g + 8 (half 1).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * half], s[nt][2 * half + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      float mNew = fmaxf(mRow[half], mx * toLog2);
      float mUse = mNew == -INFINITY ? 0.0f : mNew;
      float alpha = exp2f(mRow[half] - mUse);
      mRow[half] = mNew;
      float sum = 0.0f;
      uint32_t keep = keepBoth >> (16 * half);  // DROP: bit nt * 2 + e set where (nt, 2 * half + e) survives
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float pv = exp2f(s[nt][2 * half + e] * toLog2 - mUse);
          sum += pv;  // the softmax's own sum: dropout comes after it
          if (DROP && !((keep >> (nt * 2 + e)) & 1u)) pv = 0.0f;
          s[nt][2 * half + e] = pv;
        }
      }
      lRow[half] = lRow[half] * alpha + sum;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][2 * half] *= alpha;
        o[dt][2 * half + 1] *= alpha;
      }
    }
    cpAsyncWait<1>();  // V_j landed
    __syncthreads();
    if (j + 1 < nBlocks)
      loadTile<BN, D, DS, THREADS>(sV + (buf ^ 1) * BN * DS * 2, v + int64_t(j + 1) * BN * p.v.s, p.v.s,
                                   p.Sk - (j + 1) * BN);
    cpAsyncCommit();
    gemmPB<T, D, DS, BN / 16>(o, s, vT, lane);
  }
  cpAsyncWait<0>();

  float inv[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = lRow[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[half] = l > 0.0f ? (DROP ? p.dropScale : 1.0f) / l : 0.0f;
    int row = m0 + wr0 + (lane >> 2) + half * 8;
    if ((lane & 3) == 0 && row < p.Sq)
      p.lse2[int64_t(bh) * p.Sq + row] = l > 0.0f ? mRow[half] + log2f(l) : INFINITY;
  }
  // Each warp reuses its own 16 rows of the Q tile as the staging area (its Q fragments are in registers).
  T* out = static_cast<T*>(p.out) + b * p.o.b + h * p.o.h + int64_t(m0 + wr0) * p.o.s;
  storeRows<T, D, DS>(o, inv, sQ, smem, wr0, out, p.o.s, m0 + wr0, p.Sq, lane);
}

// ---- backward
// --------------------------------------------------------------------------------------------------------

// delta[bh, i] = sum_d dO[i, d] * O[i, d]; one warp per row.
template <class T, int D>
__global__ void deltaKernel(Params p) {
  int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (row >= int64_t(p.B) * p.H * p.Sq) return;
  int i = int(row % p.Sq), bh = int(row / p.Sq), b = bh / p.H, h = bh % p.H;
  const T* o = at<T>(p.o, b, h, i);
  const T* d = at<T>(p.dout, b, h, i);
  float acc = 0.0f;
  for (int c = lane; c < D; c += 32) acc += toAcc(o[c]) * toAcc(d[c]);
  acc = warpSum(acc);
  if (lane == 0) p.delta[row] = acc;
}

// dK, dV for 16 * WARPS keys, looping over 64-query tiles.
template <class T, int D, int WARPS, bool DROP, bool BIAS>
__global__ void __launch_bounds__(WARPS * 32) backwardKvKernel(Params p) {
  constexpr int BN = 16 * WARPS, BM = kBlockN, THREADS = WARPS * 32, DS = kSmemStride<D>;
  extern __shared__ __align__(128) char smem[];
  uint32_t sK = smemAddr(smem), sV = sK + BN * DS * 2, sQ = sV + BN * DS * 2, sDo = sQ + 2 * BM * DS * 2;
  float* sLse = reinterpret_cast<float*>(smem + (2 * BN + 4 * BM) * DS * 2);
  float* sDelta = sLse + 2 * BM;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  int n0 = blockIdx.x * BN;
  // Query rows i with i + shift >= n0 can see one of these keys.
  int iStart = p.causal ? max(0, n0 - p.shift) / BM : 0;
  int iBlocks = (p.Sq + BM - 1) / BM;

  const T* q = at<T>(p.q, b, h, 0);
  const T* dout = at<T>(p.dout, b, h, 0);
  const float* lse = p.lse2 + int64_t(bh) * p.Sq;
  const float* delta = p.delta + int64_t(bh) * p.Sq;
  auto loadQTile = [&](int i, int buf) {
    loadTile<BM, D, DS, THREADS>(sQ + buf * BM * DS * 2, q + int64_t(i) * BM * p.q.s, p.q.s, p.Sq - i * BM);
    loadTile<BM, D, DS, THREADS>(sDo + buf * BM * DS * 2, dout + int64_t(i) * BM * p.dout.s, p.dout.s,
                                 p.Sq - i * BM);
    for (int r = threadIdx.x; r < BM; r += THREADS) {
      int row = i * BM + r;
      // Rows past the end get P = exp2(s - inf) = 0.
      sLse[buf * BM + r] = row < p.Sq ? lse[row] : INFINITY;
      sDelta[buf * BM + r] = row < p.Sq ? delta[row] : 0.0f;
    }
  };
  loadTile<BN, D, DS, THREADS>(sK, at<T>(p.k, b, h, n0), p.k.s, p.Sk - n0);
  loadTile<BN, D, DS, THREADS>(sV, at<T>(p.v, b, h, n0), p.v.s, p.Sk - n0);
  if (iStart < iBlocks) loadQTile(iStart, 0);
  cpAsyncCommit();

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  const int wr0 = warp * 16;
  const T* biasBH = BIAS ? static_cast<const T*>(p.bias) + b * p.biasB + h * p.biasH : nullptr;
  for (int i = iStart; i < iBlocks; ++i) {
    int buf = (i - iStart) & 1;
    uint32_t qT = sQ + buf * BM * DS * 2, doT = sDo + buf * BM * DS * 2;
    const float* lseT = sLse + buf * BM;
    const float* deltaT = sDelta + buf * BM;
    cpAsyncWait<0>();
    __syncthreads();
    if (i + 1 < iBlocks) loadQTile(i + 1, buf ^ 1);
    cpAsyncCommit();

    // S^T = K Q^T (rows: this warp's keys; cols: the tile's queries) -> P^T.
    float s[BM / 8][4] = {};
    gemmABt<T, D, DS, BM / 8>(s, sK, wr0, qT, lane);
    int key0 = n0 + wr0 + (lane >> 2);
    uint32_t keep = 0;  // DROP: bit nt * 4 + e set where s[nt][e] survives dropout
    static_assert(!DROP || BM / 8 * 4 <= 32, "the keep bits fit one word");
    if constexpr (DROP) keep = dropColTile(p, bh, n0 + wr0, i * BM, lane);
#pragma unroll
    for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int key = key0 + (e >> 1) * 8;
        int c = nt * 8 + 2 * (lane & 3) + (e & 1);
        int query = i * BM + c;
        bool masked = p.causal && key > query + p.shift;
        float logit = s[nt][e] * p.scaleLog2;
        // NOTE [Biased fused attention], transposed (element (key, query)): read here rather than ahead of
        // the GEMM, as the dK/dV accumulators leave no registers for a tile of it at head dim 128.
        if (BIAS && key < p.Sk && query < p.Sq)
          logit += toAcc(biasBH[int64_t(query) * p.biasS + key]) * kLog2e;
        s[nt][e] = masked ? 0.0f : exp2f(logit - lseT[c]);
      }
    }
    // dV += (P z)^T dO, z = the dropout mask times 1 / (1 - p) (the scale is applied once at the end).
    gemmPB<T, D, DS, BM / 16, DROP>(dv, s, doT, lane, keep);
    // dP^T = V dO^T -> dS^T = P^T (z dP^T - delta).
    float dp[BM / 8][4] = {};
    gemmABt<T, D, DS, BM / 8>(dp, sV, wr0, doT, lane);
#pragma unroll
    for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int c = nt * 8 + 2 * (lane & 3) + (e & 1);
        float z = !DROP ? 1.0f : ((keep >> (nt * 4 + e)) & 1u) ? p.dropScale : 0.0f;
        dp[nt][e] = s[nt][e] * (z * dp[nt][e] - deltaT[c]);
      }
    }
    // dK += dS^T Q (the softmax scale is applied once at the end).
    gemmPB<T, D, DS, BM / 16>(dk, dp, qT, lane);
  }
  cpAsyncWait<0>();
  __syncthreads();  // every warp is done with the Q/dO tiles; K and V rows are per warp anyway
  float one[2] = {DROP ? p.dropScale : 1.0f, DROP ? p.dropScale : 1.0f}, sc[2] = {p.scale, p.scale};
  T* dkOut = static_cast<T*>(p.dk) + b * p.dkS.b + h * p.dkS.h + int64_t(n0 + wr0) * p.dkS.s;
  T* dvOut = static_cast<T*>(p.dv) + b * p.dvS.b + h * p.dvS.h + int64_t(n0 + wr0) * p.dvS.s;
  storeRows<T, D, DS>(dk, sc, sK, smem, wr0, dkOut, p.dkS.s, n0 + wr0, p.Sk, lane);
  storeRows<T, D, DS>(dv, one, sV, smem + BN * DS * 2, wr0, dvOut, p.dvS.s, n0 + wr0, p.Sk, lane);
}

// dQ for 16 * WARPS queries, looping over 64-key tiles.
template <class T, int D, int WARPS, bool DROP, bool BIAS>
__global__ void __launch_bounds__(WARPS * 32) backwardQKernel(Params p) {
  constexpr int BM = 16 * WARPS, BN = kBlockN, THREADS = WARPS * 32, DS = kSmemStride<D>;
  extern __shared__ __align__(128) char smem[];
  uint32_t sQ = smemAddr(smem), sDo = sQ + BM * DS * 2, sK = sDo + BM * DS * 2, sV = sK + 2 * BN * DS * 2;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int mBlock = int(gridDim.x) - 1 - int(blockIdx.x);
  int bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  int m0 = mBlock * BM;
  int nEnd = p.causal ? min(p.Sk, m0 + BM + p.shift) : p.Sk;
  int nBlocks = (nEnd + BN - 1) / BN;
  const int wr0 = warp * 16;

  const T* k = at<T>(p.k, b, h, 0);
  const T* v = at<T>(p.v, b, h, 0);
  loadTile<BM, D, DS, THREADS>(sQ, at<T>(p.q, b, h, m0), p.q.s, p.Sq - m0);
  loadTile<BM, D, DS, THREADS>(sDo, at<T>(p.dout, b, h, m0), p.dout.s, p.Sq - m0);
  auto loadKv = [&](int j, int buf) {
    loadTile<BN, D, DS, THREADS>(sK + buf * BN * DS * 2, k + int64_t(j) * BN * p.k.s, p.k.s, p.Sk - j * BN);
    loadTile<BN, D, DS, THREADS>(sV + buf * BN * DS * 2, v + int64_t(j) * BN * p.v.s, p.v.s, p.Sk - j * BN);
  };
  if (nBlocks > 0) loadKv(0, 0);
  cpAsyncCommit();

  float lseRow[2], deltaRow[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    int row = m0 + wr0 + (lane >> 2) + half * 8;
    bool ok = row < p.Sq;
    lseRow[half] = ok ? p.lse2[int64_t(bh) * p.Sq + row] : INFINITY;
    deltaRow[half] = ok ? p.delta[int64_t(bh) * p.Sq + row] : 0.0f;
  }
  float dq[D / 8][4] = {};
  const float toLog2 = BIAS ? 1.0f : p.scaleLog2;  // a biased tile is already in the log2 domain
  for (int j = 0; j < nBlocks; ++j) {
    int buf = j & 1;
    uint32_t kT = sK + buf * BN * DS * 2, vT = sV + buf * BN * DS * 2;
    cpAsyncWait<0>();
    __syncthreads();
    if (j + 1 < nBlocks) loadKv(j + 1, buf ^ 1);
    cpAsyncCommit();

    int col0 = j * BN;
    float bias[BN / 8][4];  // NOTE [Biased fused attention]
    if constexpr (BIAS) loadBiasTile<T>(p, b, h, bias, m0 + wr0, col0, lane);
    float s[BN / 8][4] = {};
    gemmABt<T, D, DS, BN / 8>(s, sQ, wr0, kT, lane);
    if constexpr (BIAS) addBiasTile(p, s, bias);
    if (col0 + BN > p.Sk || (p.causal && col0 + BN - 1 > m0 + p.shift))
      maskTile(s, m0 + wr0, col0, p.Sk, p.causal, p.shift, lane);
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = exp2f(s[nt][e] * toLog2 - lseRow[e >> 1]);
    float dp[BN / 8][4] = {};
    gemmABt<T, D, DS, BN / 8>(dp, sDo, wr0, vT, lane);
    uint32_t keep = 0;  // DROP: bit nt * 4 + e set where s[nt][e] survives dropout
    if constexpr (DROP) keep = dropRowTile<false>(p, bh, m0 + wr0, col0, lane);
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // DROP: the dropout mask times 1 / (1 - p).
        float z = !DROP ? 1.0f : ((keep >> (nt * 4 + e)) & 1u) ? p.dropScale : 0.0f;
        dp[nt][e] = s[nt][e] * (z * dp[nt][e] - deltaRow[e >> 1]);
      }
    if (BIAS && p.dbias) addBiasGradTile(p, b, h, dp, m0 + wr0, col0, lane);
    gemmPB<T, D, DS, BN / 16>(dq, dp, kT, lane);
  }
  cpAsyncWait<0>();
  float sc[2] = {p.scale, p.scale};
  T* dqOut = static_cast<T*>(p.dq) + b * p.dqS.b + h * p.dqS.h + int64_t(m0 + wr0) * p.dqS.s;
  storeRows<T, D, DS>(dq, sc, sQ, smem, wr0, dqOut, p.dqS.s, m0 + wr0, p.Sq, lane);
}

}  // namespace strata::kernels::flash
