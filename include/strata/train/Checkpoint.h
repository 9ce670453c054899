// Checkpoints.
//
// A checkpoint is a directory <save>/step-<N>/ holding, per rank, model and optimizer safetensors shards
// (model-rank<r>.safetensors, optimizer-rank<r>.safetensors) and a JSON manifest: the step, RNG and data
// position, the config, the model section's effective values, the shard list, and a CRC32C and size per file.
//
// NOTE [Checkpoint durability]
// A checkpoint is written to <save>/step-<N>.tmp; every file and the directory are fsynced, the directory is
// renamed into place, and only then is <save>/latest rewritten (also by rename). A crash at any point leaves
// the previous checkpoint intact and `latest` pointing at it; the next run removes the leftover `.tmp`
// directories. Loading verifies every file's CRC32C against the manifest before it trusts a byte, so a
// corrupted or truncated file is named instead of trained on. No tensor holding a NaN or an infinity is ever
// saved: the save fails instead, naming the tensor.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/Generator.h"
#include "strata/core/Tensor.h"
#include "strata/nn/TensorParallel.h"
#include "strata/zero/ChunkLayout.h"

namespace strata::train {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The size and CRC32C of a written file.
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// A tensor a save writes, produced only when the writer reaches it: a live tensor, or state read from the
// SSD tier then, so a save holds one tensor in memory at a time.
struct SaveTensor {
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
  std::function<Tensor()> value;
};
using SaveTensors = std::vector<SaveTensor>;
SaveTensors toSave(const NamedTensors& tensors);

// safetensors: 8-byte little-endian header length, a JSON header (dtype, shape, data_offsets per tensor, plus
// string "__metadata__"), then the raw bytes. The file is fsynced. With requireFinite, a floating tensor
// holding a NaN or an infinity stops the write before the file is created, naming the tensor.
FileDigest writeSafetensors(const std::string& path, const NamedTensors& tensors,
                            const std::map<std::string, std::string>& metadata = {},
                            bool requireFinite = false);
FileDigest writeSafetensors(const std::string& path, const SaveTensors& tensors,
                            const std::map<std::string, std::string>& metadata, bool requireFinite);
// Reads every tensor to `device`; fills `metadata` when given. A malformed file is an error naming it.
std::map<std::string, Tensor> readSafetensors(const std::string& path, Device device = Device::cpu(),
                                              std::map<std::string, std::string>* metadata = nullptr);

// One tensor of a safetensors file as its header describes it; begin/end are absolute file offsets.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};
// The header of a safetensors file (no tensor data is read); fills `metadata` when given.
std::vector<SafetensorsEntry> readSafetensorsHeader(const std::string& path,
                                                    std::map<std::string, std::string>* metadata = nullptr);

struct CheckpointState {
  int64_t step = 0;                           // iterations completed
  int64_t optimizerSteps = 0;                 // AdamW's step count (bias correction)
  GeneratorState rng;                         // the default generator (dropout)
  int64_t dataIndex = 0;                      // next training batch index
  double lossScale = 0;                       // fp16's dynamic loss scale (0: none)
  int64_t lossScaleGoodSteps = 0;             // and its count of good steps since the scale last changed
  std::map<std::string, std::string> config;  // the keys the run set
  // The effective value of every model.* key (config/Config.h's effectiveValues), checked on resume.
  std::map<std::string, std::string> model;
  // Where each parameter lives: its chunk, offset, numel, shape and the chunks' dtype (empty when the run
  // had not laid out chunks yet).
  zero::ChunkLayout layout;
  int worldSize = 1;     // ranks that wrote the checkpoint
  bool chunked = false;  // the tensors are chunk pieces (NOTE [Sharded chunk checkpoints])
  // The run that wrote it (NOTE [Run lineage] in train/Run.h; "" in checkpoints older than run ids), and the
  // effective value of every config key, what a resume starts from (empty in older checkpoints).
  std::string runId;
  std::map<std::string, std::string> effective;
  // A tensor-parallel run's (parallel.tensor > 1): how each sliced parameter was cut, so that the readers
  // of whole parameters join the tensor ranks' slices (NOTE [Tensor-parallel checkpoints] in
  // train/CheckpointPieces.h). Empty otherwise.
  std::map<std::string, nn::TensorSlice> tensorSlices;
};

// The ranks that save one checkpoint together, and the two collectives the save needs. single() is one rank;
// the distributed context supplies real ones (MPI or NCCL), and tests can use threads.
struct CheckpointGroup {
  int rank = 0, worldSize = 1;
  std::function<void()> barrier;
  // Every rank's `text`, in rank order, on every rank.
  std::function<std::vector<std::string>(const std::string&)> allGather;
  static CheckpointGroup single();
};

// Writes a checkpoint under `saveDir` with every rank of `group` calling it: rank 0 owns the temporary
// directory, the manifest and `latest`; each rank writes only its own shard files (model-rank<r>,
// optimizer-rank<r>), and the collectives order it all (NOTE [Checkpoint durability]). Returns the step
// directory on every rank once the checkpoint is complete. A failure on any rank (a non-finite tensor, a full
// disk) fails the save on every rank with the same message and leaves the previous checkpoints as they were.
std::string saveCheckpoint(const std::string& saveDir, const NamedTensors& model,
                           const NamedTensors& optimizer, const CheckpointState& state,
                           const CheckpointGroup& group = CheckpointGroup::single());
std::string saveCheckpoint(const std::string& saveDir, const SaveTensors& model, const SaveTensors& optimizer,
                           const CheckpointState& state,
                           const CheckpointGroup& group = CheckpointGroup::single());

// The saved state of the checkpoint `path` refers to (manifest only; no tensor is read).
CheckpointState readCheckpointState(const std::string& path);
// Resolves `path` (a step directory, or a save directory with a `latest` file), verifies its files' checksums
// and loads it into the given tensors in place. Every model tensor must be present with the same shape, and
// the checkpoint may hold no model tensor the model lacks (both are listed in the error). With
// `loadOptimizer` false only the model is read. `rank` picks the shard (the same world size). Returns the
// saved state.
CheckpointState loadCheckpoint(const std::string& path, const NamedTensors& model,
                               const NamedTensors& optimizer, bool loadOptimizer = true, int rank = 0);
// Every model tensor of a checkpoint, merged across the shards its manifest lists (on the CPU), checksums
// verified; a tensor-parallel run's slices joined into whole parameters under their own names.
std::map<std::string, Tensor> loadModelShards(const std::string& path);
// A chunk layout as the manifest writes it (JSON text), and back (`where` names it in errors).
std::string chunkLayoutText(const zero::ChunkLayout& layout);
zero::ChunkLayout chunkLayoutFromText(const std::string& text, const std::string& where);
// Streams the model tensors of the checkpoint `path` (all shards, checksums verified) into one safetensors
// file `output`, each renamed by `rename` when given, in name order (a tensor-parallel run's slices joined,
// as loadModelShards does). One tensor is in memory at a time, so the peak stays at the largest tensor (with
// its slices), not the model. The output is written atomically.
struct MergeStats {
  size_t tensors = 0;
  uint64_t bytes = 0;            // tensor bytes written
  uint64_t peakBufferBytes = 0;  // the largest buffer held
};
MergeStats mergeModelShards(const std::string& path, const std::string& output,
                            const std::function<std::string(const std::string&)>& rename = {},
                            const std::map<std::string, std::string>& metadata = {});
// The step directory `path` refers to.
std::string resolveCheckpoint(const std::string& path);

// NOTE [Sharded chunk checkpoints]
// The trainer saves the model state as pieces of its chunks (zero/ChunkLayout.h), without gathering anything:
// each rank writes, for every chunk, the elements its ZeRO shard covers, cut at the chunk's used length, in
// fp32 — "param.<c>@<begin>" (the fp32 masters, or fp32 parameters) in model-rank<r>.safetensors, and
// "exp_avg.<c>@<begin>", "exp_avg_sq.<c>@<begin>" in optimizer-rank<r>.safetensors. A save so moves every
// byte once and holds nothing beyond the rank's own state; the manifest's layout says where each parameter
// lies. ChunkCheckpointReader finds any range of any parameter among all the ranks' pieces, so a checkpoint
// loads at any world size and any chunk size (resharding by parameter name), and `strata convert` streams it
// one parameter at a time. An optimizer's state in a layout of its own (Adafactor's factored second moment,
// "adafactor_v.<c>@<begin>") is saved the same way but reloads only into the same chunks and shards. With a
// delayed SSD update pending, "delayed_param.<c>@<begin>" pieces hold the parameters that lag their masters
// (NOTE [Delayed update checkpoints] in train/CheckpointPieces.h), and under PowerSGD "powersgd.<c>@<begin>"
// pieces each rank's Q matrices and error feedback of chunk c (begin: its shard's), which reload only into
// the same chunks, ranks and dist.powersgd_rank. Checkpoints of the older form (whole per-parameter tensors,
// whole per-chunk moments "exp_avg.<c>") read through the same reader.
std::string chunkPieceName(const std::string& kind, int64_t chunk, int64_t begin);

class ChunkCheckpointReader {
 public:
  // Reads the manifest and the safetensors headers of the checkpoint `path` refers to. Each file's CRC32C is
  // verified the first time one of its bytes is needed.
  explicit ChunkCheckpointReader(const std::string& path);
  ~ChunkCheckpointReader();
  ChunkCheckpointReader(const ChunkCheckpointReader&) = delete;
  ChunkCheckpointReader& operator=(const ChunkCheckpointReader&) = delete;

