// CPU AdamW: one fused pass over every tensor set. Each element reads the fp32 master, m, v and the gradient
// and writes the master, m, v and the parameter's copy (bf16, f16 or f32) in the same loop iteration, so the
// state streams through memory once: 16 bytes read and 12 + 2 written per parameter with a 16-bit copy
// (12 read and 8 + 2 written with m and v in bf16, optimizer.moments_dtype).
// The copy is written with non-temporal stores by default: nothing reads it back on the CPU soon (it is
// copied to the device), and a plain store would first read each of its lines from memory (2 more bytes per
// parameter). NOTE [CPU AdamW stores]: the choices, master, m and v included.
//
// Paths: AVX-512, AVX2 and scalar, chosen at run time (NOTE [CPU AdamW paths] in CpuAdamW.h). The vector
// paths are functions with a target attribute, so the library builds for baseline x86-64 and only calls
// them after the CPU says it has the instructions.
//
// Threads: the sets are one index space (set after set); thread t of T takes the t-th of T equal ranges,
// cut at multiples of 64 elements, the same ranges every step, and walks it set by set: a contiguous stream
// per thread, no per-step allocation. NOTE [CPU AdamW split]: with STRATA_CPU_SPLIT=steal a thread that
// finishes its range takes blocks from the others' instead of waiting for them.
#include "CpuAdamW.h"

#if defined(__x86_64__) || defined(__i386__)
#define STRATA_CPU_X86 1
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*, which -Wmaybe-uninitialized reports inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#else
#define STRATA_CPU_X86 0  // other architectures take the scalar path, which their compilers may vectorise
#endif
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "CpuKernels.h"
#include "strata/core/Device.h"

namespace strata::ops::cpu {
namespace {

enum class CopyKind { None, F32, BF16, F16 };
enum class GradKind { F32, BF16, F16 };  // 16-bit gradient buffers are widened as they are read
// m and v (both of one kind): fp32, or bf16 (optimizer.moments_dtype), widened as they are read and the
// new values rounded to nearest even as they are written (NOTE [AdamW bits] in strata/ops/Ops.h).
enum class MomentKind { F32, BF16 };

// One set as raw pointers (offsets applied) and its decay factor.
struct AdamSpan {
  float* param;
  const void* grad;
  void* m;  // fp32 or bf16 (momentKind)
  void* v;
  void* copy;
  CopyKind kind;
  GradKind gradKind;
  MomentKind momentKind;
  float decay;  // 1 - lr * weight decay
};

// The bytes of one element of m (and of v).
inline int64_t momentBytes(const AdamSpan& s) {
  return s.momentKind == MomentKind::BF16 ? 2 : 4;
}

// Moment element i in fp32 (exact), and the new value stored (bf16: rounded as BFloat16(float) rounds).
template <MomentKind kMoments>
inline float momentAt(const void* moments, int64_t i) {
  if constexpr (kMoments == MomentKind::BF16)
    return bitsFloat(uint32_t(static_cast<const uint16_t*>(moments)[i]) << 16);
  return static_cast<const float*>(moments)[i];
}
template <MomentKind kMoments>
inline void setMoment(void* moments, int64_t i, float x) {
  if constexpr (kMoments == MomentKind::BF16)
    static_cast<uint16_t*>(moments)[i] = BFloat16::fromFloat(x);
  else
    static_cast<float*>(moments)[i] = x;
}

// Gradient element i in fp32 (exact for every kind). A half NaN comes back quiet, as the vector paths'
// hardware conversion gives it.
inline float gradAt(const AdamSpan& s, int64_t i) {
  switch (s.gradKind) {
    case GradKind::BF16:
      return bitsFloat(uint32_t(static_cast<const uint16_t*>(s.grad)[i]) << 16);
    case GradKind::F16: {
      uint16_t h = static_cast<const uint16_t*>(s.grad)[i];
      bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
      return Half::toFloat(nan ? uint16_t(h | 0x200u) : h);
    }
    case GradKind::F32:
      break;
  }
  return static_cast<const float*>(s.grad)[i];
}

// The step's constants, shared by every set.
struct AdamConsts {
  // -lr rather than a negation of the step: x86 negates a NaN's sign but fmsub keeps it, so a path that
  // negated would differ from one that used fmsub when the step is NaN.
  float scale, negLr, beta1, oneMinusBeta1, beta2, oneMinusBeta2, eps, c1,
      c2;  // c1, c2: 1 / bias corrections
  // How the vector paths store and prefetch (NOTE [CPU AdamW stores]); the scalar path ignores both.
  CpuStores stores;
  int64_t prefetchElems;
};

// ---- scalar: the reference order of operations, and the vector paths' tails

template <MomentKind kMoments>
void scalarRangeOf(const AdamSpan& s, const AdamConsts& k, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    float g = gradAt(s, i) * k.scale;
    float m = std::fma(k.beta1, momentAt<kMoments>(s.m, i), k.oneMinusBeta1 * g);
    float v = std::fma(k.beta2, momentAt<kMoments>(s.v, i), (k.oneMinusBeta2 * g) * g);
    float update = (k.negLr * (m * k.c1)) / (std::sqrt(v * k.c2) + k.eps);
    float p = std::fma(s.param[i], s.decay, update);
    setMoment<kMoments>(s.m, i, m);
    setMoment<kMoments>(s.v, i, v);
    s.param[i] = p;
    switch (s.kind) {
      case CopyKind::F32:
        static_cast<float*>(s.copy)[i] = p;
        break;
      case CopyKind::BF16:
        static_cast<uint16_t*>(s.copy)[i] = BFloat16::fromFloat(p);
        break;
      case CopyKind::F16:
        static_cast<uint16_t*>(s.copy)[i] = Half::fromFloat(p);
        break;
      case CopyKind::None:
        break;
    }
  }
}

#if STRATA_CPU_X86

// ---- the vector paths' common frame

// NOTE [CPU AdamW stores]
// The vector paths walk 32 elements an iteration, so that every stream's stores fill whole 64-byte lines: two
// lines of each fp32 stream, one of a 16-bit copy. Before the loop, scalar code takes the elements up to
// the first line boundary of the copy (16-bit) or else of the master. How the loop stores (CpuStores):
//  - plain: ordinary stores everywhere. A store to a line the core does not hold first reads the line
//    (read-for-ownership): the copy, which nothing reads, costs 2 bytes read per parameter on top.
//  - copy: the copy (16-bit or fp32) with non-temporal stores, a whole line per store on AVX-512 (two back
//    to back on AVX2): no read-for-ownership, and nothing of the copy left in the caches. The copy goes to
//    the device; nothing on the CPU reads it back.
//  - stream: the master, m and v too. Their lines were just read, so there is no read-for-ownership to
//    save, but their write-back goes straight to memory instead of through the caches (dirty lines evicted
//    from L2 to a non-inclusive L3 and then to memory on Intel servers), and nothing reads them before the
//    next step. It needs master, m and v on the same 64-byte phase as the anchor; where they are not, they
//    fall back to plain stores.
// Every range that stored non-temporally ends in an sfence, so its stores are visible before the thread
// reaches the barrier that ends the update, and so before the caller hands the staging to the device
// (copyAsync after ops::adamw returns). The stores do not change a bit of the result.
// STRATA_CPU_PREFETCH=N (elements, default 512) prefetches N elements ahead of the loads in software: on the
// H200's host, 512 ran the update with the bf16 copy at 4.26 Gparam/s against 4.00 without (16 threads,
// BENCHMARKS.md).
constexpr int64_t kDefaultPrefetch = 512;

inline bool lineAligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 64 == 0;
}

