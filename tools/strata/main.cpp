// The `strata` command: train, bench, info, plan, generate, convert, tokenize, embed, config.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include <unistd.h>

#include "models/Zoo.h"
#include "models/ZooHf.h"
#include "strata/config/Config.h"
#include "strata/config/ConfigKeys.h"
#include "strata/core/Allocator.h"
#include "strata/data/SentencePieceTokenizer.h"
#include "strata/data/Tokenize.h"
#include "strata/data/WordPieceTokenizer.h"
#include "strata/distributed/Launch.h"
#include "strata/interop/HfImport.h"
#include "strata/interop/SentenceEmbedder.h"
#include "strata/optim/Adafactor.h"
#include "strata/plan/Calibration.h"
#include "strata/plan/Plan.h"
#include "strata/strata.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Interrupts.h"
#include "strata/train/Trainer.h"
#include "strata/zero/ChunkLayout.h"

using namespace strata;

namespace {

const char* kCommands[] = {"train",   "bench",    "info",  "plan",  "generate",
                           "convert", "tokenize", "embed", "config"};

// A word as a POSIX shell reads it back: as it is when it is plain, else in single quotes.
std::string shellWord(const std::string& word) {
  bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("_./=:,+@%-", ch) != nullptr;
  });
  if (plain) return word;
  std::string out = "'";
  for (char ch : word) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::string shellLine(const std::vector<std::string>& words) {
  std::string line;
  for (const auto& w : words) line += (line.empty() ? "" : " ") + shellWord(w);
  return line;
}

// The mpirun words that started this rank: its parent's command line up to this program when the parent is
// mpirun (it is on rank 0's host), else `mpirun -np N` with what the environment shows. Open MPI's kill
// timeout is added when it is unset (NOTE [Interrupts] in train/Interrupts.h).
std::vector<std::string> mpirunWords(const std::vector<std::string>& own, int ranks) {
  std::vector<std::string> parent;
  {
    std::ifstream in("/proc/" + std::to_string(getppid()) + "/cmdline", std::ios::binary);
    std::string word;
    while (std::getline(in, word, '\0')) parent.push_back(word);
  }
  std::vector<std::string> words;
  std::string launcher = parent.empty() ? "" : std::filesystem::path(parent[0]).filename().string();
  bool isMpirun = launcher == "mpirun" || launcher == "mpiexec" || launcher == "orterun";
  // The parent's words end with this program's own (its path as given, then the same arguments).
  if (isMpirun && parent.size() > own.size()) {
    size_t at = parent.size() - own.size();
    bool same = std::filesystem::path(parent[at]).filename() == std::filesystem::path(own[0]).filename();
    for (size_t i = 1; same && i < own.size(); ++i) same = parent[at + i] == own[i];
    if (same) words.assign(parent.begin(), parent.begin() + std::ptrdiff_t(at));
  }
  if (words.empty()) {
    words = {"mpirun", "-np", std::to_string(ranks)};
    const char* oversubscribe = std::getenv("OMPI_MCA_rmaps_base_oversubscribe");
    if (oversubscribe && std::string(oversubscribe) == "1") words.push_back("--oversubscribe");
    if (geteuid() == 0) words.push_back("--allow-run-as-root");
  }
  if (!train::openMpiKillTimeout().set)
    words.insert(words.begin() + 1, {"--mca", "odls_base_sigkill_timeout", "30"});
  return words;
}

// The command that resumes this run: the one that started it with --resume (and without --overwrite), the
// save directory spelt out when the command's own config would not find it, and under mpirun the mpirun
// words with their rank count.
std::string resumeCommand(const std::vector<std::string>& argv, const config::Config& given,
                          const train::Trainer& trainer) {
  std::vector<std::string> words;
  if (train::launchedByOpenMpi()) words = mpirunWords(argv, trainer.parallel().worldSize());
  words.push_back(argv[0]);
  for (size_t i = 1; i < argv.size(); ++i)
    if (argv[i] != "--overwrite" && argv[i] != "--resume") words.push_back(argv[i]);
  std::string saveDir = trainer.saveDirectory();
  if (train::saveDirectoryOf(given) != saveDir) {
    words.push_back("--set");
    words.push_back("checkpoint.save=" + saveDir);
  }
  words.push_back("--resume");
  return shellLine(words);
}

int runTrain(const std::string& configPath, std::vector<std::string> overrides, bool resume, bool overwrite,
             const std::vector<std::string>& argv) {
  // Under mpirun every rank reads the same config: a problem with it is rank 0's to print, once.
  int launchRank = dist::launchInfoFromEnvironment().rank;
  if (resume) overrides.push_back("checkpoint.resume=true");
  config::Config config;
  try {
    config = config::loadConfig(configPath, overrides);
  } catch (const Error& e) {
    if (launchRank != 0) throw train::ReportedByRankZero(e.message());
    throw;
  }
  config.checkpoint.overwrite = overwrite;
  train::Trainer trainer(config);
  std::string resumeWith = resumeCommand(argv, config, trainer);
  trainer.setResumeCommand(resumeWith);
  train::TrainResult r = trainer.run();
  if (!trainer.parallel().isMain())
    return r.interruptSignal != 0 ? 128 + r.interruptSignal : 0;  // rank 0 reports
  if (r.alreadyComplete) {
    std::printf(
        "\nthe run is complete (checkpoint %s, iteration %ld); sample from it with: strata generate %s\n",
        r.checkpoint.c_str(), long(r.steps), r.checkpoint.c_str());
    return 0;
  }
  std::string val = r.evaluations > 0 ? fmt::format(", val loss {:.4f}", r.valLoss) : std::string();
  std::string skipped =
      r.skippedSteps > 0 ? fmt::format(" ({} steps skipped)", r.skippedSteps) : std::string();
  if (r.interruptSignal != 0) {
    std::printf("\ninterrupted after %ld iterations: train loss %.4f%s%s\n", long(r.steps), r.trainLoss,
                val.c_str(), skipped.c_str());
    // The newest complete checkpoint of the run: this one's, or the one it resumed.
    std::string last = !r.checkpoint.empty() ? r.checkpoint : trainer.start().checkpoint;
    if (!last.empty())
      std::printf("checkpoint %s; resume with:\n  %s\n", last.c_str(), resumeWith.c_str());
    else
      std::printf("no checkpoint was saved (set checkpoint.save to keep interrupted runs)\n");
    if (r.stoppedByMpirun)
      std::printf(
          "(mpirun may take up to twice its kill timeout to return; the ranks are done, and a second Ctrl-C "
          "ends it now)\n");
    std::fflush(stdout);
    return 128 + r.interruptSignal;
  }
  std::printf("\nfinished %ld iterations: train loss %.4f%s%s\n", long(r.steps), r.trainLoss, val.c_str(),
              skipped.c_str());
  if (!r.checkpoint.empty())
    std::printf("checkpoint %s; sample from it with: strata generate %s\n", r.checkpoint.c_str(),
                r.checkpoint.c_str());
  return 0;
}

