// CPU AdamW throughput: the CPU kernel of ops::adamw over N fp32 parameters with a 16-bit copy, per path and
// thread count. Each path is first checked bit for bit against the scalar one on a small set, then timed.
// Bytes per parameter (the fewest the update must move): 16 read (master, m, v, gradient) and 12 written
// (master, m, v) plus the copy (2 for bf16/f16, 4 for f32, 0 for none): 30 with bf16. --moments bf16 keeps
// m and v in bf16 (optimizer.moments_dtype): 8 bytes fewer, 22 with a bf16 copy.
// Prints one line per measurement, then a markdown table:
//   cpu_adamw PATH THREADS PARAMS MEDIAN_MS GPARAM_PER_S GB_PER_S STORES PREFETCH
// Usage: bench_cpu_adamw [--params N] [--threads 1,2,4,8,16] [--isa best|all|avx512|avx2|scalar]
//                        [--copy bf16|f16|f32|none] [--repeats R] [--memory plain|huge]
//                        [--split static|steal|both] [--stores plain,copy,stream|all] [--prefetch 0,512]
//                        [--moments fp32|bf16]
// --split picks how the threads share the update (NOTE [CPU AdamW split]; default STRATA_CPU_SPLIT's);
// a stealing split is printed as PATH-steal (avx512-steal). STRATA_CPU_PIN=all also pins the calling thread.
// --stores lists how the vector paths store (NOTE [CPU AdamW stores]; default STRATA_CPU_STORES's) and
// --prefetch the software prefetch distances in elements (default STRATA_CPU_PREFETCH's); every
// combination is timed, stores innermost, so that the variants of one thread count run back to back.
// --memory huge maps the buffers with transparent huge pages advised (madvise MADV_HUGEPAGE, as hosts with
// THP in `madvise` mode need); plain uses the ordinary host allocator. (NOTE [Host state memory] in
// core/Allocator.h: the measurement that left huge pages out of the host state.)
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "src/ops/cpu/CpuAdamW.h"
#include "strata/strata.h"

using namespace strata;
using ops::cpu::CpuIsa;

namespace {

std::vector<int> parseList(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoi(item));
  return out;
}

ops::AdamWHyper hyperAt(int step) {
  ops::AdamWHyper h;
  h.lr = 1e-4f;
  h.beta1 = 0.9f;
  h.beta2 = 0.95f;
  h.biasCorrection1 = float(1 - std::pow(0.9, step));
  h.biasCorrection2 = float(1 - std::pow(0.95, step));
  return h;
}

// Parameters in [-0.5, 0.5), gradients in [-0.01, 0.01), moments zero, written by the threads in the
// kernel's static partition (first touch: on a multi-socket host each thread's pages are local).
bool hugePages = false;           // --memory huge
DType momentsDType = DType::F32;  // --moments

Tensor buffer(int64_t n, DType dtype = DType::F32) {
  if (!hugePages) return Tensor::empty({n}, dtype);
  size_t bytes = size_t(n) * dtypeSize(dtype);
  size_t mapped = (bytes + (size_t(2) << 20) - 1) / (size_t(2) << 20) * (size_t(2) << 20);
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("bench_cpu_adamw: mmap");
    std::exit(1);
  }
  madvise(p, mapped, MADV_HUGEPAGE);
  // Never unmapped: the bench's buffers live until it exits.
  auto storage = std::make_shared<StorageImpl>(p, bytes, Device::cpu());
  return Tensor::fromStorage(std::move(storage), {n}, {1}, 0, dtype);
}

ops::AdamWTensors makeSet(int64_t n, std::optional<DType> copy) {
  ops::AdamWTensors s{buffer(n),
                      buffer(n),
                      buffer(n, momentsDType),
                      buffer(n, momentsDType),
                      0.1f,
                      copy ? buffer(n, *copy) : Tensor()};
  float *p = static_cast<float*>(s.param.data()), *g = static_cast<float*>(s.grad.data());
  char *m = static_cast<char*>(s.m.data()), *v = static_cast<char*>(s.v.data());
  size_t width = dtypeSize(momentsDType);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t h = uint32_t(i) * 2654435761u;
    p[i] = float(h >> 8) / float(1 << 24) - 0.5f;
    g[i] = (float((h * 2246822519u) >> 8) / float(1 << 24) - 0.5f) * 0.02f;
    std::memset(m + size_t(i) * width, 0, width);  // zero in either dtype
    std::memset(v + size_t(i) * width, 0, width);
  }
  if (copy) std::memset(s.copy.data(), 0, s.copy.nbytes());
  return s;
}