// The end of the scalar head: the first element from `begin` at which the anchor (the 16-bit copy, else
// the master) starts a 64-byte line, or `end`.
int64_t headEnd(const AdamSpan& s, int64_t begin, int64_t end) {
  bool halfCopy = s.kind == CopyKind::BF16 || s.kind == CopyKind::F16;
  uintptr_t at = halfCopy ? reinterpret_cast<uintptr_t>(static_cast<uint16_t*>(s.copy) + begin)
                          : reinterpret_cast<uintptr_t>(s.param + begin);
  return std::min(end, begin + int64_t((64 - at % 64) % 64 / (halfCopy ? 2 : 4)));
}

// Which streams the loop from element i stores non-temporally (NOTE [CPU AdamW stores]): only those that
// start a 64-byte line there, which non-temporal vector stores require.
struct StreamChoice {
  bool state, copy;
};
StreamChoice streamChoice(const AdamSpan& s, const AdamConsts& k, int64_t i) {
  bool copy = k.stores != CpuStores::Plain && s.kind != CopyKind::None &&
              lineAligned(static_cast<char*>(s.copy) + i * (s.kind == CopyKind::F32 ? 4 : 2));
  bool state = k.stores == CpuStores::Stream && lineAligned(s.param + i) &&
               lineAligned(static_cast<char*>(s.m) + i * momentBytes(s)) &&
               lineAligned(static_cast<char*>(s.v) + i * momentBytes(s));
  return {state, copy};
}

// Software prefetches for the four read streams, `ahead` elements past i (two fp32 lines each; a 16-bit
// gradient's or moment's one). Prefetches do not fault, so past the end is harmless; the addresses are
// computed as integers because a pointer past the end is not one C++ lets us form. Always inlined: GCC finds
// that a function holding only prefetches has no effect and drops its calls.
[[gnu::always_inline]] inline void prefetchLine(const void* base, int64_t byteOffset) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(base) + uintptr_t(byteOffset)),
               _MM_HINT_T0);
}