  const std::string& directory() const { return dir_; }
  const CheckpointState& state() const { return state_; }
  // True when the checkpoint holds the optimizer's moments (AdamW's exp_avg and exp_avg_sq).
  bool hasOptimizer() const;
  // True when it holds chunk pieces of `kind`.
  bool hasKind(const std::string& kind) const;
  // A piece of a kind in an optimizer's own layout (Adafactor's "adafactor_v", not one value per element):
  // the `n` values saved for chunk `chunk` by the rank whose shard began at `begin`. False when there is no
  // such piece of that length (the checkpoint was saved with other chunks or another world size).
  bool readChunkPiece(const std::string& kind, int64_t chunk, int64_t begin, int64_t n, float* dst);
  // The saved parameters, by name: shape and dtype (fp32 for chunk pieces).
  struct Parameter {
    Shape shape;
    DType dtype = DType::F32;
  };
  const std::map<std::string, Parameter>& parameters() const { return params_; }
  // The raw bytes of parameter `name` (kind "param"), whole, in its saved dtype.
  void readParameter(const std::string& name, void* dst);
  // fp32 values of elements [begin, end) of chunk `chunk` of `layout` (this run's layout, of any chunk size)
  // for `kind` ("param", "exp_avg" or "exp_avg_sq"): each parameter's part is read by name from wherever the
  // checkpoint holds it, and the gaps between parameters are zero.
  void readChunkRange(const zero::ChunkLayout& layout, const std::string& kind, int64_t chunk, int64_t begin,
                      int64_t end, float* dst);
  // As readChunkRange, for a kind saved for some elements only (the delayed update's "delayed_param", NOTE
  // [Delayed update checkpoints] in train/CheckpointPieces.h): writes those the checkpoint holds, leaves the
  // others, and returns how many it wrote.
  int64_t readSavedChunkRange(const zero::ChunkLayout& layout, const std::string& kind, int64_t chunk,
                              int64_t begin, int64_t end, float* dst);
  // Refuses a `layout` whose parameters differ from the saved ones (missing, extra or reshaped; all listed).
  void checkParameters(const zero::ChunkLayout& layout) const;

