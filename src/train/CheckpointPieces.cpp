#include "train/CheckpointPieces.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "strata/autograd/GradMode.h"
#include "strata/distributed/Communicator.h"
#include "strata/distributed/ProcessGroup.h"
#include "strata/ops/Ops.h"
#include "strata/zero/NvmeTier.h"

namespace strata::train {

namespace {

// Elements [a, b) of chunk state `t`: the whole padded chunk, or the shard `r` of it.
Tensor chunkRange(const Tensor& t, zero::ShardRange r, int64_t a, int64_t b) {
  int64_t base = t.numel() == r.size() ? r.begin : 0;
  return t.narrow(0, a - base, b - a);
}

// Reads a checkpoint's values of chunk state into one host buffer, as fp32: each piece of state reads the
// range of its chunk it covers (the whole padded chunk, or this rank's shard), and converts on the way in (a
// 16-bit parameter becomes its master rounded).
struct StateReader {
  ChunkCheckpointReader& reader;
  const zero::ChunkLayout& layout;
  const zero::ChunkGroups& groups;
  std::vector<float> host;

  // `numel` values from the chunk's element `begin` (-1: the shard's first when `numel` is the shard's size,
  // else 0).
  void read(int64_t numel, size_t c, const char* kind, int64_t begin = -1) {
    zero::ShardRange r = groups.shard(c);
    if (begin < 0) begin = numel == r.size() ? r.begin : 0;
    int64_t end = std::min(begin + numel, layout.chunks[c].used);
    host.assign(size_t(numel), 0.0f);
    if (begin < end) reader.readChunkRange(layout, kind, int64_t(c), begin, end, host.data());
  }
  void fill(const Tensor& t, size_t c, const char* kind) {
    read(t.numel(), c, kind);
    ops::copy(t, Tensor::fromHost(host.data(), DType::F32, host.size(), {t.numel()}, t.device()));
  }
};

// A field of chunk c's state in the optimizer's own layout (Adafactor's factored statistics), `numel`
// values into in.host: the piece saved for this chunk's range (the same layout, checked before).
void readOwnLayout(ModelState& s, StateReader& in, size_t c, const std::string& kind, int64_t numel,
                   int64_t savedIndex) {
  in.host.assign(size_t(numel), 0.0f);
  STRATA_USER_CHECK(
      in.reader.readChunkPiece(kind, savedIndex, s.optimizer->ranges()[c].begin, numel, in.host.data()),
      "checkpoint {}: its {} state does not match this run's chunks (it reloads only at the chunk size and "
      "world size it was saved with); set checkpoint.load_model_only: true to start the optimizer fresh from "
      "its weights",
      in.reader.directory(), kind);
}

// Chunk c's state on the SSD: the master and each field of the optimizer's state over its range (zero
// without `optimizer`).
void loadSsdChunk(ModelState& s, StateReader& in, size_t c, bool optimizer, int64_t savedIndex) {
  zero::ShardRange range = s.optimizer->ranges()[c];
  in.read(range.size(), c, "param", range.begin);
  s.nvme->write(c, zero::NvmeTier::Master, in.host.data());
  for (const optim::ChunkStateField& field : s.optimizer->chunkState(c)) {
    int64_t n = s.nvme->fieldElems(c, field.ssdField);
    if (!optimizer)
      in.host.assign(size_t(n), 0.0f);
    else if (field.elementwise)
      in.read(n, c, field.kind.c_str(), range.begin);
    else
      readOwnLayout(s, in, c, field.kind, n, savedIndex);
    if (n > 0) s.nvme->write(c, field.ssdField, in.host.data());
  }
}

// Chunk c's parameters, master and (with `optimizer`) optimizer state.
void loadChunk(ModelState& s, StateReader& in, size_t c, bool optimizer, int64_t savedIndex) {
  Tensor home = s.parameterHome(c);
  in.fill(home, c, "param");
  // NOTE [Parameter homes] in zero/ParameterGatherer.h: parameters homed on the SSD go into their extent.
  if (s.nvme && s.nvme->holdsParameters(c))
    s.nvme->wait(s.nvme->writeAsync(c, {{zero::NvmeTier::Parameters, home.data(), home.dtype()}}));
  if (s.optimizer->home(c) == zero::Tier::Nvme) {
    loadSsdChunk(s, in, c, optimizer, savedIndex);
    return;
  }
  if (s.optimizer->hasMaster(c)) in.fill(s.optimizer->masterFlats()[c], c, "param");
  if (!optimizer) return;
  for (const optim::ChunkStateField& field : s.optimizer->chunkState(c)) {
    if (field.elementwise) {
      in.fill(field.values, c, field.kind.c_str());
      continue;
    }
    if (field.values.numel() == 0) continue;
    readOwnLayout(s, in, c, field.kind, field.values.numel(), savedIndex);
    ops::copy(field.values, Tensor::fromHost(in.host.data(), DType::F32, in.host.size(),
                                             {field.values.numel()}, field.values.device()));
  }
}

}  // namespace

CheckpointPieces::CheckpointPieces(ModelState& state) : state_(state) {
  planLayout();
}

void CheckpointPieces::planLayout() {
  const zero::ChunkLayout& local = state_.chunks->layout();
  const ExpertNames& experts = state_.experts;
  // NOTE [Tensor-parallel checkpoints]: every tensor rank's chunks, its parameters named "tp<t>/<name>";
  // with experts split, each expert rank's expert chunks under their experts' names (after every tensor
  // rank's base chunks: tensor rank by tensor rank, expert rank by expert rank).
  bool split = state_.tensor.active();
  int tensorRanks = split ? state_.tensor.size : 1, tensorRank = split ? state_.tensor.rank : 0;
  auto onTensorRank = [split](int t, const std::string& name) {
    return split ? "tp" + std::to_string(t) + "/" + name : name;
  };
  std::map<std::string, const std::function<std::string(int)>*> byName;
  for (const auto& [name, fn] : experts.rename) byName[name] = &fn;
  auto onExpertRank = [&](const std::string& name, int rank) {
    auto it = byName.find(name);
    STRATA_CHECK(it != byName.end(), "expert chunk parameter '{}' is not an expert's", name);
    return (*it->second)(rank);
  };
  bool renames = !experts.rename.empty();
  auto isExpert = [&](size_t c) { return renames && local.chunks[c].family == 1; };
  layout_.chunks.clear();
  layout_.slots.clear();
  // Chunk c of this rank's layout as tensor rank t and (an expert chunk) expert rank q would name it.
  auto append = [&](size_t c, int t, int q) {
    int64_t index = int64_t(layout_.chunks.size());
    zero::ChunkInfo info = local.chunks[c];
    info.slots.clear();
    for (int64_t k : local.chunks[c].slots) {
      zero::ChunkSlot slot = local.slots[size_t(k)];
      slot.name = onTensorRank(t, isExpert(c) ? onExpertRank(slot.name, q) : slot.name);
      slot.chunk = index;
      info.slots.push_back(int64_t(layout_.slots.size()));
      layout_.slots.push_back(std::move(slot));
    }
    layout_.chunks.push_back(std::move(info));
    return index;
  };
  savedIndex_.assign(local.chunks.size(), 0);
  for (int t = 0; t < tensorRanks; ++t)
    for (size_t c = 0; c < local.chunks.size(); ++c) {
      int64_t index = append(c, t, 0);
      if (t == tensorRank && (!isExpert(c) || experts.rank == 0)) savedIndex_[c] = index;
    }
  if (renames)
    for (int t = 0; t < tensorRanks; ++t)
      for (int q = 1; q < experts.ranks; ++q)
        for (size_t c = 0; c < local.chunks.size(); ++c) {
          if (!isExpert(c)) continue;
          int64_t index = append(c, t, q);
          if (t == tensorRank && q == experts.rank) savedIndex_[c] = index;
        }
  readLayout_ = local;
  for (zero::ChunkSlot& slot : readLayout_.slots) slot.name = onTensorRank(tensorRank, slot.name);
  // NOTE [Pipeline checkpoints] (a pipeline has no experts: the trainer refuses MoE under it).
  if (state_.pipelineGroup) joinStages();
}

void CheckpointPieces::joinStages() {
  // NOTE [Pipeline checkpoints]. The last stage's copy of a tied parameter is left out of what it records
  // (its pieces still hold it; nothing reads them there), and read back from the first stage's.
  if (state_.pipeline.holdsLast() && !state_.pipeline.holdsFirst()) {
    std::vector<bool> tied = state_.tiedCopySlots;
    auto isTied = [&](const std::string& name) {
      for (size_t k = 0; k < tied.size(); ++k) {
        const std::string& local = state_.chunks->layout().slots[k].name;
        if (tied[k] && (name == local ||
                        (name.size() > local.size() &&
                         name.compare(name.size() - local.size() - 1, std::string::npos, "/" + local) == 0)))
          return true;
      }
      return false;
    };
    zero::ChunkLayout kept = layout_;
    kept.slots.clear();
    for (zero::ChunkInfo& info : kept.chunks) {
      info.slots.clear();
      info.payload = 0;
    }
    for (const zero::ChunkSlot& slot : layout_.slots) {
      if (isTied(slot.name)) continue;
      kept.chunks[size_t(slot.chunk)].slots.push_back(int64_t(kept.slots.size()));
      kept.chunks[size_t(slot.chunk)].payload += slot.numel;
      kept.slots.push_back(slot);
    }
    layout_ = std::move(kept);
  }
  // Every stage's layout, this stage's chunks after those of the stages before it.
  std::vector<std::string> stages =
      dist::allGatherText(state_.pipelineGroup->communicator(), chunkLayoutText(layout_));
  zero::ChunkLayout joined;
  joined.dtype = layout_.dtype;
  joined.chunkElems = layout_.chunkElems;
  int64_t offset = 0;
  for (size_t p = 0; p < stages.size(); ++p) {
    zero::ChunkLayout stage = p == size_t(state_.pipeline.rank)
                                  ? layout_
                                  : chunkLayoutFromText(stages[p], "pipeline stage " + std::to_string(p));
    if (p == size_t(state_.pipeline.rank))
      for (int64_t& index : savedIndex_) index += offset;
    for (zero::ChunkInfo info : stage.chunks) {
      std::vector<int64_t> slots;
      for (int64_t k : info.slots) {
        zero::ChunkSlot slot = stage.slots[size_t(k)];
        slot.chunk += offset;
        slots.push_back(int64_t(joined.slots.size()));
        joined.slots.push_back(std::move(slot));
      }
      info.slots = std::move(slots);
      joined.chunks.push_back(std::move(info));
    }
    offset += int64_t(stage.chunks.size());
  }
  layout_ = std::move(joined);
}

SaveTensor CheckpointPieces::savePiece(const char* kind, size_t c, int field, bool elementwise) const {
  const optim::ChunkOptimizer& chunkOptimizer = *state_.optimizer;
  zero::ShardRange r = state_.groups.shard(c);
  int64_t end = std::min(r.end, state_.chunks->layout().chunks[c].used);
  if (chunkOptimizer.home(c) == zero::Tier::Nvme) {
    // Read from the SSD when the writer reaches it: one piece in memory at a time. A field of the
    // optimizer's own layout is saved whole, named by the first element of the optimizer's range.
    zero::NvmeTier* nvme = state_.nvme.get();
    zero::NvmeTier::Field f = zero::NvmeTier::Field(field);
    int64_t whole = nvme->fieldElems(c, f);
    int64_t offset = elementwise ? r.begin - chunkOptimizer.ranges()[c].begin : 0;
    int64_t n = elementwise ? end - r.begin : whole;
    int64_t begin = elementwise ? r.begin : chunkOptimizer.ranges()[c].begin;
    return SaveTensor{
        chunkPieceName(kind, savedIndex_[c], begin), {n}, DType::F32, [nvme, c, f, offset, n, whole] {
          Tensor all = Tensor::empty({whole}, DType::F32, Device::cpu());
          nvme->read(c, f, all.data<float>());
          return all.narrow(0, offset, n);
        }};
  }
  std::string name = chunkPieceName(kind, savedIndex_[c], r.begin);
  // The fp32 values: the masters, or fp32 chunks' own parameters (their shard at stage 3); where those lag
  // their state, the values the next update writes into them (NOTE [Delayed update checkpoints]).
  STRATA_CHECK(field == zero::NvmeTier::Master, "savePiece: chunk {}'s state is not on the SSD", c);
  Tensor pending = chunkOptimizer.hasMaster(c) ? Tensor() : state_.optimizer->pendingParameters(c);
  Tensor values = chunkOptimizer.hasMaster(c) ? chunkOptimizer.masterFlats()[c]
                  : pending.defined()         ? pending
                                              : state_.parameterHome(c);
  Tensor t = chunkRange(values, r, r.begin, end);
  return SaveTensor{name, t.shape(), t.dtype(), [t] { return t; }};
}

SaveTensor CheckpointPieces::saveField(const optim::ChunkStateField& field, size_t c) const {
  // Elementwise fields as the masters (this rank's shard, cut at the used length); the optimizer's own
  // layouts whole, named by the first element of the optimizer's range. Saved in fp32 (a bf16 first moment
  // is widened when the writer reaches it).
  zero::ShardRange r = state_.groups.shard(c);
  Tensor t = field.values;
  int64_t begin = field.elementwise ? r.begin : state_.optimizer->ranges()[c].begin;
  if (field.elementwise)
    t = chunkRange(t, r, r.begin, std::min(r.end, state_.chunks->layout().chunks[c].used));
  return SaveTensor{chunkPieceName(field.kind, savedIndex_[c], begin), t.shape(), DType::F32,
                    [t] { return t.dtype() == DType::F32 ? t : ops::to(t, Device::cpu(), DType::F32); }};
}

SaveTensors CheckpointPieces::model() const {
  state_.optimizer->waitDelayed();  // NOTE [Delayed update checkpoints]: the state final, nothing written
  SaveTensors out;
  for (size_t c = 0; c < state_.chunks->numChunks(); ++c) {
    zero::ShardRange r = state_.groups.shard(c);
    if (r.begin < std::min(r.end, state_.chunks->layout().chunks[c].used))
      out.push_back(savePiece("param", c, zero::NvmeTier::Master));
  }
  return out;
}

SaveTensors CheckpointPieces::optimizer() const {
  optim::ChunkOptimizer& chunkOptimizer = *state_.optimizer;
  chunkOptimizer.waitDelayed();
  SaveTensors out;
  for (size_t c = 0; c < state_.chunks->numChunks(); ++c) {
    zero::ShardRange r = state_.groups.shard(c);
    int64_t end = std::min(r.end, state_.chunks->layout().chunks[c].used);
    if (r.begin >= end) continue;
    if (chunkOptimizer.pendingParameters(c).defined()) {
      // NOTE [Delayed update checkpoints]: the parameters the next forward reads, behind their state.
      Tensor t = chunkRange(state_.parameterHome(c), r, r.begin, end);
      out.push_back(SaveTensor{chunkPieceName("delayed_param", savedIndex_[c], r.begin), t.shape(),
                               DType::F32, [t] { return ops::to(t, Device::cpu(), DType::F32); }});
    }
    bool ssd = chunkOptimizer.home(c) == zero::Tier::Nvme;
    for (const optim::ChunkStateField& field : chunkOptimizer.chunkState(c)) {
      // A field of the optimizer's own layout over a whole chunk (stage 0 on several ranks) is the same on
      // every rank: rank 0 saves it.
      bool whole = chunkOptimizer.ranges()[c].size() == state_.chunks->paddedElems(c);
      int64_t numel = ssd ? state_.nvme->fieldElems(c, field.ssdField) : field.values.numel();
      if (!field.elementwise && (numel == 0 || (whole && state_.groups.rankIn(c) != 0))) continue;
      out.push_back(ssd ? savePiece(field.kind.c_str(), c, field.ssdField, field.elementwise)
                        : saveField(field, c));
    }
  }
  return out;
}

void CheckpointPieces::checkOptimizerState(ChunkCheckpointReader& reader) const {
  const optim::ChunkOptimizer& chunkOptimizer = *state_.optimizer;
  size_t n = state_.chunks->numChunks();
  // The kinds this optimizer saves (AdamW: exp_avg and exp_avg_sq; Adafactor: adafactor_v, and exp_avg with
  // a first moment).
  std::vector<std::string> kinds;
  for (size_t c = 0; c < n && kinds.empty(); ++c)
    for (const optim::ChunkStateField& field : chunkOptimizer.chunkState(c)) kinds.push_back(field.kind);
  for (const std::string& kind : kinds)
    STRATA_USER_CHECK(reader.hasKind(kind),
                      "checkpoint {} holds no {} state (no optimizer state, or another optimizer's); set "
                      "checkpoint.load_model_only: true to start the optimizer fresh from its weights",
                      reader.directory(), kind);
  // A field in the optimizer's own layout (Adafactor's factored statistics) is not resharded by parameter:
  // it reloads only into the chunks and shards it was saved from.
  bool ownLayout = false;
  for (size_t c = 0; c < n && !ownLayout; ++c)
    for (const optim::ChunkStateField& field : chunkOptimizer.chunkState(c)) ownLayout |= !field.elementwise;
  if (!ownLayout) return;
  const zero::ChunkLayout& saved = reader.state().layout;
  bool same = saved.chunks.size() == layout_.chunks.size() && saved.slots.size() == layout_.slots.size();
  for (size_t k = 0; same && k < layout_.slots.size(); ++k)
    same = saved.slots[k].name == layout_.slots[k].name && saved.slots[k].chunk == layout_.slots[k].chunk &&
           saved.slots[k].offset == layout_.slots[k].offset;
  // The ranks that shard the state: the data-parallel ones (the world over parallel.tensor and
  // parallel.pipeline).
  int ranks = state_.groups.ranks();
  auto savedValue = [&](const char* key) {
    auto it = reader.state().effective.find(key);
    return it == reader.state().effective.end() ? int64_t(1) : std::max<int64_t>(1, std::stoll(it->second));
  };
  int64_t savedRanks =
      reader.state().worldSize / (savedValue("parallel.tensor") * savedValue("parallel.pipeline"));
  STRATA_USER_CHECK(same && (state_.stage == 0 || savedRanks == ranks),
                    "checkpoint {}: its optimizer state was saved with {} ({} data-parallel rank{}), and "
                    "reloads only into the same chunk layout and, at ZeRO stage >= 1, as many data-parallel "
                    "ranks (this run: {}); set checkpoint.load_model_only: true to start the optimizer fresh "
                    "from its weights",
                    reader.directory(), same ? "these chunks" : "another chunk layout", savedRanks,
                    savedRanks == 1 ? "" : "s", ranks);
}

void CheckpointPieces::load(ChunkCheckpointReader& reader, bool optimizer) {
  NoGradGuard noGrad;
  state_.optimizer->finishDelayed();
  reader.checkParameters(layout_);
  if (optimizer) checkOptimizerState(reader);
  StateReader in{reader, readLayout_, state_.groups, {}};
  for (size_t c = 0; c < state_.chunks->numChunks(); ++c) loadChunk(state_, in, c, optimizer, savedIndex_[c]);
  // NOTE [Delayed update checkpoints]: parameters saved behind their state go back into the chunks, and the
  // values just loaded wait for the next update.
  if (optimizer && reader.hasKind("delayed_param")) loadDelayedParameters(reader);
}

void CheckpointPieces::loadDelayedParameters(ChunkCheckpointReader& reader) {
  const zero::ChunkLayout& layout = readLayout_;
  std::vector<float> host;
  for (size_t c = 0; c < state_.chunks->numChunks(); ++c) {
    // What the forward reads: the whole chunk, or at stage 3 this rank's shard of it.
    Tensor live = state_.parameterHome(c);
    zero::ShardRange r = state_.groups.shard(c);
    int64_t begin = state_.stage == 3 ? r.begin : 0;
    int64_t end = std::min(begin + live.numel(), layout.chunks[c].used);
    if (begin >= end) continue;
    host = live.toVector<float>();
    if (reader.readSavedChunkRange(layout, "delayed_param", int64_t(c), begin, end, host.data()) == 0)
      continue;
    zero::ShardRange range = state_.optimizer->ranges()[c];
    Tensor next = chunkRange(live, r, range.begin, range.end);
    if (!state_.optimizer->deferParameters(c, next)) continue;
    ops::copy(live, Tensor::fromHost(host.data(), DType::F32, host.size(), {live.numel()}, live.device()));
  }
}

}  // namespace strata::train