template <GradKind kGrad, MomentKind kMoments>
[[gnu::always_inline]] inline void prefetchAt(const AdamSpan& s, int64_t i, int64_t ahead) {
  int64_t at = (i + ahead) * 4;
  prefetchLine(s.param, at);
  prefetchLine(s.param, at + 64);
  for (const void* stream : {static_cast<const void*>(s.m), static_cast<const void*>(s.v)}) {
    if constexpr (kMoments == MomentKind::F32) {
      prefetchLine(stream, at);
      prefetchLine(stream, at + 64);
    } else {
      prefetchLine(stream, at / 2);
    }
  }
  if constexpr (kGrad == GradKind::F32) {
    prefetchLine(s.grad, at);
    prefetchLine(s.grad, at + 64);
  } else {
    prefetchLine(s.grad, at / 2);
  }
}

// The vector range: the scalar head, the 32-element loop with the stores chosen for this span, an sfence
// after non-temporal stores, the scalar tail. Loop<kStreamState, kStreamCopy> returns where it stopped.
template <template <bool, bool> class Loop, MomentKind kMoments>
void vectorRange(const AdamSpan& s, const AdamConsts& k, int64_t begin, int64_t end) {
  int64_t i = headEnd(s, begin, end);
  scalarRangeOf<kMoments>(s, k, begin, i);
  StreamChoice choice = streamChoice(s, k, i);
  if (choice.state && choice.copy)
    i = Loop<true, true>::run(s, k, i, end);
  else if (choice.state)
    i = Loop<true, false>::run(s, k, i, end);
  else if (choice.copy)
    i = Loop<false, true>::run(s, k, i, end);
  else
    i = Loop<false, false>::run(s, k, i, end);
  if (choice.state || choice.copy) _mm_sfence();
  scalarRangeOf<kMoments>(s, k, i, end);
}

// ---- AVX-512 (avx512f for the arithmetic; bw and vl come with every AVX-512 server CPU since Skylake-SP)

#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))

// BFloat16::fromFloat on 16 lanes: round to nearest even on the bits, quiet NaNs as (bits >> 16) | 0x40.
STRATA_AVX512 inline __m256i bf16Of(__m512 p) {
  __m512i u = _mm512_castps_si512(p);
  __m512i high = _mm512_srli_epi32(u, 16);
  __m512i rounding =
      _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, rounding), 16);
  __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  __mmask16 nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// Half::fromFloat on 16 lanes: the hardware conversion rounds to nearest even as Half does (overflow to inf,
// subnormals included); a NaN becomes sign | 0x7e00, which is what converting the canonical quiet NaN with
// the same sign gives.
STRATA_AVX512 inline __m256i halfOf(__m512 p) {
  __m512i sign = _mm512_and_si512(_mm512_castps_si512(p), _mm512_set1_epi32(int(0x80000000u)));
  __m512 quiet = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x7fc00000)));
  __mmask16 nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  return _mm512_cvtps_ph(_mm512_mask_blend_ps(nan, p, quiet), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// 16 gradients from element i, widened to fp32 (exactly: a bf16 is the high half of its float).
template <GradKind kGrad>
STRATA_AVX512 inline __m512 gradsAt(const void* grad, int64_t i) {
  if constexpr (kGrad == GradKind::F32) return _mm512_loadu_ps(static_cast<const float*>(grad) + i);
  __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(grad) + i));
  if constexpr (kGrad == GradKind::BF16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  return _mm512_cvtph_ps(bits);
}

template <bool kStream>
STRATA_AVX512 inline void put(float* at, __m512 x) {
  if constexpr (kStream)
    _mm512_stream_ps(at, x);
  else
    _mm512_storeu_ps(at, x);
}

// 16 moments from element i, widened to fp32 (exactly); and 16 new ones stored, bf16 rounded as bf16Of does
// (a stored line of bf16 moments is half a line: 32 bytes, aligned where the loop streams).
template <MomentKind kMoments>
STRATA_AVX512 inline __m512 momentsAt(const void* moments, int64_t i) {
  if constexpr (kMoments == MomentKind::F32) return _mm512_loadu_ps(static_cast<const float*>(moments) + i);
  __m256i bits =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(moments) + i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

template <MomentKind kMoments, bool kStream>
STRATA_AVX512 inline void putMoments(void* moments, int64_t i, __m512 x) {
  if constexpr (kMoments == MomentKind::F32) {
    put<kStream>(static_cast<float*>(moments) + i, x);
  } else {
    auto* at = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(moments) + i);
    if constexpr (kStream)
      _mm256_stream_si256(at, bf16Of(x));
    else
      _mm256_storeu_si256(at, bf16Of(x));
  }
}

