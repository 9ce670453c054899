#include "TestUtil.h"
#include "strata/ops/Registry.h"

using namespace strata;

namespace {
using ProbeKernel = int(int);
int probeCpu(int x) {
  return x + 1;
}
}  // namespace

TEST_CASE("registry dispatches by op and device and names what is missing", "[ops][registry]") {
  ops::Registry registry;
  registry.add<ProbeKernel>("probe", DeviceType::CPU, &probeCpu);
  REQUIRE(registry.find<ProbeKernel>("probe", DeviceType::CPU)(41) == 42);
  REQUIRE(registry.has("probe", DeviceType::CPU));
  REQUIRE(!registry.has("probe", DeviceType::CUDA));
  try {
    registry.find<ProbeKernel>("probe", DeviceType::CUDA);
    FAIL("expected a missing-kernel error");
  } catch (const Error& e) {
    std::string msg = e.what();
    REQUIRE(msg.find("'probe'") != std::string::npos);
    REQUIRE(msg.find("'cuda'") != std::string::npos);
  }
  REQUIRE_THROWS_AS(registry.find<int(double)>("probe", DeviceType::CPU), Error);
}

TEST_CASE("built-in cpu kernels are registered", "[ops][registry]") {
  auto& r = ops::Registry::instance();
  for (const char* op : {"add", "mul", "gelu_tanh", "where", "sum", "amax", "gemm", "softmax", "norm",
                         "embedding", "cross_entropy", "dropout", "copy", "random"})
    REQUIRE(r.has(op, DeviceType::CPU));
  REQUIRE(r.has("gemm", DeviceType::CUDA) == builtWithCuda());
}