// Trains `iters` measured steps after as many warm-up steps on random tokens (data.format: random), with no
// evaluation, sample or checkpoint, and reports the measured interval.
int runBench(const std::string& configPath, std::vector<std::string> overrides, int64_t iters, bool profile) {
  STRATA_USER_CHECK(iters > 0, "bench: --iters must be positive, got {}", iters);
  std::string out = (std::filesystem::temp_directory_path() / "strata-bench").string();
  std::filesystem::remove_all(out);
  // Later --set values win, so the bench's own settings go last.
  for (std::string kv :
       {std::string("data.format=random"), "train.train_iters=" + std::to_string(2 * iters),
        "train.log_interval=" + std::to_string(iters), std::string("train.eval_interval=0"),
        std::string("train.sample_length=0"), std::string("lr_schedule.warmup_iters=0"),
        std::string("checkpoint.save="), std::string("checkpoint.save_interval=0"), "train.out_dir=" + out})
    overrides.push_back(kv);
  if (profile) setenv("STRATA_PROFILE", "1", 1);
  config::Config config = config::loadConfig(configPath, overrides, /*requireData=*/false);
  train::Trainer trainer(config);
  train::TrainResult r = trainer.run();
  const train::TrainRecord& m = r.last;
  std::string memory;
  for (const auto& [tier, gib] : m.memoryGb) memory += fmt::format(" | {} {:.2f} GiB", tier, gib);
  for (const auto& [name, n] : m.counts) memory += fmt::format(" | {} {}", name, n);
  std::printf("\nbench %s: %ld measured iterations after %ld warm-up | %.1f ms/iter | %.0f tokens/s | %s%s\n",
              configPath.c_str(), long(iters), long(iters), m.msPerIter, m.tokensPerSec,
              train::formatThroughput(m).c_str(), memory.c_str());
  return 0;
}

std::string humanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s", b, units[u]);
  return buf;
}

int runInfo(const std::string& configPath, const std::vector<std::string>& overrides) {
  config::Config c = config::loadConfig(configPath, overrides, /*requireData=*/false);
  // Counted from the architecture's own formula, so `info` answers instantly even for models that would not
  // fit here.
  models::ModelSpec spec = config::modelSpecFrom(c, Device::cpu());
  int64_t params = models::numParameters(spec);
  double flops = models::flopsPerToken(spec);
  std::printf("model          %s: %s\n", c.model.arch.c_str(), models::describeShape(spec).c_str());
  std::printf("head           %s\n", models::describeHead(spec).c_str());
  std::printf("parameters     %ld (%.3f B)\n", long(params), double(params) / 1e9);
  std::printf("FLOPs/token    %.4g (%s, training)\n", flops, models::flopsFormula(spec).c_str());
  std::printf("tokens/iter    %ld\n", long(c.train.globalBatchSize * c.model.seqLength));
  // Bytes per parameter of each kind of state, as training lays it out (zero/ChunkManager.h): parameters
  // in chunks of the compute dtype, fp32 gradient buffers per chunk, and the optimizer's fp32 master and
  // state per chunk (a fp32 parameter is its own master): AdamW's m and v, or Adafactor's factored second
  // moment and optional first moment (optim::adafactorStateBytes).
  // The configured device, present or not (info plans; it does not run).
  Device planned = c.train.device == "auto" ? (cudaAvailable() ? Device::cuda(0) : Device::cpu())
                                            : Device::parse(c.train.device);
  DType compute = config::computeDTypeFor(c, planned);
  std::string dt = dtypeName(compute);
  struct Kind {
    std::string name;
    double bytesPerParam;
    std::string note;
  };
  auto shapes = models::parameterShapes(config::modelSpecFrom(c, Device::cpu()));
  bool adafactor = c.optimizer.type == "adafactor";
  std::string optimizerName = adafactor ? "Adafactor" : "AdamW";
  std::vector<Kind> kinds = {{dt + " parameters", double(dtypeSize(compute)), "views into the chunks"}};
  kinds.push_back({"fp32 gradients", 4, "flat buffer per chunk"});
  if (compute != DType::F32) kinds.push_back({"fp32 masters (" + optimizerName + ")", 4, "per chunk"});
  if (adafactor) {
    optim::AdafactorConfig ac = config::adafactorConfigFrom(c);
    std::vector<Shape> shapeList;
    for (const auto& [name, shape] : shapes) shapeList.push_back(shape);
    double total = double(optim::adafactorStateBytes(shapeList, ac));
    double firstMoment = ac.hasFirstMoment() ? (ac.firstMomentBf16 ? 2.0 : 4.0) : 0.0;
    if (ac.hasFirstMoment())
      kinds.push_back({std::string("Adafactor m (") + (ac.firstMomentBf16 ? "bf16" : "fp32") + ")",
                       firstMoment, "per chunk"});
    kinds.push_back({"Adafactor v (factored)", total / double(params) - firstMoment,
                     "row and column means per matrix, full v per vector"});
  } else {
    // optimizer.moments_dtype: fp32 or bf16, in every tier.
    const std::string& moments = c.optimizer.momentsDType;
    double momentBytes = moments == "bf16" ? 2 : 4;
    kinds.push_back({"AdamW m (" + moments + ")", momentBytes, "per chunk"});
    kinds.push_back({"AdamW v (" + moments + ")", momentBytes, "per chunk"});
  }
  double perParam = 0;
  std::printf("model state by kind:       bytes/param  total\n");
  // Whole numbers as before; Adafactor's factored state needs decimals.
  auto figure = [](double b) {
    return b == std::floor(b) ? fmt::format("{:6.0f}", b) : fmt::format("{:6.3f}", b);
  };
  for (const auto& k : kinds) {
    perParam += k.bytesPerParam;
    std::printf("  %-28s %s  %10s%s%s\n", k.name.c_str(), figure(k.bytesPerParam).c_str(),
                humanBytes(k.bytesPerParam * double(params)).c_str(), k.note.empty() ? "" : "  ",
                k.note.c_str());
  }
  std::printf("  %-28s %s  %10s\n", "model state total", figure(perParam).c_str(),
              humanBytes(perParam * double(params)).c_str());
  double optimizerState = perParam - double(dtypeSize(compute)) - 4;
  std::printf("optimizer state (%s, optimizer.type): %.3f bytes/param beyond the parameters and gradients\n",
              optimizerName.c_str(), optimizerState);
  int64_t chunkBytes = int64_t(c.zero.chunkSizeMb * double(1 << 20));
  zero::ChunkLayout layout = zero::planChunks(shapes, chunkBytes, compute);
  std::printf("parameter chunks (zero_optimization.chunk_size_mb %g, first-use order): %s",
              c.zero.chunkSizeMb, layout.table().c_str());
  int64_t best = zero::bestChunkBytes(shapes, compute);
  if (best != chunkBytes && layout.chunks.size() > 1) {
    zero::ChunkLayout bestLayout = zero::planChunks(shapes, best, compute);
    std::printf("  chunk_size_mb %ld would fill %.1f%% (%zu chunks)\n", long(best >> 20),
                100.0 * double(bestLayout.payloadElems()) / double(bestLayout.capacityElems()),
                bestLayout.chunks.size());
  }
  return 0;
}