template <CopyKind kKind, GradKind kGrad, MomentKind kMoments>
struct Avx512 {
  template <bool kStreamState, bool kStreamCopy>
  struct Loop {
    STRATA_AVX512 static int64_t run(const AdamSpan& s, const AdamConsts& k, int64_t i, int64_t end) {
      const __m512 scale = _mm512_set1_ps(k.scale), negLr = _mm512_set1_ps(k.negLr);
      const __m512 eps = _mm512_set1_ps(k.eps), decay = _mm512_set1_ps(s.decay);
      const __m512 beta1 = _mm512_set1_ps(k.beta1), oneMinusBeta1 = _mm512_set1_ps(k.oneMinusBeta1);
      const __m512 beta2 = _mm512_set1_ps(k.beta2), oneMinusBeta2 = _mm512_set1_ps(k.oneMinusBeta2);
      const __m512 c1 = _mm512_set1_ps(k.c1), c2 = _mm512_set1_ps(k.c2);
      // Locals: the stores below could otherwise alias `s` and make the compiler reload every pointer.
      float* param = s.param;
      void *firstMoment = s.m, *secondMoment = s.v;
      const void* grad = s.grad;
      void* copy = s.copy;
      const int64_t ahead = k.prefetchElems;
      for (; i + 32 <= end; i += 32) {
        if (ahead > 0) prefetchAt<kGrad, kMoments>(s, i, ahead);
        __m512 p[2];
        for (int h = 0; h < 2; ++h) {
          int64_t j = i + 16 * h;
          __m512 g = _mm512_mul_ps(gradsAt<kGrad>(grad, j), scale);
          __m512 m =
              _mm512_fmadd_ps(beta1, momentsAt<kMoments>(firstMoment, j), _mm512_mul_ps(oneMinusBeta1, g));
          __m512 v = _mm512_fmadd_ps(beta2, momentsAt<kMoments>(secondMoment, j),
                                     _mm512_mul_ps(_mm512_mul_ps(oneMinusBeta2, g), g));
          __m512 update = _mm512_div_ps(_mm512_mul_ps(negLr, _mm512_mul_ps(m, c1)),
                                        _mm512_add_ps(_mm512_sqrt_ps(_mm512_mul_ps(v, c2)), eps));
          p[h] = _mm512_fmadd_ps(_mm512_loadu_ps(param + j), decay, update);
          putMoments<kMoments, kStreamState>(firstMoment, j, m);
          putMoments<kMoments, kStreamState>(secondMoment, j, v);
          put<kStreamState>(param + j, p[h]);
        }
        if constexpr (kKind == CopyKind::F32) {
          put<kStreamCopy>(static_cast<float*>(copy) + i, p[0]);
          put<kStreamCopy>(static_cast<float*>(copy) + i + 16, p[1]);
        }
        if constexpr (kKind == CopyKind::BF16 || kKind == CopyKind::F16) {
          __m512i line = kKind == CopyKind::BF16
                             ? _mm512_inserti64x4(_mm512_castsi256_si512(bf16Of(p[0])), bf16Of(p[1]), 1)
                             : _mm512_inserti64x4(_mm512_castsi256_si512(halfOf(p[0])), halfOf(p[1]), 1);
          auto* at = reinterpret_cast<__m512i*>(static_cast<uint16_t*>(copy) + i);
          if constexpr (kStreamCopy)
            _mm512_stream_si512(at, line);
          else
            _mm512_storeu_si512(at, line);
        }
      }
      return i;
    }
  };
};

template <CopyKind kKind, GradKind kGrad, MomentKind kMoments>
void avx512Range(const AdamSpan& s, const AdamConsts& k, int64_t begin, int64_t end) {
  vectorRange<Avx512<kKind, kGrad, kMoments>::template Loop, kMoments>(s, k, begin, end);
}

// ---- AVX2

STRATA_AVX2 inline __m128i bf16Of(__m256 p) {
  __m256i u = _mm256_castps_si256(p);
  __m256i high = _mm256_srli_epi32(u, 16);
  __m256i rounding =
      _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, rounding), 16);
  __m256i quiet = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  __m256 nan = _mm256_cmp_ps(p, p, _CMP_UNORD_Q);
  __m256i bits =
      _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan));
  // Every lane is below 2^16, so the saturating pack keeps it.
  return _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
}

