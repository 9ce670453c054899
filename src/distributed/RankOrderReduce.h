// Private to the dist layer: the reduction behind the MPI backend's deterministic sums (NOTE [Deterministic
// reductions] in strata/distributed/Communicator.h).
#pragma once

#include <cstdint>

#include "strata/core/DType.h"
#include "strata/distributed/Communicator.h"

namespace strata::dist {

// out[i] = rows[0][i] (op) rows[1][i] (op) ... (op) rows[numRows-1][i], left to right, where row r starts at
// rows + r * rowElements elements. f32/bf16/f16 accumulate in f32 and round once; f64 in f64; integers in
// their own type (sums wrap). Max propagates NaN. `out` may alias row 0 but no other row.
void reduceRowsInOrder(void* out, const void* rows, int64_t rowElements, int numRows, DType dtype,
                       ReduceOp op);

}  // namespace strata::dist
