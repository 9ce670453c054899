// The text of a failed file operation, for the errors users see.
#pragma once

#include <string>

namespace strata {

// strerror(err), and for EFBIG (a write or reservation past the process's file-size limit, `ulimit -f`) that
// limit and how to raise it. Strata ignores SIGXFSZ while it writes (train/Interrupts.h, the `strata`
// command), so such a write fails with EFBIG and ends up here instead of killing the process.
std::string fileErrorText(int err);

}  // namespace strata
