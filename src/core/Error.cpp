#include "strata/core/Error.h"

namespace strata::detail {

void throwError(const char* file, int line, const char* condition, const std::string& message,
                bool userFacing) {
  std::string where = std::string(file);
  auto slash = where.rfind("/src/");
  if (slash != std::string::npos) where = where.substr(slash + 1);
  where += ":" + std::to_string(line);
  if (condition) where += std::string(", check failed: ") + condition;
  throw Error(message, where, userFacing);
}

}  // namespace strata::detail
