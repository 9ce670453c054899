// Runtime element types. f64 exists for CPU gradient checks; the GPU computes in bf16/f16/f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

#include "strata/core/Half.h"

namespace strata {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8, F64 };

size_t dtypeSize(DType t);
const char* dtypeName(DType t);
bool isFloating(DType t);
DType dtypeFromName(const std::string& name);  // "f32", "bf16", ... ; throws on an unknown name
std::ostream& operator<<(std::ostream& os, DType t);

template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::F16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::U8;
};

template <class T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) with the host type of `t`. Host types: float, double, BFloat16, Half, int32_t,
// int64_t, uint8_t. Backends map these to their own types where they differ (CUDA uses __nv_bfloat16 and
// __half).
template <class Fn>
decltype(auto) visitDType(DType t, Fn&& fn) {
  switch (t) {
    case DType::F32:
      return fn(TypeTag<float>{});
    case DType::F64:
      return fn(TypeTag<double>{});
    case DType::BF16:
      return fn(TypeTag<BFloat16>{});
    case DType::F16:
      return fn(TypeTag<Half>{});
    case DType::I32:
      return fn(TypeTag<int32_t>{});
    case DType::I64:
      return fn(TypeTag<int64_t>{});
    case DType::U8:
      return fn(TypeTag<uint8_t>{});
  }
  return fn(TypeTag<float>{});
}

}  // namespace strata
