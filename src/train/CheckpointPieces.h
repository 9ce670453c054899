// Private to the step engine: this rank's model and optimizer state as checkpoint pieces (NOTE [Sharded
// chunk checkpoints] in train/Checkpoint.h), and the load of them from a checkpoint of any world size and
// chunk size. Pieces are views into the live state (or, for SSD-resident state, reads of the tier when the
// writer reaches them); no collective.
//
// NOTE [Expert-parallel checkpoints]
// Under expert parallelism the ranks' layouts differ in their expert chunks: the same shapes, other experts.
// A checkpoint's manifest records one layout of the whole model: this rank's chunks, the expert chunks
// holding expert-parallel rank 0's experts, followed by the expert chunks of ranks 1, 2, ... (their experts'
// names). Each rank saves its pieces under its chunks' indices in that layout, so the pieces of different
// experts never share a name. Every piece is found by parameter name, so the checkpoint loads at any
// expert-parallel size (one included), world size and chunk size, and `strata convert` sees every expert.
//
// NOTE [Tensor-parallel checkpoints]
// Under tensor parallelism (NOTE [Tensor parallelism] in nn/TensorParallel.h) the ranks of a tensor-parallel
// group hold different slices under the same names. The manifest's layout holds every tensor rank's chunks:
// tensor rank t's chunk c at index t x chunks + c, its parameters named "tp<t>/<name>" (the whole ones too,
// one copy per tensor rank). So such a checkpoint loads only at its parallel.tensor (the trainer refuses
// another, naming the checkpoint's), at any data-parallel size and chunk size as usual.
//
// NOTE [Pipeline checkpoints]
// Under pipeline parallelism (NOTE [Pipeline stages] in nn/Pipeline.h) each stage holds other parameters in
// chunks of its own. The manifest's layout joins them: stage 0's chunks, then stage 1's, and so on (each as
// tensor parallelism names them), every parameter once: the last stage's copy of the tied embedding is not
// recorded, and that stage reads the first stage's pieces for it (the two copies are equal). The stages
// exchange their layouts once, at start. So `strata convert` and `strata generate` see one whole model, and
// a resume reloads each stage's parameters by name; the trainer takes a checkpoint only at the pipeline
// layout that saved it (parallel.pipeline, parallel.virtual_stages).
//
// NOTE [Delayed update checkpoints]
// With a delayed SSD update pending (NOTE [Delayed SSD update] in optim/AdamW.h) a save changes nothing
// live: it waits for the worker and saves the state as every update left it (the masters, m and v, which
// `strata generate` and `convert` read), and beside it, for each chunk whose parameters lag, this rank's
// shard of the parameters as the next step's forward reads them, "delayed_param.<c>@<begin>" in the
// optimizer file (fp32; 4 bytes per SSD-resident parameter). A full load (not load_model_only) puts those
// into the chunks over the masters' values and hands the masters' values to the optimizer as pending
// (deferParameters): the next step's forward reads the stale parameters and its update first writes the
// new ones, as in the run that saved. At the world size, stage, chunk size and placement that saved it the
// resume continues that run bit for bit. Elsewhere the checkpoint loads as any does (by parameter name):
// the first step after it still reads what the saving run's would, and the updates then follow this run's
// placement, so the curve departs from the saving run's where that placement delays other chunks than it
// did (as another world size's sums do anyway). A run with store.delayed_update off writes the pending
// values at its first update, and delays nothing after that.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/optim/ChunkOptimizer.h"
#include "strata/train/Checkpoint.h"
#include "strata/zero/ChunkLayout.h"
#include "train/ModelState.h"

namespace strata::train {

class CheckpointPieces {
 public:
  // Plans the layout a checkpoint's manifest records (NOTE [Expert-parallel checkpoints]).
  explicit CheckpointPieces(ModelState& state);

  const zero::ChunkLayout& layout() const { return layout_; }
  // Chunk c's index in layout(): what its pieces are named by.
  int64_t savedIndex(size_t c) const { return savedIndex_[c]; }
  // This rank's parameters (fp32: the masters, or fp32 chunks' own values) and optimizer state; both wait
  // for a delayed SSD update first (NOTE [Delayed update checkpoints]).
  SaveTensors model() const;
  SaveTensors optimizer() const;
  // The parameters and masters, and the optimizer's state when `optimizer`.
  void load(ChunkCheckpointReader& reader, bool optimizer);

 private:
  void planLayout();
  // NOTE [Pipeline checkpoints]: the stages' layouts joined into layout_ (a collective over the stages).
  void joinStages();
  // One checkpoint piece of chunk c: its fp32 values (field Master), or (SSD chunks) a field of its state,
  // over this rank's shard when `elementwise`, else whole (the optimizer's own layout).
  SaveTensor savePiece(const char* kind, size_t c, int field, bool elementwise = true) const;
  // One of chunk c's optimizer state fields (optim::ChunkStateField) as a checkpoint piece.
  SaveTensor saveField(const optim::ChunkStateField& field, size_t c) const;
  // Refuses a checkpoint without this optimizer's state, or whose state of the optimizer's own layout does
  // not fit this run's chunks.
  void checkOptimizerState(ChunkCheckpointReader& reader) const;
  void loadDelayedParameters(ChunkCheckpointReader& reader);

  ModelState& state_;
  zero::ChunkLayout layout_;  // the whole model's layout, as the manifest records it
  // This rank's chunks named as the checkpoint names them (NOTE [Tensor-parallel checkpoints]; the chunks'
  // own layout without tensor parallelism).
  zero::ChunkLayout readLayout_;
  std::vector<int64_t> savedIndex_;  // by chunk: its index in layout_
};

}  // namespace strata::train
