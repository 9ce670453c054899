// AdamW with state (m, v) beside each fp32 master, decoupled weight decay, and bias correction.
// Parameters of rank < 2 (biases, norm gains) get no weight decay, as in GPT-2/nanoGPT.
//
// Two ways to hold the state:
// - per parameter: fp32 parameters that are their own masters, with m and v per tensor;
// - per chunk (zero/ChunkManager.h): m and v are one flat buffer each per chunk, and for 16-bit chunks the
//   fp32 masters are too (ChunkManager::takeMasters); each step updates the masters and writes the 16-bit
//   parameters in the same pass (the kernel rounds the new master into the parameter).
// Either way a parameter whose gradient is undefined at step() (no gradient in this step) is left alone.
//
// NOTE [AdamW moments dtype]
// m and v are fp32, or bf16 (optimizer.moments_dtype: AdamWConfig::momentsDType) wherever they live: on the
// device, in host memory, in the GPU lane's device scratch, in the SSD buffer sets and in the SSD tier's
// fields (stored as they are, whatever store.nvme_state_dtype says: config validation takes fp32 or bf16
// there and refuses fp16). The kernels widen them as they read and round the new values to nearest even as
// they write (NOTE [AdamW bits] in ops/Ops.h), so every tier and lane still gives the same bits. The master
// stays fp32. State per parameter: 4 + 2 + 2 bytes instead of 4 + 4 + 4. Checkpoints save m and v as fp32
// pieces either way (widened exactly), so a run of either dtype loads the other's (the dtype is the run's
// setting: a resume changes it with checkpoint.allow_changes); loading into bf16 moments rounds, and a bf16
// run's own checkpoint reloads to the same bits.
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/Allocator.h"
#include "strata/core/Tensor.h"
#include "strata/ops/Ops.h"
#include "strata/optim/ChunkOptimizer.h"
#include "strata/optim/SsdStateStream.h"
#include "strata/zero/ChunkManager.h"
#include "strata/zero/NvmeTier.h"
#include "strata/zero/Store.h"

