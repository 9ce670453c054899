// The sequential micro-batch schedule: each micro-batch's forward, then its backward from the loss that
// forward returned, in micro-batch order. (The engine under other schedules: tests/distributed/mpi/
// MicroBatchScheduleTest.cpp.)
#include <string>
#include <vector>

#include "TestUtil.h"
#include "strata/train/MicroBatchSchedule.h"

using namespace strata;

TEST_CASE("the sequential schedule runs forward then backward of each micro-batch, in order",
          "[train][stepengine][schedule]") {
  std::vector<std::string> calls;
  train::MicroBatchWork work;
  work.forward = [&](int64_t micro) {
    calls.push_back("f" + std::to_string(micro));
    return Tensor::fromVector<float>({float(micro) + 0.5f}, {1});
  };
  work.backward = [&](int64_t micro, const Tensor& loss) {
    calls.push_back("b" + std::to_string(micro));
    REQUIRE(loss.toVector<float>() == std::vector<float>{float(micro) + 0.5f});  // its own forward's loss
  };
  train::SequentialSchedule().run(3, work);
  REQUIRE(calls == std::vector<std::string>{"f0", "b0", "f1", "b1", "f2", "b2"});
  calls.clear();
  train::SequentialSchedule().run(0, work);
  REQUIRE(calls.empty());
}
