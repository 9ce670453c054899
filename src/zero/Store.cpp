#include "strata/zero/Store.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "strata/core/Error.h"

namespace strata::zero {

namespace {

std::string gib(uint64_t bytes) {
  if (bytes == kUnlimited) return "unlimited";
  if (bytes > 0 && bytes < (1ull << 30)) return fmt::format("{:.1f} MiB", double(bytes) / double(1ull << 20));
  return fmt::format("{:.2f} GiB", double(bytes) / double(1ull << 30));
}

}  // namespace

const char* tierName(Tier tier) {
  switch (tier) {
    case Tier::Device:
      return "device";
    case Tier::Host:
      return "host";
    case Tier::Nvme:
      return "nvme";
  }
  return "?";
}

uint64_t parseBudgetGb(const std::string& text, uint64_t autoValue, const std::string& key) {
  if (text.empty() || text == "auto") return autoValue;
  double gb = 0;
  size_t used = 0;
  try {
    gb = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  STRATA_USER_CHECK(used == text.size() && gb >= 0, "{} is '{}': give a number of GiB (>= 0) or auto", key,
                    text);
  return uint64_t(gb * double(1ull << 30));
}

uint64_t availableHostBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return kUnlimited;
}

size_t StorePlacement::chunksOn(Tier tier) const {
  size_t n = 0;
  for (Tier t : optimizerTier) n += t == tier;
  return n;
}

std::string StorePlacement::table() const {
  std::ostringstream out;
  out << detail::format("model state {} on {} chunks:", gib(total()), optimizerTier.size());
  for (int t = 0; t < kNumTiers; ++t) {
    Tier tier = Tier(t);
    out << fmt::format("\n  {:<6} {:>12}", tierName(tier), gib(bytes[t]));
    std::string what;
    if (tier == Tier::Device) what = detail::format("parameters ({})", gib(parameterBytes));
    size_t n = chunksOn(tier);
    if (n > 0)
      what +=
          detail::format("{}optimizer state of {} chunk{}", what.empty() ? "" : ", ", n, n == 1 ? "" : "s");
    if (!what.empty()) out << "  " << what;
  }
  return out.str();
}

StorePlacement placeModelState(uint64_t parameterBytes, const std::vector<uint64_t>& optimizerBytes,
                               const StoreBudgets& budgets) {
  StorePlacement p;
  p.parameterBytes = parameterBytes;
  p.optimizerBytes = optimizerBytes;
  STRATA_USER_CHECK(budgets.device == kUnlimited || parameterBytes <= budgets.device,
                    "the parameters alone need {} on the device, over store.gpu_budget_gb ({}); the SSD and "
                    "host tiers hold optimizer state only, for now",
                    gib(parameterBytes), gib(budgets.device));
  p.bytes[int(Tier::Device)] = parameterBytes;
  uint64_t deviceLeft = budgets.device == kUnlimited ? kUnlimited : budgets.device - parameterBytes;
  uint64_t hostLeft = budgets.host;
  // In chunk order: the device while its budget lasts, then the host, then the SSD; once a chunk goes to a
  // colder tier the rest follow, so each tier holds a run of chunks.
  int tier = int(Tier::Device);
  for (uint64_t b : optimizerBytes) {
    if (tier == int(Tier::Device) && deviceLeft != kUnlimited && b > deviceLeft) tier = int(Tier::Host);
    if (tier == int(Tier::Host) && hostLeft != kUnlimited && b > hostLeft) tier = int(Tier::Nvme);
    if (tier == int(Tier::Device) && deviceLeft != kUnlimited) deviceLeft -= b;
    if (tier == int(Tier::Host) && hostLeft != kUnlimited) hostLeft -= b;
    p.optimizerTier.push_back(Tier(tier));
    p.bytes[tier] += b;
  }
  uint64_t nvme = p.bytes[int(Tier::Nvme)];
  STRATA_USER_CHECK(
      nvme <= budgets.nvme,
      "the model state needs {} beside {} on the device and {} of host memory (store.gpu_budget_gb "
      "{}, store.host_budget_gb {}); the SSD tier's budget is {} (store.nvme_budget_gb, with "
      "zero_optimization.nvme_path): raise a budget, or use more ranks",
      gib(nvme), gib(p.bytes[int(Tier::Device)]), gib(p.bytes[int(Tier::Host)]), gib(budgets.device),
      gib(budgets.host), gib(budgets.nvme));
  return p;
}

std::vector<size_t> chunksToPromote(const StorePlacement& placement, const std::vector<uint64_t>& deviceBytes,
                                    uint64_t room) {
  std::vector<size_t> out;
  uint64_t used = 0;
  for (size_t c = 0; c < placement.optimizerTier.size(); ++c) {
    if (placement.optimizerTier[c] == Tier::Device) continue;
    if (used + deviceBytes[c] > room) break;
    used += deviceBytes[c];
    out.push_back(c);
  }
  return out;
}

}  // namespace strata::zero
