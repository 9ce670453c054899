#include "distributed/CollectiveCall.h"

#include <cstdio>
#include <string_view>

#include "strata/core/Error.h"

namespace strata::dist {

const char* reduceOpName(ReduceOp op) {
  return op == ReduceOp::Sum ? "sum" : "max";
}

std::string describeCall(const GroupInfo& group, const CollectiveCall& call) {
  std::string op = call.reduce ? detail::format("{}({})", call.op, call.reduce) : std::string(call.op);
  if (std::string_view(call.op) != "barrier") {
    op += detail::format(" of {} {} elements ({} bytes)", call.elements, dtypeName(call.dtype),
                         call.elements * int64_t(dtypeSize(call.dtype)));
  }
  if (!call.peers.empty()) op += " (" + call.peers + ")";
  return detail::format("{} on rank {} of group '{}' ({} ranks)", op, group.rank, group.name, group.size);
}

void failCollective(const GroupInfo& group, const CollectiveCall& call, const std::string& reason) {
  std::string message = "dist: " + describeCall(group, call) + " " + reason;
  std::fprintf(stderr, "[strata] error: %s\n", message.c_str());
  std::fflush(stderr);
  STRATA_USER_FAIL("{}", message);
}

std::string timeoutReason(double seconds) {
  return detail::format(
      "did not finish within {} s (dist.timeout_s): another rank died, skipped this collective or called "
      "collectives in another order; the job is aborted",
      seconds);
}

}  // namespace strata::dist
