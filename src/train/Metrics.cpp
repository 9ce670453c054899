#include "strata/train/Metrics.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "strata/core/Checksum.h"
#include "strata/core/Error.h"
#include "strata/core/FileError.h"

namespace strata::train {

namespace {

uint32_t maskedCrc(const void* data, size_t n) {
  uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(v | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void tag(std::string& out, int field, int wire) {
  varint(out, uint64_t(field) << 3 | uint64_t(wire));
}
void bytesField(std::string& out, int field, const std::string& b) {
  tag(out, field, 2);
  varint(out, b.size());
  out += b;
}
template <class T>
void fixedField(std::string& out, int field, T v) {
  tag(out, field, sizeof(T) == 8 ? 1 : 5);
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.append(buf, sizeof(T));
}

double wallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

constexpr const char* kRunTag = ".run-";

TensorBoardWriter::TensorBoardWriter(const std::string& dir, const std::string& runId) : runId_(runId) {
  std::filesystem::create_directories(dir);
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  // Several writers of one process in one second (tests, repeated runs) get distinct files.
  static std::atomic<int> serial{0};
  int n = serial++;
  path_ = (std::filesystem::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}{}{}", int64_t(wallTime()),
                                                    std::string(host), getpid(),
                                                    n > 0 ? fmt::format(".{}", n) : std::string(),
                                                    runId.empty() ? std::string() : kRunTag + runId))
              .string();
  out_.open(path_, std::ios::binary);
  STRATA_USER_CHECK(out_.good(), "cannot create TensorBoard event file {}: {}", path_, std::strerror(errno));
  // Event { wall_time = 1; file_version = 3 }
  std::string event;
  fixedField(event, 1, wallTime());
  bytesField(event, 3, "brain.Event:2");
  writeRecord(event);
}

void TensorBoardWriter::writeRecord(const std::string& payload) {
  uint64_t len = payload.size();
  uint32_t lenCrc = maskedCrc(&len, 8), dataCrc = maskedCrc(payload.data(), payload.size());
  out_.write(reinterpret_cast<const char*>(&len), 8);
  out_.write(reinterpret_cast<const char*>(&lenCrc), 4);
  out_.write(payload.data(), std::streamsize(payload.size()));
  out_.write(reinterpret_cast<const char*>(&dataCrc), 4);
}

void TensorBoardWriter::flush() {
  out_.flush();
  STRATA_USER_CHECK(out_.good(), "cannot write TensorBoard event file {}: {}", path_, fileErrorText(errno));
}

void TensorBoardWriter::sessionStart(int64_t step) {
  // SessionLog { status = 1 (START); msg = 3 }, Event { wall_time = 1; step = 2; session_log = 6 }
  std::string log;
  tag(log, 1, 0);
  varint(log, 1);
  if (!runId_.empty()) bytesField(log, 3, "run " + runId_);
  std::string event;
  fixedField(event, 1, wallTime());
  tag(event, 2, 0);
  varint(event, uint64_t(step));
  bytesField(event, 6, log);
  writeRecord(event);
}

void TensorBoardWriter::scalar(const std::string& name, double value, int64_t step) {
  // Summary.Value { tag = 1; simple_value = 2 }, Summary { value = 1 }, Event { wall_time = 1; step = 2;
  // summary = 5 }
  std::string v;
  bytesField(v, 1, name);
  fixedField(v, 2, float(value));
  std::string summary;
  bytesField(summary, 1, v);
  std::string event;
  fixedField(event, 1, wallTime());
  tag(event, 2, 0);
  varint(event, uint64_t(step));
  bytesField(event, 5, summary);
  writeRecord(event);
}

std::string eventFileRunId(const std::string& fileName) {
  size_t at = fileName.rfind(kRunTag);
  return at == std::string::npos ? std::string() : fileName.substr(at + std::strlen(kRunTag));
}

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto total = int64_t(seconds + 0.5);
  char buf[32];
  if (total < 60)
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(total));
  else if (total < 3600)
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(total / 60),
                  static_cast<long long>(total % 60));
  else
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(total / 3600),
                  static_cast<long long>(total / 60 % 60));
  return buf;
}

namespace {

// Rewrites `path` keeping the records at or before `resumeStep` (a torn last line from a crash goes too).
void keepRecordsThrough(const std::string& path, int64_t resumeStep) {
  namespace fs = std::filesystem;
  if (!fs::is_regular_file(path)) return;  // absent, or a device a user pointed it at
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object() && record.contains("step") && record["step"].is_number() &&
        record["step"].get<int64_t>() <= resumeStep)
      kept += line + "\n";
  }
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept;
    out.flush();
    STRATA_USER_CHECK(out.good(), "cannot write {}: {}", tmp, std::strerror(errno));
  }
  fs::rename(tmp, path);
}

}  // namespace

MetricsLogger::MetricsLogger(const std::string& outDir, int64_t resumeStep, const std::string& runId)
    : jsonlPath_((std::filesystem::create_directories(outDir),
                  (std::filesystem::path(outDir) / "metrics.jsonl").string())),
      runId_(runId),
      tb_(outDir, runId) {
  keepRecordsThrough(jsonlPath_, resumeStep);
  jsonl_.open(jsonlPath_, std::ios::app);
  STRATA_USER_CHECK(jsonl_.good(), "cannot open {}: {}", jsonlPath_, std::strerror(errno));
  tb_.sessionStart(resumeStep + 1);
  tb_.flush();
}