std::string optionalFigure(const std::optional<double>& value, const char* format) {
  return value ? fmt::format(fmt::runtime(format), *value) : std::string("-");
}

std::string optionalBytes(const std::optional<uint64_t>& value) {
  return value ? humanBytes(double(*value)) : std::string("-");
}

// `strata bench --calibrate`: this machine's rates and sizes, for `strata plan` (plan/Calibration.h).
int runCalibrate(const std::string& outPath, const std::string& nvmePath, double nvmeGb) {
  std::string path = outPath.empty() ? plan::defaultCalibrationPath() : outPath;
  std::string dir = nvmePath.empty() ? std::filesystem::temp_directory_path().string() : nvmePath;
  auto start = std::chrono::steady_clock::now();
  plan::Calibration c = plan::calibrate(dir, uint64_t(nvmeGb * double(1ull << 30)));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  plan::writeCalibration(c, path);
  std::printf("\n%-34s %s\n", "what", "measured");
  std::printf("%-34s %s\n", "device", c.deviceName.value_or("none (no GPU: GPU fields left out)").c_str());
  std::printf("%-34s %s\n", "device memory", optionalBytes(c.deviceMemoryBytes).c_str());
  std::printf("%-34s %s\n", "PCIe pinned H2D", optionalFigure(c.h2dGBs, "{:.1f} GB/s").c_str());
  std::printf("%-34s %s\n", "PCIe pinned D2H", optionalFigure(c.d2hGBs, "{:.1f} GB/s").c_str());
  std::printf("%-34s %s%s\n", "bf16 GEMM", optionalFigure(c.gemmTflops, "{:.0f} TFLOP/s").c_str(),
              c.gemmTflops ? (" (" + c.gemmShape + ")").c_str() : "");
  std::printf("%-34s %s\n", "host memory (total / available)",
              (optionalBytes(c.hostMemoryBytes) + " / " + optionalBytes(c.hostAvailableBytes)).c_str());
  std::printf(
      "%-34s %s (%d threads)\n", "CPU AdamW (fp32 state, bf16 out)",
      optionalFigure(c.cpuAdamwElemsPerS ? std::optional<double>(*c.cpuAdamwElemsPerS / 1e9) : std::nullopt,
                     "{:.2f} G elements/s")
          .c_str(),
      c.cpuThreads);
  std::printf("%-34s %s write, %s read%s\n", "SSD, 16 MiB blocks",
              optionalFigure(c.nvmeWriteGBs, "{:.2f} GB/s").c_str(),
              optionalFigure(c.nvmeReadGBs, "{:.2f} GB/s").c_str(),
              !c.nvmeWriteGBs ? " (too little free space to measure)"
              : c.nvmeDirect  ? " (O_DIRECT)"
                              : " (the file system refused O_DIRECT: buffered, fdatasync)");
  std::printf("%-34s %s (%s free)\n", "SSD path", c.nvmePath.c_str(), optionalBytes(c.nvmeFreeBytes).c_str());
  std::printf(
      "\nwrote %s in %.1f s; `strata plan CONFIG` reads it (STRATA_CALIBRATION or --calibration pick "
      "another)\n",
      path.c_str(), seconds);
  return 0;
}

