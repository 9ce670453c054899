// Private to the dist layer: what a collective call is, for error messages, and the one way a collective
// fails.
#pragma once

#include <cstdint>
#include <string>

#include "strata/core/DType.h"
#include "strata/distributed/Communicator.h"

namespace strata::dist {

struct CollectiveCall {
  const char* op = "";
  const char* reduce = nullptr;  // "sum", "max", or none
  int64_t elements = 0;          // elements each rank sends (allGather: its block; others: its whole tensor)
  DType dtype = DType::U8;
  std::string peers;  // point-to-point: "send to rank 1 (tag 0), receive from rank 1 (tag 1)"
};

// "allReduce(sum) of 1024 bf16 elements (2048 bytes) on rank 1 of group 'world' (4 ranks)"; a barrier has no
// sizes.
std::string describeCall(const GroupInfo& group, const CollectiveCall& call);

// Writes "dist: <description> <reason>" to stderr at once (another rank may abort the job before this one's
// exception is reported) and throws it as a strata::Error.
[[noreturn]] void failCollective(const GroupInfo& group, const CollectiveCall& call,
                                 const std::string& reason);

// The reason of a timeout, naming the config key.
std::string timeoutReason(double seconds);

}  // namespace strata::dist
