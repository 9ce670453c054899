// CUDA launchers and registration: fused multi-tensor AdamW, multi-tensor Adafactor, the gradient norm.
#include <algorithm>
#include <cstring>

#include "kernels/Adafactor.cuh"
#include "kernels/Optim.cuh"
#include "src/ops/AdafactorWork.h"
#include "src/ops/cuda/CudaCommon.h"

namespace strata::ops::cuda {
namespace {

void adamw(const std::vector<AdamWTensors>& sets, const AdamWHyper& h, const Tensor& gradScale) {
  if (sets.empty()) return;
  Device dev = sets[0].param.device();
  DeviceGuard guard(dev.index);
  // Sets with fp32 moments in one launch, sets with bf16 moments (optimizer.moments_dtype) in another.
  std::vector<kernels::AdamChunk> byMoments[2];
  for (const auto& s : sets) {
    int64_t n = s.param.numel();
    bool bf16Moments = s.m.dtype() == DType::BF16;
    size_t momentBytes = dtypeSize(s.m.dtype());
    for (int64_t off = 0; off < n; off += kernels::kAdamChunk) {
      int kind = !s.copy.defined()               ? 0
                 : s.copy.dtype() == DType::BF16 ? 1
                 : s.copy.dtype() == DType::F16  ? 2
                                                 : 3;
      void* copy = kind == 0   ? nullptr
                   : kind == 3 ? static_cast<void*>(static_cast<float*>(s.copy.data()) + off)
                               : static_cast<void*>(static_cast<uint16_t*>(s.copy.data()) + off);
      int gradKind = s.grad.dtype() == DType::BF16 ? 1 : s.grad.dtype() == DType::F16 ? 2 : 0;
      const void* grad = static_cast<const char*>(s.grad.data()) + size_t(off) * dtypeSize(s.grad.dtype());
      byMoments[bf16Moments].push_back(kernels::AdamChunk{
          static_cast<float*>(s.param.data()) + off, grad,
          static_cast<char*>(s.m.data()) + size_t(off) * momentBytes,
          static_cast<char*>(s.v.data()) + size_t(off) * momentBytes, std::min(kernels::kAdamChunk, n - off),
          adamwDecayFactor(h.lr, s.weightDecay), copy, kind, gradKind});
    }
  }
  kernels::AdamParams p{-h.lr,          h.beta1, 1.0f - h.beta1,           h.beta2,
                        1.0f - h.beta2, h.eps,   1.0f / h.biasCorrection1, 1.0f / h.biasCorrection2};
  const float* scale = gradScale.defined() ? static_cast<const float*>(gradScale.data()) : nullptr;
  for (int bf16Moments = 0; bf16Moments < 2; ++bf16Moments) {
    const std::vector<kernels::AdamChunk>& chunks = byMoments[bf16Moments];
    if (chunks.empty()) continue;
    STRATA_CHECK(chunks.size() < (size_t(1) << 31), "adamw: too many chunks ({})", chunks.size());
    // The descriptors travel in one small copy on the compute stream, ordered before the kernel that reads
    // them.
    size_t bytes = chunks.size() * sizeof(kernels::AdamChunk);
    Tensor table = Tensor::empty({int64_t(bytes)}, DType::U8, dev);
    cudaStream_t stream = streamOf(table);
    STRATA_CUDA_CHECK(cudaMemcpyAsync(table.data(), chunks.data(), bytes, cudaMemcpyHostToDevice, stream));
    auto* descriptors = static_cast<const kernels::AdamChunk*>(table.data());
    if (bf16Moments)
      kernels::adamwKernel<true><<<unsigned(chunks.size()), 256, 0, stream>>>(descriptors, p, scale);
    else
      kernels::adamwKernel<false><<<unsigned(chunks.size()), 256, 0, stream>>>(descriptors, p, scale);
    STRATA_CUDA_CHECK_LAUNCH();
  }
  // `byMoments` is pageable host memory: the copies above have completed their host-side reads when
  // cudaMemcpyAsync returns.
}

// The tensors (fp32, contiguous) cut into the sum-of-squares kernel's chunks, one block each, in order.
std::vector<kernels::NormChunk> normChunks(const std::vector<Tensor>& tensors) {
  std::vector<kernels::NormChunk> chunks;
  for (const auto& t : tensors) {
    const float* base = static_cast<const float*>(t.data());
    for (int64_t off = 0; off < t.numel(); off += kernels::kAdamChunk)
      chunks.push_back(kernels::NormChunk{base + off, std::min(kernels::kAdamChunk, t.numel() - off)});
  }
  return chunks;
}

void sumOfSquares(const std::vector<Tensor>& tensors, const Tensor& out) {
  Device dev = out.device();
  DeviceGuard guard(dev.index);
  std::vector<kernels::NormChunk> chunks = normChunks(tensors);
  cudaStream_t stream = streamOf(out);
  if (chunks.empty()) {
    STRATA_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, sizeof(float), stream));
    return;
  }
  STRATA_CHECK(chunks.size() < (size_t(1) << 31), "sumOfSquares: too many chunks ({})", chunks.size());
  size_t bytes = chunks.size() * sizeof(kernels::NormChunk);
  Tensor table = Tensor::empty({int64_t(bytes)}, DType::U8, dev);
  Tensor partial = Tensor::empty({int64_t(chunks.size())}, DType::F32, dev);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(table.data(), chunks.data(), bytes, cudaMemcpyHostToDevice, stream));
  kernels::sumSquaresKernel<<<unsigned(chunks.size()), 512, 0, stream>>>(
      static_cast<const kernels::NormChunk*>(table.data()), static_cast<float*>(partial.data()));
  STRATA_CUDA_CHECK_LAUNCH();
  kernels::sumPartialsKernel<<<1, 1024, 0, stream>>>(static_cast<const float*>(partial.data()),
                                                     int(chunks.size()), static_cast<float*>(out.data()));
  STRATA_CUDA_CHECK_LAUNCH();
}