// `strata plan CONFIG`: where the model state will live, the activations and the predicted step time
// (NOTE [Plan model] in plan/Plan.h); a config that does not fit is refused with the largest model of its
// family that does.
int runPlan(const std::string& configPath, const std::vector<std::string>& overrides, int ranks,
            int ranksPerNode, const std::string& machine, const std::string& calibrationPath, bool layouts) {
  STRATA_USER_CHECK(ranks >= 1, "plan: --ranks must be at least 1, got {}", ranks);
  config::Config c = config::loadConfig(configPath, overrides, /*requireData=*/false);
  STRATA_USER_CHECK(
      layouts || c.parallel.automatic || ranks % std::max<int64_t>(1, c.parallel.tensor) == 0,
      "{}: parallel.tensor ({}) must divide the number of ranks ({}); plan --ranks a multiple of "
      "it, or --layouts to weigh every split",
      configPath, c.parallel.tensor, ranks);
  plan::PlanOptions options;
  options.ranks = ranks;
  options.ranksPerNode = ranksPerNode;
  // The machine it runs on, unless told otherwise (--machine h200, --calibration FILE).
  plan::MachineChoice chosen = plan::chooseMachine(machine, calibrationPath, c.zero.nvmePath);
  options.calibration = chosen.calibration;
  options.calibrationSource = chosen.source;
  // A machine of several GPUs (a preset, or a calibration that says so) takes that many ranks unless told.
  if (ranksPerNode == 0 && chosen.calibration.gpusPerNode > 1)
    options.ranksPerNode = chosen.calibration.gpusPerNode;
  STRATA_USER_CHECK(
      options.ranksPerNode == 0 || options.ranksPerNode >= ranks || ranks % options.ranksPerNode == 0,
      "plan: --ranks {} is not a whole number of machines of {} (--gpus-per-node)", ranks,
      options.ranksPerNode);
  if (c.parallel.automatic && !layouts) {
    // NOTE [Parallel auto] in plan/Plan.h: the layout the trainer would take, its plan, and the table; when
    // none fits that the trainer runs, the config's own split (parallel.tensor 1) is refused below.
    plan::LayoutChoice choice = plan::chooseLayout(c, options);
    if (choice.chosen >= 0) {
      std::printf("%s", plan::formatPlan(choice.layouts[size_t(choice.chosen)].plan).c_str());
      for (const std::string& note : chosen.notes) std::printf("  - %s\n", note.c_str());
    }
    std::printf("%s%s\n", plan::formatLayouts(choice.layouts).c_str(), choice.why.c_str());
    std::fflush(stdout);
    if (choice.chosen >= 0) return 0;
  }
  if (layouts) {
    // NOTE [Layouts] in plan/Plan.h: the best layout's whole plan, then every layout's line.
    std::vector<plan::LayoutPlan> all = plan::planLayouts(c, options);
    if (!all.empty() && all.front().invalid.empty() && all.front().plan.fits) {
      std::printf("%s", plan::formatPlan(all.front().plan).c_str());
      for (const std::string& note : chosen.notes) std::printf("  - %s\n", note.c_str());
      std::printf("%s", plan::formatLayouts(all).c_str());
      std::fflush(stdout);
      return 0;
    }
    std::printf("%s", plan::formatLayouts(all).c_str());
    std::fflush(stdout);
  }
  plan::ModelStatePlan plan = plan::planModelState(c, options);
  std::printf("%s", plan::formatPlan(plan).c_str());
  for (const std::string& note : chosen.notes) std::printf("  - %s\n", note.c_str());
  std::fflush(stdout);
  if (plan.fits) return 0;
  STRATA_USER_FAIL("{}", plan::refusalMessage(configPath, c, plan, options));
}

// The configs folder: ./configs when there is one, else the source tree's this binary was built from.
std::filesystem::path configsDirectory() {
  namespace fs = std::filesystem;
  if (fs::is_directory("configs/zoo")) return "configs";
  STRATA_USER_CHECK(fs::is_directory(fs::path(STRATA_CONFIGS_DIR) / "zoo"),
                    "info zoo: no configs/zoo here nor in {} (run it from the Strata checkout)",
                    STRATA_CONFIGS_DIR);
  return STRATA_CONFIGS_DIR;
}

std::string humanCount(double n) {
  const char* units[] = {"", "K", "M", "B", "T"};
  int u = 0;
  while (n >= 1000 && u < 4) {
    n /= 1000;
    ++u;
  }
  return fmt::format("{:.1f}{}", n, units[u]);
}

// Every architecture and size the configs folder holds (its own configs and configs/zoo), with parameters and
// training FLOPs per token from each architecture's own formula.
int runInfoZoo() {
  namespace fs = std::filesystem;
  fs::path dir = configsDirectory();
  struct Row {
    std::string config, arch, objective, shape;
    int64_t params;
    double flops;
  };
  std::vector<Row> rows;
  for (const fs::path& folder : {dir, dir / "zoo"}) {
    for (const auto& entry : fs::directory_iterator(folder)) {
      if (entry.path().extension() != ".yaml") continue;
      config::Config c = config::loadConfig(entry.path().string(), {}, /*requireData=*/false);
      models::ModelSpec spec = config::modelSpecFrom(c, Device::cpu());
      rows.push_back(
          {fs::relative(entry.path(), dir.parent_path().empty() ? "." : dir.parent_path()).string(),
           c.model.arch, models::objectiveName(models::objective(c.model.arch)), models::describeShape(spec),
           models::numParameters(spec), models::flopsPerToken(spec)});
    }
  }
  auto archRank = [](const std::string& arch) {
    auto all = models::architectures();
    return std::find(all.begin(), all.end(), arch) - all.begin();
  };
  std::sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    return archRank(a.arch) != archRank(b.arch) ? archRank(a.arch) < archRank(b.arch) : a.params < b.params;
  });
  std::printf("%-27s %-5s %-16s %10s %12s  %s\n", "config", "arch", "objective", "parameters", "FLOPs/token",
              "shape");
  for (const Row& r : rows)
    std::printf("%-27s %-5s %-16s %10s %12.4g  %s\n", r.config.c_str(), r.arch.c_str(), r.objective.c_str(),
                humanCount(double(r.params)).c_str(), r.flops, r.shape.c_str());
  std::printf(
      "(parameters and training FLOPs per token from each architecture's formula: strata info CONFIG "
      "says which)\n");
  return 0;
}

