// The chunk manager: parameters as views into a few chunk buffers, with flat gradient buffers beside them.
//
// NOTE [Chunk lifetime]
// The manager moves every parameter, in first-use order, into chunks planned by planChunks (ChunkLayout.h)
// in the compute dtype: each chunk is one storage, and each parameter's TensorImpl is re-pointed at its slot
// of its chunk (storage, offset and dtype swapped), so the tensors that modules, the optimizer and the
// checkpoints hold stay the same objects and see the chunk's bytes. When the compute dtype is 16-bit the
// parameters' fp32 values become the chunks' fp32 masters, handed to the optimizer (takeMasters); with an
// fp32 compute dtype a parameter is its own master. Each chunk also has a flat gradient buffer (fp32, or the
// parameters' dtype when wider) that its parameters' .grad are views into (NOTE [Gradient buffers] in
// strata/autograd/Node.h): micro-batches accumulate there without allocating. The buffer is made when the
// step's first gradient reaches the chunk in backward and released after the update (releaseGradients), so
// gradients hold memory only while activations are being freed, as per-tensor gradients did; a chunk whose
// gradients have a home in host memory releases its buffer as soon as they are copied there, in the step's
// last backward (NOTE [Gradient homes] in zero/GradientReducer.h). The move goes
// chunk by chunk, releasing each parameter's old storage as soon as it is copied, so it needs about one chunk
// of extra memory beyond the final state.
//
// A chunk's parameter bytes move as a whole: evict(i) marks them not resident (touching a parameter then
// throws, naming the chunk), and repoint(i, data, device) points them at bytes elsewhere; moving bytes is not
// writing them, so neither looks like an in-place write to a backward that saved a parameter (StorageImpl's
// content version vs residency version). Chunks are allocated at the size their parameters use (not the
// layout's capacity), so chunking costs no memory; at stage 3 the chunks gathered whole live in the
// fixed-size slots of the chunk arena (zero/ChunkArena.h).
//
// NOTE [Chunk gradients complete]
// ZeRO reduces a chunk's gradients once they are final for the step. The manager counts its parameters'
// gradient-complete notices per backward pass (each parameter hears exactly once per pass, used or not:
// NOTE [Backward passes] in strata/autograd/Engine.h); in the pass of the step's last micro-batch
// (beginBackward(true)), a chunk whose every parameter has heard is announced to the callback at once, while
// backward goes on. Chunks still short at the end of that pass (a parameter outside every module call) are
// announced by an end-of-backward callback, so each chunk completes exactly once per step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/Tensor.h"
#include "strata/zero/ChunkLayout.h"

namespace strata::nn {
class Module;
}

namespace strata::zero {

// Elements [begin, end) of a chunk: one rank's shard.
struct ShardRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// Parameters in families of their own chunks (planChunks), each family sharded over its own ranks: under
// expert parallelism the experts' chunks are sharded over their expert-data-parallel group, the others
// over all ranks.
struct ChunkFamilies {
  std::function<int(const std::string& name)> of;  // a parameter's family (0: the default)
  std::vector<int> shards;                         // by family; family 0's is the `shards` argument
};

// NOTE [Sharded layout]
// A model built with deferred parameters (NOTE [Deferred parameters] in nn/DeferredInit.h) has the same
// starting values on every rank, made from the seed wherever they are asked for, so no rank needs the whole
// of what it keeps a shard of. Given its place among each family's shards, the manager makes the fp32
// masters over this rank's shard of each chunk only (ZeRO stages 1 to 3: the masters the optimizer keeps),
// and with `parameters` the 16-bit values over that shard only too (stage 3: takeParameterShards), each
// chunk's storage left not resident until it is gathered. A rank of N then holds 1/N of the masters, and at
// stage 3 1/N of the parameters, from the start: what a rank can start is bounded by its shard of the state,
// not by the whole model.
struct ShardedLayout {
  std::vector<int> familyRanks;  // this rank's place among each family's shards
  bool parameters = false;       // the parameters' shards only (stage 3)
};

class ChunkManager {
 public:
  // Moves `parameters` (name and tensor, in first-use order, all of one dtype and device; a repeated name is
  // placed once) into chunks of `chunkBytes` of `compute` dtype (the parameters' own dtype when undefined).
  // With `shards` > 1 (ZeRO over that many ranks) each chunk's storage, masters and gradient buffer are
  // padded with zeros to a multiple of `shards` elements, so the chunk splits into equal shards.
  // The fp32 masters of 16-bit chunks are made on `masterDevice` (default: the parameters' device) while
  // their running total, in chunk order, stays within `masterDeviceBytes`, and the rest on the parameters'
  // device: the host takes what the device cannot, for a model whose masters and chunks would not fit on
  // the device together.
  // `families`: parameters of other families go into chunks of their own, padded and split for their
  // family's shard count. `sharded`: this rank's shards only (NOTE [Sharded layout]).
  ChunkManager(const std::vector<std::pair<std::string, Tensor>>& parameters, int64_t chunkBytes,
               std::optional<DType> compute = std::nullopt, int shards = 1,
               std::optional<Device> masterDevice = std::nullopt, const ChunkFamilies& families = {},
               uint64_t masterDeviceBytes = UINT64_MAX, const std::optional<ShardedLayout>& sharded = {});
  ~ChunkManager();
  ChunkManager(const ChunkManager&) = delete;
  ChunkManager& operator=(const ChunkManager&) = delete;

