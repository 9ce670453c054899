// What a machine measures for `strata plan`: PCIe, GEMM, CPU AdamW and SSD rates, and memory sizes, kept in
// a small JSON file that `strata bench --calibrate` writes (default ~/.cache/strata/calibration.json, or
// $STRATA_CALIBRATION). Fields a machine cannot measure (the GPU's, without one) are absent from the file;
// `strata plan` takes those from measuredH200() (the reference H200's measured figures) and says so.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::plan {

struct Calibration {
  std::string date;  // ISO 8601, when it was measured
  std::string host;  // hostname
  // GPU (absent without one).
  std::optional<std::string> deviceName;
  std::optional<uint64_t> deviceMemoryBytes;
  std::optional<double> h2dGBs, d2hGBs;  // pinned host memory <-> device, GB/s (1e9)
  std::optional<double> gemmTflops;      // bf16 GEMMs at a training-like shape
  std::string gemmShape;                 // what gemmTflops timed
  // The device's dense bf16 peak (its published figure): what model FLOPs utilization is a share of.
  std::optional<double> peakTflops;
  // What the device's own AdamW update and the recomputation's rereads run at, GB/s (absent: the H200's).
  std::optional<double> deviceMemoryGBs;
  // Between the GPUs of one machine, NCCL's bus bandwidth (NVLink), GB/s; and between machines, the
  // network's, per GPU (a machine's NICs over its GPUs: 8 x 400 Gb/s for 8 GPUs is 50 GB/s).
  std::optional<double> nvlinkBusGBs, networkGBs;
  int gpusPerNode = 0;  // GPUs on one machine (0: unknown)
  // Host.
  std::optional<uint64_t> hostMemoryBytes, hostAvailableBytes;  // MemTotal, MemAvailable
  std::optional<double> cpuAdamwElemsPerS;                      // fp32 state, bf16 output, all threads
  int cpuThreads = 0;
  // SSD: O_DIRECT sequential 16 MiB blocks in nvmePath (buffered I/O with fdatasync where O_DIRECT is
  // refused: nvmeDirect false).
  std::optional<double> nvmeWriteGBs, nvmeReadGBs;
  std::optional<uint64_t> nvmeFreeBytes;
  std::string nvmePath;
  bool nvmeDirect = true;

  std::string toJson() const;
  // Throws a user error naming `origin` on malformed JSON or a field of the wrong type.
  static Calibration fromJson(const std::string& text, const std::string& origin);
};

// $STRATA_CALIBRATION, else $HOME/.cache/strata/calibration.json (else ./calibration.json).
std::string defaultCalibrationPath();
// Writes the file (creating its directory); throws a user error naming the path when it cannot.
void writeCalibration(const Calibration& calibration, const std::string& path);
// The file at `path`, or nullopt when there is none; a malformed file is an error naming it.
std::optional<Calibration> readCalibration(const std::string& path);
// The H200 machine's figures measured on the reference H200 (2026-11-29): what `strata
// plan` assumes for a field no calibration file gives.
Calibration measuredH200();
// The 8-GPU H200 machine (8 x 139 GiB of device memory, 560 GiB of host memory, 235 GiB of disk, 128 cores):
// its sizes, with measuredH200()'s rates, which that machine has not measured. `strata plan --machine h200x8
// --ranks 8` plans a job on it (the ranks split its host memory, disk and cores).
Calibration measuredH200x8();
// A cluster node of 8 H200: measuredH200x8() with 8 x 400 Gb/s InfiniBand between nodes (`--machine
// h200x8-ib`).
Calibration h200x8Cluster();
// A node of 8 A100-40GB with 1 TB of host memory and 8 x 200 Gb/s HDR InfiniBand (`--machine a100x8-ib`): the
// published figures (Calibration.cpp names each one's source), not a measurement.
Calibration a100x8Cluster();

struct SsdRates {
  double writeGBs = 0, readGBs = 0;
  bool direct = true;  // false: the file system refused O_DIRECT and buffered I/O with fdatasync served
};
// Sequential write then read of `bytes` (rounded up to whole blocks) in `blockBytes` blocks through one file
// in `directory`, removed afterwards. Throws a user error naming the path on any I/O error.
SsdRates measureSsd(const std::string& directory, uint64_t bytes, uint64_t blockBytes = 16ull << 20);
// The CPU AdamW kernel (ops::adamw on fp32 parameters, gradients, m and v, writing bf16 copies) over
// `elements`, on the threads OpenMP has: elements per second, the best of `repeats`.
double measureCpuAdamw(int64_t elements, int repeats = 5);

// What this machine has, read without timing anything: its GPU (cuda:0), host memory (MemTotal, MemAvailable;
// STRATA_HOST_MEMORY_GB stands in for both in tests), physical cores, and the free space under `nvmePath`. No
// rates.
Calibration probeMachine(const std::string& nvmePath);
// This machine's host name.
std::string thisHostName();

// The machine `strata plan` plans for, and where its figures came from. `machine` is "here", "h200"
// (the reference H200), "h200x8" (the 8-GPU machine), or a node of a cluster, "h200x8-ib" or "a100x8-ib".
// Here: an explicit `calibrationPath` is used as it is; otherwise the default calibration file when it
// describes this host (its rates, with what probeMachine reads filling its gaps), else probeMachine alone
// (the plan then takes the rates from the H200, and `notes` say so). A calibration file of another host is
// never used for this one.
struct MachineChoice {
  Calibration calibration;
  std::string source;
  std::vector<std::string> notes;
};
MachineChoice chooseMachine(const std::string& machine, const std::string& calibrationPath,
                            const std::string& nvmePath);

// Measures everything this machine has (the GPU parts only with one), printing progress to stdout.
Calibration calibrate(const std::string& nvmePath, uint64_t nvmeBytes);

}  // namespace strata::plan