STRATA_AVX2 inline __m128i halfOf(__m256 p) {
  __m256i sign = _mm256_and_si256(_mm256_castps_si256(p), _mm256_set1_epi32(int(0x80000000u)));
  __m256 quiet = _mm256_castsi256_ps(_mm256_or_si256(sign, _mm256_set1_epi32(0x7fc00000)));
  __m256 nan = _mm256_cmp_ps(p, p, _CMP_UNORD_Q);
  return _mm256_cvtps_ph(_mm256_blendv_ps(p, quiet, nan), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

template <GradKind kGrad>
STRATA_AVX2 inline __m256 gradsAt8(const void* grad, int64_t i) {
  if constexpr (kGrad == GradKind::F32) return _mm256_loadu_ps(static_cast<const float*>(grad) + i);
  __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(grad) + i));
  if constexpr (kGrad == GradKind::BF16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
  return _mm256_cvtph_ps(bits);
}

template <bool kStream>
STRATA_AVX2 inline void put(float* at, __m256 x) {
  if constexpr (kStream)
    _mm256_stream_ps(at, x);
  else
    _mm256_storeu_ps(at, x);
}

template <bool kStream>
STRATA_AVX2 inline void put(__m256i* at, __m256i x) {
  if constexpr (kStream)
    _mm256_stream_si256(at, x);
  else
    _mm256_storeu_si256(at, x);
}

template <MomentKind kMoments>
STRATA_AVX2 inline __m256 momentsAt8(const void* moments, int64_t i) {
  if constexpr (kMoments == MomentKind::F32) return _mm256_loadu_ps(static_cast<const float*>(moments) + i);
  __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(moments) + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

template <MomentKind kMoments, bool kStream>
STRATA_AVX2 inline void putMoments8(void* moments, int64_t i, __m256 x) {
  if constexpr (kMoments == MomentKind::F32) {
    put<kStream>(static_cast<float*>(moments) + i, x);
  } else {
    auto* at = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(moments) + i);
    if constexpr (kStream)
      _mm_stream_si128(at, bf16Of(x));
    else
      _mm_storeu_si128(at, bf16Of(x));
  }
}

template <CopyKind kKind, GradKind kGrad, MomentKind kMoments>
struct Avx2 {
  template <bool kStreamState, bool kStreamCopy>
  struct Loop {
    STRATA_AVX2 static int64_t run(const AdamSpan& s, const AdamConsts& k, int64_t i, int64_t end) {
      const __m256 scale = _mm256_set1_ps(k.scale), negLr = _mm256_set1_ps(k.negLr);
      const __m256 eps = _mm256_set1_ps(k.eps), decay = _mm256_set1_ps(s.decay);
      const __m256 beta1 = _mm256_set1_ps(k.beta1), oneMinusBeta1 = _mm256_set1_ps(k.oneMinusBeta1);
      const __m256 beta2 = _mm256_set1_ps(k.beta2), oneMinusBeta2 = _mm256_set1_ps(k.oneMinusBeta2);
      const __m256 c1 = _mm256_set1_ps(k.c1), c2 = _mm256_set1_ps(k.c2);
      float* param = s.param;
      void *firstMoment = s.m, *secondMoment = s.v;
      const void* grad = s.grad;
      void* copy = s.copy;
      const int64_t ahead = k.prefetchElems;
      for (; i + 32 <= end; i += 32) {
        if (ahead > 0) prefetchAt<kGrad, kMoments>(s, i, ahead);
        __m256 p[4];
        for (int q = 0; q < 4; ++q) {
          int64_t j = i + 8 * q;
          __m256 g = _mm256_mul_ps(gradsAt8<kGrad>(grad, j), scale);
          __m256 m =
              _mm256_fmadd_ps(beta1, momentsAt8<kMoments>(firstMoment, j), _mm256_mul_ps(oneMinusBeta1, g));
          __m256 v = _mm256_fmadd_ps(beta2, momentsAt8<kMoments>(secondMoment, j),
                                     _mm256_mul_ps(_mm256_mul_ps(oneMinusBeta2, g), g));
          __m256 update = _mm256_div_ps(_mm256_mul_ps(negLr, _mm256_mul_ps(m, c1)),
                                        _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(v, c2)), eps));
          p[q] = _mm256_fmadd_ps(_mm256_loadu_ps(param + j), decay, update);
          putMoments8<kMoments, kStreamState>(firstMoment, j, m);
          putMoments8<kMoments, kStreamState>(secondMoment, j, v);
          put<kStreamState>(param + j, p[q]);
        }
        if constexpr (kKind == CopyKind::F32)
          for (int q = 0; q < 4; ++q) put<kStreamCopy>(static_cast<float*>(copy) + i + 8 * q, p[q]);
        if constexpr (kKind == CopyKind::BF16 || kKind == CopyKind::F16) {
          // One 64-byte line in two stores, back to back (the write-combining buffer sees a whole line).
          auto* at = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(copy) + i);
          for (int half = 0; half < 2; ++half) {
            __m256 lo = p[2 * half], hi = p[2 * half + 1];
            __m256i bits = kKind == CopyKind::BF16 ? _mm256_set_m128i(bf16Of(hi), bf16Of(lo))
                                                   : _mm256_set_m128i(halfOf(hi), halfOf(lo));
            put<kStreamCopy>(at + half, bits);
          }
        }
      }
      return i;
    }
  };
};

template <CopyKind kKind, GradKind kGrad, MomentKind kMoments>
void avx2Range(const AdamSpan& s, const AdamConsts& k, int64_t begin, int64_t end) {
  vectorRange<Avx2<kKind, kGrad, kMoments>::template Loop, kMoments>(s, k, begin, end);
}

#endif  // STRATA_CPU_X86

using RangeFn = void (*)(const AdamSpan&, const AdamConsts&, int64_t, int64_t);

template <CopyKind kKind, GradKind kGrad, MomentKind kMoments>
RangeFn pathFor(CpuIsa isa) {
#if STRATA_CPU_X86
  if (isa == CpuIsa::Avx512) return &avx512Range<kKind, kGrad, kMoments>;
  if (isa == CpuIsa::Avx2) return &avx2Range<kKind, kGrad, kMoments>;
#endif
  return &scalarRangeOf<kMoments>;
}

