#include "strata/core/DType.h"

#include "strata/core/Error.h"

namespace strata {

size_t dtypeSize(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
    case DType::F64:
      return 8;
  }
  STRATA_FAIL("unknown dtype {}", int(t));
}

const char* dtypeName(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::U8:
      return "u8";
    case DType::F64:
      return "f64";
  }
  return "?";
}

bool isFloating(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64;
}

DType dtypeFromName(const std::string& name) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8, DType::F64}) {
    if (name == dtypeName(t)) return t;
  }
  if (name == "float32" || name == "fp32") return DType::F32;
  if (name == "bfloat16") return DType::BF16;
  if (name == "float16" || name == "fp16") return DType::F16;
  STRATA_FAIL("unknown dtype '{}' (expected one of f32, bf16, f16, i32, i64, u8, f64)", name);
}

std::ostream& operator<<(std::ostream& os, DType t) {
  return os << dtypeName(t);
}

}  // namespace strata
