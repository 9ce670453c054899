#include "strata/zero/Store.h"

#include "TestUtil.h"

using namespace strata;
using zero::Tier;

namespace {
constexpr uint64_t kGiB = 1ull << 30;
}

TEST_CASE("the store places optimizer state on the device while its budget lasts, then on the host",
          "[zero][store]") {
  std::vector<uint64_t> chunks = {3 * kGiB, 3 * kGiB, 3 * kGiB, 3 * kGiB};
  // Unlimited: everything on the device.
  zero::StorePlacement all = zero::placeModelState(2 * kGiB, chunks, {});
  REQUIRE(all.chunksOn(Tier::Device) == 4);
  REQUIRE(all.bytes[int(Tier::Device)] == 14 * kGiB);
  REQUIRE(all.total() == 14 * kGiB);
  // 9 GiB on the device: the parameters (2) and two chunks' state (6); the rest on the host, in chunk order.
  zero::StorePlacement split = zero::placeModelState(2 * kGiB, chunks, {9 * kGiB, zero::kUnlimited, 0});
  REQUIRE(split.optimizerTier == std::vector<Tier>{Tier::Device, Tier::Device, Tier::Host, Tier::Host});
  REQUIRE(split.bytes[int(Tier::Device)] == 8 * kGiB);
  REQUIRE(split.bytes[int(Tier::Host)] == 6 * kGiB);
  REQUIRE(split.total() == 14 * kGiB);  // one copy of each piece
  REQUIRE(split.table().find("host") != std::string::npos);
  // Offload: the device budget is the parameters alone.
  zero::StorePlacement off = zero::placeModelState(2 * kGiB, chunks, {2 * kGiB, 20 * kGiB, 0});
  REQUIRE(off.chunksOn(Tier::Host) == 4);
  // Over the host budget: the rest goes to the SSD, while its budget lasts.
  zero::StorePlacement ssd = zero::placeModelState(2 * kGiB, chunks, {5 * kGiB, 7 * kGiB, 6 * kGiB});
  REQUIRE(ssd.optimizerTier == std::vector<Tier>{Tier::Device, Tier::Host, Tier::Host, Tier::Nvme});
  REQUIRE(ssd.bytes[int(Tier::Nvme)] == 3 * kGiB);
  REQUIRE(ssd.total() == 14 * kGiB);
  // Over every budget: refused with the figures.
  std::string e = test::errorOf([&] { zero::placeModelState(2 * kGiB, chunks, {2 * kGiB, 7 * kGiB, 0}); });
  REQUIRE(e.find("needs 6.00 GiB beside 2.00 GiB on the device and 6.00 GiB of host memory") !=
          std::string::npos);
  e = test::errorOf([&] { zero::placeModelState(2 * kGiB, chunks, {kGiB, zero::kUnlimited, 0}); });
  REQUIRE(e.find("parameters alone") != std::string::npos);
}

TEST_CASE("store budgets parse as GiB or auto", "[zero][store]") {
  REQUIRE(zero::parseBudgetGb("auto", 7, "store.gpu_budget_gb") == 7);
  REQUIRE(zero::parseBudgetGb("1.5", 7, "store.gpu_budget_gb") == 3 * kGiB / 2);
  REQUIRE(zero::parseBudgetGb("0", 7, "store.gpu_budget_gb") == 0);
  REQUIRE(test::errorOf([] {
            zero::parseBudgetGb("lots", 7, "store.host_budget_gb");
          }).find("store.host_budget_gb is 'lots'") != std::string::npos);
  REQUIRE(test::errorOf([] { zero::parseBudgetGb("-1", 7, "store.host_budget_gb"); }).size() > 0);
  REQUIRE(zero::availableHostBytes() > 0);
}

