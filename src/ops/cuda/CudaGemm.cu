// GEMM through cuBLASLt. bf16/f16 operands accumulate in fp32; f32 runs in full fp32 (no TF32).
//
// Row-major C = op(A) op(B) is computed as the column-major product C^T = op(B)^T op(A)^T, so the operands
// are passed swapped and no data moves. Plans (descriptors, layouts and the heuristic's algorithm) are cached
// per (shape, strides, transposes, dtype, alignment), so steady-state training pays for the heuristic once
// per shape.
//
// Autotuning (opt-in, STRATA_GEMM_AUTOTUNE=1): the first call of each plan times the heuristic's top
// kCandidates algorithms on its own operands and keeps the fastest, as cudnn.benchmark does. The timing
// writes into the real output when the call overwrites it anyway (beta 0), else into scratch, so no caller
// sees a difference; it synchronises the stream once per plan. It is off by default: on the H200 at the GPT
// MLP's shapes it won up to 14% on some GEMMs and lost up to 15% on others (timing noise picks badly), the
// whole 124M and 1.3B steps did not move (BENCHMARKS.md), and an autotuned choice can differ between
// processes, and with it the last bits of the results.
//
// STRATA_GEMM_BACKEND=cublas sends GEMMs without an epilogue through plain cuBLAS (cublasGemmEx and its
// strided batched form, the calls PyTorch's backward makes) instead of a cuBLASLt plan; cuBLAS then picks the
// kernel with its own heuristics. GEMMs with an epilogue stay on cuBLASLt. The default (`lt`) is cuBLASLt for
// all.
//
// FP8 operands (GemmArgs::fp8A/fp8B; NOTE [FP8 training] in autograd/Fp8.h) take the same path: E4M3/E5M2
// layouts in the TN form Hopper's FP8 kernels need (cuBLASLt's A transposed: our B stored [n, k]), the
// per-tensor dequantisation factors as A/B_SCALE_POINTER (set per call with the epilogue pointers), fp32
// accumulation, a bf16 or fp32 D, and a bf16 bias in the epilogue when an algorithm has one. With
// fp8FastAccumulate the kernel keeps its partial sums in the tensor cores' own precision instead of
// promoting them to fp32 at intervals (CUBLASLT_MATMUL_DESC_FAST_ACCUM; faster, less exact).
//
// The workspace is per stream: each call takes it from the device's caching allocator on the GEMM's stream
// and frees it once the GEMM is enqueued. Stream-ordered reuse (NOTE [Stream-ordered reuse]) hands the same
// block to the next GEMM on that stream, which runs after this one, and never to a GEMM on another stream
// while this one may still run: two streams never share a workspace, and no workspace outlives its stream.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "src/ops/cuda/CudaCommon.h"

#define STRATA_CUBLAS_CHECK(expr)                                                                       \
  do {                                                                                                  \
    cublasStatus_t strata_status_ = (expr);                                                             \
    if (strata_status_ != CUBLAS_STATUS_SUCCESS) {                                                      \
      ::strata::detail::throwError(__FILE__, __LINE__, #expr,                                           \
                                   ::strata::detail::format("cuBLAS error {}: {}", int(strata_status_), \
                                                            cublasLtGetStatusString(strata_status_)));  \
    }                                                                                                   \
  } while (0)

namespace strata::ops::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int kCandidates = 8;
constexpr size_t kMaxScratchBytes = size_t(1) << 30;  // larger accumulating outputs keep the first choice

// Read at each new plan (plans are cached, so this is rare).
bool autotune() {
  const char* v = std::getenv("STRATA_GEMM_AUTOTUNE");
  return v && std::string(v) == "1";
}

// STRATA_GEMM_BACKEND: `lt` (default) or `cublas` (see the note at the top). Read at each call (it is part of
// the plan's key).
bool plainCublasRequested() {
  const char* v = std::getenv("STRATA_GEMM_BACKEND");
  if (!v || !*v || std::string(v) == "lt") return false;
  STRATA_CHECK(std::string(v) == "cublas", "STRATA_GEMM_BACKEND={} is not one of lt, cublas", v);
  return true;
}

using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, int64_t,
                           int64_t, int64_t, int64_t, bool, int, int, int, int, int, int64_t, bool, int>;