namespace strata::optim {

struct AdamWConfig {
  double lr = 6e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weightDecay = 0.1;
  // The chunked form's update of state off the device (NOTE [Pipelined update]): pipelined in pieces, the
  // host state shared between the CPU and the GPU (optimizer.pipeline), or one chunk after another on the
  // CPU. Both give the same bits.
  bool pipeline = true;
  // Host-resident state is page-locked when a GPU is present (zero_optimization.pin_memory), which the GPU's
  // share of the pipelined update needs (NOTE [Host state memory] in core/Allocator.h).
  bool pinHostState = true;
  // The pipelined update's piece: elements per piece (optimizer.pipeline_piece_mb of fp32 state per field).
  int64_t pieceElems = int64_t(1) << 22;
  // SSD-resident chunks are updated one step late (store.delayed_update; NOTE [Delayed SSD update]).
  bool delayedSsdUpdate = false;
  // The pipelined update's CPU lane: page-locked staging slots of one piece's gradients and parameters
  // each (zero_optimization.buffer_count; at least 2). Host memory beyond the state: 2 x 4 bytes x
  // pieceElems per slot.
  int stagingSlots = 4;
  // m and v: fp32 or bf16 (NOTE [AdamW moments dtype]).
  DType momentsDType = DType::F32;
};

// NOTE [Delayed SSD update]
// The Angel-PTM paper's "lock-free updating", opt-in (store.delayed_update). At step t the SSD-resident
// chunks' gradients (clipped and unscaled by step t's coefficient) are copied to host memory and the step
// returns without updating them; a worker thread then reads their state from the SSD, updates it with step
// t's learning rate and bias corrections, writes it back and rounds the new parameters into host memory,
// while step t + 1's forward and backward run. Step t + 1's update first waits for that worker and copies
// the parameters into the chunks, so:
// - step t + 1's forward and backward see the SSD chunks' parameters from before step t's update (one step
//   stale), every other chunk's from after it; the gradients at step t + 1 are taken at those parameters;
// - every update is applied exactly once, with the gradients of its own step: after finishDelayed() the state
//   is what the undelayed optimizer reaches from the same sequence of gradients.
// Between two steps the new parameters are pending (pendingParameters): the chunks keep the stale ones until
// the next update writes them. Nothing between the steps writes them early, which would change the run (and
// at ZeRO stages 1 and 2 on several ranks leave each rank with its own shard one update ahead of the others'
// copies of it):
// - a checkpoint waits for the worker (waitDelayed) and saves the finished state, with the stale parameters
//   beside it ("delayed_param" pieces); loading puts those back into the chunks and makes the masters'
//   values pending again (deferParameters). A resume so continues the uninterrupted run bit for bit (NOTE
//   [Delayed update checkpoints] in train/CheckpointPieces.h);
// - the memory tracer's promotion (moveToDevice) writes the moved chunk's pending parameters at once: its
//   state now lives on the device, where updates are not delayed, and the run is the one that had it there
//   from the start (with fp32 state on the SSD). At stages 1 and 2 on several ranks the engine then gathers
//   the chunks again.
// It costs 4 bytes per SSD-resident parameter of host memory for the gradients, plus the 16-bit parameters',
// which the engine takes out of an automatic host budget (train/ModelState.cpp); that sends more state to the
// SSD, so it pays off only where the SSD's share is small (BENCHMARKS.md: at 16.6B on one H200 it doubled the
// SSD's state and the step). A non-finite step is skipped before any of this, as always.

// NOTE [Pipelined update]
// After the step-end decision (NOTE [Step-end decision] in train/StepEngine.h) the chunked form updates:
// 1. device-resident state with one fused GPU launch, enqueued first;
// 2. state off the device in pieces of at most AdamWConfig::pieceElems elements, taken by two lanes from the
// two ends
//    of one list (the SSD chunks' pieces first, then the host chunks'):
//    - the CPU lane takes pieces from the front. A piece's gradients come to pinned staging on the d2h
//      stream (the next piece's are requested before this one is updated), the SIMD kernel updates the
//      master, m and v in host memory (or in an SSD buffer set, read ahead and written behind per chunk as
//      NOTE [SSD tier] says) and rounds the new values into staging, and the h2d stream copies them into
//      the chunk. The staging slots (zero_optimization.buffer_count, default 4) take turns. Gradients
//      already in host memory (NOTE [Gradient homes] in zero/GradientReducer.h) are read in place.
//    - the GPU lane takes host pieces from the back: the piece's master, m and v go to device scratch (own
//      h2d stream), the GPU kernel updates them from the gradients on the device and writes the 16-bit
//      parameters in place, and the state goes back to host memory (own d2h stream). Up to kGpuLaneDepth
//      pieces are in flight, so the copies in both directions and the kernel overlap. It takes a new piece
//      whenever one completes, polled between the CPU lane's pieces.
//    The lanes meet where their speeds put them, so both finish together without a model of either: the
//    split adapts to the CPU's memory bandwidth and the PCIe link as measured by the work itself
//    (OffloadPhases::gpuLaneShare reports it). The GPU lane needs the host state page-locked and a GPU,
//    and the off-device chunks' parameters and gradients on it (it idles for homes in host memory).
// Which lane updates an element does not change its bits (NOTE [AdamW bits] in ops/Ops.h), so the pipelined
// update equals the sequential one (optimizer.pipeline: false) bitwise; the tests hold it to that. The
// next step waits for the parameters on the device (the compute stream waits for both lanes' streams).

class AdamW final : public ChunkOptimizer {
 public:
  AdamW(std::vector<std::pair<std::string, Tensor>> namedParameters, const AdamWConfig& config);
  // State per chunk of `chunks`; `masters`: its fp32 masters (takeMasters()), empty for fp32 chunks. With
  // `shards` (ZeRO stage >= 1: one range per chunk), this optimizer updates only elements [begin, end) of
  // each chunk, and `masters` and the moments cover that range alone; an empty `shards` is every chunk whole.
  // `parameterShards` (ZeRO-3: the parameters themselves are sharded): per chunk, the 16-bit (or fp32) tensor
  // holding the range's parameter values, written by the update instead of the chunk.
  // `homes` (per chunk; empty: all on the device) is each chunk's optimizer-state tier (zero/Store.h). Off
  // the device the CPU updates the state, from the chunk's gradients copied to the host, and the new
  // parameter values are copied back into the chunk: host state lives in host memory, SSD state in `nvme`'s
  // file and passes through two buffer sets of one chunk range, read ahead and written behind (NOTE [SSD
  // tier] in zero/NvmeTier.h). An fp32 chunk off the device gets an fp32 master there, its parameters being
  // the device's copy.
  AdamW(const zero::ChunkManager& chunks, std::vector<Tensor> masters, const AdamWConfig& config,
        std::vector<zero::ShardRange> shards = {}, std::vector<Tensor> parameterShards = {},
        std::vector<zero::Tier> homes = {}, zero::NvmeTier* nvme = nullptr);
  ~AdamW() override;