bool sameBits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Every path, with each way of storing, against scalar on a few odd-sized sets, three steps.
bool checkAgainstScalar(CpuIsa isa, std::optional<DType> copy, const ops::cpu::CpuAdamWOptions& options) {
  auto make = [&] {
    std::vector<ops::AdamWTensors> sets;
    for (int64_t n : {3, 1001, 65537}) sets.push_back(makeSet(n, copy));
    return sets;
  };
  auto reference = make(), candidate = make();
  for (int step = 1; step <= 3; ++step) {
    ops::cpu::adamwOnPath(CpuIsa::Scalar, reference, hyperAt(step), 0.7f);
    ops::cpu::adamwOnPath(isa, candidate, hyperAt(step), 0.7f, options);
  }
  for (size_t i = 0; i < reference.size(); ++i) {
    const auto &r = reference[i], &c = candidate[i];
    if (!sameBits(r.param, c.param) || !sameBits(r.m, c.m) || !sameBits(r.v, c.v) ||
        (copy && !sameBits(r.copy, c.copy)))
      return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = int64_t(256) << 20;
  std::vector<int> threadCounts = {1, 2, 4, 8, 16};
  std::string isaArg = "best", copyArg = "bf16";
  std::vector<ops::cpu::CpuSplit> splits = {ops::cpu::activeCpuSplit()};
  std::vector<ops::cpu::CpuStores> storesList = {ops::cpu::activeCpuStores()};
  std::vector<int> prefetches = {int(ops::cpu::activeCpuPrefetch())};
  int repeats = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--params")
      params = int64_t(std::stod(argv[i + 1]));
    else if (a == "--threads")
      threadCounts = parseList(argv[i + 1]);
    else if (a == "--isa")
      isaArg = argv[i + 1];
    else if (a == "--copy")
      copyArg = argv[i + 1];
    else if (a == "--repeats")
      repeats = std::max(1, std::stoi(argv[i + 1]));
    else if (a == "--memory")
      hugePages = std::string(argv[i + 1]) == "huge";
    else if (a == "--split") {
      std::string v = argv[i + 1];
      if (v != "static" && v != "steal" && v != "both") {
        std::fprintf(stderr, "bench_cpu_adamw: --split %s: expected static, steal or both\n", v.c_str());
        return 2;
      }
      splits.clear();
      if (v != "steal") splits.push_back(ops::cpu::CpuSplit::Static);
      if (v != "static") splits.push_back(ops::cpu::CpuSplit::Steal);
    } else if (a == "--stores") {
      std::string v = argv[i + 1] == std::string("all") ? "plain,copy,stream" : argv[i + 1];
      storesList.clear();
      std::stringstream in(v);
      for (std::string item; std::getline(in, item, ',');) {
        auto known = {ops::cpu::CpuStores::Plain, ops::cpu::CpuStores::Copy, ops::cpu::CpuStores::Stream};
        auto it = std::find_if(known.begin(), known.end(),
                               [&](ops::cpu::CpuStores s) { return item == ops::cpu::cpuStoresName(s); });
        if (it == known.end()) {
          std::fprintf(stderr, "bench_cpu_adamw: --stores %s: expected plain, copy, stream or all\n",
                       item.c_str());
          return 2;
        }
        storesList.push_back(*it);
      }
    } else if (a == "--prefetch") {
      prefetches = parseList(argv[i + 1]);
    } else if (a == "--moments") {
      std::string v = argv[i + 1];
      if (v != "fp32" && v != "bf16") {
        std::fprintf(stderr, "bench_cpu_adamw: --moments %s: expected fp32 or bf16\n", v.c_str());
        return 2;
      }
      momentsDType = v == "bf16" ? DType::BF16 : DType::F32;
    } else {
      std::fprintf(stderr, "bench_cpu_adamw: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::optional<DType> copy;
  if (copyArg != "none") copy = dtypeFromName(copyArg);
  double bytesPerParam =
      12.0 + 4.0 * double(dtypeSize(momentsDType)) + (copy ? double(dtypeSize(*copy)) : 0.0);

  std::vector<CpuIsa> paths;
  for (CpuIsa isa : {CpuIsa::Avx512, CpuIsa::Avx2, CpuIsa::Scalar}) {
    bool wanted = isaArg == "all" || isaArg == ops::cpu::cpuIsaName(isa) ||
                  (isaArg == "best" && isa == ops::cpu::activeCpuIsa());
    if (!wanted) continue;
    if (!ops::cpu::cpuIsaSupported(isa)) {
      std::printf("# %s: not supported by this CPU, skipped\n", ops::cpu::cpuIsaName(isa));
      continue;
    }
    for (ops::cpu::CpuStores stores : storesList)
      for (int prefetch : prefetches)
        if (!checkAgainstScalar(isa, copy, {.stores = stores, .prefetchElems = prefetch})) {
          std::fprintf(stderr,
                       "bench_cpu_adamw: the %s path with %s stores and prefetch %d differs from the scalar "
                       "path\n",
                       ops::cpu::cpuIsaName(isa), ops::cpu::cpuStoresName(stores), prefetch);
          return 1;
        }
    paths.push_back(isa);
  }
  if (paths.empty()) {
    std::fprintf(stderr, "bench_cpu_adamw: no path to run for --isa %s\n", isaArg.c_str());
    return 1;
  }
  std::printf(
      "# %lld parameters, copy %s, moments %s, %.0f bytes per parameter, %d repeats (median), omp max "
      "threads "
      "%d, %s pages\n",
      (long long)params, copyArg.c_str(), dtypeName(momentsDType), bytesPerParam, repeats,
      omp_get_max_threads(), hugePages ? "huge" : "plain");
  std::fflush(stdout);

  std::vector<ops::AdamWTensors> sets{makeSet(params, copy)};
  struct Row {
    std::string path;
    int threads;
    double ms, gparams, gbs;
    const char* stores;
    int prefetch;
  };
  std::vector<Row> rows;
  int step = 0;
  for (CpuIsa isa : paths) {
    for (ops::cpu::CpuSplit split : splits) {
      std::string path =
          std::string(ops::cpu::cpuIsaName(isa)) + (split == ops::cpu::CpuSplit::Steal ? "-steal" : "");
      for (int threads : threadCounts) {
        omp_set_num_threads(threads);
        // The scalar path stores plainly and never prefetches: one run.
        bool scalar = isa == CpuIsa::Scalar;
        for (int prefetch : scalar ? std::vector<int>{0} : prefetches) {
          for (ops::cpu::CpuStores stores :
               scalar ? std::vector<ops::cpu::CpuStores>{ops::cpu::CpuStores::Plain} : storesList) {
            ops::cpu::CpuAdamWOptions options{.split = split, .stores = stores, .prefetchElems = prefetch};
            // Warm-up: threads started and pinned.
            ops::cpu::adamwOnPath(isa, sets, hyperAt(++step), 1.0f, options);
            std::vector<double> ms;
            for (int r = 0; r < repeats; ++r) {
              auto start = std::chrono::steady_clock::now();
              ops::cpu::adamwOnPath(isa, sets, hyperAt(++step), 1.0f, options);
              ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                               .count());
            }
            std::sort(ms.begin(), ms.end());
            double median = ms[ms.size() / 2];
            Row row{path,
                    threads,
                    median,
                    double(params) / (median * 1e-3) / 1e9,
                    double(params) * bytesPerParam / (median * 1e-3) / 1e9,
                    ops::cpu::cpuStoresName(stores),
                    prefetch};
            rows.push_back(row);
            std::printf("cpu_adamw %s %d %lld %.3f %.3f %.1f %s %d\n", path.c_str(), threads,
                        (long long)params, row.ms, row.gparams, row.gbs, row.stores, row.prefetch);
            std::fflush(stdout);
          }
        }
      }
    }
  }
  std::printf(
      "\n| path | stores | prefetch | threads | ms/step | Gparam/s | GB/s "
      "|\n|---|---|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows)
    std::printf("| %s | %s | %d | %d | %.2f | %.3f | %.1f |\n", r.path.c_str(), r.stores, r.prefetch,
                r.threads, r.ms, r.gparams, r.gbs);
  return 0;
}
