// The CPU AdamW kernel's instruction-set paths, for the tests and the bench (ops::adamw picks one itself).
#pragma once

#include "strata/ops/Ops.h"

namespace strata::ops::cpu {

// NOTE [CPU AdamW paths]
// AVX-512 (avx512f/bw/vl), AVX2 (avx2/fma/f16c) and scalar code give bitwise-equal results: each element
// goes through the same operations in the same order, every multiply-add is an explicit fma (std::fma in
// the scalar code), sqrt and division are correctly rounded in all three, and the 16-bit copy rounds as
// BFloat16(float) and Half(float) do (NaN included). Only how elements are grouped into vectors differs.
// No step negates a value (x86 flips a NaN's sign on negation but not in fmsub), so a NaN or infinity in a
// gradient comes out as the same bits everywhere; when NaNs meet in one operation (a NaN state and a NaN
// gradient), which payload wins may differ, never whether the result is NaN.
enum class CpuIsa { Scalar, Avx2, Avx512 };

const char* cpuIsaName(CpuIsa isa);
// Whether this CPU (and the OS's saved vector state) runs the path.
bool cpuIsaSupported(CpuIsa isa);
// The path ops::adamw takes: STRATA_CPU_ISA (avx512, avx2 or scalar) when set, else the best supported one.
// Decided once per process and logged once.
CpuIsa activeCpuIsa();

// ops::adamw's CPU kernel on a given path (fails when the CPU lacks it); threads: OpenMP's current count.
// How the threads share the update (NOTE [CPU AdamW split] in CpuAdamW.cpp): one fixed range each, or their
// own range first and then blocks of the others'. Either gives the same bits.
enum class CpuSplit { Static, Steal };

const char* cpuSplitName(CpuSplit split);
// STRATA_CPU_SPLIT=static|steal (default static), read once.
CpuSplit activeCpuSplit();

// How the vector paths store the outputs (NOTE [CPU AdamW stores] in CpuAdamW.cpp): plain stores, the
// parameter's copy non-temporally, or the master, m and v non-temporally too. Every choice gives the same
// bits.
enum class CpuStores { Plain, Copy, Stream };

const char* cpuStoresName(CpuStores stores);
// STRATA_CPU_STORES=plain|copy|stream (default copy), read once.
CpuStores activeCpuStores();
// STRATA_CPU_PREFETCH=N: software prefetches N elements ahead of the vector paths' loads (default 0: the
// hardware prefetchers alone), read once.
int64_t activeCpuPrefetch();

struct CpuAdamWOptions {
  CpuSplit split = activeCpuSplit();
  CpuStores stores = activeCpuStores();
  int64_t prefetchElems = activeCpuPrefetch();
};

void adamwOnPath(CpuIsa isa, const std::vector<AdamWTensors>& sets, const AdamWHyper& hyper, float gradScale,
                 CpuSplit split = activeCpuSplit());
void adamwOnPath(CpuIsa isa, const std::vector<AdamWTensors>& sets, const AdamWHyper& hyper, float gradScale,
                 const CpuAdamWOptions& options);

}  // namespace strata::ops::cpu