int runGenerate(const std::string& checkpoint, const std::string& prompt, int64_t tokens, double temperature,
                int64_t topK, uint64_t seed, const std::string& deviceName) {
  std::string dir = train::resolveCheckpoint(checkpoint);
  config::Config c = interop::checkpointConfig(dir);
  Device device = config::resolveDevice(deviceName);
  std::shared_ptr<data::Objective> objective = data::makeObjective(c, device);
  nn::Module& model = objective->model();
  auto weights = train::loadModelShards(dir);
  for (auto& [name, p] : model.namedParameters()) {
    auto it = weights.find(name);
    STRATA_USER_CHECK(it != weights.end(), "checkpoint {} has no tensor '{}'", dir, name);
    STRATA_USER_CHECK(it->second.shape() == p.shape(),
                      "checkpoint {}: '{}' has shape {}, its config gives {}", dir, name,
                      toString(it->second.shape()), toString(p.shape()));
    ops::copy(p, it->second);
  }
  DType compute = device.isCpu() || c.precision.dtype == "fp32" ? DType::F32 : DType::BF16;
  model.castParameters(compute);  // layers compute in their parameters' dtype
  std::optional<data::Generation> g =
      objective->generate(prompt, data::GenerateOptions{tokens, temperature, topK, seed}, compute);
  STRATA_USER_CHECK(g.has_value(), "model.arch {} {}; --prompt '{}' gives it nothing to do", c.model.arch,
                    objective->generateUsage(), prompt);
  std::printf("%s\n", g->display(prompt).c_str());
  return 0;
}

// With --hf, OUTPUT is a directory that HF's from_pretrained loads (GPT2LMHeadModel, BertForMaskedLM or
// BertForPreTraining, T5ForConditionalGeneration, SwitchTransformersForConditionalGeneration):
// model.safetensors and config.json (interop::exportHfCheckpoint). Without it OUTPUT is one safetensors file
// under Strata's names.
int runConvert(const std::string& checkpoint, const std::string& output, bool hf) {
  bool toFile = output.size() > 12 && output.substr(output.size() - 12) == ".safetensors";
  STRATA_USER_CHECK(hf || toFile,
                    "convert: OUTPUT must end in .safetensors (or pass --hf to write an HF directory)");
  if (hf) {
    interop::HfExportResult r = interop::exportHfCheckpoint(checkpoint, output);
    std::string streamed = r.peakBufferBytes > 0 ? ", streaming (at most " +
                                                       humanBytes(double(r.peakBufferBytes)) + " in memory)"
                                                 : std::string();
    std::printf("wrote %zu tensors (%s) to %s%s\n", r.tensors, humanBytes(double(r.bytes)).c_str(),
                r.weightsPath.c_str(), streamed.c_str());
    std::printf("wrote %s (HF %s; tied tensors are left to from_pretrained)\n", r.configPath.c_str(),
                r.modelClass.c_str());
    for (const std::string& note : r.notes) std::printf("note: %s\n", note.c_str());
    return 0;
  }
  std::string dir = train::resolveCheckpoint(checkpoint);
  std::filesystem::path file(output);
  if (!file.parent_path().empty()) std::filesystem::create_directories(file.parent_path());
  // Tensor by tensor: the model is never whole in memory.
  train::MergeStats stats =
      train::mergeModelShards(dir, file.string(), {}, {{"format", "pt"}, {"source", dir}});
  std::printf("wrote %zu tensors (%s) from %s to %s, streaming (at most %s in memory)\n", stats.tensors,
              humanBytes(double(stats.bytes)).c_str(), dir.c_str(), file.c_str(),
              humanBytes(double(stats.peakBufferBytes)).c_str());
  return 0;
}

// An HF transformers directory (config.json, model.safetensors) -> a Strata checkpoint under the save
// directory OUTPUT (step-0 and `latest`), which `strata generate` runs and `checkpoint.load` (with
// checkpoint.load_model_only) trains on from. It says what it built: the architecture, the shapes, the head
// (tied or not, T5's scaling), the activation and the positions.
int runConvertFromHf(const std::string& hfDir, const std::string& output) {
  interop::HfImportResult r = interop::importHfCheckpoint(hfDir, output);
  std::string ignored;
  for (const auto& name : r.unused) ignored += (ignored.empty() ? "" : ", ") + name;
  std::printf("built %s (HF %s): %s\n  %s\n", r.spec.arch.c_str(), r.modelClass.c_str(),
              models::describeShape(r.spec).c_str(), models::describeHead(r.spec).c_str());
  std::printf("wrote %s (%ld parameters) from %s%s\n", r.checkpointDir.c_str(), long(r.parameters),
              r.weightsPath.c_str(), r.unused.empty() ? "" : (" (not kept: " + ignored + ")").c_str());
  std::printf("HF's config.json has no training length: the config that loads it sets model.seq_length%s\n",
              r.spec.arch == "t5" ? " and model.decoder_seq_length" : " (up to the table's positions)");
  return 0;
}

