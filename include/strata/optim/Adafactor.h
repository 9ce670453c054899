// Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost"), as HF
// transformers' `Adafactor` computes it, beside an fp32 master like AdamW (optim/AdamW.h), with the same two
// ways to hold the state and the same method names, so that both can sit behind one interface.
//
// The update of a tensor at step t (ops::adafactor has the formulas):
// - second moment with decay beta2_t = 1 - t^decayRate, of g^2 + eps1; factored for a matrix: a running
//   mean of each row (R values) and of each column (C values) instead of R x C, and g is divided by
//   sqrt(row_i / mean(row) * col_j); a tensor of rank 1 keeps a full v;
// - the update is divided by max(1, RMS(update) / clipThreshold);
// - step size: an explicit lr, or with relativeStep min(1e-2, 1/sqrt(t)) (warmupInit: min(1e-6 t,
//   1/sqrt(t))); with scaleParameter times max(eps2, RMS(master)), the RMS taken before the update;
// - an optional first moment (beta1 >= 0) of the scaled update, in fp32 or bf16 (firstMomentBf16);
// - decoupled weight decay: master *= 1 - step size x weightDecay, for parameters of rank >= 2 only (as
//   AdamW here; HF decays every parameter).
// A tensor of rank > 2 is factored as the matrix [numel / last dim, last dim] (HF factors each slice of
// its leading dims separately).
//
// What is factored, and how the state maps to pieces:
// - per parameter: each parameter of rank >= 2 is factored; its state is "v_row.<name>" [R] and
//   "v_col.<name>" [C]; a rank-1 parameter has "v.<name>"; with a first moment, "m.<name>".
// - per chunk: each parameter piece inside this rank's range (ZeRO shard) gets its own state, as one
//   tensor of its own would. A piece that is a whole parameter of rank >= 2, or whole rows of one (the rows
//   inside the range), is factored over its rows: its R is the piece's rows, C the parameter's last dim.
//   Any other piece (a rank-1 parameter, or a piece that starts or ends mid-row) keeps a full v. The
//   statistics, RMS(master) and RMS(update) are then the piece's, not the whole parameter's: a
//   parameter split across ranks is updated as its pieces would be on their own (with one rank every piece
//   is a whole parameter, and the update equals the per-parameter form's). Per chunk the state is two flat
//   buffers: "exp_avg.<chunk>" (the first moment over the range, fp32 or bf16; absent without one) and
//   "exp_avg_sq.<chunk>" (fp32: per piece in layout order, either its R row values then its C column
//   values, or its full v).
// Where the chunked form's state lives: each chunk's master and state is on the device, in host memory or
// on the SSD (its home, zero/Store.h). NOTE [Adafactor host chunks] says how host chunks are updated, NOTE
// [Adafactor SSD chunks] how SSD chunks are.
//
// NOTE [Adafactor host chunks]
// A host-resident chunk's master, m and statistics are streamed through device scratch on the compute
// stream: copied in, updated by the device's kernel (which also writes the 16-bit parameters in place), and
// copied back, one chunk after another. The copies are synchronous (page-locked, at the link's speed), so
// they do not overlap the kernels or each other's direction yet: at 30.6B the 104 GiB of host masters take
// about 5 s a step (BENCHMARKS.md). Adafactor's state beside the master is at most a quarter of AdamW's (none
// but the factored statistics without a first moment), so the PCIe link moves about 8 bytes per parameter
// each step (the master both ways) where a CPU update would read and write 12 (master, gradient, parameter)
// through host memory; the reductions of the factored second moment also stay on the GPU. Without a GPU (the
// CPU "device") the kernel updates the host tensors where they are. The bits are the device-resident
// update's: the same kernel, the same inputs.
// A chunk whose parameters are homed off the device (NOTE [Parameter homes] in zero/ParameterGatherer.h;
// its state is then off the device too) is updated the same way, and its new values go to the home: on a
// GPU the kernel rounds them into device scratch (zeroed first: the gaps between parameters stay zeros),
// which is copied into the page-locked home, or into the host staging of a chunk homed on the SSD, whose
// extent's Parameters field is then written (waiting for the write before the next chunk); without a GPU the
// kernel rounds them into the home (or the zeroed staging) directly. fp32 parameters are their master's
// values, copied whole. The bits are those of the parameters on the device. Gradients homed in host memory
// (NOTE [Gradient homes] in zero/GradientReducer.h) come to the device with the state, widened to fp32 there
// when they are 16-bit: the device's kernel reads the same values, so the bits are those of gradients kept
// on the device (the link carries them twice, out during backward and in at the update; the device holds
// them one chunk at a time).
//
// NOTE [Adafactor SSD chunks]
// An SSD-resident chunk's master, first moment and second moment are the three fields of its extent in the
// SSD tier (NOTE [SSD tier] in zero/NvmeTier.h; adafactorTierFields): the fp32 master over the range; the
// first moment over the range (none without one) in bf16 with adafactor_bf16_momentum (as it is in memory,
// moved unconverted), else in store.nvme_state_dtype; and the second moment's flat buffer (per piece its
// rows then columns, or its full v) always in fp32, as it is small (a matrix's rows plus columns). An update
// passes over the SSD chunks after the device's and the host's, through AdamW's read-ahead and write-behind
// (optim/SsdStateStream.h): chunk k + 1's fields are read into one host buffer set while chunk k is updated
// in the other, as a host chunk is (its state streamed through device scratch on a GPU, updated where it is
// without one), and written back behind. With fp32 state on the SSD the bits are the host chunks' (and so
// the device's); the buffer sets take 2 x (4 + 0, 2 or 4) bytes per element of the largest SSD range.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "strata/core/Tensor.h"
#include "strata/ops/Ops.h"
#include "strata/optim/ChunkOptimizer.h"
#include "strata/optim/SsdStateStream.h"
#include "strata/zero/ChunkLayout.h"
#include "strata/zero/ChunkManager.h"
#include "strata/zero/NvmeTier.h"