// The same in two halves: the first kernel's per-block partials, then the second kernel over the partials
// of every list, copied end to end (the blocks of sumOfSquares over the concatenated tensors).
Tensor sumOfSquaresParts(const std::vector<Tensor>& tensors) {
  Device dev = tensors[0].device();
  DeviceGuard guard(dev.index);
  std::vector<kernels::NormChunk> chunks = normChunks(tensors);
  STRATA_CHECK(chunks.size() < (size_t(1) << 31), "sumOfSquaresParts: too many chunks ({})", chunks.size());
  Tensor partial = Tensor::empty({int64_t(chunks.size())}, DType::F32, dev);
  if (chunks.empty()) return partial;
  size_t bytes = chunks.size() * sizeof(kernels::NormChunk);
  Tensor table = Tensor::empty({int64_t(bytes)}, DType::U8, dev);
  cudaStream_t stream = streamOf(partial);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(table.data(), chunks.data(), bytes, cudaMemcpyHostToDevice, stream));
  kernels::sumSquaresKernel<<<unsigned(chunks.size()), 512, 0, stream>>>(
      static_cast<const kernels::NormChunk*>(table.data()), static_cast<float*>(partial.data()));
  STRATA_CUDA_CHECK_LAUNCH();
  return partial;
}

void sumParts(const std::vector<Tensor>& parts, const Tensor& out) {
  Device dev = out.device();
  DeviceGuard guard(dev.index);
  cudaStream_t stream = streamOf(out);
  int64_t n = 0;
  for (const auto& p : parts) n += p.numel();
  if (n == 0) {
    STRATA_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, sizeof(float), stream));
    return;
  }
  STRATA_CHECK(n < (int64_t(1) << 31), "sumParts: too many parts ({})", n);
  Tensor all = parts.size() == 1 ? parts[0] : Tensor::empty({n}, DType::F32, dev);
  if (parts.size() > 1) {
    int64_t at = 0;
    for (const auto& p : parts) {
      STRATA_CUDA_CHECK(cudaMemcpyAsync(static_cast<float*>(all.data()) + at, p.data(), p.nbytes(),
                                        cudaMemcpyDeviceToDevice, stream));
      at += p.numel();
    }
  }
  kernels::sumPartialsKernel<<<1, 1024, 0, stream>>>(static_cast<const float*>(all.data()), int(n),
                                                     static_cast<float*>(out.data()));
  STRATA_CUDA_CHECK_LAUNCH();
}

// ----

