#include "strata/core/FileError.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "strata/core/Error.h"

namespace strata {

std::string fileErrorText(int err) {
  std::string text = std::strerror(err);
  rlimit limit{};
  if (err == EFBIG && ::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    text += detail::format(
        " (the file-size limit of this process, `ulimit -f`, is {} bytes: raise it, e.g. `ulimit -f "
        "unlimited`, or write less to this file)",
        uint64_t(limit.rlim_cur));
  return text;
}

}  // namespace strata
