// Training metrics: one record per log interval goes to the console (a Megatron-style line), to
// <out_dir>/metrics.jsonl, and to a TensorBoard event file (<out_dir>/events.out.tfevents.*).
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata::train {

// Appends TensorBoard scalar events: TFRecord framing (length, masked CRC32C, payload, masked CRC32C) around
// hand-encoded Event protobufs, the format tensorboard reads.
class TensorBoardWriter {
 public:
  // A new event file in `dir`; a run's id (train/Run.h), when given, ends its name (".run-<id>") and is the
  // message of its session-start records.
  explicit TensorBoardWriter(const std::string& dir, const std::string& runId = "");
  void scalar(const std::string& tag, double value, int64_t step);
  // A SessionLog START at `step`: TensorBoard drops the events of earlier files at this step and after, so a
  // resumed run's curve replaces the orphaned tail of the interrupted one.
  void sessionStart(int64_t step);
  // Flushes; a failed write (a full disk) throws naming the file.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void writeRecord(const std::string& payload);
  std::string path_, runId_;
  std::ofstream out_;
};

// The run id an event file's name carries ("" when none: a file of another writer, or of an older version).
std::string eventFileRunId(const std::string& fileName);

struct TrainRecord {
  int64_t step = 0, totalSteps = 0;
  double loss = 0, lr = 0, gradNorm = 0, lossScale = 1;
  double msPerIter = 0, tokensPerSec = 0;
  // Per GPU (per rank), from the model's training FLOPs per token: none when the model counts none
  // (nn::CausalLM::flopsPerToken). MFU is 0 where the device's peak is unknown (the CPU). setThroughput.
  std::optional<double> tflops, mfu;
  double elapsedSeconds = 0, etaSeconds = 0;  // since the run (or the resume) started; to the last iteration
  int64_t skippedSteps = 0;                   // in this interval: fp16 overflows and non-finite steps
  double offloadMs = 0;  // per step: the update of optimizer state off the device, which the device waits for
  // The same by phase (name -> ms per step: grads_out, cpu, params_in, ssd_wait, gpu_wait), when
  // offloadMs > 0, and the share of the off-device elements the GPU updated (NOTE [Pipelined update]).
  std::vector<std::pair<std::string, double>> offloadPhasesMs;
  double offloadGpuShare = 0;
  std::map<std::string, double> memoryGb;  // tier -> GiB in use (gpu, host)
  // Counts beside the memory (alloc_failures, arena_slots...): metrics.jsonl fields under their own names.
  std::map<std::string, int64_t> counts;
  // MoE layers (nn/MoE.h), by module name, as the last step routed them: tokens per expert, the dropped
  // share of the choices, the unweighted load-balancing and z losses.
  struct MoELayer {
    std::string name;
    std::vector<int64_t> tokensPerExpert;
    double dropped = 0, auxLoss = 0, zLoss = 0;
  };
  std::vector<MoELayer> moe;
};

// Sets r.tflops and r.mfu from r.tokensPerSec over `ranks` ranks at `flopsPerToken` training FLOPs per
// token against the device's dense peak `peakFlops` (0: unknown, MFU 0); both none when the model counts no
// FLOPs.
void setThroughput(TrainRecord& r, std::optional<double> flopsPerToken, double peakFlops, int ranks);
// "123.45 TFLOP/s | MFU 12.5%", or "TFLOP/s unknown" when the model counts no FLOPs: the log line's and
// `strata bench`'s words.
std::string formatThroughput(const TrainRecord& r);

class MetricsLogger {
 public:
  // Opens outDir/metrics.jsonl and a new event file. Records of an earlier run past `resumeStep` are dropped
  // (all of them for a fresh run, resumeStep 0), so the file never holds two values for one step; the event
  // file starts with a SessionLog START for TensorBoard to do the same. Every record carries `runId` as
  // "run_id" (NOTE [Run lineage] in train/Run.h).
  MetricsLogger(const std::string& outDir, int64_t resumeStep, const std::string& runId = "");
  // A failed write (a full disk, a removed directory) throws naming the file: metrics are never truncated
  // silently.
  void train(const TrainRecord& r);
  void eval(int64_t step, double valLoss);
  const std::string& jsonlPath() const { return jsonlPath_; }

 private:
  void writeLine(const std::string& line);
  std::string jsonlPath_, runId_;
  std::ofstream jsonl_;
  TensorBoardWriter tb_;
};

// "42s", "3m07s", "2h05m".
std::string formatDuration(double seconds);

}  // namespace strata::train
