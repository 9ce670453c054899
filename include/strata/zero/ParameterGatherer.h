// ZeRO-3's parameter gathers: each rank keeps only its shard of every chunk's parameters, and a chunk is
// gathered whole while the modules that use it run, forward and backward.
//
// NOTE [Parameter gathering]
// At stage 3 a chunk's storage is not resident except while gathered into a slot. A module's forward
// pre-hook gathers the chunks that hold its own parameters; outside backward it first releases the gathered
// chunks that neither it nor a module still running (its callers) needs, so a forward holds the chunks of a
// few modules at a time. In backward a module's pre-backward hook gathers its chunks again, and a chunk is
// released as soon as every one of its parameters has its gradient for the pass (nothing later in the pass
// reads it). The step releases everything after each forward and each backward. Gathers run on the gather
// stream (NOTE [Collective lanes] in distributed/Communicator.h), and compute waits on the chunk's event only
// when a module needs it. The first micro-batch records the order of the gathers (forward and backward); from
// then on each gather also starts the next zero_optimization.prefetch_depth chunks of that order, which no
// release touches until they are used (or until a pass leaves the order, as an evaluation's forwards do). A
// chunk is gathered into a slot of the chunk arena (store.arena, NOTE [Chunk arena] in zero/ChunkArena.h),
// or else into a block of the caching allocator. A parameter is thus sure to be resident only during its
// module's own calls: code that reads a child's parameter outside the child's call (rather than through
// Module::call or nn::fusedCall, NOTE [Module calls] in nn/Module.h) touches a released chunk, and the error
// names the parameter and those two ways (explainResidency).
//
// NOTE [Parameter homes]
// A chunk's parameters have a home tier (NOTE [Store placement] in zero/Store.h): the device, host memory
// (page-locked where a GPU copies from it), or the SSD. A chunk homed off the device lives the life above at
// any ZeRO stage: its storage is not resident except while it is brought into a slot of the chunk arena for
// its modules' calls, in the recorded order, prefetch_depth ahead, and released after its last use in
// forward and again in backward. Bringing it in is a copy from the home into the slot on the gather stream
// (cudaMemcpyAsync from page-locked memory; on the CPU the home and the slot are two buffers), followed at
// stage 3 on several ranks by the all-gather of the slot in place (this rank's shard was copied into its
// block of the slot): a rank's shard has a home. At stage 0 the home is the whole chunk and the chunks
// homed on the device stay resident, untouched by the gatherer; at stage 3 every chunk is gathered, from
// its home. The optimizer's state of an off-device chunk is off the device too. AdamW updates such a chunk on
// the CPU (the pipelined update's GPU lane, which writes parameters on the device, then stays idle);
// Adafactor streams its state through device scratch as for any host chunk and rounds the new values into
// device scratch of their own, copied to the home after the kernel (NOTE [Adafactor host chunks] in
// optim/Adafactor.h). Either writes the new 16-bit parameters into the home, so the next gather copies
// them: before the update writes a home, homesWritable() waits for the copies still reading it (the host
// must not change page-locked bytes a copy engine is reading). Stages 1 and 2 all-gather the updated shards
// into resident chunks, and refuse homes off the device at start-up, as do store.delayed_update and
// parallel.pipeline.
//
// A chunk homed on the SSD keeps its parameters (this rank's shard) in the Parameters field of its extent
// in the SSD tier (NOTE [SSD tier] in zero/NvmeTier.h). Bringing it in is a read into a page-locked staging
// buffer, then the copy above from the buffer into the slot. The read goes ahead of the gathers: once the
// order is recorded, the SSD chunks among the prefetch_depth chunks after those gathered ahead are read
// ahead on the tier's I/O thread while compute runs, and a chunk's gather waits only for what is left of its
// read (where the tier's checksum error, naming the file and the offset, is thrown). A buffer is free again
// once the copy from it ended; the buffers stay between steps, at most prefetch_depth + 1 of the largest SSD
// chunk's parameters (the reads ahead, and the one a gather waits on). The staging does not keep a chunk
// between its forward and its backward: an SSD chunk is read twice per micro-batch, as often as a host
// chunk is copied. homesWritable() drops the reads ahead, which an update of the extents would make stale
// (a write issued after them runs after them: the tier's issue order). The update of such a chunk (its
// optimizer state in host memory or on the SSD, read ahead as the tier does for state; AdamW's on the CPU,
// Adafactor's through device scratch) rounds the new values into its staging and writes them into the
// extent, waiting for the write before the next chunk: the pipelined update's lanes step aside for the
// plain update then. A checkpoint saves the chunk from its master; a load writes the extent. The engine's
// parameterShards[c] of such a chunk is a view of one host buffer of the largest of them, which only the
// load fills.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "strata/core/Stream.h"
#include "strata/core/Tensor.h"
#include "strata/zero/ChunkArena.h"
#include "strata/zero/ChunkGroups.h"
#include "strata/zero/ChunkManager.h"
#include "strata/zero/NvmeTier.h"
#include "strata/zero/Store.h"

namespace strata::nn {
class Module;
}

