// The chunk layout: which chunk, and where in it, each parameter lives.
//
// Parameters are packed, in first-use order, into chunks of a fixed capacity (zero_optimization.chunk_size_mb
// of the parameters' dtype). A parameter starts at an offset aligned to kChunkAlignBytes, so every parameter
// view stays aligned for vectorised kernels and cuBLASLt. A parameter that does not fit in the room left
// opens the next chunk. One larger than a whole chunk gets a chunk of its own size (PatrickStar's rule), and
// the open chunk stays open for the small parameters after it, so a model whose matrices exceed the chunk
// size does not leave a mostly empty chunk behind each of them. A tensor shared by several modules (a tied
// embedding and LM head) appears once, at its first use.
//
// The layout depends only on names, shapes, the order and the chunk size, never on values, so `strata info`
// plans it from the architecture's shapes without building the model, and training numbers do not depend on
// it: every parameter is the same tensor wherever it sits.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/DType.h"
#include "strata/core/Shape.h"

namespace strata::zero {

constexpr int64_t kChunkAlignBytes = 256;

struct ChunkSlot {
  std::string name;  // the parameter ("h.3.attn.qkv.weight")
  Shape shape;
  int64_t chunk = 0;   // index into ChunkLayout::chunks
  int64_t offset = 0;  // first element within the chunk
  int64_t numel = 0;
};

struct ChunkInfo {
  int64_t capacity = 0;        // elements (the regular capacity, or the size of an oversized parameter)
  int64_t used = 0;            // elements up to the end of the last parameter (alignment gaps included)
  int64_t payload = 0;         // elements that belong to parameters
  std::vector<int64_t> slots;  // indices into ChunkLayout::slots, in order
  int family = 0;              // its parameters' family (planChunks)
  double fill() const { return capacity > 0 ? double(payload) / double(capacity) : 0.0; }
};

struct ChunkLayout {
  DType dtype = DType::F32;
  int64_t chunkElems = 0;  // the regular capacity
  std::vector<ChunkSlot> slots;
  std::vector<ChunkInfo> chunks;

  int64_t payloadElems() const;
  int64_t capacityElems() const;
  // The slot of a parameter by name; throws when there is none.
  const ChunkSlot& slot(const std::string& name) const;
  // A table for `strata info`: a summary line, then one line per chunk (size, fill, parameters); with more
  // than maxRows chunks, the first and last few.
  std::string table(size_t maxRows = 24) const;
};

// Plans the layout of `parameters` (name and shape, in first-use order; repeated names are placed once) in
// chunks of `chunkBytes` bytes of `dtype`. `families` (one per parameter; empty: all 0) keeps parameters of
// different families in different chunks, each family with its own open chunk: expert parallelism puts the
// experts, which differ from rank to rank and are sharded over other ranks, in chunks of their own.
ChunkLayout planChunks(const std::vector<std::pair<std::string, Shape>>& parameters, int64_t chunkBytes,
                       DType dtype, const std::vector<int>& families = {});

// The chunk size, among multiples of 8 MiB from 32 to 512 MiB, whose layout wastes the fewest bytes (the
// smaller on a tie): PatrickStar's chunk-size search. `strata info` suggests it beside the configured size.
int64_t bestChunkBytes(const std::vector<std::pair<std::string, Shape>>& parameters, DType dtype);

}  // namespace strata::zero