namespace strata::optim {

struct AdafactorConfig {
  double lr = 0;      // explicit step size; 0: the relative step
  double beta1 = -1;  // first moment's decay; negative: no first moment
  bool firstMomentBf16 = false;
  double decayRate = -0.8;
  double eps1 = 1e-30;         // added to g^2
  double eps2 = 1e-3;          // least parameter scale
  double clipThreshold = 1.0;  // <= 0: no update clipping
  double weightDecay = 0.0;
  bool scaleParameter = true;
  bool relativeStep = true;
  bool warmupInit = false;
  // Host-resident state is page-locked when a GPU is present (zero_optimization.pin_memory), so its copies
  // to and from the device run at the link's speed.
  bool pinHostState = true;

  // The relative step is used when asked for, or when no explicit lr is given.
  bool usesRelativeStep() const { return relativeStep || lr <= 0; }
  bool hasFirstMoment() const { return beta1 >= 0; }
};

// Optimizer-state bytes of Adafactor for parameters of these shapes, excluding the fp32 masters: the first
// moment (4 or 2 bytes per element) and the second moment (R + C values per matrix, numel per vector).
uint64_t adafactorStateBytes(const std::vector<Shape>& shapes, const AdafactorConfig& config);
// The same for elements [range.begin, range.end) of chunk `chunk` of `layout`, cut into pieces as the
// chunked form cuts them.
uint64_t adafactorStateBytes(const zero::ChunkLayout& layout, size_t chunk, zero::ShardRange range,
                             const AdafactorConfig& config);
// The SSD tier's fields of elements `range` of chunk `chunk` (NOTE [Adafactor SSD chunks]), with
// store.nvme_state_dtype `stateDType`.
zero::NvmeTier::ChunkFields adafactorTierFields(const zero::ChunkLayout& layout, size_t chunk,
                                                zero::ShardRange range, const AdafactorConfig& config,
                                                DType stateDType);

class Adafactor final : public ChunkOptimizer {
 public:
  // fp32 parameters that are their own masters.
  Adafactor(std::vector<std::pair<std::string, Tensor>> namedParameters, const AdafactorConfig& config);
  // State per parameter piece of `chunks` (as AdamW's chunked constructor): `masters` are the chunks' fp32
  // masters (takeMasters(); empty for fp32 chunks), `shards` one range per chunk (ZeRO stage >= 1; empty:
  // every chunk whole), `parameterShards` per chunk the tensor holding the range's parameter values (ZeRO-3).
  // `homes` (per chunk; empty: all on the device): each chunk's state tier (NOTE [Adafactor host chunks]);
  // SSD chunks keep their state in `nvme`, whose extents are adafactorTierFields' (NOTE [Adafactor SSD
  // chunks]).
  Adafactor(const zero::ChunkManager& chunks, std::vector<Tensor> masters, const AdafactorConfig& config,
            std::vector<zero::ShardRange> shards = {}, std::vector<Tensor> parameterShards = {},
            std::vector<zero::Tier> homes = {}, zero::NvmeTier* nvme = nullptr);

  // One update from each parameter's .grad() times `gradScale` (device fp32 scalar, undefined for 1). `lr`
  // is the step size when the config has no relative step; with one it is ignored. Parameters without a
  // gradient are skipped.
  void step(double lr, const Tensor& gradScale = Tensor());
  // The chunked form's update from flat gradients, one per chunk: the chunk's whole (padded) gradient
  // buffer or its range's, fp32 or 16-bit (a 16-bit chunk's gradients are widened to fp32 one chunk at a
  // time).
  void stepChunks(double lr, const std::vector<Tensor>& gradients,
                  const Tensor& gradScale = Tensor()) override;
  // Each piece's gradients in `gradients` (as stepChunks takes them, fp32), one view per piece in layout
  // order; undefined for the pieces of a chunk whose gradients are undefined.
  std::vector<Tensor> gradientPieces(const std::vector<Tensor>& gradients) const;
  void zeroGrad();

