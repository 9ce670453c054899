// The training metrics' throughput figures: TFLOP/s and MFU from the model's own FLOPs per token, and
// "unknown" for a model that counts none.
#include "TestUtil.h"
#include "strata/train/Metrics.h"

using namespace strata;

TEST_CASE("TFLOP/s come from the model's own FLOPs per token, and are unknown when it counts none",
          "[train][metrics][flops]") {
  train::TrainRecord r;
  r.tokensPerSec = 2e6;
  // 3e6 FLOPs per token at 2e6 tokens/s over 2 ranks: 3 TFLOP/s per rank, 0.3% of a 989 TFLOP/s peak.
  train::setThroughput(r, 3e6, 989e12, 2);
  REQUIRE(r.tflops.has_value());
  REQUIRE(*r.tflops == Approx(3.0).epsilon(1e-12));
  REQUIRE(*r.mfu == Approx(3.0 / 989).epsilon(1e-12));
  REQUIRE(train::formatThroughput(r) == "3.00 TFLOP/s | MFU 0.3%");
  // Another model's count gives its own figure.
  train::setThroughput(r, 6e6, 989e12, 2);
  REQUIRE(*r.tflops == Approx(6.0).epsilon(1e-12));
  // A device whose peak is unknown (the CPU): MFU 0.
  train::setThroughput(r, 3e6, 0, 1);
  REQUIRE(*r.tflops == Approx(6.0).epsilon(1e-12));
  REQUIRE(*r.mfu == 0);
  REQUIRE(train::formatThroughput(r) == "6.00 TFLOP/s | MFU 0.0%");
  // A model that counts no FLOPs: no figure at all, not a guess, and no MFU.
  train::setThroughput(r, std::nullopt, 989e12, 1);
  REQUIRE(!r.tflops.has_value());
  REQUIRE(!r.mfu.has_value());
  REQUIRE(train::formatThroughput(r) == "TFLOP/s unknown");
}