namespace strata::zero {

class ParameterGatherer {
 public:
  // Evicts every chunk of `chunks` (the model's parameters live in `parameterShards` now: this rank's shard
  // of each chunk, which the update writes) and hooks `model`'s modules to gather them. `arena`: into the
  // slots of chunk arenas (one per slot class, zero::planChunkArena), else into caching-allocator blocks.
  // The hooks and the manager's pass-complete listener hold this gatherer: it lives as long as they run.
  // `homes` (NOTE [Parameter homes]): per chunk the tier of `parameterShards[c]` (empty: every one on the
  // device). `acrossRanks`: stage 3, where every chunk is gathered over its ranks; else (stage 0) each
  // parameterShards[c] is the whole chunk and only the chunks homed off the device are gathered, by a copy.
  // `nvme`: the SSD tier holding the Parameters field of the chunks homed on Tier::Nvme (their
  // parameterShards[c] are not read).
  ParameterGatherer(ChunkManager& chunks, const ChunkGroups& groups, std::vector<Tensor> parameterShards,
                    nn::Module& model, Device device, int64_t prefetchDepth, bool arena,
                    std::vector<Tier> homes = {}, bool acrossRanks = true, NvmeTier* nvme = nullptr);
  ~ParameterGatherer();
  ParameterGatherer(const ParameterGatherer&) = delete;
  ParameterGatherer& operator=(const ParameterGatherer&) = delete;

  // After a micro-batch's forward: what its backward needs is gathered again, module by module (what was
  // prefetched for it stays).
  void forwardDone();
  // After a micro-batch's backward: everything goes, prefetched chunks too; the first backward ends the
  // recording of the order the later passes prefetch in.
  void backwardDone();

  // Before the host writes the homes off the device (the update): waits for the copies reading them, and
  // drops the SSD reads ahead.
  void homesWritable();
  // Whether chunk c is gathered (not resident between its modules' calls).
  bool gathers(size_t c) const { return managed_[c]; }

  // The most chunks gathered at once so far, and the arenas (none with store.arena off).
  size_t peakGathered() const { return peakGathered_; }
  // The SSD chunks' reads so far, and how many were issued ahead of their gather.
  size_t ssdReads() const { return ssdReads_; }
  size_t ssdReadsAhead() const { return ssdReadsAhead_; }
  // The page-locked staging buffers the SSD reads go through (NOTE [Parameter homes]).
  size_t stagingBuffers() const { return staging_.size(); }
  std::vector<const ChunkArena*> arenas() const;

 private:
  // Makes a touch of a released chunk an error that names the parameter touched and what to do.
  void explainResidency();
  void hookModules(nn::Module& model);
  // Releases what neither the module starting nor a running one needs (forward only).
  void releaseUnneeded(const std::vector<size_t>& own);
  void gather(size_t chunk);
  // Where the recorded order has reached with `chunk`, and the prefetches from there.
  void prefetchAfter(size_t chunk);
  void startGather(size_t chunk);
  // An SSD chunk's read into a staging buffer, unless one is under way (NOTE [Parameter homes]).
  void readAhead(size_t chunk);
  // A staging buffer with no read pending on it; its last copy ended.
  size_t freeStaging();
  // Waits for the reads ahead not yet copied and frees their buffers.
  void dropReadsAhead();
  void release(size_t chunk);
  void releaseAll(bool prefetchedToo);

  ChunkManager& chunks_;
  const ChunkGroups& groups_;
  std::vector<Tensor> parameterShards_;  // this rank's shard of each chunk's parameters
  Device device_;
  int64_t prefetchDepth_;
  std::vector<Tier> homes_;    // per chunk: where parameterShards_[c] lives
  bool acrossRanks_;           // stage 3: gathers all-gather over the chunk's ranks
  std::vector<bool> managed_;  // per chunk: gathered (else resident throughout, stage 0's device chunks)
  std::vector<Tensor> slots_;  // each chunk's gathered parameters while it is resident
  std::map<nn::Module*, std::vector<size_t>> moduleChunks_;  // the chunks of each module's own parameters
  std::vector<nn::Module*> active_;                          // modules whose forward is running
  std::vector<std::unique_ptr<Event>> gathered_;             // each chunk's last gather, on the gather stream
  std::vector<bool> prefetched_;                             // gathered ahead and not used yet
  std::vector<size_t> order_;  // the chunks in the order the first micro-batch gathered them
  size_t cursor_ = 0;          // how far this pass has come in order_
  bool recording_ = true;
  // With store.arena: where slots_ live, and each gathered chunk's slot (-1: none).
  std::vector<std::unique_ptr<ChunkArena>> arenas_;
  std::vector<int> arenaClass_;  // per chunk: its arena
  std::vector<int> arenaSlot_;
  size_t gatheredNow_ = 0, peakGathered_ = 0;
  // The SSD homes: the tier, the staging buffers (each with its last copy's event and the chunk whose read
  // it holds, -1: none) and per chunk its buffer with a read issued and not yet copied (-1: none).
  NvmeTier* nvme_ = nullptr;
  struct Staging {
    Tensor buffer;
    std::unique_ptr<Event> copied;
    bool copying = false;
    int64_t chunk = -1;
    NvmeTier::Ticket ticket = 0;
  };
  std::vector<Staging> staging_;
  std::vector<int64_t> stagingOf_;
  size_t ssdReads_ = 0, ssdReadsAhead_ = 0;
};

}  // namespace strata::zero
