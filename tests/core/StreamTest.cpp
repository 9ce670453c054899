#include "TestUtil.h"

using namespace strata;

TEST_CASE("cpu streams and events run synchronously", "[core][stream]") {
  DeviceStreams streams = DeviceStreams::create(Device::cpu());
  REQUIRE(streams.compute.native() == nullptr);
  Event start(Device::cpu(), true), stop(Device::cpu(), true);
  start.record(streams.h2d);
  Tensor t = ops::ones({256});
  stop.record(streams.h2d);
  stop.block(streams.compute);
  REQUIRE(stop.query());
  stop.synchronize();
  REQUIRE(start.elapsedMs(stop) >= 0.0f);
  REQUIRE(ops::sum(t).item() == 256.0);
}

TEST_CASE("stream guard sets and restores the current stream", "[core][stream]") {
  Stream before = currentStream(Device::cpu());
  {
    Stream s = Stream::create(Device::cpu());
    StreamGuard guard(s);
    REQUIRE(currentStream(Device::cpu()) == s);
  }
  REQUIRE(currentStream(Device::cpu()) == before);
}

TEST_CASE("[cuda] streams order work across the four device streams", "[cuda][stream]") {
  STRATA_REQUIRE_CUDA();
  Device gpu = Device::cuda(0);
  DeviceStreams streams = DeviceStreams::create(gpu);
  Tensor host = ops::arange(0, 1 << 20);
  Tensor dev = Tensor::empty(host.shape(), DType::F32, gpu);
  Event copied(gpu);
  {
    StreamGuard guard(streams.h2d);
    ops::copy(dev, host);
    copied.record(streams.h2d);
  }
  copied.block(streams.compute);
  StreamGuard guard(streams.compute);
  Tensor doubled = ops::affine(dev, 2.0, 0.0);
  REQUIRE(ops::sum(doubled).to(Device::cpu()).item() ==
          Approx(double(1 << 20) * ((1 << 20) - 1)).epsilon(1e-5));
}