// Raw text -> a nanoGPT .bin of token ids, on every physical core, with a progress line on stderr.
int runTokenize(const std::string& input, const std::string& output, const std::string& kind,
                const std::string& vocabFile, const std::string& mergesFile, bool cased, int threads) {
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (kind == "wordpiece") {
    STRATA_USER_CHECK(!vocabFile.empty(), "tokenize: the wordpiece tokenizer needs --vocab-file (vocab.txt)");
    data::WordPieceOptions options;
    options.lowerCase = !cased;
    tokenizer = std::make_unique<data::WordPieceTokenizer>(vocabFile, options);
  } else if (kind == "sentencepiece") {
    STRATA_USER_CHECK(!vocabFile.empty(),
                      "tokenize: the sentencepiece tokenizer needs --vocab-file (a .model file, e.g. T5's "
                      "spiece.model)");
    tokenizer = std::make_unique<data::SentencePieceTokenizer>(vocabFile);
  } else if (kind == "gpt2") {
    STRATA_USER_CHECK(!vocabFile.empty() && !mergesFile.empty(),
                      "tokenize: the gpt2 tokenizer needs --vocab-file and --merges-file");
    tokenizer = std::make_unique<data::Gpt2Tokenizer>(vocabFile, mergesFile);
  } else {
    tokenizer = std::make_unique<data::ByteTokenizer>();
  }
  data::TokenizeOptions options;
  options.threads = threads > 0 ? threads : physicalCpuCores();
  auto start = std::chrono::steady_clock::now();
  double lastPrint = -1;
  options.progress = [&](int64_t done, int64_t total) {
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (done < total && seconds - lastPrint < 0.5) return;
    lastPrint = seconds;
    double mb = double(done) / 1e6;
    std::fprintf(stderr, "\rtokenizing %s: %5.1f%% (%.0f of %.0f MB, %.1f MB/s)", input.c_str(),
                 total > 0 ? 100.0 * double(done) / double(total) : 100.0, mb, double(total) / 1e6,
                 seconds > 0 ? mb / seconds : 0.0);
    if (done >= total) std::fprintf(stderr, "\n");
  };
  data::TokenizeResult r = data::tokenizeFile(input, output, *tokenizer, options);
  std::printf("wrote %ld %s tokens from %ld bytes to %s in %.1f s on %d threads\n", long(r.tokens),
              kind.c_str(), long(r.bytes), output.c_str(), r.seconds, options.threads);
  return 0;
}