  // One update with learning rate `lr` from each parameter's .grad() times `gradScale` (a device fp32 scalar,
  // e.g. the clipping coefficient; undefined for 1). Parameters without a gradient are skipped.
  void step(double lr, const Tensor& gradScale = Tensor());
  // The chunked form's update from flat fp32 gradients, one per chunk: either the chunk's whole (padded)
  // gradient buffer or just its shard's range. Every element of the range is updated.
  void stepChunks(double lr, const std::vector<Tensor>& gradients,
                  const Tensor& gradScale = Tensor()) override;
  // Each chunk's gradients over this optimizer's range in `gradients` (as stepChunks takes them), one flat
  // view per parameter piece in layout order: the global gradient norm's terms, in an order that does not
  // depend on how the parameters are split into shards (only on where the shard boundaries fall).
  std::vector<Tensor> gradientPieces(const std::vector<Tensor>& gradients) const;
  void zeroGrad();

  int64_t stepCount() const override { return step_; }
  // Wall seconds the last stepChunks spent on chunks off the device.
  double offDeviceSeconds() const override { return offDeviceSeconds_; }
  // The last stepChunks' off-device seconds by phase: gradients to the host, the CPU kernel, parameters back
  // to the device, and waiting for the SSD's reads and writes (what read-ahead did not hide).
  // With the pipelined update: the time the CPU lane waited for gradients and for staging to be free, its
  // kernel time, the time the step waited for the GPU lane after the CPU lane ran out of pieces, and the
  // share of the off-device elements the GPU lane updated.
  using OffloadPhases = optim::OffloadPhases;
  // The pipelined update's GPU lane depth (NOTE [Pipelined update]).
  static constexpr int kGpuLaneDepth = 3;
  OffloadPhases offloadPhases() const override { return phases_; }
  // fp32, or 16-bit gradient buffers (precision.grad_accum_dtype): the kernels widen them as they read.
  bool acceptsGradients(DType dtype) const override {
    return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16;
  }
  void setStepCount(int64_t s) override { step_ = s; }
  // Whether stepChunks reads the next SSD chunk's state while it updates the current one (the default), or
  // reads each when it comes to it, through one buffer set (the same values, for tests and measurements).
  void setSsdReadAhead(bool on) { readAhead_ = on; }
  const AdamWConfig& config() const { return config_; }
  // Optimizer state for checkpoints: per chunk "exp_avg.<chunk>" and "exp_avg_sq.<chunk>" (flat, in
  // momentsDType), or per parameter "m.<param>" and "v.<param>".
  std::vector<std::pair<std::string, Tensor>> namedState() const;
  // The fp32 master of each parameter by name (views into the chunks' masters; the parameters themselves
  // when they are fp32): what a checkpoint saves as the model.
  std::vector<std::pair<std::string, Tensor>> namedMasters() const;
  // Rounds every master into its 16-bit parameter (after the masters were loaded); nothing for fp32.
  void writeParameters() override;
  // Whether chunk c's fp32 values are separate from its parameters (16-bit chunks, or state on the host).
  bool hasMaster(size_t c) const override { return c < masters_.size() && masters_[c].defined(); }
  // NOTE [Delayed SSD update]: waits for a delayed SSD update still running (its state is then final, its
  // parameters pending) and rethrows the worker's error; finishDelayed() also writes every pending parameter
  // into the chunks. Nothing when none is running or pending.
  void waitDelayed() override;
  void finishDelayed() override;
  Tensor pendingParameters(size_t c) override;
  bool deferParameters(size_t c, const Tensor& values) override;
  // Moves chunk c's optimizer state from the host or the SSD to `device` (the memory tracer's promotion):
  // its master, m and v become device tensors updated by the device's kernel, and its pending parameters go
  // into the chunk at once. An fp32 chunk's parameters become their own master again.
  void moveToDevice(size_t c, Device device) override;
  zero::Tier home(size_t c) const override { return c < homes_.size() ? homes_[c] : zero::Tier::Device; }
  // The chunked form's flat buffers, per chunk over its range: masters (undefined where the parameters are
  // their own), m and v (all three undefined for chunks on the SSD); the ranges.
  const std::vector<Tensor>& masterFlats() const override { return masters_; }
  const std::vector<Tensor>& firstMoments() const { return m_; }
  const std::vector<Tensor>& secondMoments() const { return v_; }
  const std::vector<zero::ShardRange>& ranges() const override { return ranges_; }
  // ChunkOptimizer: "exp_avg" (m) and "exp_avg_sq" (v), elementwise; the bytes of master, m and v.
  std::vector<ChunkStateField> chunkState(size_t c) const override;
  uint64_t stateBytes(size_t c) const override;
  uint64_t deviceStateBytes(size_t c) const override;

