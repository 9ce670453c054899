// Errors: STRATA_CHECK(cond, "message with {} values", x) throws strata::Error with the file and line.
//
// Two kinds. An internal error (STRATA_CHECK, STRATA_FAIL) is a broken invariant or a misuse of the API: its
// what() ends with "[src/file.cpp:line, check failed: cond]" so a bug report points at the code. A user error
// (STRATA_USER_CHECK, STRATA_USER_FAIL) is about something the user controls (a config key, a file, a
// command-line flag): its what() is the message alone, which already names that thing; the location is still
// kept in location(), and `strata` prints it too when STRATA_DEBUG=1.
//
// The formatter here is deliberately tiny (each "{}" takes the next argument through operator<<) so that this
// header compiles under nvcc as well as the host compiler; fmt's consteval format strings do not.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace strata {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, std::string location = {}, bool userFacing = false)
      : std::runtime_error(userFacing || location.empty() ? message : message + " [" + location + "]"),
        message_(message),
        location_(std::move(location)),
        userFacing_(userFacing) {}
  // The message without the source location.
  const std::string& message() const { return message_; }
  // "src/config/Config.cpp:12, check failed: cond", or empty.
  const std::string& location() const { return location_; }
  bool userFacing() const { return userFacing_; }

 private:
  std::string message_, location_;
  bool userFacing_ = false;
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

[[noreturn]] void throwError(const char* file, int line, const char* condition, const std::string& message,
                             bool userFacing = false);

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

// User errors: the message names what the user controls (see the note at the top).
#define STRATA_USER_CHECK(cond, ...)                                                                        \
  do {                                                                                                      \
    if (!(cond)) {                                                                                          \
      ::strata::detail::throwError(__FILE__, __LINE__, #cond, ::strata::detail::format(__VA_ARGS__), true); \
    }                                                                                                       \
  } while (0)

#define STRATA_USER_FAIL(...) \
  ::strata::detail::throwError(__FILE__, __LINE__, nullptr, ::strata::detail::format(__VA_ARGS__), true)