template <GradKind kGrad, MomentKind kMoments>
RangeFn rangeFnFor(CpuIsa isa, CopyKind kind) {
  switch (kind) {
    case CopyKind::F32:
      return pathFor<CopyKind::F32, kGrad, kMoments>(isa);
    case CopyKind::BF16:
      return pathFor<CopyKind::BF16, kGrad, kMoments>(isa);
    case CopyKind::F16:
      return pathFor<CopyKind::F16, kGrad, kMoments>(isa);
    case CopyKind::None:
      break;
  }
  return pathFor<CopyKind::None, kGrad, kMoments>(isa);
}

template <MomentKind kMoments>
RangeFn rangeFnOf(CpuIsa isa, CopyKind kind, GradKind grad) {
  switch (grad) {
    case GradKind::BF16:
      return rangeFnFor<GradKind::BF16, kMoments>(isa, kind);
    case GradKind::F16:
      return rangeFnFor<GradKind::F16, kMoments>(isa, kind);
    case GradKind::F32:
      break;
  }
  return rangeFnFor<GradKind::F32, kMoments>(isa, kind);
}

RangeFn rangeFn(CpuIsa isa, const AdamSpan& s) {
  return s.momentKind == MomentKind::BF16 ? rangeFnOf<MomentKind::BF16>(isa, s.kind, s.gradKind)
                                          : rangeFnOf<MomentKind::F32>(isa, s.kind, s.gradKind);
}

AdamSpan spanOf(const AdamWTensors& s, const AdamWHyper& h) {
  CopyKind kind = !s.copy.defined()               ? CopyKind::None
                  : s.copy.dtype() == DType::BF16 ? CopyKind::BF16
                  : s.copy.dtype() == DType::F16  ? CopyKind::F16
                                                  : CopyKind::F32;
  GradKind grad = s.grad.dtype() == DType::BF16  ? GradKind::BF16
                  : s.grad.dtype() == DType::F16 ? GradKind::F16
                                                 : GradKind::F32;
  return AdamSpan{static_cast<float*>(s.param.data()),
                  s.grad.data(),
                  s.m.data(),
                  s.v.data(),
                  s.copy.defined() ? s.copy.data() : nullptr,
                  kind,
                  grad,
                  s.m.dtype() == DType::BF16 ? MomentKind::BF16 : MomentKind::F32,
                  adamwDecayFactor(h.lr, s.weightDecay)};
}

// Updates elements [begin, end) of the sets' joint index space.
void updateRange(CpuIsa isa, const std::vector<AdamWTensors>& sets, const AdamWHyper& h, const AdamConsts& k,
                 int64_t begin, int64_t end) {
  int64_t offset = 0;
  for (const auto& s : sets) {
    int64_t n = s.param.numel(), lo = std::max(begin, offset), hi = std::min(end, offset + n);
    if (lo < hi) {
      AdamSpan span = spanOf(s, h);
      rangeFn(isa, span)(span, k, lo - offset, hi - offset);
    }
    offset += n;
    if (offset >= end) break;
  }
}

// ---- thread placement

// NOTE [CPU AdamW thread pinning]
// The update is bound by memory bandwidth, and a thread that the scheduler moves mid-step loses its
// prefetch streams and, on a multi-socket host, its local memory. So the kernel pins OpenMP's worker threads
// itself, one per physical core first (then second hyperthreads), within the CPUs the process may use: the
// placement OMP_PROC_BIND=close with OMP_PLACES=cores would give. Explicit affinity rather than a proc_bind
// clause because libgomp ignores proc_bind without OMP_PLACES in the environment, which the trainer does not
// control. It stands aside when:
//  - OMP_PROC_BIND / OMP_PLACES bind the threads already (the user's placement wins);
//  - STRATA_CPU_PIN=0;
//  - the threads of all ranks on this node (OMPI/MPICH/torchrun local size) outnumber the usable CPUs:
//    pinning then stacks threads onto the same CPUs, which is worse than letting the scheduler spread them.
// Ranks on one node take disjoint slices (local rank x threads onward). The calling thread (thread 0) is
// the trainer's thread, which drives streams and I/O between optimizer steps, so it keeps its placement by
// default; STRATA_CPU_PIN=all pins it too (to the first CPU of the slice, which no worker takes) for the
// length of each update and puts its own affinity back after, in case the scheduler would leave it on a
// worker's CPU.
struct CpuPlaces {
  std::vector<int> cpus;  // usable CPUs, one per physical core first
  int localRank = 0, localSize = 1;
  bool enabled = false;
  bool caller = false;  // STRATA_CPU_PIN=all: thread 0 too, for the update's length
};

int envInt(const char* name, int fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != 0 ? std::atoi(text) : fallback;
}

const CpuPlaces& cpuPlaces() {
  static const CpuPlaces places = [] {
    CpuPlaces p;
    const char* pin = std::getenv("STRATA_CPU_PIN");
    if ((pin != nullptr && std::strcmp(pin, "0") == 0) || omp_get_proc_bind() != omp_proc_bind_false)
      return p;
    p.cpus = cpusByPhysicalCore();
    p.localRank = envInt("OMPI_COMM_WORLD_LOCAL_RANK", envInt("MPI_LOCALRANKID", envInt("LOCAL_RANK", 0)));
    p.localSize =
        envInt("OMPI_COMM_WORLD_LOCAL_SIZE", envInt("MPI_LOCALNRANKS", envInt("LOCAL_WORLD_SIZE", 1)));
    p.localSize = std::max(1, p.localSize);
    p.localRank = std::clamp(p.localRank, 0, p.localSize - 1);
    p.enabled = !p.cpus.empty();
    p.caller = p.enabled && pin != nullptr && std::strcmp(pin, "all") == 0;
    return p;
  }();
  return places;
}

