#include "strata/zero/ChunkLayout.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "strata/core/Error.h"

namespace strata::zero {

int64_t ChunkLayout::payloadElems() const {
  int64_t n = 0;
  for (const auto& c : chunks) n += c.payload;
  return n;
}

int64_t ChunkLayout::capacityElems() const {
  int64_t n = 0;
  for (const auto& c : chunks) n += c.capacity;
  return n;
}

const ChunkSlot& ChunkLayout::slot(const std::string& name) const {
  for (const auto& s : slots)
    if (s.name == name) return s;
  STRATA_FAIL("the chunk layout has no parameter '{}'", name);
}

std::string ChunkLayout::table(size_t maxRows) const {
  double elemBytes = double(dtypeSize(dtype));
  auto mib = [&](int64_t elems) { return double(elems) * elemBytes / double(1 << 20); };
  std::string out = fmt::format(
      "{} chunks of {:.2f} MiB ({}), {:.1f}% filled:\n", chunks.size(), mib(chunkElems), dtypeName(dtype),
      capacityElems() > 0 ? 100.0 * double(payloadElems()) / double(capacityElems()) : 0.0);
  size_t head = chunks.size() > maxRows ? maxRows * 2 / 3 : chunks.size();
  size_t tail = chunks.size() > maxRows ? maxRows - head : 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (i == head && tail > 0) out += fmt::format("  ... {} more chunks ...\n", chunks.size() - head - tail);
    if (i >= head && i < chunks.size() - tail) continue;
    const ChunkInfo& c = chunks[i];
    const ChunkSlot& first = slots[size_t(c.slots.front())];
    const ChunkSlot& last = slots[size_t(c.slots.back())];
    std::string names = c.slots.size() == 1 ? first.name : first.name + " .. " + last.name;
    out += fmt::format("  chunk {:>4}  {:>9.2f} MiB  {:>5.1f}%  {:>4} params  {}\n", i, mib(c.capacity),
                       100.0 * c.fill(), c.slots.size(), names);
  }
  return out;
}

ChunkLayout planChunks(const std::vector<std::pair<std::string, Shape>>& parameters, int64_t chunkBytes,
                       DType dtype, const std::vector<int>& families) {
  STRATA_CHECK(families.empty() || families.size() == parameters.size(),
               "planChunks: {} families for {} parameters", families.size(), parameters.size());
  int64_t elemBytes = int64_t(dtypeSize(dtype));
  int64_t align = std::max<int64_t>(1, kChunkAlignBytes / elemBytes);
  ChunkLayout layout;
  layout.dtype = dtype;
  layout.chunkElems = std::max<int64_t>(align, chunkBytes / elemBytes / align * align);
  std::set<std::string> placed;
  std::map<int, int64_t> openOf;  // by family: the regular chunk that takes the next parameters that fit
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto& [name, shape] = parameters[i];
    int family = families.empty() ? 0 : families[i];
    int64_t& open = openOf.try_emplace(family, -1).first->second;
    if (!placed.insert(name).second) continue;  // a tied tensor: placed at its first use
    ChunkSlot s{name, shape, 0, 0, numelOf(shape)};
    STRATA_CHECK(s.numel > 0, "parameter '{}' has no elements", name);
    auto newChunk = [&](int64_t capacity) {
      ChunkInfo c;
      c.capacity = capacity;
      c.family = family;
      layout.chunks.push_back(c);
      return int64_t(layout.chunks.size()) - 1;
    };
    int64_t start = 0;
    if (s.numel > layout.chunkElems) {
      // Larger than a chunk: a chunk of its own size. The open regular chunk stays open, so the small
      // parameters that follow (its bias, the next norms) do not each start a mostly empty chunk.
      s.chunk = newChunk((s.numel + align - 1) / align * align);
    } else {
      if (open >= 0) start = (layout.chunks[size_t(open)].used + align - 1) / align * align;
      if (open < 0 || start + s.numel > layout.chunkElems) {
        open = newChunk(layout.chunkElems);
        start = 0;
      }
      s.chunk = open;
    }
    ChunkInfo& c = layout.chunks[size_t(s.chunk)];
    s.offset = start;
    c.used = start + s.numel;
    c.payload += s.numel;
    c.slots.push_back(int64_t(layout.slots.size()));
    layout.slots.push_back(std::move(s));
  }
  return layout;
}

int64_t bestChunkBytes(const std::vector<std::pair<std::string, Shape>>& parameters, DType dtype) {
  int64_t best = 0, bestWaste = 0;
  for (int64_t mib = 32; mib <= 512; mib += 8) {
    ChunkLayout layout = planChunks(parameters, mib << 20, dtype);
    int64_t waste = layout.capacityElems() - layout.payloadElems();
    if (best == 0 || waste < bestWaste) {
      best = mib << 20;
      bestWaste = waste;
    }
  }
  return best;
}

}  // namespace strata::zero
