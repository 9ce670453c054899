#include "strata/zero/Store.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "strata/core/Device.h"
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
  uint64_t bytes = deviceFreeBytes(Device::cpu());
  return bytes > 0 ? bytes : kUnlimited;
}

ParameterHome parseParameterHome(const std::string& text, const std::string& key) {
  if (text.empty() || text == "auto") return ParameterHome::Auto;
  if (text == "device") return ParameterHome::Device;
  if (text == "host") return ParameterHome::Host;
  if (text == "nvme") return ParameterHome::Nvme;
  STRATA_USER_FAIL("{} is '{}': give auto, device, host or nvme", key, text);
}

size_t StorePlacement::parameterChunksOn(Tier tier) const {
  if (parameterTier.empty()) return tier == Tier::Device ? optimizerTier.size() : 0;
  size_t n = 0;
  for (Tier t : parameterTier) n += t == tier;
  return n;
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
    uint64_t params = parameterBytesOn(tier);
    size_t homed = parameterChunksOn(tier);
    if (tier == Tier::Device && parameterTier.empty())
      what = detail::format("parameters ({})", gib(parameterBytes));
    else if (homed > 0)
      what = detail::format("parameters of {} chunk{} ({})", homed, homed == 1 ? "" : "s", gib(params));
    size_t n = chunksOn(tier);
    if (n > 0)
      what +=
          detail::format("{}optimizer state of {} chunk{}", what.empty() ? "" : ", ", n, n == 1 ? "" : "s");
    if (!what.empty()) out << "  " << what;
  }
  return out.str();
}

namespace {

// Tiers for the chunks in order from `first` on, past the device's chunks: the host while its budget lasts,
// then the SSD; the SSD bytes they take, or kUnlimited past its budget.
uint64_t placeOffDevice(const std::vector<uint64_t>& optimizerBytes, const std::vector<uint64_t>& nvmeBytes,
                        size_t first, const StoreBudgets& budgets, std::vector<Tier>* tiers) {
  uint64_t hostLeft = budgets.host, nvme = 0;
  bool host = true;
  for (size_t c = first; c < optimizerBytes.size(); ++c) {
    uint64_t b = optimizerBytes[c];
    if (host && hostLeft != kUnlimited && b > hostLeft) host = false;
    if (host) {
      if (hostLeft != kUnlimited) hostLeft -= b;
    } else {
      nvme += nvmeBytes.empty() ? b : nvmeBytes[c];
    }
    if (tiers) tiers->push_back(host ? Tier::Host : Tier::Nvme);
  }
  return nvme;
}

}  // namespace

StorePlacement placeModelState(uint64_t parameterBytes, const std::vector<uint64_t>& optimizerBytes,
                               const StoreBudgets& budgets, const std::vector<uint64_t>& nvmeBytes) {
  return placeModelState(std::vector<uint64_t>{parameterBytes}, ParameterHome::Device, optimizerBytes,
                         budgets, nvmeBytes);
}

