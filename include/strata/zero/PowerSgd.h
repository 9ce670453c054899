// PowerSGD (Vogels et al. 2019): the data-parallel gradient reduction of 2-D gradients sent as rank-r
// factors. NOTE [PowerSGD]: for a gradient M (n x m) with r < min(n, m) and r (n + m) < n m, each rank adds
// its error feedback e to its local gradient (M' = M + e), then
//   P = M' Q            summed over the ranks (Q: m x r, this list's last Q; first drawn from a seeded
//                       generator, identical on every rank)
//   P^ = P with orthonormal columns (block Gram-Schmidt, twice; the same operations on the same sum everywhere)
//   Q = M'^T P^         summed over the ranks; the sum of the ranks' gradients is then P^ Q^T
//   e = M' - P^ (M'^T P^)^T, this rank's part of what the factors missed (the ranks' e sum to exactly
//                       sum(M') - P^ Q^T), added to its next gradient
// Every other gradient (1-D ones, small matrices) is summed exactly. Each reduce() runs three collectives
// whatever the number of gradients: the exact ones packed into one, every P into one, every Q into one.
// The gradients are summed, as the plain all-reduce sums them (not averaged). The Q matrices and error
// feedback are state: checkpoints keep them (saveState, loadState), and a resume continues exactly.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "strata/core/Tensor.h"

namespace strata::dist {
class Communicator;
}

namespace strata::zero {

class PowerSgd {
 public:
  // `rank`: r, at least 1; `seed`: the first Q's generator (the same on every rank).
  PowerSgd(int64_t rank, uint64_t seed);

  // Whether a gradient of `shape` is compressed at rank r (2-D, r < min(n, m), fewer elements sent).
  static bool compresses(const Shape& shape, int64_t rank);
  // Elements one reduce() of gradients of `shapes` sends (factors for the compressed ones).
  static int64_t sentElements(const std::vector<Shape>& shapes, int64_t rank);

  // Sums `grads` (views, written in place; fp32 or 16-bit, on `device`) over `comm`'s ranks. `key` names the
  // list (a chunk): its Q matrices and error feedback are kept for its next reduce(), which must pass
  // gradients of the same shapes. Runs the collectives on the comm stream, the rest on the current one.
  void reduce(size_t key, const std::vector<Tensor>& grads, dist::Communicator& comm, Device device);

  // Forgets every list's Q and error feedback (after a step whose gradients were not finite): the next
  // reduce() starts afresh.
  void reset() { lists_.clear(); }

  // Checkpoints: list `key`'s state as one flat fp32 tensor (every Q^T, then every error feedback, in the
  // gradients' order; a copy), whether it has any, and how many elements it has for gradients of `shapes`.
  bool hasState(size_t key) const { return lists_.count(key) > 0; }
  Tensor saveState(size_t key) const;
  static int64_t stateElements(const std::vector<Shape>& shapes, int64_t rank);
  // Sets list `key`'s state, for gradients of `shapes`, from `flat` as saveState gave it, on `device`.
  void loadState(size_t key, const std::vector<Shape>& shapes, const Tensor& flat, Device device);

  // Bytes of fp32 error feedback and Q matrices this rank keeps for gradients of `shapes`.
  static int64_t stateBytes(const std::vector<Shape>& shapes, int64_t rank);

 private:
  struct ListState {
    std::vector<Tensor> qt;     // by compressed gradient: Q^T (r x m), fp32
    std::vector<Tensor> error;  // by compressed gradient: the error feedback (n x m), fp32
  };
  int64_t rank_;
  uint64_t seed_;
  std::map<size_t, ListState> lists_;
};

}  // namespace strata::zero
