// The model-state store: every piece of model state has one home tier (the compute device, host memory or
// the SSD), and the bytes across the tiers add up to the model state, each piece counted once.
//
// NOTE [Store placement]
// The pieces are a rank's 16-bit (or fp32) parameter chunks (or their shards at ZeRO-3) and, per chunk, the
// optimizer state of the rank's range: fp32 master (16-bit chunks only), AdamW's m and v. Parameters are the
// hottest state (every forward and backward reads them), so they are placed first: in chunk order each
// chunk's parameters go to the device while the device budget lasts, then to host memory while the host
// budget lasts, then to the SSD (store.parameter_home: auto; device, host and nvme put every chunk's there;
// auto goes past the host only with an SSD budget, and the parameters there count against it with the
// optimizer state). A chunk homed off the device is brought into a slot ahead of each use (NOTE [Parameter
// homes] in zero/ParameterGatherer.h). The
// optimizer state of a chunk is read once per step; in chunk order it goes to the device while what the
// parameters left of the device budget lasts, then to host memory while what they left of the host budget
// lasts, then to the SSD; a chunk whose parameters are off the device keeps its optimizer state off it too
// (its update writes the parameters' home). The CPU updates AdamW's host and SSD chunks (optim/AdamW.h);
// Adafactor streams them through the device (NOTE [Adafactor host chunks] in optim/Adafactor.h). A placement
// over the SSD budget is refused before any work, with the figures. Budgets: store.gpu_budget_gb,
// store.host_budget_gb (auto: 90% of the memory available at start), store.nvme_budget_gb (auto: the free
// space of zero_optimization.nvme_path; none without a path). Until the memory tracer sizes the device budget
// from a warm-up step, the device's `auto` means "all of it" unless
// zero_optimization.offload_optimizer.device is cpu or nvme.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace strata::zero {

enum class Tier { Device, Host, Nvme };
const char* tierName(Tier tier);
constexpr int kNumTiers = 3;

constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

// Byte budgets of model state per tier; kUnlimited: no limit.
struct StoreBudgets {
  uint64_t device = kUnlimited;
  uint64_t host = kUnlimited;
  uint64_t nvme = 0;
};

// Parses a budget in GiB ("auto", or a number >= 0); `autoValue` stands for "auto". `key` names the setting
// in errors.
uint64_t parseBudgetGb(const std::string& text, uint64_t autoValue, const std::string& key);
// Host memory this process may still use: MemAvailable from /proc/meminfo (kUnlimited when unreadable).
uint64_t availableHostBytes();

// store.parameter_home: where the parameter chunks live (NOTE [Store placement]).
enum class ParameterHome { Auto, Device, Host, Nvme };
// "auto", "device", "host" or "nvme"; `key` names the setting in errors.
ParameterHome parseParameterHome(const std::string& text, const std::string& key = "store.parameter_home");

// Where a rank's model state lives.
struct StorePlacement {
  uint64_t parameterBytes = 0;            // on the device
  uint64_t parameterHostBytes = 0;        // homed in host memory
  uint64_t parameterNvmeBytes = 0;        // homed on the SSD
  std::vector<Tier> parameterTier;        // per chunk (empty: every chunk's on the device)
  std::vector<uint64_t> optimizerBytes;   // per chunk
  std::vector<Tier> optimizerTier;        // per chunk
  uint64_t bytes[kNumTiers] = {0, 0, 0};  // per tier, parameters included

  uint64_t total() const { return bytes[0] + bytes[1] + bytes[2]; }
  size_t chunksOn(Tier tier) const;
  // Chunk c's parameters' home, and how many chunks' parameters are homed on `tier`.
  Tier parameterHome(size_t c) const { return c < parameterTier.size() ? parameterTier[c] : Tier::Device; }
  size_t parameterChunksOn(Tier tier) const;
  // The parameter bytes homed on `tier`.
  uint64_t parameterBytesOn(Tier tier) const {
    return tier == Tier::Device ? parameterBytes
           : tier == Tier::Host ? parameterHostBytes
                                : parameterNvmeBytes;
  }
  // A table: one row per tier (bytes, chunks' optimizer state), for the log and `strata info`.
  std::string table() const;
};

// Places the optimizer state of each chunk (bytes per chunk, in chunk order) beside `parameterBytes` of
// device-resident parameters, within `budgets` (NOTE [Store placement]). `nvmeBytes`: what each chunk's
// state takes on the SSD, where m and v may be kept in half precision (empty: as `optimizerBytes`). Throws a
// user error naming the figures when the state does not fit.
StorePlacement placeModelState(uint64_t parameterBytes, const std::vector<uint64_t>& optimizerBytes,
                               const StoreBudgets& budgets, const std::vector<uint64_t>& nvmeBytes = {});
// The same with each chunk's parameters homed by `home` (NOTE [Store placement]): `parameterBytes` per chunk.
StorePlacement placeModelState(const std::vector<uint64_t>& parameterBytes, ParameterHome home,
                               const std::vector<uint64_t>& optimizerBytes, const StoreBudgets& budgets,
                               const std::vector<uint64_t>& nvmeBytes = {});

// The smallest device budget (the parameters, and the optimizer state of the first chunks) with which the
// rest of the optimizer state fits the host and SSD budgets: where a traced start (NOTE [Memory tracer])
// begins when the host and the SSD cannot hold all of it. kUnlimited when no device share makes it fit.
uint64_t smallestDeviceBudget(uint64_t parameterBytes, const std::vector<uint64_t>& optimizerBytes,
                              const StoreBudgets& budgets, const std::vector<uint64_t>& nvmeBytes = {});

// NOTE [Memory tracer]
// When store.gpu_budget_gb is auto and the model state with its gradient buffers would take more than 80% of
// the device, the optimizer state starts off the device (host, then SSD; only the share those cannot hold
// stays on it: smallestDeviceBudget) and the first step is traced: the device allocator's peak over it is
// everything but that state. The tracer then moves chunks' optimizer state onto the device while the traced
// peak plus the moved bytes stays within 92% of the device less a margin (1 GiB, or 1/16 of a smaller
// device): the SSD's chunks first, as each costs a read and a write of the disk per step, then the host's,
// each in chunk order. STRATA_DEVICE_MEMORY_GB overrides the device's size (to share a GPU, or to test the
// tracer on a small budget).

// The chunks whose optimizer state moves to the device within `room` bytes, each costing `deviceBytes[c]`
// there: the SSD's in chunk order, then the host's, until the next one does not fit. A chunk whose
// parameters are homed off the device stays where it is.
std::vector<size_t> chunksToPromote(const StorePlacement& placement, const std::vector<uint64_t>& deviceBytes,
                                    uint64_t room);

}  // namespace strata::zero