// Binds the calling thread to one CPU; false where the system refuses.
bool pinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// The slice's CPU for thread `thread` of `threads`, or -1 where the kernel does not pin (above).
int placeOf(int thread, int threads) {
  const CpuPlaces& places = cpuPlaces();
  if (!places.enabled || int64_t(threads) * places.localSize > int64_t(places.cpus.size())) return -1;
  return places.cpus[size_t(places.localRank * threads + thread)];
}

// STRATA_CPU_PIN=all: pin() (by thread 0 of the team, the calling thread, with the team's size) pins it to
// its slice's first CPU until the CallerPin goes, which restores the thread's own affinity.
class CallerPin {
 public:
  CallerPin() = default;
  void pin(int threads) {
    int cpu = cpuPlaces().caller ? placeOf(0, threads) : -1;
    if (cpu < 0 || pthread_getaffinity_np(pthread_self(), sizeof(saved_), &saved_) != 0) return;
    pinned_ = pinTo(cpu);
  }
  ~CallerPin() {
    if (pinned_) pthread_setaffinity_np(pthread_self(), sizeof(saved_), &saved_);
  }
  CallerPin(const CallerPin&) = delete;
  CallerPin& operator=(const CallerPin&) = delete;

 private:
  cpu_set_t saved_{};
  bool pinned_ = false;
};

void pinWorker(int thread, int threads) {
  int cpu = thread == 0 ? -1 : placeOf(thread, threads);
  if (cpu < 0) return;
  thread_local int pinnedTo = -1;
  if (pinnedTo != cpu && pinTo(cpu)) pinnedTo = cpu;
}

// NOTE [CPU AdamW split]
// The static split gives each thread one contiguous range, the same every step. A thread that the scheduler
// shares with another, or that runs on a slower core, then holds up the whole update. With
// STRATA_CPU_SPLIT=steal each range is taken in blocks of kSplitBlock elements (a multiple of 64, so where a
// set's streams start on a cache line no two threads write into one line) through a per-range atomic cursor,
// for at most kMaxSplitThreads threads: a thread walks its own range first, as the static split does, then
// takes the blocks still left in the others'. Which thread updates an element does not change its bits.
// STRATA_CPU_SPLIT=static (the default) keeps the plain split; bench_cpu_adamw --split measures both.
constexpr int kMaxSplitThreads = 256;

// STRATA_CPU_STORES unset (NOTE [CPU AdamW stores]); bench_cpu_adamw --stores measures the three.
constexpr CpuStores kDefaultStores = CpuStores::Copy;
constexpr int64_t kSplitBlock = 32768;

CpuIsa resolveIsa() {
  CpuIsa best = cpuIsaSupported(CpuIsa::Avx512) ? CpuIsa::Avx512
                : cpuIsaSupported(CpuIsa::Avx2) ? CpuIsa::Avx2
                                                : CpuIsa::Scalar;
  const char* forced = std::getenv("STRATA_CPU_ISA");
  if (forced == nullptr || *forced == 0) {
    spdlog::info("CPU AdamW: {} path (the best this CPU runs; STRATA_CPU_ISA=avx512|avx2|scalar chooses)",
                 cpuIsaName(best));
    return best;
  }
  std::string name = forced;
  CpuIsa isa = name == "avx512" ? CpuIsa::Avx512 : name == "avx2" ? CpuIsa::Avx2 : CpuIsa::Scalar;
  STRATA_USER_CHECK(name == "avx512" || name == "avx2" || name == "scalar",
                    "STRATA_CPU_ISA={}: expected avx512, avx2 or scalar", name);
  STRATA_USER_CHECK(cpuIsaSupported(isa), "STRATA_CPU_ISA={}: this CPU does not run the {} path (best: {})",
                    name, name, cpuIsaName(best));
  spdlog::info("CPU AdamW: {} path (STRATA_CPU_ISA)", cpuIsaName(isa));
  return isa;
}

}  // namespace

const char* cpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx512:
      return "avx512";
    case CpuIsa::Avx2:
      return "avx2";
    case CpuIsa::Scalar:
      return "scalar";
  }
  return "?";
}