// Each pass over every set is one launch (kernels/Adafactor.cuh). The descriptor tables, the column
// scratch, the per-block partial sums and the per-set scalars live in two device buffers from the caching
// allocator; the tables travel in one copy on the compute stream.
void adafactor(const std::vector<AdafactorTensors>& sets, const AdafactorHyper& h, const Tensor& gradScale) {
  if (sets.empty()) return;
  Device dev = sets[0].param.device();
  DeviceGuard guard(dev.index);
  constexpr int64_t kBlockElems = 65536, kSliceRows = 256, kMaxSlices = 64, kFinishColumns = 256;
  std::vector<AdafactorBlock> blocks;
  std::vector<int64_t> firstBlock;
  adafactorBlocks(sets, kBlockElems, blocks, firstBlock);
  if (blocks.empty()) return;
  // Column slices: each factored set's rows in up to kMaxSlices slices of at least kSliceRows rows.
  struct SetSlices {
    int64_t slices = 0, rowsPer = 0, scratchOffset = 0;
  };
  std::vector<SetSlices> slicing(sets.size());
  int64_t scratchFloats = 0;
  for (size_t k = 0; k < sets.size(); ++k) {
    if (!adafactorFactored(sets[k])) continue;
    int64_t rows = sets[k].row.numel();
    SetSlices& sl = slicing[k];
    int64_t want = std::clamp<int64_t>((rows + kSliceRows - 1) / kSliceRows, 1, kMaxSlices);
    sl.rowsPer = (rows + want - 1) / want;
    sl.slices = (rows + sl.rowsPer - 1) / sl.rowsPer;
    sl.scratchOffset = scratchFloats;
    scratchFloats += sl.slices * sets[k].col.numel();
  }
  int64_t numBlocks = int64_t(blocks.size());
  // Workspace: column scratch, then the parameter and update partials (one float per block each).
  Tensor workspace = Tensor::empty({std::max<int64_t>(1, scratchFloats + 2 * numBlocks)}, DType::F32, dev);
  float* scratch = static_cast<float*>(workspace.data());
  float* paramPartial = scratch + scratchFloats;
  float* updatePartial = paramPartial + numBlocks;
  std::vector<kernels::AdafactorSetDesc> descs;
  std::vector<kernels::AdafactorWorkBlock> work;
  std::vector<kernels::AdafactorColumnSlice> columnSlices;
  std::vector<kernels::AdafactorColumnFinish> finishes;
  for (size_t k = 0; k < sets.size(); ++k) {
    const AdafactorTensors& s = sets[k];
    bool factored = adafactorFactored(s);
    kernels::AdafactorSetDesc d{};
    d.param = static_cast<float*>(s.param.data());
    d.grad = static_cast<const float*>(s.grad.data());
    d.m = s.m.defined() ? s.m.data() : nullptr;
    d.mKind = !s.m.defined() ? 0 : s.m.dtype() == DType::BF16 ? 2 : 1;
    d.v = factored ? nullptr : static_cast<float*>(s.v.data());
    d.row = factored ? static_cast<float*>(s.row.data()) : nullptr;
    d.col = factored ? static_cast<float*>(s.col.data()) : nullptr;
    d.n = s.param.numel();
    d.rows = factored ? s.row.numel() : 0;
    d.cols = factored ? s.col.numel() : 0;
    d.firstBlock = firstBlock[k];
    d.numBlocks = firstBlock[k + 1] - firstBlock[k];
    d.weightDecay = s.weightDecay;
    d.copy = s.copy.defined() ? s.copy.data() : nullptr;
    d.copyKind = !s.copy.defined() ? 0 : s.copy.dtype() == DType::BF16 ? 1 : 2;
    descs.push_back(d);
    if (!factored) continue;
    const SetSlices& sl = slicing[k];
    for (int64_t c = 0; c < d.cols; c += 32)
      for (int64_t slice = 0; slice < sl.slices; ++slice)
        columnSlices.push_back(kernels::AdafactorColumnSlice{
            int64_t(k), c, std::min(d.cols, c + 32), slice * sl.rowsPer,
            std::min(d.rows, (slice + 1) * sl.rowsPer), scratch + sl.scratchOffset, slice});
    for (int64_t c = 0; c < d.cols; c += kFinishColumns)
      finishes.push_back(kernels::AdafactorColumnFinish{int64_t(k), c, std::min(d.cols, c + kFinishColumns),
                                                        sl.slices, scratch + sl.scratchOffset});
  }
  for (const AdafactorBlock& b : blocks) work.push_back(kernels::AdafactorWorkBlock{b.set, b.begin, b.end});
  STRATA_CHECK(work.size() < (size_t(1) << 31) && columnSlices.size() < (size_t(1) << 31),
               "adafactor: too many blocks ({})", work.size());
  // One table: set descriptors, work blocks, column slices, column finishes, then the per-set scalars.
  auto align = [](size_t b) { return (b + 15) / 16 * 16; };
  size_t setsBytes = align(descs.size() * sizeof(kernels::AdafactorSetDesc));
  size_t workBytes = align(work.size() * sizeof(kernels::AdafactorWorkBlock));
  size_t slicesBytes = align(columnSlices.size() * sizeof(kernels::AdafactorColumnSlice));
  size_t finishBytes = align(finishes.size() * sizeof(kernels::AdafactorColumnFinish));
  size_t scalarsBytes = sets.size() * sizeof(kernels::AdafactorSetScalars);
  std::vector<uint8_t> host(setsBytes + workBytes + slicesBytes + finishBytes, 0);
  std::memcpy(host.data(), descs.data(), descs.size() * sizeof(kernels::AdafactorSetDesc));
  std::memcpy(host.data() + setsBytes, work.data(), work.size() * sizeof(kernels::AdafactorWorkBlock));
  if (!columnSlices.empty())
    std::memcpy(host.data() + setsBytes + workBytes, columnSlices.data(),
                columnSlices.size() * sizeof(kernels::AdafactorColumnSlice));
  if (!finishes.empty())
    std::memcpy(host.data() + setsBytes + workBytes + slicesBytes, finishes.data(),
                finishes.size() * sizeof(kernels::AdafactorColumnFinish));
  Tensor table = Tensor::empty({int64_t(host.size() + scalarsBytes)}, DType::U8, dev);
  cudaStream_t stream = streamOf(table);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(table.data(), host.data(), host.size(), cudaMemcpyHostToDevice, stream));
  uint8_t* base = static_cast<uint8_t*>(table.data());
  auto* dSets = reinterpret_cast<const kernels::AdafactorSetDesc*>(base);
  auto* dWork = reinterpret_cast<const kernels::AdafactorWorkBlock*>(base + setsBytes);
  auto* dSlices = reinterpret_cast<const kernels::AdafactorColumnSlice*>(base + setsBytes + workBytes);
  auto* dFinish =
      reinterpret_cast<const kernels::AdafactorColumnFinish*>(base + setsBytes + workBytes + slicesBytes);
  auto* dScalars = reinterpret_cast<kernels::AdafactorSetScalars*>(base + host.size());
  kernels::AdafactorParams p{
      h.lr, h.beta1, h.beta2, h.eps1, h.eps2, h.clipThreshold, h.scaleParameter ? 1 : 0};
  const float* scale = gradScale.defined() ? static_cast<const float*>(gradScale.data()) : nullptr;
  unsigned numSets = unsigned(sets.size());
  kernels::adafactorStatsKernel<<<unsigned(numBlocks), 256, 0, stream>>>(dSets, dWork, p, scale,
                                                                         paramPartial);
  STRATA_CUDA_CHECK_LAUNCH();
  if (!columnSlices.empty()) {
    kernels::adafactorColumnPartialKernel<<<unsigned(columnSlices.size()), dim3(32, 8), 0, stream>>>(
        dSets, dSlices, p, scale);
    STRATA_CUDA_CHECK_LAUNCH();
    kernels::adafactorColumnFinishKernel<<<unsigned(finishes.size()), 256, 0, stream>>>(dSets, dFinish, p);
    STRATA_CUDA_CHECK_LAUNCH();
  }
  kernels::adafactorSetScalarsKernel<<<numSets, 256, 0, stream>>>(dSets, paramPartial, p, dScalars);
  STRATA_CUDA_CHECK_LAUNCH();
  kernels::adafactorUpdateSquaresKernel<<<unsigned(numBlocks), 256, 0, stream>>>(dSets, dWork, dScalars,
                                                                                 scale, updatePartial);
  STRATA_CUDA_CHECK_LAUNCH();
  kernels::adafactorClipKernel<<<numSets, 256, 0, stream>>>(dSets, updatePartial, p, dScalars);
  STRATA_CUDA_CHECK_LAUNCH();
  kernels::adafactorApplyKernel<<<unsigned(numBlocks), 256, 0, stream>>>(dSets, dWork, dScalars, p, scale);
  STRATA_CUDA_CHECK_LAUNCH();
  // `host` is pageable: cudaMemcpyAsync has read it when it returns. The workspace and the table go back
  // to the allocator as adamw's table does, on the stream that used them.
}

}  // namespace

void registerOptim(Registry& r) {
  r.add<SumOfSquaresKernel>("sum_of_squares", DeviceType::CUDA, &sumOfSquares);
  r.add<SquarePartsKernel>("sum_of_squares_parts", DeviceType::CUDA, &sumOfSquaresParts);
  r.add<SumPartsKernel>("sum_parts", DeviceType::CUDA, &sumParts);
  r.add<AdamWKernel>("adamw", DeviceType::CUDA, &adamw);
  r.add<AdafactorKernel>("adafactor", DeviceType::CUDA, &adafactor);
}

}  // namespace strata::ops::cuda