// Mean-pooled, L2-normalised sentence embeddings (interop/SentenceEmbedder.h): one line per text, its floats
// separated by spaces, in the order given (--text values first, then the file's non-empty lines).
int runEmbed(const std::string& modelDir, const std::vector<std::string>& texts, const std::string& file,
             const std::string& deviceName, int64_t batchSize, int64_t maxSeqLength) {
  std::vector<std::string> all = texts;
  if (!file.empty()) {
    std::ifstream in(file);
    STRATA_USER_CHECK(in.good(), "embed: cannot read --file {}", file);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) all.push_back(line);
    }
  }
  STRATA_USER_CHECK(!all.empty(), "embed: no text given (--text TEXT, or --file with one text per line)");
  interop::SentenceEmbedderOptions options;
  options.device = config::resolveDevice(deviceName);
  options.batchSize = batchSize;
  options.maxSeqLength = maxSeqLength;
  interop::SentenceEmbedder embedder(modelDir, options);
  std::string line;
  for (const std::vector<float>& e : embedder.embed(all)) {
    line.clear();
    for (size_t i = 0; i < e.size(); ++i) line += fmt::format("{}{:.9g}", i == 0 ? "" : " ", e[i]);
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

// `strata trian` -> "unknown command 'trian'; did you mean 'train'?" (CLI11 alone says only that the
// argument was not expected).
bool reportUnknownCommand(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  std::string given = argv[1];
  std::string best;
  size_t bestDistance = SIZE_MAX;
  std::string all;
  for (const char* command : kCommands) {
    if (given == command) return false;
    size_t d = config::editDistance(given, command);
    if (d < bestDistance) {
      bestDistance = d;
      best = command;
    }
    all += (all.empty() ? "" : ", ") + std::string(command);
  }
  if (bestDistance <= std::max<size_t>(2, given.size() / 2))
    std::fprintf(stderr, "error: unknown command '%s'; did you mean '%s'?\n", given.c_str(), best.c_str());
  else
    std::fprintf(stderr, "error: unknown command '%s'; the commands are %s (strata --help)\n", given.c_str(),
                 all.c_str());
  return true;
}

// One line per failure, never `terminate called`: user errors print their message (the location too with
// STRATA_DEBUG=1); internal errors keep their source location.
int reportError(const std::exception& e) {
  const char* debug = std::getenv("STRATA_DEBUG");
  bool withLocation = debug && std::string(debug) != "0";
  if (const auto* error = dynamic_cast<const Error*>(&e)) {
    if (error->userFacing() && withLocation && !error->location().empty())
      std::fprintf(stderr, "error: %s [%s]\n", error->message().c_str(), error->location().c_str());
    else
      std::fprintf(stderr, "error: %s\n", e.what());
    // NOTE [Out of memory]: the allocator's own figures, for a bug report.
    if (const auto* oom = dynamic_cast<const OutOfMemory*>(&e); oom && withLocation)
      std::fprintf(stderr, "  the allocator's figures: %s\n", oom->figures().c_str());
  } else if (const auto* fsError = dynamic_cast<const std::filesystem::filesystem_error*>(&e)) {
    std::fprintf(stderr, "error: %s\n", fsError->what());
  } else if (dynamic_cast<const std::bad_alloc*>(&e)) {
    std::fprintf(stderr, "error: out of host memory\n");
  } else {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Strata: train large Transformer models on few GPUs"};
  app.require_subcommand(1);
  app.set_version_flag("--version",
                       std::string("strata ") + STRATA_VERSION +
                           (builtWithCuda() ? " (CPU and CUDA backends)" : " (CPU backend only)"));
  spdlog::set_pattern("[%H:%M:%S] %v");
  // A write past the file-size limit (ulimit -f) fails with EFBIG and an error naming the file, instead of
  // SIGXFSZ ending the process without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  if (reportUnknownCommand(argc, argv)) return 2;

  std::string config;
  std::vector<std::string> overrides;
  bool resume = false, overwrite = false;
  auto* train = app.add_subcommand("train", "train a model from a YAML config");
  train->add_option("config", config, "YAML config file")->required();
  train->add_option("--set", overrides, "override a config key: --set train.train_iters=100");
  auto* resumeFlag = train->add_flag(
      "--resume", resume,
      "continue the run from the save directory's latest checkpoint, or start it when there is none "
      "(checkpoint.resume)");
  train
      ->add_flag(
          "--overwrite", overwrite,
          "start over: remove another run's metrics, events and checkpoints from train.out_dir and the "
          "save directory first")
      ->excludes(resumeFlag);

  int64_t benchIters = 20;
  bool benchProfile = false, calibrate = false;
  std::string calibrationOut, nvmePath;
  double nvmeGb = 2;
  auto* bench = app.add_subcommand(
      "bench",
      "training speed of a config on random tokens (no data needed); --calibrate: this machine's rates for "
      "`strata plan`");
  bench->add_option("config", config, "YAML config file (not with --calibrate)");
  bench->add_option("--set", overrides, "override a config key: --set train.micro_batch_size=16");
  bench->add_option("--iters", benchIters, "measured iterations (after as many warm-up iterations)");
  bench->add_flag("--profile", benchProfile, "also print the step profile (STRATA_PROFILE)");
  bench->add_flag("--calibrate", calibrate,
                  "measure PCIe, GEMM, CPU AdamW and SSD rates and memory sizes into a calibration file");
  bench->add_option("--out", calibrationOut,
                    "with --calibrate: the file to write (default $STRATA_CALIBRATION or "
                    "~/.cache/strata/calibration.json)");
  bench->add_option("--nvme-path", nvmePath,
                    "with --calibrate: the directory the SSD is measured in (default: "
                    "the temp directory)");
  bench->add_option("--nvme-gb", nvmeGb, "with --calibrate: GiB written and read back on the SSD (default 2)")
      ->check(CLI::PositiveNumber);

  int planRanks = 1, planRanksPerNode = 0;
  bool planLayouts = false;
  std::string planMachine = "here";
  std::string calibrationPath;
  auto* plan = app.add_subcommand(
      "plan",
      "where each byte of model state will live (GPU, host, SSD), activation memory and the predicted step "
      "time, without a GPU; refuses a config that cannot fit");
  plan->add_option("config", config, "YAML config file")->required();
  plan->add_option("--set", overrides, "override a config key");
  plan->add_option("--ranks", planRanks, "ranks (GPUs) to plan for (default 1)")->check(CLI::PositiveNumber);
  plan->add_option("--gpus-per-node,--ranks-per-node", planRanksPerNode,
                   "ranks (GPUs) on each machine, which split its host memory, SSD and cores; the ranks span "
                   "ranks / this machines (default: the machine's GPUs for a preset, else all the ranks)")
      ->check(CLI::PositiveNumber);
  plan->add_option(
      "--machine", planMachine,
      "the machine to plan for: here (default: this machine, with its calibration file when it has "
      "one), h200 (the reference H200, measured), h200x8 (the 8-GPU H200 machine: its memory, disk and "
      "cores, the H200's rates), h200x8-ib (a cluster node of that machine with 8 x 400 Gb/s InfiniBand) or "
      "a100x8-ib (a node of 8 A100-40GB, 1 TB of host memory and 8 x 200 Gb/s InfiniBand: published "
      "figures)");
  plan->add_flag(
      "--layouts", planLayouts,
      "weigh every split of the ranks into data x tensor x pipeline parallel (gpt) and plan the fastest that "
      "fits");
  plan->add_option("--calibration", calibrationPath,
                   "calibration file (default $STRATA_CALIBRATION or ~/.cache/strata/calibration.json)");

  auto* info = app.add_subcommand(
      "info",
      "parameters, FLOPs per token and bytes per component of a config (`info zoo`: of every config)");
  info->add_option("config", config, "YAML config file, or `zoo` for every architecture and size")
      ->required();
  info->add_option("--set", overrides, "override a config key");

  std::string checkpoint, prompt = "\n", device = "auto";
  int64_t tokens = 200, topK = 40;
  double temperature = 0.8;
  uint64_t seed = 1;
  auto* generate = app.add_subcommand(
      "generate",
      "what a checkpoint's model makes of a prompt: GPT continues it, T5 decodes from it, BERT fills "
      "each [MASK] in it");
  generate->add_option("checkpoint", checkpoint, "checkpoint directory (or a save directory with `latest`)")
      ->required();
  generate->add_option("--prompt", prompt, "text to continue");
  generate->add_option("--tokens", tokens, "tokens to produce at most")->check(CLI::PositiveNumber);
  auto* temperatureOption =
      generate
          ->add_option("--temperature", temperature, "sampling temperature (0: greedy; default 0.8, T5 0)")
          ->check(CLI::NonNegativeNumber);
  generate
      ->add_option("--top-k", topK,
                   "sample among the k most likely tokens (0: all); BERT lists as many (<= 10)")
      ->check(CLI::NonNegativeNumber);
  generate->add_option("--seed", seed, "sampling seed");
  generate->add_option("--device", device, "auto, cpu or cuda[:N]");

  std::string output;
  bool hf = false;
  auto* convert = app.add_subcommand(
      "convert",
      "merge a checkpoint's model shards into one safetensors file (--hf: an HF directory); "
      "--from-hf HF_DIR OUTPUT: an HF model into a checkpoint");
  std::string fromHf;
  convert->add_option("checkpoint", checkpoint, "checkpoint directory (or a save directory with `latest`)");
  convert->add_option("output", output,
                      "the .safetensors file to write; with --hf, a directory for from_pretrained");
  convert->add_flag(
      "--hf", hf,
      "HF transformers names (GPT2LMHeadModel, BertForMaskedLM, T5ForConditionalGeneration) plus "
      "config.json");
  convert->add_option(
      "--from-hf", fromHf,
      "import: an HF directory (config.json and model.safetensors) into a checkpoint under the "
      "save directory OUTPUT");

  std::string tokenizeInput, tokenizeOutput, tokenizerKind = "gpt2", vocabFile, mergesFile;
  int tokenizeThreads = 0;
  auto* tokenize =
      app.add_subcommand("tokenize", "tokenize a text file into a nanoGPT .bin (uint16 ids), on every core");
  tokenize->add_option("input", tokenizeInput, "the text file")->required()->check(CLI::ExistingFile);
  tokenize->add_option("output", tokenizeOutput, "the .bin to write")->required();
  bool tokenizeCased = false;
  tokenize->add_option("--tokenizer", tokenizerKind, "gpt2 (default), byte, wordpiece or sentencepiece")
      ->check(CLI::IsMember({"gpt2", "byte", "wordpiece", "sentencepiece"}));
  tokenize->add_option("--vocab-file", vocabFile,
                       "GPT-2's vocab.json, BERT's vocab.txt for wordpiece, a .model for sentencepiece");
  tokenize->add_flag("--cased", tokenizeCased,
                     "wordpiece: keep case and accents (default: lower-case, strip)");
  tokenize->add_option("--merges-file", mergesFile, "GPT-2's merges.txt");
  tokenize->add_option("--threads", tokenizeThreads, "threads (default: the physical cores)")
      ->check(CLI::NonNegativeNumber);

  std::string embedModel, embedFile;
  std::vector<std::string> embedTexts;
  int64_t embedBatch = 32, embedMaxSeq = 0;
  auto* embed = app.add_subcommand(
      "embed",
      "sentence embeddings of a BERT sentence-transformers model (all-MiniLM-L6-v2): mean-pooled, "
      "L2-normalised, one line of floats per text");
  embed->add_option("model_dir", embedModel, "config.json, model.safetensors and vocab.txt")
      ->required()
      ->check(CLI::ExistingDirectory);
  embed->add_option("--text", embedTexts, "a text to embed (repeatable)");
  embed->add_option("--file", embedFile, "a file of texts, one per line")->check(CLI::ExistingFile);
  embed->add_option("--device", device, "auto, cpu or cuda[:N]");
  embed->add_option("--batch-size", embedBatch, "texts per forward")->check(CLI::PositiveNumber);
  embed
      ->add_option("--max-seq-length", embedMaxSeq,
                   "tokens per text, [CLS] and [SEP] included (default: sentence_bert_config.json's)")
      ->check(CLI::NonNegativeNumber);

  bool listKeys = false;
  auto* configCommand = app.add_subcommand(
      "config",
      "the config keys: --list prints each key's type, default and meaning (docs/configuration.md)");
  configCommand->add_flag("--list", listKeys, "print every config key as Markdown, a table per section");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    if (*train)
      return runTrain(config, overrides, resume, overwrite, std::vector<std::string>(argv, argv + argc));
    if (*info)
      return config == "zoo" && !std::filesystem::exists(config) ? runInfoZoo() : runInfo(config, overrides);
    if (*bench) {
      if (calibrate) {
        STRATA_USER_CHECK(config.empty() && overrides.empty(),
                          "bench --calibrate measures the machine and takes no CONFIG or --set");
        return runCalibrate(calibrationOut, nvmePath, nvmeGb);
      }
      STRATA_USER_CHECK(!config.empty(), "bench: give a CONFIG (or --calibrate)");
      return runBench(config, overrides, benchIters, benchProfile);
    }
    if (*plan)
      return runPlan(config, overrides, planRanks, planRanksPerNode, planMachine, calibrationPath,
                     planLayouts);
    if (*generate)
      return runGenerate(checkpoint, prompt, tokens, temperatureOption->count() > 0 ? temperature : -1.0,
                         topK, seed, device);
    if (*convert) {
      if (!fromHf.empty()) {
        // `convert --from-hf HF_DIR OUTPUT`: the one positional given is the output.
        STRATA_USER_CHECK(!hf, "convert: --hf exports and --from-hf imports; give one of them");
        STRATA_USER_CHECK(output.empty(), "convert --from-hf HF_DIR OUTPUT takes one positional argument");
        return runConvertFromHf(fromHf, checkpoint);
      }
      STRATA_USER_CHECK(!checkpoint.empty() && !output.empty(), "convert: give CHECKPOINT and OUTPUT");
      return runConvert(checkpoint, output, hf);
    }
    if (*configCommand) {
      STRATA_USER_CHECK(listKeys,
                        "config: give --list to print every config key with its type, default and "
                        "meaning");
      std::fputs(config::configReference().c_str(), stdout);
      return 0;
    }
    if (*embed) return runEmbed(embedModel, embedTexts, embedFile, device, embedBatch, embedMaxSeq);
    if (*tokenize)
      return runTokenize(tokenizeInput, tokenizeOutput, tokenizerKind, vocabFile, mergesFile, tokenizeCased,
                         tokenizeThreads);
  } catch (const train::ReportedByRankZero&) {
    return 1;  // rank 0 printed it for the job
  } catch (const std::exception& e) {
    return reportError(e);
  } catch (...) {
    std::fprintf(stderr, "error: unknown failure\n");
    return 1;
  }
  return 0;
}