TEST_CASE("the memory tracer moves chunks onto the device in order while the room lasts", "[zero][store]") {
  std::vector<uint64_t> chunks = {3 * kGiB, 3 * kGiB, 3 * kGiB, 3 * kGiB};
  zero::StorePlacement p = zero::placeModelState(2 * kGiB, chunks, {5 * kGiB, 7 * kGiB, 6 * kGiB});
  // Chunk 0 is on the device already; 1 and 2 on the host, 3 on the SSD.
  std::vector<uint64_t> deviceBytes = {3 * kGiB, 3 * kGiB, 3 * kGiB, 3 * kGiB};
  // The SSD's chunk first (it costs a disk read and write per step), then the host's in order.
  REQUIRE(zero::chunksToPromote(p, deviceBytes, 7 * kGiB) == std::vector<size_t>{3, 1});
  REQUIRE(zero::chunksToPromote(p, deviceBytes, 2 * kGiB).empty());
  REQUIRE(zero::chunksToPromote(p, deviceBytes, 100 * kGiB) == std::vector<size_t>{3, 1, 2});
}

TEST_CASE("the SSD tier counts its chunks at the size their stored dtype takes", "[zero][store]") {
  // 12 bytes per element on the device and the host; 8 on the SSD with bf16 m and v.
  std::vector<uint64_t> chunks = {3 * kGiB, 3 * kGiB, 3 * kGiB, 3 * kGiB};
  std::vector<uint64_t> ssd = {2 * kGiB, 2 * kGiB, 2 * kGiB, 2 * kGiB};
  // At full size two chunks would need 6 GiB of a 4 GiB SSD budget; at their SSD size they fit.
  REQUIRE(test::errorOf([&] {
            zero::placeModelState(2 * kGiB, chunks, {2 * kGiB, 6 * kGiB, 4 * kGiB});
          }).find("SSD tier's budget") != std::string::npos);
  zero::StorePlacement p = zero::placeModelState(2 * kGiB, chunks, {2 * kGiB, 6 * kGiB, 4 * kGiB}, ssd);
  REQUIRE(p.optimizerTier == std::vector<Tier>{Tier::Host, Tier::Host, Tier::Nvme, Tier::Nvme});
  REQUIRE(p.bytes[int(Tier::Nvme)] == 4 * kGiB);
  REQUIRE(p.optimizerBytes[3] == 2 * kGiB);
  REQUIRE(p.total() == 2 * kGiB + 6 * kGiB + 4 * kGiB);
}

TEST_CASE("a traced start keeps on the device only what the host and the SSD cannot hold", "[zero][store]") {
  std::vector<uint64_t> chunks = {3 * kGiB, 3 * kGiB, 3 * kGiB, 3 * kGiB};
  std::vector<uint64_t> ssd = {2 * kGiB, 2 * kGiB, 2 * kGiB, 2 * kGiB};
  zero::StoreBudgets budgets{zero::kUnlimited, 6 * kGiB, 2 * kGiB};
  // Host 2 chunks, SSD 1 at its SSD size: one chunk's state must stay on the device.
  uint64_t device = zero::smallestDeviceBudget(2 * kGiB, chunks, budgets, ssd);
  REQUIRE(device == 5 * kGiB);
  budgets.device = device;
  zero::StorePlacement p = zero::placeModelState(2 * kGiB, chunks, budgets, ssd);
  REQUIRE(p.optimizerTier == std::vector<Tier>{Tier::Device, Tier::Host, Tier::Host, Tier::Nvme});
  // Everything fits off the device: the parameters alone.
  REQUIRE(zero::smallestDeviceBudget(2 * kGiB, chunks, {zero::kUnlimited, 6 * kGiB, 4 * kGiB}, ssd) ==
          2 * kGiB);
  // Nothing off the device at all: every chunk on it.
  REQUIRE(zero::smallestDeviceBudget(2 * kGiB, chunks, {zero::kUnlimited, 0, 0}) == 14 * kGiB);
}

