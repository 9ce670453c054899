// Private to the dist layer: what a collective call is, for error messages, and the one way a collective
// fails.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

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

// What a point-to-point exchange reports (NOTE [Point-to-point] in Communicator.h): every transfer's
// elements, the first one's dtype, and `peers`. T: a backend's transfer (count, dtype).
template <class T>
CollectiveCall sendReceiveCall(const std::vector<T>& sends, const std::vector<T>& receives,
                               std::string peers) {
  int64_t elements = 0;
  for (const auto* list : {&sends, &receives})
    for (const auto& t : *list) elements += t.count;
  CollectiveCall call{"sendReceive", nullptr, elements,
                      sends.empty() ? (receives.empty() ? DType::U8 : receives[0].dtype) : sends[0].dtype};
  call.peers = std::move(peers);
  return call;
}

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