struct Plan {
  bool supported = true;     // false: the heuristic had no algorithm for an optional epilogue
  bool plainCublas = false;  // true: cublasGemmEx, no cuBLASLt descriptors
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layoutX = nullptr, layoutY = nullptr, layoutC = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (layoutX) cublasLtMatrixLayoutDestroy(layoutX);
    if (layoutY) cublasLtMatrixLayoutDestroy(layoutY);
    if (layoutC) cublasLtMatrixLayoutDestroy(layoutC);
  }
};

struct LtState {
  cublasLtHandle_t handle = nullptr;
  cublasHandle_t blas = nullptr;  // created with the first plain-cuBLAS plan
  std::mutex mutex;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

LtState& ltState(int device) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<LtState>> states(64);
  std::lock_guard<std::mutex> lock(mutex);
  auto& s = states[size_t(device)];
  if (!s) {
    DeviceGuard guard(device);
    s = std::make_unique<LtState>();
    STRATA_CUBLAS_CHECK(cublasLtCreate(&s->handle));
  }
  return *s;
}

// This call's workspace, on `stream` (see the note at the top).
struct Workspace {
  CachingAllocator& allocator;
  void* ptr;
  Workspace(int device, const Stream& stream)
      : allocator(*strata::cuda::deviceContext(device).allocator),
        ptr(allocator.allocate(kWorkspaceBytes, stream)) {}
  ~Workspace() { allocator.deallocate(ptr); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
};

int alignmentOf(const void* p) {
  uintptr_t v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (v % uintptr_t(a)) != 0) a >>= 1;
  return a;
}

cudaDataType_t cudaType(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F16:
      return CUDA_R_16F;
    default:
      STRATA_FAIL("matmul: dtype {} is not supported on cuda (f32, bf16, f16)", t);
  }
}

// FP8 operands (GemmArgs::fp8A/fp8B): the cuBLASLt type of a format.
cudaDataType_t fp8Type(Fp8Format f) {
  return f == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

// The plan key's code of g's FP8 formats (0: not FP8).
int fp8Code(const GemmArgs& g) {
  if (!g.fp8A) return 0;
  return 1 + int(*g.fp8A) * 2 + int(*g.fp8B) + (g.fp8FastAccumulate ? 4 : 0);
}

void setBatch(cublasLtMatrixLayout_t layout, int64_t batch, int64_t stride) {
  if (batch <= 1) return;
  int32_t count = int32_t(batch);
  STRATA_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                       &stride, sizeof(stride)));
}

// The cuBLASLt epilogue for g's bias, gelu, dgelu and biasGrad requests. Column-major D^T [n, m]: a bias or
// bias gradient over our n runs along D^T's rows, and the sums over k of our B are those of cuBLASLt's A.
cublasLtEpilogue_t epilogueOf(const GemmArgs& g) {
  if (g.gelu) {
    if (g.aux) return g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    return g.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  }
  if (g.dgelu) return CUBLASLT_EPILOGUE_DGELU;
  if (g.biasGrad) return CUBLASLT_EPILOGUE_BGRADA;
  return g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

// The per-call pointers of the epilogue and of FP8's scales (the plan is shared; callers hold the state's
// lock). cuBLASLt's A is our B (the column-major view), so our B's scale is its A's.
void setEpiloguePointers(const Plan& plan, const GemmArgs& g) {
  if (g.fp8A) {
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                       &g.scaleB, sizeof(g.scaleB)));
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                       &g.scaleA, sizeof(g.scaleA)));
  }
  const void* bias = g.biasGrad ? g.biasGrad : g.bias;
  if (bias)
    STRATA_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (g.aux)
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                       &g.aux, sizeof(g.aux)));
}