TEST_CASE("parameters take the device first, then host memory, and their chunks' state stays off the device",
          "[zero][store][homes]") {
  // Four chunks of 1 GiB of parameters and 3 GiB of optimizer state each.
  std::vector<uint64_t> params = {kGiB, kGiB, kGiB, kGiB};
  std::vector<uint64_t> state = {3 * kGiB, 3 * kGiB, 3 * kGiB, 3 * kGiB};
  // auto, 2.5 GiB on the device: two chunks' parameters there, the other two in host memory; the half GiB
  // left on the device holds no chunk's state, and the homed chunks' state never goes there.
  zero::StorePlacement p =
      zero::placeModelState(params, zero::ParameterHome::Auto, state, {5 * kGiB / 2, 20 * kGiB, 0});
  REQUIRE(p.parameterTier == std::vector<Tier>{Tier::Device, Tier::Device, Tier::Host, Tier::Host});
  REQUIRE(p.parameterBytes == 2 * kGiB);
  REQUIRE(p.parameterHostBytes == 2 * kGiB);
  REQUIRE(p.parameterChunksOn(Tier::Host) == 2);
  REQUIRE(p.chunksOn(Tier::Device) == 0);
  REQUIRE(p.bytes[int(Tier::Device)] == 2 * kGiB);
  REQUIRE(p.bytes[int(Tier::Host)] == 14 * kGiB);
  REQUIRE(p.total() == 16 * kGiB);
  REQUIRE(p.table().find("parameters of 2 chunks (2.00 GiB)") != std::string::npos);
  // A device that holds the parameters and a chunk's state: that chunk's, the first one's.
  zero::StorePlacement q =
      zero::placeModelState(params, zero::ParameterHome::Auto, state, {7 * kGiB, 20 * kGiB, 0});
  REQUIRE(q.parameterTier.empty());  // every chunk's parameters on the device
  REQUIRE(q.optimizerTier == std::vector<Tier>{Tier::Device, Tier::Host, Tier::Host, Tier::Host});
  // The host's budget counts the homed parameters before the optimizer state: what is left goes to the SSD.
  zero::StorePlacement r = zero::placeModelState(params, zero::ParameterHome::Host, state,
                                                 {zero::kUnlimited, 6 * kGiB, 12 * kGiB});
  REQUIRE(r.parameterChunksOn(Tier::Host) == 4);
  REQUIRE(r.optimizerTier == std::vector<Tier>{Tier::Nvme, Tier::Nvme, Tier::Nvme, Tier::Nvme});
  zero::StorePlacement s = zero::placeModelState(params, zero::ParameterHome::Host, state,
                                                 {zero::kUnlimited, 10 * kGiB, 9 * kGiB});
  REQUIRE(s.optimizerTier == std::vector<Tier>{Tier::Host, Tier::Host, Tier::Nvme, Tier::Nvme});
  // The memory tracer leaves a homed chunk's state where it is.
  REQUIRE(zero::chunksToPromote(p, state, 100 * kGiB) == std::vector<size_t>{0, 1});
  // device: the parameters over the device's budget are refused, naming the key that homes them elsewhere.
  std::string e = test::errorOf([&] {
    zero::placeModelState(params, zero::ParameterHome::Device, state, {2 * kGiB, 20 * kGiB, 0});
  });
  REQUIRE(e.find("store.parameter_home") != std::string::npos);
  // Neither the device nor the host holds them, and there is no SSD budget: refused with the figures.
  e = test::errorOf([&] {
    zero::placeModelState(params, zero::ParameterHome::Auto, state, {kGiB, 2 * kGiB, 0});
  });
  REQUIRE(e.find("store.host_budget_gb") != std::string::npos);
  REQUIRE(e.find("zero_optimization.nvme_path") != std::string::npos);
  // host: the parameters over the host's budget are refused even with an SSD budget.
  e = test::errorOf([&] {
    zero::placeModelState(params, zero::ParameterHome::Host, state, {kGiB, 2 * kGiB, 100 * kGiB});
  });
  REQUIRE(e.find("store.host_budget_gb") != std::string::npos);
  REQUIRE(zero::parseParameterHome("host") == zero::ParameterHome::Host);
  REQUIRE(zero::parseParameterHome("nvme") == zero::ParameterHome::Nvme);
  REQUIRE(test::errorOf([] { zero::parseParameterHome("ssd"); }).find("store.parameter_home") !=
          std::string::npos);
}

