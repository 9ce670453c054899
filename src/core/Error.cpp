#include "strata/core/Error.h"

namespace strata::detail {

void throwError(const char* file, int line, const char* condition, const std::string& message) {
  std::string text = message;
  std::string where = std::string(file);
  auto slash = where.rfind("/src/");
  if (slash != std::string::npos) where = where.substr(slash + 1);
  text += " [" + where + ":" + std::to_string(line);
  if (condition) text += std::string(", check failed: ") + condition;
  text += "]";
  throw Error(text);
}

}  // namespace strata::detail
