// Training metrics: one record per log interval goes to the console (a Megatron-style line), to
// <out_dir>/metrics.jsonl, and to a TensorBoard event file (<out_dir>/events.out.tfevents.*).
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>

namespace strata::train {

// Appends TensorBoard scalar events: TFRecord framing (length, masked CRC32C, payload, masked CRC32C) around
// hand-encoded Event protobufs, the format tensorboard reads.
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& dir);
  void scalar(const std::string& tag, double value, int64_t step);
  void flush() { out_.flush(); }
  const std::string& path() const { return path_; }

 private:
  void writeRecord(const std::string& payload);
  std::string path_;
  std::ofstream out_;
};

struct TrainRecord {
  int64_t step = 0, totalSteps = 0;
  double loss = 0, lr = 0, gradNorm = 0, lossScale = 1;
  double msPerIter = 0, tokensPerSec = 0, tflops = 0, mfu = 0;
  std::map<std::string, double> memoryGb;  // tier -> GiB in use (gpu, host)
};

class MetricsLogger {
 public:
  // Opens (appending, so a resumed run continues its files) metrics.jsonl and an event file in outDir.
  explicit MetricsLogger(const std::string& outDir);
  void train(const TrainRecord& r);
  void eval(int64_t step, double valLoss);

 private:
  std::ofstream jsonl_;
  TensorBoardWriter tb_;
};

}  // namespace strata::train