 private:
  struct Piece {
    int64_t begin = 0, end = 0;  // elements of the saved chunk
    size_t file = 0;
    uint64_t offset = 0;  // of element `begin` in the file
  };
  // Elements [begin, end) of parameter `name`'s flat values, of `kind`, as fp32; with `whole` every one of
  // them must be saved, else those saved are read. Returns how many were read.
  int64_t readParameterRange(const std::string& kind, const std::string& name, int64_t begin, int64_t end,
                             float* dst, bool whole = true);
  void readBytes(size_t file, uint64_t offset, size_t bytes, void* dst);

  std::string dir_;
  CheckpointState state_;
  bool chunked_ = false;
  std::vector<std::string> files_;
  std::vector<int> fds_;
  std::vector<bool> verified_;
  std::map<std::string, FileDigest> digests_;  // by file name, from the manifest
  std::map<std::string, Parameter> params_;
  // Chunk pieces by kind and saved chunk (sorted by begin); whole parameter tensors of the older form.
  std::map<std::string, std::map<int64_t, std::vector<Piece>>> pieces_;
  std::map<std::string, std::pair<size_t, SafetensorsEntry>> wholeParams_;
};

// Removes what failed saves left in `saveDir` (step-<N>.tmp directories, latest.tmp); returns their names.
std::vector<std::string> removeStaleTemporaries(const std::string& saveDir);
// Deletes the oldest step-<N> directories of run `runId` in `saveDir` so that `keep` of that run remain (0:
// keep all), never the one `latest` names; another run's checkpoints are never touched. Returns the removed
// names.
std::vector<std::string> pruneCheckpoints(const std::string& saveDir, int64_t keep, const std::string& runId);

}  // namespace strata::train