// The index of the fastest of the heuristic's `found` candidates on g's operands (see the note at the top);
// 0 when there is one, or when scratch for an accumulating output cannot be had.
int fastest(LtState& st, const Plan& plan, const GemmArgs& g, const cublasLtMatmulHeuristicResult_t* results,
            int found) {
  if (found <= 1) return 0;
  Stream stream = currentStream(g.device);
  CachingAllocator& allocator = *strata::cuda::deviceContext(g.device.index).allocator;
  size_t outBytes =
      dtypeSize(g.outDtype.value_or(g.dtype)) * size_t((g.batch - 1) * g.strideC + g.ldc * (g.m - 1) + g.n);
  void* scratch = nullptr;
  if (g.beta != 0.0f) {
    if (outBytes > kMaxScratchBytes) return 0;
    scratch = allocator.tryAllocate(outBytes, stream);
    if (!scratch) return 0;
  }
  void* out = scratch ? scratch : g.c;
  // Released on every path, a failed launch included.
  struct Timing {
    CachingAllocator& allocator;
    void* scratch;
    cudaEvent_t start = nullptr, stop = nullptr;
    ~Timing() {
      if (start) cudaEventDestroy(start);
      if (stop) cudaEventDestroy(stop);
      if (scratch) allocator.deallocate(scratch);
    }
  } timing{allocator, scratch};
  STRATA_CUDA_CHECK(cudaEventCreate(&timing.start));
  STRATA_CUDA_CHECK(cudaEventCreate(&timing.stop));
  Workspace workspace(g.device.index, stream);
  cudaStream_t s = strata::cuda::nativeStream(stream);
  float alpha = g.alpha, beta = g.beta;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(st.handle, plan.desc, &alpha, g.b, plan.layoutX, g.a, plan.layoutY, &beta, g.c,
                          plan.layoutC, out, plan.layoutC, &algo, workspace.ptr, kWorkspaceBytes, s);
  };
  int best = 0;
  float bestMs = -1;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > kWorkspaceBytes) continue;
    if (run(results[i].algo) != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; a refusal drops the candidate
    constexpr int kRepeats = 10;
    bool ran = true;
    STRATA_CUDA_CHECK(cudaEventRecord(timing.start, s));
    for (int r = 0; r < kRepeats && ran; ++r) ran = run(results[i].algo) == CUBLAS_STATUS_SUCCESS;
    STRATA_CUDA_CHECK(cudaEventRecord(timing.stop, s));
    STRATA_CUDA_CHECK(cudaEventSynchronize(timing.stop));
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, timing.start, timing.stop));
    if (ran && (bestMs < 0 || ms < bestMs)) {
      best = i;
      bestMs = ms;
    }
  }
  return best;
}

std::unique_ptr<Plan> makePlan(LtState& st, const GemmArgs& g, int alignX, int alignY, int alignC,
                               bool plainCublas) {
  auto plan = std::make_unique<Plan>();
  if (plainCublas) {
    if (!st.blas) STRATA_CUBLAS_CHECK(cublasCreate(&st.blas));
    plan->plainCublas = true;
    return plan;
  }
  // FP8 operands (A [m, k], B [n, k]: cuBLASLt's A = our B transposed, its B = our A, the TN layout Hopper's
  // FP8 kernels take) carry their formats; the others share g.dtype.
  cudaDataType_t dtX = g.fp8B ? fp8Type(*g.fp8B) : cudaType(g.dtype);
  cudaDataType_t dtY = g.fp8A ? fp8Type(*g.fp8A) : cudaType(g.dtype);
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Column-major view: C^T [n, m] = X [n, k] * Y [k, m] with X = op(B)^T and Y = op(A)^T.
  cublasOperation_t opX = g.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opY = g.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATA_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opX, sizeof(opX)));
  STRATA_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opY, sizeof(opY)));
  uint64_t xRows = g.transB ? g.k : g.n, xCols = g.transB ? g.n : g.k;
  uint64_t yRows = g.transA ? g.m : g.k, yCols = g.transA ? g.k : g.m;
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layoutX, dtX, xRows, xCols, g.ldb));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layoutY, dtY, yRows, yCols, g.lda));
  cudaDataType_t ct = cudaType(g.outDtype.value_or(g.dtype));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->layoutC, ct, uint64_t(g.n), uint64_t(g.m), g.ldc));
  setBatch(plan->layoutX, g.batch, g.strideB);
  setBatch(plan->layoutY, g.batch, g.strideA);
  setBatch(plan->layoutC, g.batch, g.strideC);
  if (g.fp8A) {
    setEpiloguePointers(*plan, g);
    int8_t fast = g.fp8FastAccumulate ? 1 : 0;
    STRATA_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  }
  cublasLtEpilogue_t epilogue = epilogueOf(g);
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                       sizeof(epilogue)));
    if (g.aux) {
      int64_t ld = g.ldAux;
      STRATA_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
    }
    // FP8 inputs: the bias in D's dtype (bf16), said explicitly, as the default depends on the inputs.
    if (g.fp8A && g.bias) {
      cudaDataType_t bt = cudaType(*g.outDtype);
      STRATA_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    }
    // The heuristic reads the pointers' alignment.
    setEpiloguePointers(*plan, g);
  }

  cublasLtMatmulPreference_t pref = nullptr;
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  uint32_t ax = uint32_t(alignX), ay = uint32_t(alignY), ac = uint32_t(alignC);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &ax, sizeof(ax));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ay, sizeof(ay));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof(ac));
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(st.handle, plan->desc, plan->layoutX, plan->layoutY, plan->layoutC,
                                     plan->layoutC, pref, autotune() ? kCandidates : 1, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // An FP8 product with a bias falls back to the product then the bias (ops::fp8MatmulInto).
  bool optional = g.gelu || g.dgelu || g.biasGrad || (g.fp8A && g.bias);
  if (optional && (status != CUBLAS_STATUS_SUCCESS || found == 0)) {
    plan->supported = false;
    return plan;
  }
  STRATA_CHECK(status == CUBLAS_STATUS_SUCCESS && found > 0,
               "matmul: cuBLASLt found no algorithm for [{} x {}] @ [{} x {}] ({}, batch {}, status {})", g.m,
               g.k, g.k, g.n, dtypeName(g.dtype), g.batch, int(status));
  plan->algo = results[fastest(st, *plan, g, results, found)].algo;
  return plan;
}