 private:
  ops::AdamWHyper hyper(double lr) const;
  struct Slot {
    std::string name;
    Tensor param, master, m, v;  // master: the parameter itself when it is fp32
    float weightDecay;
    // Chunked form: the piece [begin, end) of chunk `chunk` (a whole parameter, or the part of one inside the
    // range); param is then the piece's 16-bit view.
    size_t chunk = 0;
    int64_t begin = 0, end = 0;
    Shape shape, strides;  // of the piece (the parameter's, or flat)
  };
  AdamWConfig config_;
  std::vector<Slot> slots_;
  // The host-homed chunks' update: gradients to the host, the CPU kernel, parameters back.
  // An off-device chunk's master, m and v as host tensors.
  using HostState = StateTensors;
  void stepHostChunk(size_t c, const ops::AdamWHyper& h, const std::vector<Tensor>& gradients,
                     const Tensor& hostScale, const HostState& st);
  // Chunk c's state: its own (host tier), or read from the SSD into the first buffer set (outside a step).
  HostState hostState(size_t c);
  std::vector<Tensor> masters_, m_, v_;  // per chunk (chunked state only)
  std::vector<zero::ShardRange> ranges_;
  std::vector<zero::Tier> homes_;  // per chunk
  zero::NvmeTier* nvme_ = nullptr;
  SsdBuffers ssdBuffers_;  // two sets of an SSD chunk's master, m and v (NOTE [SSD tier])
  bool readAhead_ = true;
  std::vector<Tensor> paramFlats_;  // per chunk: the range's parameter values (device), for host chunks
  std::vector<std::vector<size_t>> slotsOf_;  // per chunk: its slots
  // Page-locked staging for the host chunks' transfers (gradients out, parameters back), bounded: one chunk
  // range's worth, made on first use.
  std::unique_ptr<PinnedHostPool> staging_;
  Tensor staged(const Shape& shape, DType dtype);
  // NOTE [Pipelined update]: the off-device update in pieces over two lanes.
  struct Piece {
    size_t chunk;
    int64_t begin, end;  // elements of the chunk (not of its range)
  };
  // `ssdAcquire(k)` waits for the k-th SSD chunk's state (in chunk order) and returns its buffers;
  // `ssdRelease(k, state)` writes them back behind. False (nothing done) when the lanes' staging could not be
  // page-locked: the caller then runs the sequential update.
  bool stepOffDevicePipelined(const ops::AdamWHyper& h, const std::vector<Tensor>& gradients,
                              const Tensor& gradScale, const Tensor& hostScale,
                              const std::function<HostState(size_t)>& ssdAcquire,
                              const std::function<void(size_t, const HostState&)>& ssdRelease);
  // The kernel's sets for elements [p.begin, p.end) of chunk p.chunk: master, m and v from `state` (over
  // the chunk's range, or over the piece when `statePiece`), gradients from `grads` (the chunk's gradient
  // buffer as stepChunks takes it, or the piece's when `gradsPiece`), the 16-bit copy into `copy` (over the
  // piece; undefined: none).
  std::vector<ops::AdamWTensors> pieceSets(const Piece& p, const HostState& state, bool statePiece,
                                           const Tensor& grads, bool gradsPiece, const Tensor& copy) const;
  // Zeroes the elements of `params` (over the piece) that no parameter covers.
  void zeroPieceGaps(const Piece& p, const Tensor& params) const;
  struct Lanes;  // the lanes' streams, staging and scratch, made on first use
  std::unique_ptr<Lanes> lanes_;
  // NOTE [Delayed SSD update]: the pending update of the SSD chunks, and starting one.
  struct Delayed;
  std::unique_ptr<Delayed> delayed_;
  void startDelayed(const ops::AdamWHyper& h, const std::vector<Tensor>& gradients, const Tensor& hostScale);
  bool delaysSsd() const { return config_.delayedSsdUpdate && nvme_ != nullptr; }
  bool hostPinned_ = false;  // every host chunk's state is page-locked (the GPU lane may run)
  int64_t step_ = 0;
  double offDeviceSeconds_ = 0;
  OffloadPhases phases_;
};

// The global L2 norm of the gradients, as an fp32 scalar on `device` (no host sync).
Tensor gradNorm(const std::vector<Tensor>& parameters, Device device);
// min(1, maxNorm / (norm + 1e-6)) as an fp32 scalar on norm's device; pass it to AdamW::step to clip.
Tensor clipCoefficient(const Tensor& norm, double maxNorm);

}  // namespace strata::optim