StorePlacement placeModelState(const std::vector<uint64_t>& parameterBytes, ParameterHome home,
                               const std::vector<uint64_t>& optimizerBytes, const StoreBudgets& budgets,
                               const std::vector<uint64_t>& nvmeBytes) {
  STRATA_CHECK(nvmeBytes.empty() || nvmeBytes.size() == optimizerBytes.size(),
               "placeModelState: {} SSD sizes for {} chunks", nvmeBytes.size(), optimizerBytes.size());
  StorePlacement p;
  p.optimizerBytes = optimizerBytes;
  // The parameters first, in chunk order: the device while its budget lasts, then host memory.
  uint64_t deviceLeft = budgets.device, hostLeft = budgets.host;
  auto take = [](uint64_t& left, uint64_t b) {
    if (left != kUnlimited && b > left) return false;
    if (left != kUnlimited) left -= b;
    return true;
  };
  bool perChunk = home != ParameterHome::Device;
  bool device = home == ParameterHome::Device || home == ParameterHome::Auto;
  bool host = home != ParameterHome::Nvme;
  STRATA_USER_CHECK(home != ParameterHome::Nvme || budgets.nvme > 0,
                    "store.parameter_home is nvme, but the SSD tier has no budget: set "
                    "zero_optimization.nvme_path to a folder on the SSD (and store.nvme_budget_gb auto or "
                    "above 0)");
  // Once a chunk goes to a colder tier the rest follow, as for the optimizer state.
  for (size_t c = 0; c < parameterBytes.size(); ++c) {
    uint64_t b = parameterBytes[c];
    device = device && (home == ParameterHome::Device || take(deviceLeft, b));
    if (!device) host = host && take(hostLeft, b);
    Tier tier = device ? Tier::Device : host ? Tier::Host : Tier::Nvme;
    if (tier == Tier::Nvme)
      STRATA_USER_CHECK(
          home != ParameterHome::Host && budgets.nvme > 0,
          "chunk {}'s parameters ({}) fit neither the device ({} of parameters there, "
          "store.gpu_budget_gb {}) nor host memory ({} of parameters there, store.host_budget_gb {}): "
          "raise a budget, home them on the SSD (store.parameter_home auto or nvme, with "
          "zero_optimization.nvme_path), or use more ranks at zero_optimization.stage 3",
          c, gib(b), gib(p.parameterBytes), gib(budgets.device), gib(p.parameterHostBytes),
          gib(budgets.host));
    (tier == Tier::Device ? p.parameterBytes
     : tier == Tier::Host ? p.parameterHostBytes
                          : p.parameterNvmeBytes) += b;
    if (perChunk) p.parameterTier.push_back(tier);
  }
  if (home == ParameterHome::Device) {
    STRATA_USER_CHECK(budgets.device == kUnlimited || p.parameterBytes <= budgets.device,
                      "the parameters alone need {} on the device, over store.gpu_budget_gb ({}); raise it, "
                      "or set store.parameter_home: auto (or host) to home parameters in host memory",
                      gib(p.parameterBytes), gib(budgets.device));
    if (deviceLeft != kUnlimited) deviceLeft -= p.parameterBytes;
  }
  // Every chunk's on the device: no per-chunk homes.
  if (perChunk && p.parameterHostBytes == 0 && p.parameterNvmeBytes == 0) p.parameterTier.clear();
  p.bytes[int(Tier::Device)] = p.parameterBytes;
  p.bytes[int(Tier::Host)] = p.parameterHostBytes;
  p.bytes[int(Tier::Nvme)] = p.parameterNvmeBytes;
  StoreBudgets left = budgets;
  left.host = hostLeft;
  // Then each chunk's optimizer state in chunk order: the device while its budget lasts, then the host, then
  // the SSD; once a chunk goes to a colder tier the rest follow, so each tier holds a run of chunks. A chunk
  // whose parameters are off the device keeps its state off it too.
  size_t onDevice = 0;
  for (; onDevice < optimizerBytes.size(); ++onDevice) {
    uint64_t b = optimizerBytes[onDevice];
    if (p.parameterHome(onDevice) != Tier::Device) break;
    if (deviceLeft != kUnlimited && b > deviceLeft) break;
    if (deviceLeft != kUnlimited) deviceLeft -= b;
    p.optimizerTier.push_back(Tier::Device);
    p.bytes[int(Tier::Device)] += b;
  }
  placeOffDevice(optimizerBytes, nvmeBytes, onDevice, left, &p.optimizerTier);
  for (size_t c = onDevice; c < optimizerBytes.size(); ++c) {
    if (p.optimizerTier[c] == Tier::Nvme && !nvmeBytes.empty()) p.optimizerBytes[c] = nvmeBytes[c];
    p.bytes[int(p.optimizerTier[c])] += p.optimizerBytes[c];
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

uint64_t smallestDeviceBudget(uint64_t parameterBytes, const std::vector<uint64_t>& optimizerBytes,
                              const StoreBudgets& budgets, const std::vector<uint64_t>& nvmeBytes) {
  uint64_t device = parameterBytes;
  for (size_t first = 0; first <= optimizerBytes.size(); ++first) {
    if (placeOffDevice(optimizerBytes, nvmeBytes, first, budgets, nullptr) <= budgets.nvme) return device;
    if (first < optimizerBytes.size()) device += optimizerBytes[first];
  }
  return kUnlimited;
}

std::vector<size_t> chunksToPromote(const StorePlacement& placement, const std::vector<uint64_t>& deviceBytes,
                                    uint64_t room) {
  std::vector<size_t> out;
  uint64_t used = 0;
  for (Tier from : {Tier::Nvme, Tier::Host})
    for (size_t c = 0; c < placement.optimizerTier.size(); ++c) {
      if (placement.optimizerTier[c] != from || placement.parameterHome(c) != Tier::Device) continue;
      if (used + deviceBytes[c] > room) return out;
      used += deviceBytes[c];
      out.push_back(c);
    }
  return out;
}

}  // namespace strata::zero