bool cpuIsaSupported(CpuIsa isa) {
  if (isa == CpuIsa::Scalar) return true;
#if STRATA_CPU_X86
  // __builtin_cpu_supports also checks that the OS saves the registers (XCR0).
  if (isa == CpuIsa::Avx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  if (isa == CpuIsa::Avx2)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#endif
  return false;
}

const char* cpuSplitName(CpuSplit split) {
  return split == CpuSplit::Steal ? "steal" : "static";
}

CpuSplit activeCpuSplit() {
  static const CpuSplit split = [] {
    const char* text = std::getenv("STRATA_CPU_SPLIT");
    std::string name = text != nullptr ? text : "";
    STRATA_USER_CHECK(name.empty() || name == "static" || name == "steal",
                      "STRATA_CPU_SPLIT={}: expected static or steal", name);
    return name == "steal" ? CpuSplit::Steal : CpuSplit::Static;
  }();
  return split;
}

CpuIsa activeCpuIsa() {
  static const CpuIsa isa = resolveIsa();
  return isa;
}

const char* cpuStoresName(CpuStores stores) {
  switch (stores) {
    case CpuStores::Plain:
      return "plain";
    case CpuStores::Copy:
      return "copy";
    case CpuStores::Stream:
      return "stream";
  }
  return "?";
}

CpuStores activeCpuStores() {
  static const CpuStores stores = [] {
    const char* text = std::getenv("STRATA_CPU_STORES");
    std::string name = text != nullptr ? text : "";
    STRATA_USER_CHECK(name.empty() || name == "plain" || name == "copy" || name == "stream",
                      "STRATA_CPU_STORES={}: expected plain, copy or stream", name);
    return name == "plain" ? CpuStores::Plain : name == "stream" ? CpuStores::Stream : kDefaultStores;
  }();
  return stores;
}

int64_t activeCpuPrefetch() {
  static const int64_t elems = [] {
    const char* text = std::getenv("STRATA_CPU_PREFETCH");
    if (text == nullptr || *text == 0) return kDefaultPrefetch;
    char* end = nullptr;
    long long n = std::strtoll(text, &end, 10);
    STRATA_USER_CHECK(*end == 0 && n >= 0,
                      "STRATA_CPU_PREFETCH={}: expected a count of elements >= 0 (0: no software prefetch)",
                      text);
    return int64_t(n);
  }();
  return elems;
}

void adamwOnPath(CpuIsa isa, const std::vector<AdamWTensors>& sets, const AdamWHyper& h, float gradScale,
                 CpuSplit split) {
  adamwOnPath(isa, sets, h, gradScale, CpuAdamWOptions{.split = split});
}

void adamwOnPath(CpuIsa isa, const std::vector<AdamWTensors>& sets, const AdamWHyper& h, float gradScale,
                 const CpuAdamWOptions& options) {
  STRATA_CHECK(cpuIsaSupported(isa), "adamw: this CPU does not run the {} path", cpuIsaName(isa));
  CpuSplit split = options.split;
  AdamConsts k{.scale = gradScale,
               .negLr = -h.lr,
               .beta1 = h.beta1,
               .oneMinusBeta1 = 1.0f - h.beta1,
               .beta2 = h.beta2,
               .oneMinusBeta2 = 1.0f - h.beta2,
               .eps = h.eps,
               .c1 = 1.0f / h.biasCorrection1,
               .c2 = 1.0f / h.biasCorrection2,
               .stores = options.stores,
               .prefetchElems = options.prefetchElems};
  int64_t total = 0;
  for (const auto& s : sets) total += s.param.numel();
  int threads = int(std::clamp<int64_t>(total / kParallelGrain, 1, omp_get_max_threads()));
  if (threads == 1 || omp_in_parallel()) {
    updateRange(isa, sets, h, k, 0, total);
    return;
  }
  bool steal = split == CpuSplit::Steal;
  if (steal) threads = std::min(threads, kMaxSplitThreads);  // one cursor each
  CallerPin callerPin;
  // One cursor per thread's range, each on its own cache line: the next block of the range to take.
  struct alignas(64) Cursor {
    std::atomic<int64_t> next;
  };
  Cursor cursors[kMaxSplitThreads];
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), count = omp_get_num_threads();
    if (t == 0)
      callerPin.pin(count);
    else
      pinWorker(t, count);
    // Cuts at multiples of 64 elements: where a set's streams start on a cache line (chunk flats do), no
    // two threads write into one line.
    auto cut = [&](int i) { return i == count ? total : (total * i / count) & ~int64_t(63); };
    if (!steal) {
      updateRange(isa, sets, h, k, cut(t), cut(t + 1));
    } else {
      cursors[t].next.store(cut(t), std::memory_order_relaxed);
#pragma omp barrier
      // Its own range first, then the others' in turn, a block at a time (NOTE [CPU AdamW split]).
      for (int i = 0; i < count; ++i) {
        int r = (t + i) % count;
        int64_t end = cut(r + 1);
        for (int64_t b = cursors[r].next.fetch_add(kSplitBlock, std::memory_order_relaxed); b < end;
             b = cursors[r].next.fetch_add(kSplitBlock, std::memory_order_relaxed))
          updateRange(isa, sets, h, k, b, std::min(end, b + kSplitBlock));
      }
    }
  }
}

}  // namespace strata::ops::cpu

#if STRATA_CPU_X86
#pragma GCC diagnostic pop
#endif