void MetricsLogger::writeLine(const std::string& line) {
  jsonl_ << line << "\n";
  jsonl_.flush();
  STRATA_USER_CHECK(jsonl_.good(), "cannot write {}: {}", jsonlPath_, fileErrorText(errno));
}

void setThroughput(TrainRecord& r, std::optional<double> flopsPerToken, double peakFlops, int ranks) {
  r.tflops.reset();
  r.mfu.reset();
  if (!flopsPerToken) return;
  r.tflops = r.tokensPerSec * *flopsPerToken / 1e12 / double(ranks);
  r.mfu = peakFlops > 0 ? *r.tflops * 1e12 / peakFlops : 0.0;
}

std::string formatThroughput(const TrainRecord& r) {
  if (!r.tflops) return "TFLOP/s unknown";
  return fmt::format("{:.2f} TFLOP/s | MFU {:.1f}%", *r.tflops, 100.0 * r.mfu.value_or(0.0));
}

void MetricsLogger::train(const TrainRecord& r) {
  std::string mem;
  nlohmann::json j{{"step", r.step},
                   {"loss", r.loss},
                   {"lr", r.lr},
                   {"grad_norm", r.gradNorm},
                   {"loss_scale", r.lossScale},
                   {"ms_per_iter", r.msPerIter},
                   {"tokens_per_s", r.tokensPerSec},
                   {"elapsed_s", r.elapsedSeconds},
                   {"skipped_steps", r.skippedSteps},
                   {"offload_ms", r.offloadMs}};
  // No TFLOP/s or MFU fields for a model that counts no FLOPs (rather than a guess).
  if (r.tflops) j["tflops"] = *r.tflops;
  if (r.mfu) j["mfu"] = *r.mfu;
  if (!runId_.empty()) j["run_id"] = runId_;
  for (const auto& [phase, ms] : r.offloadPhasesMs) j["offload_" + phase + "_ms"] = ms;
  if (!r.offloadPhasesMs.empty()) j["offload_gpu_share"] = r.offloadGpuShare;
  for (const auto& [tier, gb] : r.memoryGb) {
    j["mem_" + tier + "_gb"] = gb;
    mem += fmt::format(" | mem {} {:.2f} GiB", tier, gb);
  }
  for (const auto& [name, n] : r.counts) {
    j[name] = n;
    mem += fmt::format(" | {} {}", name, n);
  }
  if (!r.moe.empty()) {
    // Per layer in metrics.jsonl; in the log line the means over the layers and the busiest expert's load
    // against an even share.
    double dropped = 0, aux = 0, z = 0, busiest = 0;
    for (const auto& layer : r.moe) {
      j["moe"][layer.name] = {{"tokens_per_expert", layer.tokensPerExpert},
                              {"dropped", layer.dropped},
                              {"aux_loss", layer.auxLoss},
                              {"z_loss", layer.zLoss}};
      dropped += layer.dropped / double(r.moe.size());
      aux += layer.auxLoss / double(r.moe.size());
      z += layer.zLoss / double(r.moe.size());
      int64_t total = 0, most = 0;
      for (int64_t n : layer.tokensPerExpert) {
        total += n;
        most = std::max(most, n);
      }
      if (total > 0)
        busiest = std::max(busiest, double(most) * double(layer.tokensPerExpert.size()) / double(total));
    }
    j["moe_dropped"] = dropped;
    j["moe_aux_loss"] = aux;
    j["moe_z_loss"] = z;
    mem += fmt::format(" | moe dropped {:.3f} aux {:.3f} z {:.3f} busiest {:.2f}x", dropped, aux, z, busiest);
  }
  writeLine(j.dump());
  std::string skipped = r.skippedSteps > 0 ? fmt::format(" | skipped {}", r.skippedSteps) : std::string();
  if (r.offloadMs > 0) {
    skipped += fmt::format(" | offload wait {:.1f} ms", r.offloadMs);
    std::string phases;
    for (const auto& [phase, ms] : r.offloadPhasesMs)
      phases += fmt::format("{}{} {:.0f}", phases.empty() ? "" : ", ", phase, ms);
    if (!phases.empty()) skipped += fmt::format(" ({}; gpu share {:.2f})", phases, r.offloadGpuShare);
  }
  spdlog::info(
      "iteration {:>6}/{:>6} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | loss scale {:.0f}{} | {:.1f} "
      "ms/iter | {:.0f} tokens/s | {}{} | elapsed {} | ETA {}",
      r.step, r.totalSteps, r.loss, r.lr, r.gradNorm, r.lossScale, skipped, r.msPerIter, r.tokensPerSec,
      formatThroughput(r), mem, formatDuration(r.elapsedSeconds), formatDuration(r.etaSeconds));
  tb_.scalar("train/loss", r.loss, r.step);
  tb_.scalar("train/lr", r.lr, r.step);
  tb_.scalar("train/grad_norm", r.gradNorm, r.step);
  tb_.scalar("perf/tokens_per_s", r.tokensPerSec, r.step);
  if (r.tflops) tb_.scalar("perf/tflops", *r.tflops, r.step);
  tb_.flush();
}

void MetricsLogger::eval(int64_t step, double valLoss) {
  nlohmann::json j{{"step", step}, {"val_loss", valLoss}};
  if (!runId_.empty()) j["run_id"] = runId_;
  writeLine(j.dump());
  spdlog::info("evaluation at iteration {} | val loss {:.4f}", step, valLoss);
  tb_.scalar("val/loss", valLoss, step);
  tb_.flush();
}

}  // namespace strata::train