  const ChunkLayout& layout() const { return layout_; }
  size_t numChunks() const { return chunks_.size(); }
  DType dtype() const { return layout_.dtype; }
  // Chunk i's storage and its elements as one flat tensor (its used length).
  const Storage& storage(size_t i) const { return chunks_[i]; }
  Tensor flat(size_t i) const;
  // The same over the padded length, and that length; shard `rank` of chunk i.
  Tensor paddedFlat(size_t i) const;
  int64_t paddedElems(size_t i) const;
  // The shards of family 0's chunks, and of chunk i (its family's).
  int shards() const { return shards_; }
  int shards(size_t i) const { return chunkShards_[i]; }
  int family(size_t i) const { return layout_.chunks[i].family; }
  // Shard `rank` (of chunk i's family's shards(i)) of chunk i.
  ShardRange shard(size_t i, int rank) const;
  // Chunk i's flat gradient buffer (the padded length; bytes between parameters are never written), made by
  // the first gradient of a step that reaches the chunk; undefined before that and after releaseGradients.
  const Tensor& gradients(size_t i) const;
  // Drops every parameter's gradient and the chunks' gradient buffers (after the update: their memory goes
  // back to the allocator until the next backward).
  void releaseGradients();
  // Chunk i's alone; and its gradient buffer, made now if no gradient has reached it yet.
  void releaseGradients(size_t i);
  Tensor ensureGradients(size_t i);
  // The gradient buffers' dtype: fp32 for 16-bit chunks unless set here to the chunks' own dtype (half the
  // memory; micro-batches and repeated uses then accumulate in 16 bits). Only while no buffer exists.
  void setGradientDType(DType dtype);
  DType gradientDType() const;
  // Bytes of chunk i's parameters (its used length).
  size_t bytes(size_t i) const;
  // The parameters of chunk i, in slot order, and every parameter in layout order.
  std::vector<Tensor> parameters(size_t i) const;
  const std::vector<Tensor>& parameters() const { return params_; }

  // The fp32 masters of 16-bit chunks, one flat tensor per chunk (empty when the chunks hold fp32); the
  // first call moves them out, to their owner, the optimizer.
  std::vector<Tensor> takeMasters();
  // Under a sharded layout with `parameters`, this rank's shard of each chunk's 16-bit values (the chunks
  // themselves are not resident); the first call moves them out. Empty otherwise.
  std::vector<Tensor> takeParameterShards();

  void evict(size_t i);
  void repoint(size_t i, void* data, Device device);

  // NOTE [Chunk gradients complete]. The callback gets the chunk index.
  void onGradientsComplete(std::function<void(size_t)> callback);
  // Every backward pass (each micro-batch), as soon as every parameter of a chunk has heard in it: the
  // chunk's parameters are not needed again in this pass (ZeRO-3 releases the chunk).
  void onPassGradientsComplete(std::function<void(size_t)> callback);
  // Call before each micro-batch's backward; lastMicroBatch: the step's gradients are final after it.
  void beginBackward(bool lastMicroBatch);
  // Announces every chunk not yet announced in this step, outside backward: a pipeline stage's gradients are
  // final only once the schedule has run every backward and the tied embedding's copies are summed (NOTE
  // [Pipeline schedules] in train/PipelineSchedule.h), so its passes run with beginBackward(false).
  void announceGradientsComplete();

 private:
  struct Notices;
  void listen();
  struct Grads {
    DType dtype;
    Device device;
    std::vector<int64_t> elems;  // each chunk's padded length
    std::vector<Tensor> flat;
    Tensor get(size_t chunk);
  };

  static int64_t padTo(int64_t used, int shards);
  // Gives parameter k (layout order) its gradient home: a view into its chunk's buffer.
  void homeGradient(size_t k);

  int shards_ = 1;
  std::vector<int> chunkShards_;
  ChunkLayout layout_;
  std::vector<Storage> chunks_;
  std::shared_ptr<Grads> grads_;
  std::vector<Tensor> masters_;
  std::vector<Tensor> parameterShards_;  // NOTE [Sharded layout]
  std::vector<Tensor> params_;
  std::vector<int64_t> chunkOf_;  // by parameter, in layout order
  std::shared_ptr<Notices> notices_;
};

// The names of `model`'s parameters in the order their modules first run in `forward` (a pass the caller
// drives, typically one micro-batch without gradients): each module's forward pre-hook claims the module's
// own parameters (NOTE [Module calls] in nn/Module.h: every use of a parameter runs inside its module's
// call). Parameters no module claimed follow in registration order.
std::vector<std::string> recordFirstUse(nn::Module& model, const std::function<void()>& forward);

}  // namespace strata::zero
