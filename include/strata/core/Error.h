// Errors: STRATA_CHECK(cond, "message with {} values", x) throws strata::Error with the file and line.
//
// The formatter here is deliberately tiny (each "{}" takes the next argument through operator<<) so that this
// header compiles under nvcc as well as the host compiler; fmt's consteval format strings do not.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace strata {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

inline void formatInto(std::ostringstream& os, std::string_view fmt) {
  os << fmt;
}

template <class First, class... Rest>
void formatInto(std::ostringstream& os, std::string_view fmt, const First& first, const Rest&... rest) {
  auto pos = fmt.find("{}");
  if (pos == std::string_view::npos) {
    os << fmt;
    return;
  }
  os << fmt.substr(0, pos) << first;
  formatInto(os, fmt.substr(pos + 2), rest...);
}

template <class... Args>
std::string format(std::string_view fmt, const Args&... args) {
  std::ostringstream os;
  formatInto(os, fmt, args...);
  return os.str();
}

[[noreturn]] void throwError(const char* file, int line, const char* condition, const std::string& message);

}  // namespace detail
}  // namespace strata

#define STRATA_CHECK(cond, ...)                                                                       \
  do {                                                                                                \
    if (!(cond)) {                                                                                    \
      ::strata::detail::throwError(__FILE__, __LINE__, #cond, ::strata::detail::format(__VA_ARGS__)); \
    }                                                                                                 \
  } while (0)

#define STRATA_FAIL(...) \
  ::strata::detail::throwError(__FILE__, __LINE__, nullptr, ::strata::detail::format(__VA_ARGS__))
