// The SSD tier's bandwidth per backend (NOTE [SSD tier] in zero/NvmeTier.h), as the optimizer drives it: a
// file of --gb GiB under --dir, in chunks whose fp32 master is --chunk-mb MiB (m and v in --dtype), written
// behind and read ahead through two buffer sets. Every chunk read back is checked (its number and a sample of
// its values). Rows: io_uring (where built) and the thread pool at --depth and --block-mb, and "one-piece":
// one 16 MiB piece in flight, as the tier moved its bytes before them. GB/s counts the file's bytes (the
// median of --repeats).
// Prints:  nvme BACKEND depth DEPTH block_MiB BLOCK dtype DTYPE file_GiB SIZE write_GB/s W read_GB/s R
// Usage: bench_nvme --dir DIR [--gb 4] [--chunk-mb 64] [--block-mb 16] [--depth 8] [--dtype fp32|bf16|fp16]
//                   [--backend both|uring|threads] [--repeats 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "strata/strata.h"
#include "strata/zero/NvmeTier.h"

using namespace strata;

namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  const char* label;
  zero::NvmeIoConfig io;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The value element i of set s holds (exact in bf16 and fp16: small integers).
float pattern(size_t s, size_t i) {
  return float(int(i % 61) - 30 + int(s));
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, backendArg = "both";
  double gb = 4, chunkMb = 64, blockMb = 16;
  int64_t depth = 8;
  int repeats = 3;
  DType dtype = DType::F32;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--dir")
      dir = v;
    else if (a == "--gb")
      gb = std::stod(v);
    else if (a == "--chunk-mb")
      chunkMb = std::stod(v);
    else if (a == "--block-mb")
      blockMb = std::stod(v);
    else if (a == "--depth")
      depth = std::stoll(v);
    else if (a == "--dtype")
      dtype = v == "fp32" ? DType::F32 : v == "bf16" ? DType::BF16 : v == "fp16" ? DType::F16 : DType::U8;
    else if (a == "--backend")
      backendArg = v;
    else if (a == "--repeats")
      repeats = std::max(1, std::stoi(v));
  }
  if (dir.empty() || dtype == DType::U8 ||
      (backendArg != "both" && backendArg != "uring" && backendArg != "threads")) {
    std::fprintf(stderr,
                 "usage: bench_nvme --dir DIR [--gb 4] [--chunk-mb 64] [--block-mb 16] [--depth 8] "
                 "[--dtype fp32|bf16|fp16] [--backend both|uring|threads] [--repeats 3]\n");
    return 2;
  }
  int64_t elems = std::max<int64_t>(1024, int64_t(chunkMb * double(1 << 20) / 4));
  double extent = double(elems) * double(4 + 2 * dtypeSize(dtype));
  size_t chunks = size_t(std::max(1.0, gb * double(1ull << 30) / extent + 0.5));
  int64_t blockBytes = int64_t(blockMb * double(1 << 20));

  std::vector<Row> rows;
  if (backendArg != "threads" && zero::NvmeTier::uringBuilt())
    rows.push_back({"io_uring", {blockBytes, depth, zero::NvmeBackend::Uring}});
  if (backendArg == "uring" && !zero::NvmeTier::uringBuilt()) {
    std::fprintf(stderr, "bench_nvme: this build has no liburing\n");
    return 2;
  }
  if (backendArg != "uring") rows.push_back({"threads", {blockBytes, depth, zero::NvmeBackend::Threads}});
  rows.push_back({"one-piece", {int64_t(16) << 20, 1, zero::NvmeBackend::Threads}});

  // Two buffer sets of a chunk's three fields, as the optimizer keeps.
  std::vector<float> sets[2][3];
  for (size_t s = 0; s < 2; ++s)
    for (auto& f : sets[s]) {
      f.resize(size_t(elems));
      for (size_t i = 0; i < f.size(); ++i) f[i] = pattern(s, i);
    }
  auto fields = [&](size_t s) {
    return std::vector<zero::NvmeTier::FieldValues>{{zero::NvmeTier::Master, sets[s][0].data()},
                                                    {zero::NvmeTier::FirstMoment, sets[s][1].data()},
                                                    {zero::NvmeTier::SecondMoment, sets[s][2].data()}};
  };
  int failures = 0;
  for (const Row& row : rows) {
    std::vector<double> writeGBs, readGBs;
    std::string used;
    for (int r = 0; r < repeats; ++r) {
      zero::NvmeTier tier(dir, 0, std::vector<int64_t>(chunks, elems), dtype, row.io);
      used = tier.backendName();
      double bytes = double(tier.fileBytes());
      // Write-behind: chunk k leaves from set k % 2 once chunk k - 2's write from it has ended.
      std::vector<zero::NvmeTier::Ticket> tickets(chunks, 0);
      auto t0 = Clock::now();
      for (size_t k = 0; k < chunks; ++k) {
        if (k >= 2) tier.wait(tickets[k - 2]);
        for (auto& f : sets[k % 2]) f[0] = float(k % 200);
        tickets[k] = tier.writeAsync(k, fields(k % 2));
      }
      tier.wait(tickets.back());
      auto t1 = Clock::now();
      // Read-ahead: chunk k + 1 is in flight while chunk k is checked.
      for (auto& s : sets)
        for (auto& f : s) f.assign(f.size(), -1.0f);
      tickets[0] = tier.readAsync(0, fields(0));
      for (size_t k = 0; k < chunks; ++k) {
        if (k + 1 < chunks) tickets[k + 1] = tier.readAsync(k + 1, fields((k + 1) % 2));
        tier.wait(tickets[k]);
        for (const auto& f : sets[k % 2]) {
          bool ok = f[0] == float(k % 200);
          for (size_t i = 1; i < f.size(); i += 4093) ok = ok && f[i] == pattern(k % 2, i);
          if (!ok) ++failures;
        }
        // The set is refilled by the read of chunk k + 2, issued next, behind this check.
      }
      auto t2 = Clock::now();
      writeGBs.push_back(bytes / std::chrono::duration<double>(t1 - t0).count() / 1e9);
      readGBs.push_back(bytes / std::chrono::duration<double>(t2 - t1).count() / 1e9);
    }
    std::printf(
        "nvme %-9s %-8s depth %3ld block_MiB %6.2f dtype %s file_GiB %.2f write_GB/s %.3f read_GB/s %.3f\n",
        row.label, used.c_str(), long(row.io.queueDepth), double(row.io.blockBytes) / double(1 << 20),
        dtypeName(dtype), double(chunks) * extent / double(1ull << 30), median(writeGBs), median(readGBs));
  }
  if (failures > 0) {
    std::fprintf(stderr, "bench_nvme: %d chunk fields read back wrong\n", failures);
    return 1;
  }
  return 0;
}