TEST_CASE("parameters go to the SSD after the host's budget, counted against the SSD's with their state",
          "[zero][store][homes][nvme]") {
  std::vector<uint64_t> params = {kGiB, kGiB, kGiB, kGiB};
  std::vector<uint64_t> state = {3 * kGiB, 3 * kGiB, 3 * kGiB, 3 * kGiB};
  // auto: a chunk's parameters on the device, two in host memory, the last on the SSD; the host's half GiB
  // left holds no chunk's state, so every chunk's state goes to the SSD.
  zero::StorePlacement p =
      zero::placeModelState(params, zero::ParameterHome::Auto, state, {kGiB, 5 * kGiB / 2, 20 * kGiB});
  REQUIRE(p.parameterTier == std::vector<Tier>{Tier::Device, Tier::Host, Tier::Host, Tier::Nvme});
  REQUIRE(p.parameterBytes == kGiB);
  REQUIRE(p.parameterHostBytes == 2 * kGiB);
  REQUIRE(p.parameterNvmeBytes == kGiB);
  REQUIRE(p.parameterBytesOn(Tier::Nvme) == kGiB);
  REQUIRE(p.parameterChunksOn(Tier::Nvme) == 1);
  REQUIRE(p.optimizerTier == std::vector<Tier>{Tier::Nvme, Tier::Nvme, Tier::Nvme, Tier::Nvme});
  REQUIRE(p.bytes[int(Tier::Nvme)] == 13 * kGiB);
  REQUIRE(p.total() == 16 * kGiB);
  REQUIRE(p.table().find("nvme") != std::string::npos);
  REQUIRE(p.table().find("parameters of 1 chunk (1.00 GiB), optimizer state of 4 chunks") !=
          std::string::npos);
  // Once a chunk's parameters went to the SSD, the later ones follow (a run of chunks per tier), even where
  // a later one would fit the host.
  zero::StorePlacement q = zero::placeModelState({kGiB, 2 * kGiB, kGiB / 2}, zero::ParameterHome::Auto,
                                                 {0, 0, 0}, {0, 3 * kGiB / 2, 20 * kGiB});
  REQUIRE(q.parameterTier == std::vector<Tier>{Tier::Host, Tier::Nvme, Tier::Nvme});
  // nvme: every chunk's there; the state follows the host's budget.
  zero::StorePlacement r = zero::placeModelState(params, zero::ParameterHome::Nvme, state,
                                                 {zero::kUnlimited, 7 * kGiB, 20 * kGiB});
  REQUIRE(r.parameterChunksOn(Tier::Nvme) == 4);
  REQUIRE(r.parameterBytes == 0);
  REQUIRE(r.optimizerTier == std::vector<Tier>{Tier::Host, Tier::Host, Tier::Nvme, Tier::Nvme});
  REQUIRE(r.bytes[int(Tier::Nvme)] == 10 * kGiB);
  REQUIRE(zero::chunksToPromote(r, state, 100 * kGiB).empty());
  // The parameters count against the SSD's budget: 4 GiB of them and 6 of state do not fit in 9.
  std::string e = test::errorOf([&] {
    zero::placeModelState(params, zero::ParameterHome::Nvme, state, {zero::kUnlimited, 7 * kGiB, 9 * kGiB});
  });
  REQUIRE(e.find("store.nvme_budget_gb") != std::string::npos);
  // nvme without an SSD budget names the setting that gives one.
  e = test::errorOf([&] {
    zero::placeModelState(params, zero::ParameterHome::Nvme, state, {zero::kUnlimited, 7 * kGiB, 0});
  });
  REQUIRE(e.find("store.parameter_home is nvme") != std::string::npos);
  REQUIRE(e.find("zero_optimization.nvme_path") != std::string::npos);
}