// g through plain cuBLAS on `s` (the same column-major view as the cuBLASLt plans); callers hold the state's
// lock, which guards the handle's stream and workspace.
void plainGemm(cublasHandle_t blas, const GemmArgs& g, void* workspace, cudaStream_t s) {
  STRATA_CUBLAS_CHECK(cublasSetStream(blas, s));
  STRATA_CUBLAS_CHECK(cublasSetWorkspace(blas, workspace, kWorkspaceBytes));
  cudaDataType_t dt = cudaType(g.dtype), ct = cudaType(g.outDtype.value_or(g.dtype));
  cublasOperation_t opX = g.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opY = g.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATA_CHECK(g.m <= INT32_MAX && g.n <= INT32_MAX && g.k <= INT32_MAX && g.lda <= INT32_MAX &&
                   g.ldb <= INT32_MAX && g.ldc <= INT32_MAX && g.batch <= INT32_MAX,
               "matmul: [{} x {}] @ [{} x {}] is too large for cuBLAS's 32-bit sizes", g.m, g.k, g.k, g.n);
  float alpha = g.alpha, beta = g.beta;
  if (g.batch <= 1) {
    STRATA_CUBLAS_CHECK(cublasGemmEx(blas, opX, opY, int(g.n), int(g.m), int(g.k), &alpha, g.b, dt,
                                     int(g.ldb), g.a, dt, int(g.lda), &beta, g.c, ct, int(g.ldc),
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    STRATA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(blas, opX, opY, int(g.n), int(g.m), int(g.k), &alpha, g.b,
                                                   dt, int(g.ldb), g.strideB, g.a, dt, int(g.lda), g.strideA,
                                                   &beta, g.c, ct, int(g.ldc), g.strideC, int(g.batch),
                                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

bool gemm(const GemmArgs& g) {
  bool fp8 = g.fp8A.has_value();
  STRATA_CHECK(fp8 == g.fp8B.has_value() &&
                   (!fp8 || (g.dtype == DType::U8 && g.outDtype && !g.transA && g.transB && g.batch == 1 &&
                             g.scaleA && g.scaleB && !(g.gelu || g.dgelu || g.biasGrad))),
               "gemm: FP8 operands take A [m, k] and B [n, k], batch 1, scales, a bias at most");
  STRATA_CHECK(fp8 || !g.outDtype || *g.outDtype == g.dtype ||
                   (*g.outDtype == DType::F32 && (g.dtype == DType::BF16 || g.dtype == DType::F16)),
               "gemm: output dtype {} for {} operands is not supported", *g.outDtype, g.dtype);
  STRATA_CHECK(fp8 || !(g.bias || g.gelu || g.dgelu) || !g.outDtype || *g.outDtype == g.dtype,
               "gemm: a bias or GELU epilogue needs C in the operands' dtype");
  STRATA_CHECK(!g.hasEpilogue() || g.batch == 1, "gemm: epilogues need batch 1");
  STRATA_CHECK(!(g.gelu && g.dgelu) && (!g.dgelu || g.aux) && (!g.biasGrad || !(g.bias || g.gelu || g.dgelu)),
               "gemm: unsupported epilogue combination");
  int device = g.device.index;
  DeviceGuard guard(device);
  LtState& st = ltState(device);
  int alignX = alignmentOf(g.b), alignY = alignmentOf(g.a), alignC = alignmentOf(g.c);
  // Epilogue vectors and aux take C's alignment class in the plan key (all fresh allocations in practice).
  for (const void* p : {g.bias, static_cast<const void*>(g.aux), static_cast<const void*>(g.biasGrad)})
    if (p) alignC = std::min(alignC, alignmentOf(p));
  // The backend is part of the key: a process that changes STRATA_GEMM_BACKEND gets the one it asks for.
  bool plainCublas = !fp8 && epilogueOf(g) == CUBLASLT_EPILOGUE_DEFAULT && plainCublasRequested();
  PlanKey key{int(g.dtype),
              g.m,
              g.n,
              g.k,
              g.lda,
              g.ldb,
              g.ldc,
              g.transA,
              g.transB,
              g.batch,
              g.strideA,
              g.strideB,
              g.strideC,
              g.beta != 0.0f,
              alignX,
              alignY,
              alignC,
              int(epilogueOf(g)),
              int(g.outDtype.value_or(g.dtype)),
              g.ldAux,
              plainCublas,
              fp8Code(g)};
  Plan* plan;
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    auto it = st.plans.find(key);
    if (it == st.plans.end())
      it = st.plans.emplace(key, makePlan(st, g, alignX, alignY, alignC, plainCublas)).first;
    plan = it->second.get();
  }
  if (!plan->supported) return false;
  Stream stream = currentStream(g.device);
  Workspace workspace(device, stream);
  float alpha = g.alpha, beta = g.beta;
  // The plan is shared and the epilogue pointers are per call: set them and enqueue under the lock.
  std::lock_guard<std::mutex> lock(st.mutex);
  if (plan->plainCublas) {
    plainGemm(st.blas, g, workspace.ptr, strata::cuda::nativeStream(stream));
    return true;
  }
  setEpiloguePointers(*plan, g);
  cublasStatus_t status = cublasLtMatmul(
      st.handle, plan->desc, &alpha, g.b, plan->layoutX, g.a, plan->layoutY, &beta, g.c, plan->layoutC, g.c,
      plan->layoutC, &plan->algo, workspace.ptr, kWorkspaceBytes, strata::cuda::nativeStream(stream));
  if (status == CUBLAS_STATUS_SUCCESS) return true;
  // An FP8 product whose bias epilogue the library refuses at run time: the caller adds the bias after.
  if (fp8 && g.bias && status == CUBLAS_STATUS_NOT_SUPPORTED) {
    plan->supported = false;
    return false;
  }
  if (fp8)
    STRATA_USER_FAIL(
        "FP8 GEMM [{} x {}] @ [{} x {}]^T ({} x {} into {}, beta {}, bias {}) failed with cuBLAS status {} "
        "(operand alignments {}, {} and {} bytes; scale pointers at {} and {} bytes). FP8 needs a Hopper or "
        "Ada GPU and sizes that are multiples of 16; set precision.fp8: false to train in bf16",
        g.m, g.k, g.n, g.k, *g.fp8A == Fp8Format::E4M3 ? "E4M3" : "E5M2",
        *g.fp8B == Fp8Format::E4M3 ? "E4M3" : "E5M2", dtypeName(*g.outDtype), g.beta, g.bias ? "yes" : "no",
        int(status), alignY, alignX, alignC, alignmentOf(g.scaleA), alignmentOf(g.scaleB));
  STRATA_CUBLAS_CHECK(status);
  return true;
}

}  // namespace

void registerGemm(Registry& r) {
  r.add<GemmKernel>("gemm", DeviceType::CUDA, &gemm);
}

}  // namespace strata::ops::cuda