  int64_t stepCount() const override { return step_; }
  void setStepCount(int64_t s) override { step_ = s; }
  const AdafactorConfig& config() const { return config_; }
  // The step size before the parameter scale at step t (1-based): the relative step, or `lr`.
  double stepSize(double lr, int64_t t) const;
  // Optimizer state in memory (the names in the header note; SSD chunks' state is the tier's).
  std::vector<std::pair<std::string, Tensor>> namedState() const;
  // The fp32 master of each parameter (piece) by name (undefined for the pieces of SSD chunks).
  std::vector<std::pair<std::string, Tensor>> namedMasters() const;
  // Rounds every master into its 16-bit parameter; nothing for fp32.
  void writeParameters() override;
  bool hasMaster(size_t c) const override { return c < masters_.size() && masters_[c].defined(); }
  // Per chunk: the masters (undefined where the parameters are their own), the first and second moments
  // (all three undefined for chunks on the SSD).
  const std::vector<Tensor>& masterFlats() const override { return masters_; }
  const std::vector<Tensor>& firstMoments() const { return m_; }
  const std::vector<Tensor>& secondMoments() const { return v_; }
  const std::vector<zero::ShardRange>& ranges() const override { return ranges_; }
  zero::Tier home(size_t c) const override { return c < homes_.size() ? homes_[c] : zero::Tier::Device; }
  // ChunkOptimizer: "exp_avg" (the first moment, elementwise, when there is one) and "adafactor_v" (the
  // second moment's flat buffer, in this optimizer's own layout); for an SSD chunk, the tier's fields.
  // Moving an SSD chunk reads its state from the tier (the caller releases the tier's extent).
  std::vector<ChunkStateField> chunkState(size_t c) const override;
  uint64_t stateBytes(size_t c) const override;
  uint64_t deviceStateBytes(size_t c) const override;
  void moveToDevice(size_t c, Device device) override;
  bool acceptsGradients(DType dtype) const override { return dtype != DType::I64; }
  // Wall seconds the last stepChunks spent on chunks off the device (host and SSD), and of them the wait for
  // the SSD (what read-ahead did not hide).
  double offDeviceSeconds() const override { return offDeviceSeconds_; }
  OffloadPhases offloadPhases() const override { return phases_; }
  // Whether the state of piece (or parameter) i, in layout order, is factored.
  bool factored(size_t i) const { return slots_.at(i).rows > 0; }
  // Whether stepChunks reads the next SSD chunk's state while it updates the current one (the default), or
  // reads each when it comes to it, through one buffer set (the same values).
  void setSsdReadAhead(bool on) { readAhead_ = on; }
  size_t numPieces() const { return slots_.size(); }

 private:
  ops::AdafactorHyper hyper(double lr) const;
  struct Slot {
    std::string name;
    Tensor param, master, m, v, row, col;  // master: the parameter itself when it is fp32
    float weightDecay = 0;
    size_t chunk = 0;
    int64_t begin = 0, end = 0;  // chunked form: the piece [begin, end) of chunk `chunk`
    Shape shape, strides;
    // The second moment: R rows and C columns (rows 0: a full v), from element vAt of the chunk's buffer.
    int64_t rows = 0, cols = 0, vAt = 0;
  };
  ops::AdafactorTensors tensorsOf(const Slot& s, const Tensor& grad) const;
  // Chunk c's slots as views into its masters_, m_ and v_ (or its parameters, for their own masters).
  void bindSlots(size_t c);
  // The kernel's sets of chunk c with its state off the device in `state` (its range's master and first
  // moment, its second moment's buffer), writing the parameters unless `copyParameters` is false: into the
  // chunk's own, or into `parametersOut` (the range's values, flat) where it is defined.
  std::vector<ops::AdafactorTensors> offDeviceSets(size_t c, const StateTensors& state,
                                                   const std::vector<Tensor>& grads, bool copyParameters,
                                                   const Tensor& parametersOut) const;
  // Chunk c's update alone: its gradients widened to fp32 when they are not; its state off the device in
  // `state` (host memory or an SSD buffer set) streamed through device scratch on a GPU (NOTE [Adafactor
  // host chunks]).
  void stepChunk(size_t c, const ops::AdafactorHyper& h, const Tensor& gradients, const Tensor& gradScale,
                 const StateTensors& state);
  AdafactorConfig config_;
  std::vector<Slot> slots_;
  std::vector<Tensor> masters_, m_, v_;  // per chunk (chunked form only)
  std::vector<zero::ShardRange> ranges_;
  std::vector<zero::Tier> homes_;             // per chunk
  std::vector<Tensor> paramFlats_;            // per chunk: the range's parameter values
  std::vector<std::vector<size_t>> slotsOf_;  // per chunk: its slots
  std::vector<int64_t> secondElems_;          // per chunk: its second moment's elements
  Device device_ = Device::cpu();             // the compute device (the chunks')
  // Device scratch for a host chunk's master, m and v, and for the new 16-bit parameters of a chunk homed
  // off the device.
  Tensor scratch_[4];
  zero::NvmeTier* nvme_ = nullptr;
  SsdBuffers ssdBuffers_;  // NOTE [Adafactor SSD chunks]: two sets of an SSD chunk's state
  bool readAhead_ = true;
  int64_t step_ = 0;
  double offDeviceSeconds_ = 0;
  OffloadPhases phases_;
};

}  // namespace strata::optim
