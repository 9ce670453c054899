// Shapes and strides are small vectors of int64 in elements.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

using Shape = std::vector<int64_t>;

int64_t numelOf(const Shape& shape);
Shape contiguousStrides(const Shape& shape);
// Normalises a possibly negative dimension index against `ndim`; throws with the op name on out of range.
int64_t wrapDim(int64_t dim, int64_t ndim, const char* op = "op");
// NumPy broadcasting of two shapes; throws naming both shapes when they do not broadcast.
Shape broadcastShapes(const Shape& a, const Shape& b);
std::string toString(const Shape& shape);

}  // namespace strata
