// The chunk manager: parameters as views into a few chunk buffers.
//
// NOTE [Chunk lifetime]
// The manager moves every parameter, in first-use order, into chunks planned by planChunks
// (ChunkLayout.h): each chunk is one storage, and each parameter's TensorImpl is re-pointed at its slot of
// its chunk (storage and offset swapped, values copied once), so the tensors that modules, the optimizer and
// the checkpoints hold stay the same objects and see the chunk's bytes. A chunk moves as a whole: evict(i)
// marks its bytes not resident (touching a parameter then throws, naming the chunk), and repoint(i, data,
// device) points it at bytes elsewhere; moving bytes is not writing them, so neither looks like an in-place
// write to a backward that saved a parameter (StorageImpl's content version vs residency version). Chunks are
// allocated at the size their parameters use (not the layout's capacity) until the GPU arena of fixed-size
// slots exists, so chunking costs no memory.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/Tensor.h"
#include "strata/zero/ChunkLayout.h"

namespace strata::nn {
class Module;
}

namespace strata::zero {

class ChunkManager {
 public:
  // Moves `parameters` (name and tensor, in first-use order, all of one dtype and device; a repeated name is
  // placed once) into chunks of `chunkBytes`.
  ChunkManager(const std::vector<std::pair<std::string, Tensor>>& parameters, int64_t chunkBytes);

  const ChunkLayout& layout() const { return layout_; }
  size_t numChunks() const { return chunks_.size(); }
  // Chunk i's storage and its elements as one flat tensor (its used length).
  const Storage& storage(size_t i) const { return chunks_[i]; }
  Tensor flat(size_t i) const;
  // Bytes of chunk i (its used length).
  size_t bytes(size_t i) const;

  void evict(size_t i);
  void repoint(size_t i, void* data, Device device);

 private:
  ChunkLayout layout_;
  DType dtype_;
  std::vector<Storage> chunks_;
};

// The names of `model`'s parameters in the order their modules first run in `forward` (a pass the caller
// drives, typically one micro-batch without gradients): each module's forward pre-hook claims the module's
// own parameters (NOTE [Module calls] in nn/Module.h: every use of a parameter runs inside its module's
// call). Parameters no module claimed follow in registration order.
std::vector<std::string> recordFirstUse(nn::Module& model, const std::function<void()>& forward);

}  // namespace strata::zero
