#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include "TestUtil.h"
#include "strata/autograd/Functions.h"
#include "strata/data/Objective.h"
#include "strata/plan/Plan.h"
#include "strata/train/StepEngine.h"
#include "strata/train/Trainer.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

config::Config configFile(const std::string& name, std::vector<std::string> overrides = {}) {
  return config::loadConfig(std::string(STRATA_SOURCE_DIR) + "/configs/" + name, overrides,
                            /*requireData=*/false);
}

// A machine with round figures, so the step-time terms can be checked by hand.
plan::PlanOptions roundMachine() {
  plan::Calibration m;
  m.host = "test";
  m.deviceName = "test GPU";
  m.deviceMemoryBytes = 140ull << 30;
  m.h2dGBs = 50;
  m.d2hGBs = 25;
  m.gemmTflops = 1000;
  m.hostMemoryBytes = 1000ull << 30;
  m.cpuAdamwElemsPerS = 1e9;
  m.nvmeWriteGBs = 1;
  m.nvmeReadGBs = 2;
  m.nvmeFreeBytes = 1000ull << 30;
  plan::PlanOptions options;
  options.calibration = m;
  options.calibrationSource = "test";
  return options;
}

const plan::StepTerm* term(const plan::ModelStatePlan& p, const std::string& name) {
  for (const auto& t : p.terms)
    if (t.name == name) return &t;
  return nullptr;
}

fs::path corpus() {
  fs::path p = fs::temp_directory_path() / "strata-plan-corpus.txt";
  if (!fs::exists(p)) std::ofstream(p) << "the quick brown fox jumps over the lazy dog\n";
  return p;
}

// A tiny Adafactor GPT on the CPU with small device and host budgets and an SSD tier in `nvme`, plus `extra`.
config::Config tinyAdafactor(const std::string& gpuBudget, const std::string& hostBudget,
                             const fs::path& nvme, std::vector<std::string> extra) {
  std::vector<std::string> sets = {"data.path=" + corpus().string(),
                                   "train.device=cpu",
                                   "model.num_layers=2",
                                   "model.hidden_size=32",
                                   "model.num_attention_heads=2",
                                   "model.seq_length=32",
                                   "train.micro_batch_size=2",
                                   "zero_optimization.chunk_size_mb=0.02",
                                   "optimizer.type=adafactor",
                                   "optimizer.lr=0.01",
                                   "optimizer.adafactor_beta1=0.9",
                                   "store.gpu_budget_gb=" + gpuBudget,
                                   "store.host_budget_gb=" + hostBudget,
                                   "zero_optimization.nvme_path=" + nvme.string()};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return config::parseConfig("", "test", sets);
}

}  // namespace

TEST_CASE("the plan's placement inputs are the engine's, without building the model", "[train][plan]") {
  // A tiny GPT on the CPU with a device budget that splits the optimizer state between the tiers.
  config::Config c = config::parseConfig(
      "", "test",
      {"data.path=" + corpus().string(), "train.device=cpu", "model.num_layers=2", "model.hidden_size=32",
       "model.num_attention_heads=2", "model.seq_length=32", "train.micro_batch_size=2",
       "zero_optimization.chunk_size_mb=0.02", "store.gpu_budget_gb=0.0003", "zero_optimization.stage=1"});
  auto model = models::buildModel(config::modelSpecFrom(c, Device::cpu()));
  data::CausalLmObjective objective(model, nullptr);
  train::ZeroStepEngine engine(objective, c, Device::cpu(), DType::F32);
  const zero::StorePlacement& real = engine.placement();

  plan::ModelStatePlan p = plan::planModelState(c, roundMachine());
  REQUIRE(p.fits);
  REQUIRE(p.inputs.layout.chunks.size() == engine.chunks().numChunks());
  REQUIRE(p.placement.parameterBytes == real.parameterBytes);
  REQUIRE(p.placement.optimizerTier == real.optimizerTier);
  REQUIRE(real.chunksOn(zero::Tier::Device) > 0);
  REQUIRE(real.chunksOn(zero::Tier::Host) > 0);
  for (int t = 0; t < zero::kNumTiers; ++t) {
    INFO(zero::tierName(zero::Tier(t)));
    REQUIRE(p.placement.bytes[t] == real.bytes[t]);
    uint64_t kinds = 0;
    for (int k = 0; k < plan::kNumStateKinds; ++k) kinds += p.kindBytes[k][t];
    REQUIRE(kinds == real.bytes[t]);
  }

  // Two ranks: chunks padded to equal shards, each rank's range of them, as ChunkManager pads them.
  auto chunks = train::layOutModelChunks(objective, Device::cpu(), DType::F32, int64_t(0.02 * (1 << 20)), 2);
  for (int stage : {1, 3}) {
    config::Config staged = c;
    staged.zero.stage = stage;
    plan::ModelStateInputs in = plan::modelStateInputs(staged, 2, DType::F32);
    uint64_t params = 0;
    for (size_t i = 0; i < chunks->numChunks(); ++i) {
      REQUIRE(in.paddedElems[i] == chunks->paddedElems(i));
      REQUIRE(in.rangeElems[i] == chunks->shard(i, 0).size());
      params += uint64_t(stage == 3 ? chunks->shard(i, 0).size() : chunks->paddedElems(i)) * 4;
    }
    REQUIRE(in.parameterBytes == params);
  }
}

TEST_CASE("plan: GPT-6.7B with its optimizer on the host", "[train][plan]") {
  config::Config c = configFile("gpt3-6.7b.yaml", {"zero_optimization.offload_optimizer.device=cpu"});
  plan::PlanOptions options = roundMachine();
  plan::ModelStatePlan p = plan::planModelState(c, options);
  REQUIRE(p.fits);
  const int device = int(zero::Tier::Device), host = int(zero::Tier::Host);
  uint64_t elems = uint64_t(p.inputs.rangeElemsTotal());
  REQUIRE(p.kindBytes[plan::kParameters][device] == 2 * elems);
  REQUIRE(p.kindBytes[plan::kMasters][device] == 0);
  for (int k : {plan::kMasters, plan::kFirstMoments, plan::kSecondMoments})
    REQUIRE(p.kindBytes[k][host] == 4 * elems);
  // The step-time terms from the machine's figures.
  REQUIRE(term(p, "compute")->seconds ==
          Approx(p.flopsPerStep / (1000e12 * plan::kComputeEfficiency)).epsilon(1e-12));
  // The host update: the CPU (1 G/s) and the GPU lane (25 GB/s / 24 B) share the elements, beside the
  // gradients out (fp32 at 25 GB/s) and the parameters in (bf16 at 50 GB/s).
  double lanes = double(elems) / (1e9 + 25e9 / plan::kGpuLaneBytesPerElem);
  REQUIRE(term(p, "host update")->seconds ==
          Approx(std::max(lanes, 4.0 * double(elems) / 25e9 + 2.0 * double(elems) / 50e9)));
  REQUIRE(term(p, "SSD") == nullptr);
  REQUIRE(p.serialSeconds > p.overlappedSeconds);
  REQUIRE(p.bound == "compute");
  // Without the pipeline the CPU alone updates, after the transfers.
  plan::ModelStatePlan serial = plan::planModelState(
      configFile("gpt3-6.7b.yaml",
                 {"zero_optimization.offload_optimizer.device=cpu", "optimizer.pipeline=false"}),
      options);
  REQUIRE(term(serial, "host update")->seconds ==
          Approx(double(elems) / 1e9 + 4.0 * double(elems) / 25e9 + 2.0 * double(elems) / 50e9));
  // B4 x 8 micro-batches: the gradients of all chunks live beside one micro-batch's activations.
  REQUIRE(p.accumulation == 8);
  REQUIRE(p.devicePeakBytes == p.inputs.parameterBytes + p.inputs.gradientBytes + p.activations.bytes +
                                   p.transientBytes + plan::kDeviceWorkspaceBytes);
  REQUIRE(p.transientBytes == uint64_t(plan::kBackwardAllowance * double(p.activations.bytes)));
  std::string text = plan::formatPlan(p);
  REQUIRE(text.find("host update") != std::string::npos);
  REQUIRE(text.find("fp32 masters") != std::string::npos);
  // State off the device: the plan says what bf16 gradient buffers would free; with them, the device holds
  // 2 bytes per element less and the gradients cross to the host at 2 bytes.
  REQUIRE(text.find("precision.grad_accum_dtype: bf16 would keep") != std::string::npos);
  plan::ModelStatePlan bf16 = plan::planModelState(
      configFile("gpt3-6.7b.yaml",
                 {"zero_optimization.offload_optimizer.device=cpu", "precision.grad_accum_dtype=bf16"}),
      options);
  REQUIRE(bf16.fits);
  REQUIRE(bf16.inputs.gradientBytes * 2 == p.inputs.gradientBytes);
  REQUIRE(bf16.devicePeakBytes + p.inputs.gradientBytes / 2 == p.devicePeakBytes);
  REQUIRE(term(bf16, "host update")->seconds ==
          Approx(std::max(lanes, 2.0 * double(elems) / 25e9 + 2.0 * double(elems) / 50e9)));
  REQUIRE(plan::formatPlan(bf16).find("would keep") == std::string::npos);
}

TEST_CASE("plan: AdamW's m and v in bf16 take 2 bytes each in every tier", "[train][plan]") {
  // optimizer.moments_dtype: bf16 (NOTE [AdamW moments dtype] in optim/AdamW.h): 8 bytes of optimizer state
  // per parameter with the fp32 master, on the host and in the GPU lane's traffic.
  plan::PlanOptions options = roundMachine();
  std::vector<std::string> host{"zero_optimization.offload_optimizer.device=cpu"};
  plan::ModelStatePlan wide = plan::planModelState(configFile("gpt3-6.7b.yaml", host), options);
  host.push_back("optimizer.moments_dtype=bf16");
  plan::ModelStatePlan p = plan::planModelState(configFile("gpt3-6.7b.yaml", host), options);
  REQUIRE(p.fits);
  const int hostTier = int(zero::Tier::Host);
  uint64_t elems = uint64_t(p.inputs.rangeElemsTotal());
  CHECK(p.kindBytes[plan::kMasters][hostTier] == 4 * elems);
  CHECK(p.kindBytes[plan::kFirstMoments][hostTier] == 2 * elems);
  CHECK(p.kindBytes[plan::kSecondMoments][hostTier] == 2 * elems);
  CHECK(p.optimizerBytesPerParameter == Approx(8.0));
  CHECK(wide.optimizerBytesPerParameter == Approx(12.0));
  std::string text = plan::formatPlan(p);
  CHECK(text.find("8.000 bytes of optimizer state per parameter (fp32 masters included; m and v in bf16") !=
        std::string::npos);
  // The GPU lane moves 16 bytes an element instead of 24: it takes more of the host update.
  CHECK(plan::gpuLaneBytesPerElem(DType::BF16) == 16);
  CHECK(plan::gpuLaneBytesPerElem(DType::F32) == plan::kGpuLaneBytesPerElem);
  double lanes = double(elems) / (1e9 + 25e9 / 16.0);
  CHECK(term(p, "host update")->seconds ==
        Approx(std::max(lanes, 4.0 * double(elems) / 25e9 + 2.0 * double(elems) / 50e9)));
  // On the SSD they are bf16 whatever store.nvme_state_dtype says: the state all there (4 TB free), the
  // SSD term reads and writes 8 bytes a parameter.
  options.calibration->nvmeFreeBytes = 4000ull << 30;
  plan::ModelStatePlan ssd = plan::planModelState(
      configFile("gpt3-6.7b.yaml", {"zero_optimization.offload_optimizer.device=nvme",
                                    "zero_optimization.nvme_path=/tmp/strata-plan-moments",
                                    "store.nvme_state_dtype=fp32", "optimizer.moments_dtype=bf16"}),
      options);
  const int nvme = int(zero::Tier::Nvme);
  REQUIRE(ssd.placement.chunksOn(zero::Tier::Nvme) == ssd.placement.optimizerTier.size());
  CHECK(ssd.kindBytes[plan::kMasters][nvme] == 4 * elems);
  CHECK(ssd.kindBytes[plan::kFirstMoments][nvme] == 2 * elems);
  CHECK(ssd.kindBytes[plan::kSecondMoments][nvme] == 2 * elems);
  CHECK(ssd.placement.bytes[nvme] == 8 * elems);
}

TEST_CASE("plan: configs/gpt3-25b-store.yaml fits one H200 with m and v in bf16, and not with fp32 ones",
          "[train][plan]") {
  // The 25.7B GPT that trained on the H200 with optimizer.moments_dtype bf16. The reference H200 (139 GiB
  // GPU, 125 GiB of RAM, 64 GiB of disk) places one layer more; the H200 it ran on had 0.5 GiB less free
  // disk.
  plan::PlanOptions options;
  options.calibration = plan::measuredH200();
  config::Config c = configFile("gpt3-25b-store.yaml");
  REQUIRE(c.optimizer.momentsDType == "bf16");
  REQUIRE(c.model.numLayers == 56);
  plan::ModelStatePlan p = plan::planModelState(c, options);
  INFO(plan::formatPlan(p));
  REQUIRE(p.fits);
  CHECK(double(p.parameters) > 25.5e9);
  CHECK(plan::planModelState(configFile("gpt3-25b-store.yaml", {"model.num_layers=57"}), options).fits);
  CHECK(p.optimizerBytesPerParameter == Approx(8.0));
  for (int t : {int(zero::Tier::Device), int(zero::Tier::Host), int(zero::Tier::Nvme)})
    CHECK(p.placement.bytes[t] > 0);
  // One layer more does not fit; with fp32 m and v not even 55 layers do, and the refusal names the key.
  CHECK(!plan::planModelState(configFile("gpt3-25b-store.yaml", {"model.num_layers=58"}), options).fits);
  config::Config wide =
      configFile("gpt3-25b-store.yaml", {"model.num_layers=55", "optimizer.moments_dtype=fp32"});
  CHECK(!plan::planModelState(wide, options).fits);
  std::vector<std::string> advice = plan::fitAdvice(wide, options);
  CHECK(std::find_if(advice.begin(), advice.end(), [](const std::string& a) {
          return a.rfind("--set optimizer.moments_dtype=bf16", 0) == 0;
        }) != advice.end());
}

TEST_CASE("plan: the activation estimate matches the measured GPT-6.7B forward", "[train][plan]") {
  // BENCHMARKS.md (the 6.7B activation measurement): B8 x seq 512, 86.96 GiB after the engine was built,
  // 103.8 after the forward: 16.84 GiB of activations.
  config::Config c = configFile("gpt3-6.7b.yaml", {"model.seq_length=512", "train.micro_batch_size=8"});
  models::ModelSpec spec = config::modelSpecFrom(c, Device::cpu());
  plan::ActivationEstimate a = plan::estimateActivations(spec, 8, DType::BF16, /*onGpu=*/true);
  REQUIRE(double(a.bytes) / double(1ull << 30) == Approx(16.84).epsilon(0.05));
  // Attention dropout runs in the fused kernel (no S x S kept); under STRATA_ATTENTION_DROPOUT=composed it
  // keeps S x S probabilities on top. On the CPU attention is always composed.
  spec.dropout = 0.1;
  uint64_t dropped = plan::estimateActivations(spec, 8, DType::BF16, true).bytes;
  if (fusedAttentionDropout())
    REQUIRE(dropped == a.bytes);
  else
    REQUIRE(dropped > a.bytes + (1ull << 30));
  REQUIRE(plan::estimateActivations(spec, 8, DType::BF16, false).bytes > a.bytes + (1ull << 30));
}

TEST_CASE("plan: attention says why it is composed", "[train][plan]") {
  // gpt-nano's heads are 32 wide: composed for the head dim, not for its dropout (which the fused kernel
  // takes), unless STRATA_ATTENTION_DROPOUT=composed sends dropout there first.
  plan::ModelStatePlan p = plan::planModelState(
      configFile("gpt-nano.yaml", {"model.dropout=0.1", "train.device=cuda"}), roundMachine());
  std::string why;
  for (const std::string& a : p.activations.assumptions)
    if (a.find("composed attention") != std::string::npos) why = a;
  INFO(why);
  REQUIRE(why.find(fusedAttentionDropout() ? "head dim 32" : "dropout 0.1") != std::string::npos);
  REQUIRE((why.find("dropout") != std::string::npos) == !fusedAttentionDropout());
}

TEST_CASE("plan: BERT's MLM head on the chosen tokens, and its fp32 residual stream", "[train][plan]") {
  config::Config c = configFile("zoo/bert-large.yaml", {"model.seq_length=512"});
  models::ModelSpec spec = config::modelSpecFrom(c, Device::cpu());
  plan::ActivationEstimate a = plan::estimateActivations(spec, 16, DType::BF16, /*onGpu=*/true);
  // 16 x 512 tokens: 15% is 1229, rounded up to 1280 rows of 64.
  bool head = false;
  for (const auto& t : a.terms) head = head || t.what == "MLM head on 1280 chosen tokens";
  REQUIRE(head);
  // The fp32 stream keeps 8 more bytes per element and layer (two fp32 sums, two 16-bit copies).
  spec.fp32Residual = true;
  plan::ActivationEstimate wide = plan::estimateActivations(spec, 16, DType::BF16, true);
  REQUIRE(wide.bytes - a.bytes == uint64_t(spec.numLayers) * 8 * 16 * 512 * uint64_t(spec.hiddenSize));
  // Inert in fp32.
  models::ModelSpec narrow = spec;
  narrow.fp32Residual = false;
  REQUIRE(plan::estimateActivations(spec, 16, DType::F32, true).bytes ==
          plan::estimateActivations(narrow, 16, DType::F32, true).bytes);
}

TEST_CASE("plan: gradients homed in host memory leave the device before the update", "[train][plan][homes]") {
  // NOTE [Gradient homes] in zero/GradientReducer.h. GPT-6.7B with its optimizer on the host and one
  // micro-batch a step, short enough that the gradients outweigh the activations.
  plan::PlanOptions options = roundMachine();
  auto planWith = [&](const std::string& home, std::vector<std::string> extra = {}) {
    std::vector<std::string> overrides = {"zero_optimization.offload_optimizer.device=cpu",
                                          "model.seq_length=512", "train.micro_batch_size=1",
                                          "train.global_batch_size=1", "store.gradient_home=" + home};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return plan::planModelState(configFile("gpt3-6.7b.yaml", overrides), options);
  };
  plan::ModelStatePlan device = planWith("device"), host = planWith("host"), automatic = planWith("auto");
  REQUIRE(host.fits);
  REQUIRE(host.accumulation == 1);
  REQUIRE(device.gradientHomeBytes == 0);
  // auto: the parameters are on the device, so their gradients stay there too.
  REQUIRE(automatic.gradientHomeBytes == 0);
  // Every chunk's state is on the host: every buffer leaves, and two chunks' are on the device at a time.
  REQUIRE(host.gradientHomeBytes == host.inputs.gradientBytes);
  REQUIRE(device.gradientPeakBytes == device.inputs.gradientBytes);
  REQUIRE(host.gradientPeakBytes == 2 * uint64_t(host.inputs.largestChunkElems) * 4);
  REQUIRE(host.devicePeakBytes < device.devicePeakBytes);
  // Their copy runs during backward; the host update reads them there, so only the parameters cross in it,
  // and the GPU lane idles.
  uint64_t elems = uint64_t(host.inputs.rangeElemsTotal());
  REQUIRE(term(host, "gradient homes")->seconds == Approx(double(host.inputs.gradientBytes) / 25e9));
  REQUIRE(term(device, "gradient homes") == nullptr);
  REQUIRE(term(host, "host update")->seconds ==
          Approx(std::max(double(elems) / 1e9, 2.0 * double(elems) / 50e9)));
  REQUIRE(plan::formatPlan(host).find("store.gradient_home") != std::string::npos);
  // Gradient accumulation keeps every buffer through the last forward: the peak keeps them.
  plan::ModelStatePlan accumulating = planWith("host", {"train.global_batch_size=8"});
  REQUIRE(accumulating.accumulation == 8);
  REQUIRE(accumulating.gradientHomeBytes == accumulating.inputs.gradientBytes);
  REQUIRE(accumulating.gradientPeakBytes == accumulating.inputs.gradientBytes);
  // Stages 1 and 2 are refused, naming the key.
  plan::ModelStatePlan stage1 = planWith("host", {"zero_optimization.stage=1"});
  REQUIRE(!stage1.fits);
  REQUIRE(stage1.refusal.find("store.gradient_home") != std::string::npos);
}

TEST_CASE("plan: state past the host budget goes to the SSD, and a config too big is refused",
          "[train][plan]") {
  plan::PlanOptions options = roundMachine();
  options.calibration->hostMemoryBytes = 100ull << 30;  // a 90 GiB host budget
  options.calibration->nvmeFreeBytes = 100ull << 30;    // a 90 GiB SSD budget
  config::Config c = configFile(
      "gpt3-13b.yaml", {"model.seq_length=512", "train.micro_batch_size=4", "train.global_batch_size=4",
                        "zero_optimization.nvme_path=/x", "zero_optimization.offload_optimizer.device=cpu"});
  plan::ModelStatePlan p = plan::planModelState(c, options);
  REQUIRE(p.fits);
  const int host = int(zero::Tier::Host), nvme = int(zero::Tier::Nvme);
  REQUIRE(p.placement.bytes[host] <= p.budgets.host);
  REQUIRE(p.placement.bytes[nvme] > 0);
  REQUIRE(p.placement.bytes[host] + p.placement.bytes[nvme] == 12 * uint64_t(p.inputs.rangeElemsTotal()));
  // Chunk order: the SSD holds the tail.
  bool seenNvme = false;
  for (zero::Tier t : p.placement.optimizerTier) {
    if (seenNvme) REQUIRE(t == zero::Tier::Nvme);
    seenNvme = seenNvme || t == zero::Tier::Nvme;
  }
  double ssd = double(p.placement.bytes[nvme]);
  REQUIRE(term(p, "SSD")->seconds == Approx(ssd / 2e9 + ssd / 1e9));
  REQUIRE(p.bound == "SSD");

  // Without an nvme_path there is no SSD tier: refused, and the largest model of the family that fits is
  // smaller, fits, and keeps the head width.
  c.zero.nvmePath.clear();
  plan::ModelStatePlan refused = plan::planModelState(c, options);
  REQUIRE(!refused.fits);
  REQUIRE(refused.refusal.find("SSD") != std::string::npos);
  // No tables of an empty placement or of its step: the budgets, and the refusal from the caller.
  std::string refusedText = plan::formatPlan(refused);
  REQUIRE(refusedText.find("no placement within the budgets") != std::string::npos);
  REQUIRE(refusedText.find("bytes of optimizer state per parameter") == std::string::npos);
  REQUIRE(refusedText.find("predicted step time") == std::string::npos);
  std::optional<config::Config> largest = plan::largestFittingModel(c, options);
  REQUIRE(largest.has_value());
  REQUIRE(plan::planModelState(*largest, options).fits);
  REQUIRE(largest->model.hiddenSize < c.model.hiddenSize);
  REQUIRE(largest->model.hiddenSize / largest->model.numAttentionHeads == 128);
  REQUIRE(models::numParameters(config::modelSpecFrom(*largest, Device::cpu())) > 5'000'000'000);

  // A device too small for the parameters, gradients and activations is refused too, naming them.
  c.zero.nvmePath = "/x";
  options.calibration->deviceMemoryBytes = 40ull << 30;
  plan::ModelStatePlan small = plan::planModelState(c, options);
  REQUIRE(!small.fits);
  REQUIRE(small.refusal.find("activations") != std::string::npos);
}

TEST_CASE("plan: the delayed SSD update's host reserve, as the engine leaves it", "[train][plan]") {
  plan::PlanOptions options = roundMachine();
  options.calibration->hostMemoryBytes = 100ull << 30;  // a 90 GiB automatic host budget
  options.calibration->nvmeFreeBytes = 1000ull << 30;
  std::vector<std::string> overrides{"model.seq_length=512",
                                     "train.micro_batch_size=4",
                                     "train.global_batch_size=4",
                                     "zero_optimization.nvme_path=/x",
                                     "zero_optimization.offload_optimizer.device=cpu",
                                     "precision.grad_accum_dtype=fp32"};
  plan::ModelStatePlan plain = plan::planModelState(configFile("gpt3-13b.yaml", overrides), options);
  overrides.push_back("store.delayed_update=true");
  config::Config c = configFile("gpt3-13b.yaml", overrides);
  plan::ModelStatePlan delayed = plan::planModelState(c, options);
  REQUIRE(plain.fits);
  REQUIRE(delayed.fits);
  const int host = int(zero::Tier::Host), nvme = int(zero::Tier::Nvme);
  // The reserve (fp32 gradient and bf16 parameter per SSD element) comes off the host budget, so more state
  // goes to the SSD; budget less reserve is what state may use, and together they stay in the host budget.
  uint64_t reserve =
      plan::delayedUpdateReserveBytes(c, delayed.compute, delayed.inputs.rangeElems, delayed.placement);
  uint64_t ssdElems = 0;
  for (size_t i = 0; i < delayed.placement.optimizerTier.size(); ++i)
    if (delayed.placement.optimizerTier[i] == zero::Tier::Nvme)
      ssdElems += uint64_t(delayed.inputs.rangeElems[i]);
  REQUIRE(reserve == ssdElems * 6);
  REQUIRE(delayed.budgets.host + reserve <= plain.budgets.host);
  REQUIRE(delayed.placement.bytes[host] <= delayed.budgets.host);
  REQUIRE(delayed.placement.bytes[host] + reserve <= plain.budgets.host);
  REQUIRE(delayed.placement.bytes[nvme] > plain.placement.bytes[nvme]);
  bool noted = false;
  for (const std::string& n : delayed.notes)
    noted = noted || n.find("store.delayed_update") != std::string::npos;
  REQUIRE(noted);
  // An explicit host budget is taken as given.
  overrides.push_back("store.host_budget_gb=80");
  plan::ModelStatePlan fixed = plan::planModelState(configFile("gpt3-13b.yaml", overrides), options);
  REQUIRE(fixed.budgets.host == 80ull << 30);
  // bf16 gradient buffers: the pending update keeps 2 + 2 bytes per SSD element.
  overrides.pop_back();
  std::replace(overrides.begin(), overrides.end(), std::string("precision.grad_accum_dtype=fp32"),
               std::string("precision.grad_accum_dtype=bf16"));
  config::Config c16 = configFile("gpt3-13b.yaml", overrides);
  plan::ModelStatePlan delayed16 = plan::planModelState(c16, options);
  uint64_t ssd16 = 0;
  for (size_t i = 0; i < delayed16.placement.optimizerTier.size(); ++i)
    if (delayed16.placement.optimizerTier[i] == zero::Tier::Nvme)
      ssd16 += uint64_t(delayed16.inputs.rangeElems[i]);
  REQUIRE(ssd16 > 0);
  REQUIRE(plan::delayedUpdateReserveBytes(c16, delayed16.compute, delayed16.inputs.rangeElems,
                                          delayed16.placement) == ssd16 * 4);
}

TEST_CASE("plan and the placement inputs count Adafactor's factored state", "[train][plan][adafactor]") {
  plan::PlanOptions options = roundMachine();
  config::Config adam = configFile("gpt3-1.3b.yaml");
  config::Config ada =
      configFile("gpt3-1.3b.yaml", {"optimizer.type=adafactor", "optimizer.adafactor_beta1=0.9",
                                    "optimizer.adafactor_bf16_momentum=true"});
  plan::ModelStatePlan pa = plan::planModelState(adam, options), pf = plan::planModelState(ada, options);
  REQUIRE(pa.optimizer == "adamw");
  REQUIRE(pf.optimizer == "adafactor");
  // AdamW: bf16 parameters, fp32 master, m and v: 12 bytes per parameter of optimizer state.
  REQUIRE(pa.optimizerBytesPerParameter == Approx(12.0));
  // Adafactor: the fp32 master (4), a bf16 m (2) and the factored v: a little over 6.
  REQUIRE(pf.optimizerBytesPerParameter > 6.0);
  REQUIRE(pf.optimizerBytesPerParameter < 6.1);
  const plan::ModelStateInputs& in = pf.inputs;
  for (size_t i = 0; i < in.layout.chunks.size(); ++i) {
    REQUIRE(in.firstMomentBytes[i] == uint64_t(in.rangeElems[i]) * 2);
    REQUIRE(in.optimizerBytes[i] == uint64_t(in.rangeElems[i]) * 6 + in.secondMomentBytes[i]);
    REQUIRE(in.secondMomentBytes[i] < uint64_t(in.rangeElems[i]) / 10);
  }
  std::string text = plan::formatPlan(pf);
  REQUIRE(text.find("Adafactor v (factored)") != std::string::npos);
  REQUIRE(text.find("optimizer      adafactor") != std::string::npos);
}

TEST_CASE(
    "plan: Adafactor's state past a small host budget goes to the SSD, placed and counted as the "
    "engine does",
    "[train][plan][adafactor][nvme]") {
  // A tiny GPT on the CPU: the engine's real placement and the plan's agree chunk for chunk and byte for
  // byte, the SSD's bytes being Adafactor's fields there (NOTE [Adafactor SSD chunks] in optim/Adafactor.h).
  fs::path nvme = fs::temp_directory_path() / "strata-plan-adafactor-nvme";
  config::Config c = tinyAdafactor("0.0002", "0.0001", nvme, {"store.nvme_state_dtype=bf16"});
  auto model = models::buildModel(config::modelSpecFrom(c, Device::cpu()));
  data::CausalLmObjective objective(model, nullptr);
  train::ZeroStepEngine engine(objective, c, Device::cpu(), DType::F32);
  const zero::StorePlacement& real = engine.placement();
  plan::PlanOptions options = roundMachine();
  plan::ModelStatePlan p = plan::planModelState(c, options);
  REQUIRE(p.fits);
  REQUIRE(real.chunksOn(zero::Tier::Nvme) > 0);
  REQUIRE(real.chunksOn(zero::Tier::Host) > 0);
  REQUIRE(p.placement.optimizerTier == real.optimizerTier);
  for (int t = 0; t < zero::kNumTiers; ++t) {
    INFO(zero::tierName(zero::Tier(t)));
    REQUIRE(p.placement.bytes[t] == real.bytes[t]);
    uint64_t kinds = 0;
    for (int k = 0; k < plan::kNumStateKinds; ++k) kinds += p.kindBytes[k][t];
    REQUIRE(kinds == real.bytes[t]);
  }
  // On the SSD the fp32 first moment is kept in bf16, the factored second moment in fp32.
  const int ssd = int(zero::Tier::Nvme);
  uint64_t ssdElems = 0, ssdSecond = 0;
  for (size_t i = 0; i < p.placement.optimizerTier.size(); ++i)
    if (p.placement.optimizerTier[i] == zero::Tier::Nvme) {
      ssdElems += uint64_t(p.inputs.rangeElems[i]);
      ssdSecond += p.inputs.secondMomentBytes[i];
    }
  REQUIRE(p.kindBytes[plan::kFirstMoments][ssd] == ssdElems * 2);
  REQUIRE(p.kindBytes[plan::kSecondMoments][ssd] == ssdSecond);
  REQUIRE(p.kindBytes[plan::kMasters][ssd] == ssdElems * 4);

  // GPT-13B with about 50 GiB of host budget: Adafactor's master, bf16 first moment and factored second
  // moment (about 6 bytes a parameter) overflow it onto the SSD, which the step's time then counts.
  options.calibration->hostMemoryBytes = 64ull << 30;
  config::Config big = configFile(
      "gpt3-13b.yaml",
      {"model.seq_length=512", "train.micro_batch_size=4", "train.global_batch_size=4",
       "optimizer.type=adafactor", "optimizer.adafactor_beta1=0.9", "optimizer.adafactor_bf16_momentum=true",
       "zero_optimization.nvme_path=/x", "zero_optimization.offload_optimizer.device=cpu"});
  plan::ModelStatePlan pb = plan::planModelState(big, options);
  REQUIRE(pb.fits);
  REQUIRE(pb.placement.bytes[ssd] > 0);
  REQUIRE(pb.placement.bytes[int(zero::Tier::Host)] <= pb.budgets.host);
  REQUIRE(term(pb, "SSD") != nullptr);
  REQUIRE(term(pb, "PCIe") != nullptr);
  std::string text = plan::formatPlan(pb);
  INFO(text);
  REQUIRE(text.find("  SSD ") != std::string::npos);
  // Without an SSD the same config does not fit, and the plan says which setting would.
  big.zero.nvmePath.clear();
  plan::ModelStatePlan refused = plan::planModelState(big, options);
  REQUIRE(!refused.fits);
  bool suggestsSsd = false;
  for (const std::string& s : plan::fitAdvice(big, options))
    suggestsSsd = suggestsSsd || s.find("zero_optimization.nvme_path") != std::string::npos;
  REQUIRE(suggestsSsd);
}

TEST_CASE(
    "plan: Adafactor with parameters homed on the host and the SSD, placed and counted as the engine does",
    "[train][plan][adafactor][homes]") {
  // A tiny GPT on the CPU whose parameters spread over the three tiers (NOTE [Parameter homes] in
  // zero/ParameterGatherer.h): the engine's real placement and the plan's agree chunk for chunk and byte for
  // byte, at stages 0 and 3.
  fs::path nvme = fs::temp_directory_path() / "strata-plan-adafactor-homes";
  for (int stage : {0, 3}) {
    INFO("stage " << stage);
    config::Config c =
        tinyAdafactor("0.00004", "0.00002", nvme,
                      {"store.nvme_state_dtype=fp32", "zero_optimization.stage=" + std::to_string(stage)});
    auto model = models::buildModel(config::modelSpecFrom(c, Device::cpu()));
    data::CausalLmObjective objective(model, nullptr);
    train::ZeroStepEngine engine(objective, c, Device::cpu(), DType::F32);
    const zero::StorePlacement& real = engine.placement();
    plan::ModelStatePlan p = plan::planModelState(c, roundMachine());
    INFO(plan::formatPlan(p));
    REQUIRE(p.fits);
    REQUIRE(real.parameterChunksOn(zero::Tier::Host) > 0);
    REQUIRE(real.parameterChunksOn(zero::Tier::Nvme) > 0);
    REQUIRE(p.placement.parameterTier == real.parameterTier);
    REQUIRE(p.placement.optimizerTier == real.optimizerTier);
    for (int t = 0; t < zero::kNumTiers; ++t) {
      INFO(zero::tierName(zero::Tier(t)));
      REQUIRE(p.placement.bytes[t] == real.bytes[t]);
    }
  }
  // configs/gpt3-20b-store.yaml with Adafactor on an 80 GiB GPU: the parameters that do not fit beside the
  // gradients and activations are homed in host memory, not refused; their new values cross back to the
  // homes with the masters and the state.
  plan::PlanOptions options = roundMachine();
  options.calibration->deviceMemoryBytes = 80ull << 30;
  plan::ModelStatePlan p = plan::planModelState(
      configFile("gpt3-20b-store.yaml",
                 {"zero_optimization.nvme_path=/x", "optimizer.type=adafactor",
                  "optimizer.adafactor_beta1=0.9", "optimizer.adafactor_bf16_momentum=true"}),
      options);
  INFO(plan::formatPlan(p));
  REQUIRE(p.fits);
  REQUIRE(p.optimizer == "adafactor");
  REQUIRE(p.placement.parameterHostBytes > 0);
  REQUIRE(term(p, "parameter homes") != nullptr);
  REQUIRE(term(p, "PCIe") != nullptr);
  REQUIRE(term(p, "PCIe")->detail.find("homed parameters out") != std::string::npos);
  // Their gradients are homed too (store.gradient_home: auto): out during backward, and back in with the
  // state for the GPU's update (NOTE [Gradient homes] in zero/GradientReducer.h).
  REQUIRE(p.gradientHomeBytes > 0);
  REQUIRE(term(p, "gradient homes") != nullptr);
  REQUIRE(term(p, "PCIe")->detail.find("homed gradients in") != std::string::npos);
  plan::ModelStatePlan kept = plan::planModelState(
      configFile(
          "gpt3-20b-store.yaml",
          {"zero_optimization.nvme_path=/x", "optimizer.type=adafactor", "optimizer.adafactor_beta1=0.9",
           "optimizer.adafactor_bf16_momentum=true", "store.gradient_home=device"}),
      options);
  REQUIRE(kept.gradientHomeBytes == 0);
  REQUIRE(term(kept, "gradient homes") == nullptr);
  // The homed gradients' page-locked buffers live beside the state in host memory: the automatic host budget
  // for state leaves room for them (plan::placeWithHostReserves), so state and buffers fit the budget the
  // device-gradient plan places within.
  REQUIRE(p.budgets.host + p.gradientHomeBytes == kept.budgets.host);
  REQUIRE(p.placement.bytes[int(zero::Tier::Host)] + p.gradientHomeBytes <= kept.budgets.host);
  REQUIRE(term(p, "PCIe")->seconds ==
          Approx(term(kept, "PCIe")->seconds + double(p.gradientHomeBytes) / (*p.machine.h2dGBs * 1e9)));
  // Stage 1 still refuses homes, naming the keys.
  plan::ModelStatePlan sharded = plan::planModelState(
      configFile("gpt3-20b-store.yaml",
                 {"zero_optimization.nvme_path=/x", "optimizer.type=adafactor", "zero_optimization.stage=1"}),
      options);
  REQUIRE(!sharded.fits);
  REQUIRE(sharded.refusal.find("store.parameter_home") != std::string::npos);
}

TEST_CASE("the placement inputs of expert parallelism are expert-parallel rank 0's chunks",
          "[train][plan][moe]") {
  // A GPT-MoE with 4 experts over expert-parallel groups of 2, on 4 ranks: each rank holds 2 experts, which
  // ZeRO shards over the 2 ranks holding the same ones.
  config::Config c =
      config::parseConfig("", "test",
                          {"data.path=" + corpus().string(), "train.device=cpu", "model.num_layers=2",
                           "model.hidden_size=32", "model.num_attention_heads=2", "model.seq_length=32",
                           "model.moe_num_experts=4", "model.moe_expert_parallel_size=2",
                           "zero_optimization.chunk_size_mb=0.02", "zero_optimization.stage=1"});
  models::ModelSpec spec = config::modelSpecFrom(c, Device::cpu());
  spec.expertParallel.size = 2;
  // The layout's trace runs the exchanges; a copy stands in for the group (only the order of the calls
  // counts).
  spec.expertParallel.allToAll = [](const Tensor& out, const Tensor& in) { ops::copy(out, in); };
  auto model = models::buildModel(spec);
  data::CausalLmObjective objective(model, nullptr);
  zero::ChunkFamilies families{
      [](const std::string& name) { return name.find(".experts.") != std::string::npos ? 1 : 0; }, {4, 2}};
  auto chunks = train::layOutModelChunks(objective, Device::cpu(), DType::F32, int64_t(0.02 * (1 << 20)), 4,
                                         0, families);
  plan::ModelStateInputs in = plan::modelStateInputs(c, 4, DType::F32);
  REQUIRE(in.layout.slots.size() == chunks->layout().slots.size());
  for (size_t k = 0; k < in.layout.slots.size(); ++k)
    REQUIRE(in.layout.slots[k].name == chunks->layout().slots[k].name);
  REQUIRE(in.paddedElems.size() == chunks->numChunks());
  bool anyExpert = false;
  for (size_t i = 0; i < chunks->numChunks(); ++i) {
    REQUIRE(in.layout.chunks[i].family == chunks->family(i));
    REQUIRE(in.paddedElems[i] == chunks->paddedElems(i));
    REQUIRE(in.rangeElems[i] == chunks->shard(i, 0).size());
    anyExpert |= chunks->family(i) == 1;
  }
  REQUIRE(anyExpert);
  // Against plain data parallelism, a rank holds half the experts' parameters (stage 1 keeps them whole).
  config::Config dense = c;
  dense.model.moeExpertParallelSize = 1;
  REQUIRE(in.parameterBytes < plan::modelStateInputs(dense, 4, DType::F32).parameterBytes);
}

TEST_CASE("the placement inputs of tensor parallelism are a tensor-parallel rank's slices",
          "[train][plan][tensor]") {
  // A GPT over tensor-parallel groups of 2 on 4 ranks: each rank holds its slices, which ZeRO shards over the
  // 2 data-parallel ranks holding the same ones.
  config::Config c = config::parseConfig(
      "", "test",
      {"data.path=" + corpus().string(), "train.device=cpu", "model.num_layers=2", "model.hidden_size=32",
       "model.num_attention_heads=2", "model.seq_length=32", "parallel.tensor=2",
       "zero_optimization.chunk_size_mb=0.02", "zero_optimization.stage=1"});
  models::ModelSpec spec = config::modelSpecFrom(c, Device::cpu());
  // The layout's trace runs the collectives; copies stand in for the group (only the shapes count).
  spec.tensorParallel.size = 2;
  spec.tensorParallel.allReduceSum = [](const Tensor&) {};
  spec.tensorParallel.allReduceMax = [](const Tensor&) {};
  spec.tensorParallel.allGather = [](const Tensor& out, const Tensor& in) {
    for (int r = 0; r < 2; ++r) ops::copy(out.view({2, in.numel()}).select(0, r), in.view({in.numel()}));
  };
  spec.tensorParallel.reduceScatter = [](const Tensor& out, const Tensor& in) {
    ops::copy(out.view({out.numel()}), in.view({in.numel()}).narrow(0, 0, out.numel()));
  };
  auto model = models::buildModel(spec);
  data::CausalLmObjective objective(model, nullptr);
  auto chunks = train::layOutModelChunks(objective, Device::cpu(), DType::F32, int64_t(0.02 * (1 << 20)), 2,
                                         0, zero::ChunkFamilies{});
  plan::ModelStateInputs in = plan::modelStateInputs(c, 4, DType::F32);
  REQUIRE(in.ranks == 2);
  REQUIRE(in.layout.slots.size() == chunks->layout().slots.size());
  for (size_t k = 0; k < in.layout.slots.size(); ++k) {
    REQUIRE(in.layout.slots[k].name == chunks->layout().slots[k].name);
    REQUIRE(in.layout.slots[k].shape == chunks->layout().slots[k].shape);
  }
  REQUIRE(in.paddedElems.size() == chunks->numChunks());
  for (size_t i = 0; i < chunks->numChunks(); ++i) REQUIRE(in.paddedElems[i] == chunks->paddedElems(i));
  // Against one rank, a rank holds about half of the parameters (the norms and positions stay whole).
  config::Config whole = c;
  whole.parallel.tensor = 1;
  REQUIRE(double(in.parameterBytes) <
          0.7 * double(plan::modelStateInputs(whole, 1, DType::F32).parameterBytes));
  // The plan splits the batch over the data-parallel ranks, and says how the ranks split.
  plan::PlanOptions options = roundMachine();
  options.ranks = 4;
  plan::ModelStatePlan p = plan::planModelState(c, options);
  CHECK(p.globalBatch == 2 * c.train.microBatchSize);
  CHECK(plan::formatPlan(p).find("4 ranks (2 data-parallel x 2 tensor-parallel)") != std::string::npos);
}

TEST_CASE("strata plan --ranks splits the host's memory, SSD space and cores between a machine's ranks",
          "[train][plan]") {
  // NOTE [Per-node shares] in distributed/Launch.h.
  plan::PlanOptions options = roundMachine();
  options.calibration->cpuThreads = 16;
  config::Config c = configFile("gpt-nano.yaml", {"zero_optimization.nvme_path=/tmp/strata-plan-nvme"});
  plan::ModelStatePlan one = plan::planModelState(c, options);
  CHECK(one.ranksPerNode == 1);
  CHECK(one.hostShareBytes == 1000ull << 30);
  CHECK(one.budgets.host == (1000ull << 30) / 10 * 9);
  CHECK(one.cpuThreadShare == 16);
  options.ranks = 4;
  plan::ModelStatePlan four = plan::planModelState(c, options);
  CHECK(four.ranksPerNode == 4);
  CHECK(four.hostShareBytes == 250ull << 30);
  CHECK(four.nvmeShareBytes == 250ull << 30);
  CHECK(four.budgets.host == (250ull << 30) / 10 * 9);
  CHECK(four.budgets.nvme == (250ull << 30) / 10 * 9);
  CHECK(four.cpuThreadShare == 4);
  std::string text = plan::formatPlan(four);
  CHECK(text.find("per rank       250.00 GiB of host memory, 250.00 GiB of SSD space, 4 CPU threads (4 ranks "
                  "on one machine)") != std::string::npos);
  // Two machines of two ranks each.
  options.ranksPerNode = 2;
  plan::ModelStatePlan two = plan::planModelState(c, options);
  CHECK(two.ranksPerNode == 2);
  CHECK(two.hostShareBytes == 500ull << 30);
  CHECK(two.cpuThreadShare == 8);
}

TEST_CASE("a machine without a GPU plans the CPU run, and refuses what its memory cannot hold",
          "[train][plan]") {
  plan::PlanOptions options = roundMachine();
  options.calibration->deviceName.reset();
  options.calibration->deviceMemoryBytes.reset();
  options.calibration->hostMemoryBytes = uint64_t(23.5 * double(1ull << 30));
  plan::ModelStatePlan nano = plan::planModelState(configFile("gpt-nano.yaml"), options);
  CHECK(!nano.onGpu);
  CHECK(nano.compute == DType::F32);
  CHECK(nano.fits);
  CHECK(plan::formatPlan(nano).find("machine        no GPU, 23.50 GiB host memory") != std::string::npos);
  plan::ModelStatePlan big = plan::planModelState(configFile("gpt3-1.3b.yaml"), options);
  CHECK(!big.fits);
  CHECK(big.refusal.find("the CPU run needs") != std::string::npos);
  CHECK(big.refusal.find("over the 23.50 GiB available") != std::string::npos);
  // The same machine told to train on a GPU plans for one (the reference H200's figures fill in, and say so).
  plan::ModelStatePlan asked =
      plan::planModelState(configFile("gpt-nano.yaml", {"train.device=cuda"}), options);
  CHECK(asked.onGpu);
  CHECK(asked.compute == DType::BF16);
}

TEST_CASE("strata plan uses a calibration file only for the machine it describes", "[train][plan]") {
  fs::path dir = test::freshDir("strata-plan-machine");
  fs::path file = dir / "calibration.json";
  plan::Calibration other = plan::measuredH200();
  other.host = "some-other-host";
  other.cpuAdamwElemsPerS = 1.25e9;
  plan::writeCalibration(other, file.string());
  setenv("STRATA_CALIBRATION", file.string().c_str(), 1);
  plan::MachineChoice here = plan::chooseMachine("here", "", "");
  CHECK(here.source == "this machine");
  CHECK(here.calibration.host == plan::thisHostName());
  CHECK(!here.calibration.cpuAdamwElemsPerS.has_value());  // rates are not read, only memory and cores
  REQUIRE(here.notes.size() == 2);
  CHECK(here.notes[0].find("describes host 'some-other-host', not this one") != std::string::npos);
  // The same file for this host is used, its gaps filled from the machine.
  other.host = plan::thisHostName();
  other.hostAvailableBytes.reset();
  plan::writeCalibration(other, file.string());
  plan::MachineChoice mine = plan::chooseMachine("here", "", "");
  CHECK(mine.source == file.string());
  CHECK(mine.calibration.cpuAdamwElemsPerS == 1.25e9);
  CHECK(mine.calibration.hostAvailableBytes.has_value());
  // Explicitly: any file, and the H200.
  CHECK(plan::chooseMachine("here", file.string(), "").source == file.string());
  CHECK(plan::chooseMachine("h200", "", "").calibration.host == "reference H200");
  CHECK(test::errorOf([] { plan::chooseMachine("laptop", "", ""); }).find("h200x8") != std::string::npos);
  unsetenv("STRATA_CALIBRATION");
}

TEST_CASE(
    "train.recompute auto takes the fastest mode that fits: none, selective and full each on some device",
    "[train][plan][recompute]") {
  config::Config c = configFile("gpt3-1.3b.yaml");
  REQUIRE(c.train.recompute == "auto");
  std::set<std::string> chosen;
  for (uint64_t gib : {140, 60, 50, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 24, 20, 8}) {
    CAPTURE(gib);
    plan::PlanOptions o = roundMachine();
    o.calibration->deviceMemoryBytes = gib << 30;
    plan::ModelStatePlan p = plan::planModelState(c, o);
    // The rule (NOTE [Recompute auto]): the fastest predicted step of the fixed modes that fit, the least
    // recomputation on a tie.
    double best = 0;
    std::string bestMode;
    for (const char* mode : {"none", "selective", "full"}) {
      config::Config m = c;
      m.train.recompute = mode;
      plan::ModelStatePlan q = plan::planModelState(m, o);
      CHECK(!q.recomputeAuto);
      if (q.fits && (bestMode.empty() || q.serialSeconds < best * 0.999)) {
        best = q.serialSeconds;
        bestMode = mode;
      }
    }
    CHECK(p.recomputeAuto);
    if (bestMode.empty()) {
      CHECK(!p.fits);
      CHECK(p.recomputeWhy.find("no mode fits") != std::string::npos);
      continue;
    }
    REQUIRE(p.fits);
    CHECK(p.recompute == bestMode);
    CHECK(p.serialSeconds == Approx(best));
    CHECK(plan::formatPlan(p).find("recompute " + bestMode + " (auto)") != std::string::npos);
    CHECK(p.recomputeWhy.find("auto chose " + bestMode) != std::string::npos);
    chosen.insert(bestMode);
  }
  CHECK(chosen == std::set<std::string>{"none", "selective", "full"});
  // Full recomputation's price: a third more FLOPs in the compute term.
  plan::PlanOptions o = roundMachine();
  plan::ModelStatePlan none = plan::planModelState(configFile("gpt3-1.3b.yaml", {"train.recompute=none"}), o);
  plan::ModelStatePlan full = plan::planModelState(configFile("gpt3-1.3b.yaml", {"train.recompute=full"}), o);
  CHECK(term(full, "compute")->seconds == Approx(term(none, "compute")->seconds * 4.0 / 3.0));
  CHECK(full.activations.bytes < none.activations.bytes);
}

TEST_CASE("a refused config names the settings that would fit, each checked by a plan", "[train][plan]") {
  plan::PlanOptions o = roundMachine();
  o.calibration->deviceMemoryBytes = 24ull << 30;
  config::Config c = configFile("gpt3-6.7b.yaml", {"train.recompute=none"});
  plan::ModelStatePlan p = plan::planModelState(c, o);
  REQUIRE(!p.fits);
  std::vector<std::string> advice = plan::fitAdvice(c, o);
  REQUIRE(!advice.empty());
  std::string message = plan::refusalMessage("gpt3-6.7b.yaml", c, p, o);
  CHECK(message.find("gpt3-6.7b.yaml does not fit: ") == 0);
  CHECK(message.find("What would fit:") != std::string::npos);
  // Each line's settings fit when planned: the micro-batch and the ranks lines.
  for (const std::string& line : advice) {
    CAPTURE(line);
    if (line.rfind("--set train.micro_batch_size=", 0) == 0) {
      config::Config s = c;
      s.train.microBatchSize = std::stoll(line.substr(std::string("--set train.micro_batch_size=").size()));
      s.train.globalBatchSize = c.train.globalBatchSize;
      s.train.globalBatchSizeSet = true;
      CHECK(plan::planModelState(s, o).fits);
    }
    if (line.rfind("mpirun -np ", 0) == 0) {
      config::Config s = c;
      s.zero.stage = 3;
      plan::PlanOptions r = o;
      r.ranks = r.ranksPerNode = std::stoi(line.substr(std::string("mpirun -np ").size()));
      CHECK(plan::planModelState(s, r).fits);
    }
  }
  CHECK(message.find("a smaller model") != std::string::npos);
}

TEST_CASE("the trainer runs the plan before it builds the model: a CPU run too big for the host is refused",
          "[train][plan][trainer]") {
  setenv("STRATA_HOST_MEMORY_GB", "23.5", 1);
  auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    train::Trainer trainer(
        configFile("gpt3-1.3b.yaml", {"train.device=cpu", "data.format=random", "checkpoint.save=",
                                      "train.out_dir=" + test::freshDir("strata-plan-refused").string()}));
  } catch (const Error& e) {
    message = e.message();
  }
  unsetenv("STRATA_HOST_MEMORY_GB");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(message.find("does not fit: the CPU run needs") != std::string::npos);
  CHECK(message.find("What would fit:") != std::string::npos);
  CHECK(message.find("--set train.micro_batch_size=") != std::string::npos);
  // Building the 1.3B model on the CPU alone takes longer than this.
  CHECK(seconds < 10);
}

TEST_CASE("the automatic host budget leaves the system its reserve and the store its staging",
          "[train][plan]") {
  // NOTE [Host headroom]: max(5%, min(8 GiB, a quarter)) of the host, the pipelined update's staging slots
  // (4 slots x 2 x 4 bytes x 4M elements = 128 MiB by default) and, with an SSD tier, two buffer sets of the
  // largest chunk's master, m and v, and 1 GiB for the process.
  const uint64_t GiB = 1ull << 30, MiB = 1ull << 20;
  config::Config c = configFile("gpt-nano.yaml");
  CHECK(plan::hostHeadroomBytes(c, 1 << 20, 125 * GiB) == 9 * GiB + 128 * MiB);
  CHECK(plan::hostHeadroomBytes(c, 1 << 20, 1000 * GiB) == 51 * GiB + 128 * MiB);
  CHECK(plan::hostHeadroomBytes(c, 1 << 20, 2 * GiB) == GiB + GiB / 2 + 128 * MiB);
  config::Config ssd = configFile("gpt-nano.yaml", {"zero_optimization.nvme_path=/tmp/strata-headroom"});
  CHECK(plan::hostHeadroomBytes(ssd, 1 << 20, 125 * GiB) == 9 * GiB + 128 * MiB + 24 * MiB);
  // AdamW's m and v in bf16 (optimizer.moments_dtype): 4 + 2 + 2 bytes a set.
  config::Config narrow = configFile(
      "gpt-nano.yaml", {"zero_optimization.nvme_path=/tmp/strata-headroom", "optimizer.moments_dtype=bf16"});
  CHECK(plan::hostHeadroomBytes(narrow, 1 << 20, 125 * GiB) == 9 * GiB + 128 * MiB + 16 * MiB);
  // auto is what is available less the headroom, at most 90% of it; a budget given is taken as given.
  uint64_t headroom = 9 * GiB + 128 * MiB;
  CHECK(plan::storeBudgets(c, 0, zero::kUnlimited, 40 * GiB, 0, headroom).host == 40 * GiB - headroom);
  CHECK(plan::storeBudgets(c, 0, zero::kUnlimited, 125 * GiB, 0, headroom).host == 125 * GiB / 10 * 9);
  config::Config given = configFile("gpt-nano.yaml", {"store.host_budget_gb=39"});
  CHECK(plan::storeBudgets(given, 0, zero::kUnlimited, 40 * GiB, 0, headroom).host == 39 * GiB);
  // The plan reads it so: a 64 GiB host keeps 8 GiB, the staging and the process's 1 GiB back.
  plan::PlanOptions o = roundMachine();
  o.calibration->hostMemoryBytes = 64 * GiB;
  plan::ModelStatePlan p = plan::planModelState(configFile("gpt3-1.3b.yaml"), o);
  CHECK(p.budgets.host == 64 * GiB - 9 * GiB - 128 * MiB);
  CHECK(plan::formatPlan(p).find("of headroom for the system") != std::string::npos);
}

TEST_CASE(
    "strata plan --machine h200x8 --ranks 8 places the state of a 100B GPT with AdamW at ZeRO stage 3, each "
    "rank laying out only its shards",
    "[train][plan]") {
  plan::MachineChoice box = plan::chooseMachine("h200x8", "", "");
  CHECK(box.calibration.hostMemoryBytes == 560ull << 30);
  CHECK(box.calibration.nvmeFreeBytes == 235ull << 30);
  CHECK(box.calibration.deviceMemoryBytes == plan::measuredH200().deviceMemoryBytes);
  REQUIRE(box.notes.size() == 1);  // its rates are the one-GPU machine's, and the plan says so
  plan::PlanOptions options;
  options.ranks = 8;
  options.calibration = box.calibration;
  // configs/gpt3-20b-store.yaml's store (bf16 gradient buffers, m and v in bf16 on the SSD), 93 layers of
  // width 9472: 100.6B parameters, each rank a shard of the state across its GPU, host share and SSD share.
  std::vector<std::string> overrides{"zero_optimization.stage=3", "train.global_batch_size=16",
                                     "model.num_layers=93", "model.hidden_size=9472",
                                     "model.num_attention_heads=74"};
  config::Config c = configFile("gpt3-20b-store.yaml", overrides);
  uint64_t params = uint64_t(models::numParameters(config::modelSpecFrom(c, Device::cpu())));
  REQUIRE(params > 100'000'000'000);
  plan::ModelStatePlan p = plan::planModelState(c, options);
  INFO(plan::formatPlan(p));
  // NOTE [Sharded layout] in zero/ChunkManager.h: each rank makes its eighth of the masters and of the
  // 16-bit chunks (no fp32 model is built: NOTE [Deferred parameters] in nn/DeferredInit.h).
  REQUIRE(p.fits);
  plan::LayoutElems elems = plan::layoutElems(params, 3, 8);
  CHECK(elems.masters == params / 8);
  CHECK(elems.chunks == params / 8);
  CHECK(plan::layoutElems(params, 2, 8).chunks == params);  // stages 1 and 2 keep every chunk whole
  CHECK(plan::layoutElems(params, 0, 8).masters == params);
  CHECK(plan::formatPlan(p).find("at start each rank makes only what it keeps") != std::string::npos);
  CHECK(plan::formatPlan(p).find("its 1/8 of them") != std::string::npos);
  // The state fits each rank's budgets, and the step's peak its GPU.
  CHECK(p.devicePeakBytes <= p.usableBytes);
  CHECK(p.placement.bytes[int(zero::Tier::Device)] <= p.budgets.device);
  CHECK(p.placement.bytes[int(zero::Tier::Host)] <= p.budgets.host);
  CHECK(p.placement.bytes[int(zero::Tier::Nvme)] <= p.budgets.nvme);
  CHECK(p.ranksPerNode == 8);
  CHECK(p.hostShareBytes == 70ull << 30);
  // bf16 buffers, but the ranks reduce them into fp32 shards, which is what the step holds at its peak.
  CHECK(plan::formatPlan(p).find("f32, this rank's shards and two chunks in flight") != std::string::npos);
  for (int t : {int(zero::Tier::Device), int(zero::Tier::Host), int(zero::Tier::Nvme)})
    CHECK(p.placement.bytes[t] > 0);
  // At stage 2 every rank lays out the whole model's 16-bit chunks: 187 GiB, over one GPU.
  config::Config stage2 = c;
  stage2.zero.stage = 2;
  CHECK(!plan::planModelState(stage2, options).fits);
  // On the one-GPU machine's memory split eight ways the state does not fit.
  options.calibration = plan::measuredH200();
  CHECK(!plan::planModelState(c, options).fits);
  // The largest model of the family the 8-GPU box starts is past 100B.
  options.calibration = box.calibration;
  std::optional<config::Config> largest = plan::largestFittingModel(c, options);
  REQUIRE(largest.has_value());
  CHECK(models::numParameters(config::modelSpecFrom(*largest, Device::cpu())) >= int64_t(params));
}

TEST_CASE("strata plan --layouts weighs every tensor x data split of the ranks, the fastest that fits first",
          "[train][plan]") {
  // NOTE [Layouts] in plan/Plan.h.
  plan::PlanOptions options;
  options.ranks = 8;
  options.calibration = plan::measuredH200x8();
  config::Config c = configFile("gpt3-13b.yaml", {"model.seq_length=512", "train.global_batch_size=64"});
  std::vector<plan::LayoutPlan> all = plan::planLayouts(c, options);
  INFO(plan::formatLayouts(all));
  // Without pipeline stages (the pipeline's layouts: the next test).
  std::vector<plan::LayoutPlan> layouts;
  for (const plan::LayoutPlan& l : all)
    if (l.pipeline == 1) layouts.push_back(l);
  REQUIRE(layouts.size() == 4);
  std::set<int> tensors;
  for (const plan::LayoutPlan& l : layouts) {
    tensors.insert(l.tensor);
    CHECK(l.tensor * l.data == 8);
    CHECK(l.invalid.empty());
    CHECK(l.plan.globalBatch == 64);  // the same batch whatever the split
  }
  CHECK(tensors == std::set<int>{1, 2, 4, 8});
  // Those that fit first, fastest first; the tensor-parallel ones pay their collectives.
  bool seenUnfit = false;
  for (size_t i = 0; i < layouts.size(); ++i) {
    if (!layouts[i].plan.fits) seenUnfit = true;
    CHECK((!seenUnfit || !layouts[i].plan.fits));
    if (i > 0 && layouts[i].plan.fits)
      CHECK(layouts[i - 1].plan.serialSeconds <= layouts[i].plan.serialSeconds);
    bool hasTp = std::any_of(layouts[i].plan.terms.begin(), layouts[i].plan.terms.end(),
                             [](const plan::StepTerm& t) { return t.name == "TP collectives"; });
    CHECK(hasTp == (layouts[i].tensor > 1));
  }
  REQUIRE(layouts.front().plan.fits);
  CHECK(plan::formatLayouts(layouts).find("#1") != std::string::npos);
  // 8-way tensor parallelism sends 7/8 of each all-reduce's buffer twice: more than 2-way's 1/2.
  auto tp = [&](int t) {
    for (const plan::LayoutPlan& l : layouts)
      if (l.tensor == t)
        for (const plan::StepTerm& term : l.plan.terms)
          if (term.name == "TP collectives") return term.seconds;
    return 0.0;
  };
  CHECK(tp(8) > tp(2));

  // A model that cannot split 8 ways says why.
  config::Config nano = configFile("gpt-nano.yaml", {"train.device=cuda"});
  std::vector<plan::LayoutPlan> small = plan::planLayouts(nano, options);
  bool named = false;
  for (const plan::LayoutPlan& l : small)
    if (l.tensor == 8) named = l.invalid.find("4 heads") != std::string::npos;
  CHECK(named);
}

TEST_CASE("a tensor-parallel rank keeps its share of a GPT block's activations", "[train][plan]") {
  models::ModelSpec spec =
      config::modelSpecFrom(configFile("gpt3-1.3b.yaml", {"model.seq_length=1024"}), Device::cpu());
  for (const char* recompute : {"none", "selective", "full"}) {
    INFO(recompute);
    uint64_t one = plan::estimateActivations(spec, 4, DType::BF16, true, recompute).bytes;
    uint64_t two = plan::estimateActivations(spec, 4, DType::BF16, true, recompute, 2).bytes;
    uint64_t twoSp = plan::estimateActivations(spec, 4, DType::BF16, true, recompute, 2, true).bytes;
    CHECK(two < one);
    CHECK(twoSp <= two);
    CHECK(twoSp > one / 4);
  }
  // Without recomputation, sequence parallelism splits the whole block: about half of one rank's.
  uint64_t blockOne = plan::estimateActivations(spec, 4, DType::BF16, true).terms[0].bytes;
  uint64_t blockSp = plan::estimateActivations(spec, 4, DType::BF16, true, "none", 2, true).terms[0].bytes;
  CHECK(blockSp * 2 == blockOne);
}

TEST_CASE("a tensor-parallel rank keeps its share of BERT's and T5's activations, the stream whole",
          "[train][plan]") {
  for (const char* file : {"zoo/bert-base.yaml", "zoo/t5-base.yaml"}) {
    INFO(file);
    models::ModelSpec spec = config::modelSpecFrom(configFile(file, {}), Device::cpu());
    plan::ActivationEstimate one = plan::estimateActivations(spec, 8, DType::BF16, true);
    plan::ActivationEstimate two = plan::estimateActivations(spec, 8, DType::BF16, true, "none", 2);
    // The blocks: less than one rank's, more than half of it (the stream stays whole).
    CHECK(two.terms[0].bytes < one.terms[0].bytes);
    CHECK(2 * two.terms[0].bytes > one.terms[0].bytes);
    // The head's logits split by the vocabulary.
    CHECK(two.terms.back().bytes < one.terms.back().bytes);
    CHECK(two.bytes < one.bytes);
  }
}

TEST_CASE("plan: PowerSGD's error feedback and Q matrices count in the device's working memory",
          "[train][plan]") {
  plan::PlanOptions options = roundMachine();
  options.ranks = 2;
  plan::ModelStatePlan plain =
      plan::planModelState(configFile("gpt3-1.3b.yaml", {"zero_optimization.stage=1"}), options);
  plan::ModelStatePlan compressed = plan::planModelState(
      configFile("gpt3-1.3b.yaml", {"zero_optimization.stage=1", "dist.powersgd_rank=4"}), options);
  REQUIRE(plain.inputs.powerSgdBytes == 0);
  // 4 bytes of error feedback per element of every matrix (nearly every parameter), and Q beside it.
  uint64_t params = 0;
  for (const auto& slot : compressed.inputs.layout.slots) params += uint64_t(numelOf(slot.shape));
  REQUIRE(compressed.inputs.powerSgdBytes > 4 * params * 99 / 100);
  REQUIRE(compressed.inputs.powerSgdBytes < 4 * params * 101 / 100);
  // The working memory beside the model state grows by them (the state's placement may then differ).
  const int device = int(zero::Tier::Device);
  REQUIRE(compressed.devicePeakBytes - compressed.placement.bytes[device] ==
          plain.devicePeakBytes - plain.placement.bytes[device] + compressed.inputs.powerSgdBytes);
  REQUIRE(plan::formatPlan(compressed).find("PowerSGD state") != std::string::npos);
  REQUIRE(plan::formatPlan(plain).find("PowerSGD state") == std::string::npos);
  // Stage 2 reduce-scatters: no PowerSGD (the engine refuses it).
  REQUIRE(plan::planModelState(
              configFile("gpt3-1.3b.yaml", {"zero_optimization.stage=2", "dist.powersgd_rank=4"}), options)
              .inputs.powerSgdBytes == 0);
}

TEST_CASE("strata plan --layouts enumerates data x tensor x pipeline (x virtual stages) over the machines",
          "[train][plan]") {
  // NOTE [Layouts] in plan/Plan.h: 16 ranks on two 8-GPU machines; GPT-13B has 40 layers and 40 heads.
  plan::PlanOptions options;
  options.ranks = 16;
  options.ranksPerNode = 8;
  options.calibration = plan::h200x8Cluster();
  config::Config c = configFile("gpt3-13b.yaml", {"model.seq_length=512", "train.global_batch_size=64"});
  std::vector<plan::LayoutPlan> layouts = plan::planLayouts(c, options);
  std::string table = plan::formatLayouts(layouts, 1000, 1000);
  INFO(table);
  std::set<std::tuple<int, int, int, int>> seen;
  for (const plan::LayoutPlan& l : layouts) {
    CHECK(l.data * l.tensor * l.pipeline == 16);
    CHECK(8 % l.tensor == 0);  // tensor-parallel groups inside a machine
    CHECK(40 % l.pipeline == 0);
    int64_t microBatches = 64 / (4 * l.data);  // micro-batches of 4
    if (l.virtualStages > 1) {
      CHECK(l.pipeline > 1);
      CHECK(microBatches % l.pipeline == 0);
      CHECK((40 / l.pipeline) % l.virtualStages == 0);
    }
    // The trainer's 1F1B needs at least P micro-batches a step.
    if (l.pipeline > microBatches) CHECK(l.invalid.find("fewer than the") != std::string::npos);
    if (l.invalid.empty()) {
      CHECK(l.plan.pipeline == l.pipeline);
      CHECK(l.plan.data == l.data);
      CHECK(l.plan.nodes == 2);
      CHECK(l.plan.accumulation == microBatches);
    }
    seen.insert({l.data, l.tensor, l.pipeline, l.virtualStages});
  }
  CHECK(seen.size() == layouts.size());
  // Every (T, P): T in {1, 2, 4, 8}, P dividing 16 / T and the 40 layers.
  std::set<std::pair<int, int>> tp;
  for (const plan::LayoutPlan& l : layouts) tp.insert({l.tensor, l.pipeline});
  CHECK(tp == std::set<std::pair<int, int>>{{1, 1},
                                            {1, 2},
                                            {1, 4},
                                            {1, 8},
                                            {2, 1},
                                            {2, 2},
                                            {2, 4},
                                            {2, 8},
                                            {4, 1},
                                            {4, 2},
                                            {4, 4},
                                            {8, 1},
                                            {8, 2}});
  // P = 2, D = 8: 2 micro-batches a step, so V in {2, 4, 5, 10, 20} beside 1 (20 layers a stage).
  CHECK(seen.count({8, 1, 2, 20}) == 1);
  CHECK(seen.count({8, 1, 2, 3}) == 0);  // 20 layers a stage do not split 3 ways
  // Those that fit first, fastest first; then those that do not, the nearest to fitting first.
  int phase = 0;
  for (size_t i = 0; i < layouts.size(); ++i) {
    const plan::LayoutPlan& l = layouts[i];
    int now = !l.invalid.empty() ? 2 : l.plan.fits ? 0 : 1;
    CHECK(now >= phase);
    if (i > 0 && now == phase && now == 0) CHECK(layouts[i - 1].plan.serialSeconds <= l.plan.serialSeconds);
    if (i > 0 && now == phase && now == 1)
      CHECK(layouts[i - 1].plan.devicePeakBytes <= l.plan.devicePeakBytes);
    phase = now;
  }
  REQUIRE(layouts.front().plan.fits);
  CHECK(table.find("#1") != std::string::npos);
  CHECK(table.find("MFU") != std::string::npos);

  // A layout that cannot fit is marked, with its peak and why: GPT-175B on 8 GPUs.
  options.ranks = 8;
  std::vector<plan::LayoutPlan> big = plan::planLayouts(configFile("gpt3-175b.yaml"), options);
  std::string bigTable = plan::formatLayouts(big, 1000, 1000);
  INFO(bigTable);
  CHECK(std::none_of(big.begin(), big.end(), [](const plan::LayoutPlan& l) { return l.plan.fits; }));
  CHECK(bigTable.find("does not fit (peak ") != std::string::npos);
}

TEST_CASE("a pipeline stage plans 1/P of the blocks, the 1F1B activations in flight and the bubble",
          "[train][plan]") {
  // NOTE [Layouts] in plan/Plan.h.
  plan::PlanOptions options;
  options.ranks = 8;
  options.ranksPerNode = 8;
  options.calibration = plan::measuredH200x8();
  config::Config c = configFile("gpt3-13b.yaml", {"model.seq_length=512", "train.global_batch_size=64",
                                                  "train.recompute=none", "zero_optimization.stage=1"});
  auto at = [&](int pipeline, int virtualStages, int64_t global = 64) {
    config::Config g = c;
    g.parallel.pipeline = pipeline;
    g.parallel.virtualStages = virtualStages;
    g.train.globalBatchSize = global;
    return plan::planModelState(g, options);
  };
  auto term = [](const plan::ModelStatePlan& p, const std::string& name) {
    for (const plan::StepTerm& t : p.terms)
      if (t.name == name) return t.seconds;
    return -1.0;
  };
  plan::ModelStatePlan one = at(1, 1), four = at(4, 1);
  // State: a quarter of the blocks and the embeddings, over 2 data-parallel ranks instead of 8.
  CHECK(four.data == 2);
  CHECK(four.accumulation == 64 / (4 * 2));
  double ratio = double(four.inputs.parameterBytes) / double(one.inputs.parameterBytes);
  CHECK(ratio > 0.25);
  CHECK(ratio < 0.30);
  // Activations: the first stage keeps min(P, M) = 4 micro-batches of its 10 blocks, as many blocks as the
  // whole model keeps for one micro-batch; the head's chunked logits are on the last stage only.
  CHECK(std::abs(double(four.activations.terms.front().bytes) - double(one.activations.terms.front().bytes)) <
        0.01 * double(one.activations.terms.front().bytes));
  // Interleaving keeps (1 + (P-1)/(P V)) times that.
  plan::ModelStatePlan interleaved = at(4, 2);
  CHECK(double(interleaved.activations.terms.front().bytes) ==
        Approx(double(four.activations.terms.front().bytes) * (1 + 3.0 / 8)).epsilon(0.01));
  // The bubble: (P-1)/(V M) of the compute; more micro-batches, or virtual stages, shrink it.
  CHECK(term(one, "bubble") < 0);
  CHECK(term(four, "bubble") == Approx(term(four, "compute") * 3.0 / 8.0));
  plan::ModelStatePlan more = at(4, 1, 256);
  CHECK(more.accumulation == 32);
  CHECK(term(more, "bubble") == Approx(term(more, "compute") * 3.0 / 32.0));
  CHECK(term(more, "bubble") / term(more, "compute") < term(four, "bubble") / term(four, "compute"));
  CHECK(term(interleaved, "bubble") == Approx(term(four, "bubble") / 2));
  // The stages send activations point to point, V times a micro-batch interleaved; inside the machine.
  CHECK(term(four, "pipeline p2p") > 0);
  CHECK(term(interleaved, "pipeline p2p") == Approx(2 * term(four, "pipeline p2p")));
  // The slowest stage, the last, computes the LM head beside its blocks: more than an even quarter.
  CHECK(term(four, "compute") > term(one, "compute"));
  CHECK(four.flopsPerStep == Approx(one.flopsPerStep));
}

TEST_CASE("data-parallel collectives across machines run at the network's rate", "[train][plan]") {
  // NOTE [Layouts] in plan/Plan.h: hierarchically, inside each machine at NVLink speed, across at the
  // network's.
  config::Config c = configFile("gpt3-1.3b.yaml", {"zero_optimization.stage=2", "train.micro_batch_size=1",
                                                   "train.global_batch_size=16"});
  plan::PlanOptions options;
  options.ranks = 16;
  options.calibration = plan::h200x8Cluster();
  auto collectives = [&](int perNode, double network) {
    plan::PlanOptions o = options;
    o.ranksPerNode = perNode;
    o.calibration->networkGBs = network;
    plan::ModelStatePlan p = plan::planModelState(c, o);
    for (const plan::StepTerm& t : p.terms)
      if (t.name == "collectives") return std::make_pair(t.seconds, t.detail);
    return std::make_pair(-1.0, std::string());
  };
  auto [oneMachine, oneDetail] = collectives(16, 50);
  auto [two, twoDetail] = collectives(8, 50);
  auto [twoSlow, slowDetail] = collectives(8, 25);
  INFO(twoDetail);
  CHECK(oneDetail.find("network") == std::string::npos);
  CHECK(twoDetail.find("over the network at 50 GB/s a GPU across 2 machines") != std::string::npos);
  CHECK(two > oneMachine);
  // The network's part doubles at half the rate; the NVLink part stays.
  plan::ModelStatePlan p = plan::planModelState(c, options);
  double paramBytes = 0;
  for (int64_t padded : p.inputs.paddedElems) paramBytes += double(padded) * 2;
  double moved = double(p.inputs.gradientBytes) + paramBytes;
  double nvlinkPart = moved * 7.0 / 8.0 / (331e9), networkPart = moved * 0.5 / 8.0 / 50e9;
  CHECK(two == Approx(nvlinkPart + networkPart));
  CHECK(twoSlow == Approx(nvlinkPart + 2 * networkPart));
  // Tensor parallelism 8 fills each machine: its data-parallel groups are one rank a machine, all network.
  config::Config t8 = c;
  t8.parallel.tensor = 8;
  plan::PlanOptions o = options;
  o.ranksPerNode = 8;
  plan::ModelStatePlan tp = plan::planModelState(t8, o);
  for (const plan::StepTerm& t : tp.terms)
    if (t.name == "collectives") CHECK(t.detail.find("one rank a machine: ") == 0);
}

TEST_CASE("parallel: auto takes the fastest layout that fits and that the trainer runs", "[train][plan]") {
  // NOTE [Parallel auto] in plan/Plan.h.
  config::Config c =
      configFile("gpt3-13b.yaml", {"model.seq_length=512", "train.global_batch_size=64", "parallel=auto"});
  CHECK(c.parallel.automatic);
  plan::PlanOptions options;
  options.ranks = 8;
  options.calibration = plan::measuredH200x8();
  plan::LayoutChoice choice = plan::chooseLayout(c, options);
  INFO(plan::formatLayouts(choice.layouts) << choice.why);
  REQUIRE(choice.chosen >= 0);
  const plan::LayoutPlan& chosen = choice.layouts[size_t(choice.chosen)];
  CHECK(chosen.plan.fits);
  // No layout that fits is faster.
  for (const plan::LayoutPlan& l : choice.layouts)
    if (l.invalid.empty() && l.plan.fits) CHECK(chosen.plan.serialSeconds <= l.plan.serialSeconds);
  CHECK(choice.why.find("parallel: auto chose " + chosen.name()) == 0);
  // None fits: it says so.
  config::Config big = configFile("gpt3-175b.yaml", {"parallel=auto"});
  plan::LayoutChoice none = plan::chooseLayout(big, options);
  CHECK(none.chosen < 0);
  CHECK(none.why.find("no layout of 8 ranks fits") != std::string::npos);
}

TEST_CASE("plan: a model whose parameters alone do not fit the GPU plans with parameters homed on the host",
          "[train][plan][homes]") {
  // configs/gpt3-20b-store.yaml (20.2B parameters, bf16 parameters and gradient buffers: 40 GB each) on an
  // 80 GiB GPU: beside the gradient buffers and the activations, the device has room for part of the
  // parameters; the rest are homed in host memory (NOTE [Store placement] in zero/Store.h).
  plan::PlanOptions options = roundMachine();
  options.calibration->deviceMemoryBytes = 80ull << 30;
  std::vector<std::string> overrides = {"zero_optimization.nvme_path=/x"};
  plan::ModelStatePlan p = plan::planModelState(configFile("gpt3-20b-store.yaml", overrides), options);
  INFO(plan::formatPlan(p));
  REQUIRE(p.fits);
  const int device = int(zero::Tier::Device), host = int(zero::Tier::Host);
  REQUIRE(p.placement.parameterHostBytes > 0);
  REQUIRE(p.placement.parameterBytes > 0);
  REQUIRE(p.placement.parameterBytes + p.placement.parameterHostBytes == p.inputs.parameterBytes);
  REQUIRE(p.kindBytes[plan::kParameters][host] == p.placement.parameterHostBytes);
  REQUIRE(p.kindBytes[plan::kParameters][device] == p.placement.parameterBytes);
  // The device's peak counts the parameters left on it, and the arena the homed chunks are copied into.
  REQUIRE(p.devicePeakBytes <= p.usableBytes);
  REQUIRE(p.workspaceBytes == plan::kDeviceWorkspaceBytes + p.inputs.homeGatherBytes);
  REQUIRE(p.inputs.homeGatherBytes > 0);
  // Each homed byte crosses the link twice a micro-batch (forward and backward), at 50 GB/s.
  REQUIRE(term(p, "parameter homes") != nullptr);
  REQUIRE(term(p, "parameter homes")->seconds ==
          Approx(double(p.placement.parameterHostBytes) * 2.0 * double(p.accumulation) / 50e9));
  REQUIRE(plan::formatPlan(p).find("parameter homes") != std::string::npos);
  // The homed chunks' update runs on the CPU alone (the GPU lane writes parameters on the device).
  REQUIRE(term(p, "host update") != nullptr);
  REQUIRE(term(p, "host update")->detail.find("GPU lane") == std::string::npos);
  // Stage 1 does not drive homes: refused as the engine refuses it, naming the keys.
  std::vector<std::string> stage1 = overrides;
  stage1.push_back("zero_optimization.stage=1");
  plan::ModelStatePlan sharded = plan::planModelState(configFile("gpt3-20b-store.yaml", stage1), options);
  REQUIRE(!sharded.fits);
  REQUIRE(sharded.refusal.find("zero_optimization.stage") != std::string::npos);
  REQUIRE(sharded.refusal.find("store.parameter_home") != std::string::npos);
  // Past the host's budget the parameters go to the SSD, with the state there: each byte of them read twice
  // a micro-batch (the staging does not keep it between forward and backward), no faster than the disk.
  std::vector<std::string> ssdHomes = overrides;
  ssdHomes.push_back("store.host_budget_gb=4");
  ssdHomes.push_back("store.nvme_budget_gb=2000");
  plan::ModelStatePlan onSsd = plan::planModelState(configFile("gpt3-20b-store.yaml", ssdHomes), options);
  INFO(plan::formatPlan(onSsd));
  REQUIRE(onSsd.fits);
  const int nvme = int(zero::Tier::Nvme);
  REQUIRE(onSsd.placement.parameterNvmeBytes > 0);
  REQUIRE(onSsd.placement.parameterBytes + onSsd.placement.parameterHostBytes +
              onSsd.placement.parameterNvmeBytes ==
          onSsd.inputs.parameterBytes);
  REQUIRE(onSsd.kindBytes[plan::kParameters][nvme] == onSsd.placement.parameterNvmeBytes);
  REQUIRE(term(onSsd, "parameter homes") != nullptr);
  REQUIRE(term(onSsd, "parameter homes")->detail.find("on the SSD") != std::string::npos);
  REQUIRE(term(onSsd, "parameter homes")->seconds >= double(onSsd.placement.parameterNvmeBytes) * 2.0 *
                                                         double(onSsd.accumulation) /
                                                         (*onSsd.machine.nvmeReadGBs * 1e9));
  REQUIRE(plan::formatPlan(onSsd).find("nvme") != std::string::npos);
  // Parameters kept on the device (store.parameter_home: device) do not fit: refused, naming the key.
  overrides.push_back("store.parameter_home=device");
  plan::ModelStatePlan pinned = plan::planModelState(configFile("gpt3-20b-store.yaml", overrides), options);
  REQUIRE(!pinned.fits);
  REQUIRE(pinned.refusal.find("store.parameter_home") != std::string::npos);
}

TEST_CASE(
    "plan: the fp32 masters go to host memory, split with the GPU where they outgrow it, refused where "
    "neither holds them",
    "[train][plan]") {
  // NOTE [Masters at layout] in plan/PlacementInputs.h.
  const uint64_t GiB = 1ull << 30;
  config::Config c = configFile("gpt3-36b-adafactor.yaml");
  uint64_t device = 139 * GiB, hostTotal = 125 * GiB, hostFree = 124 * GiB;
  uint64_t headroom = plan::hostHeadroomBytes(c, int64_t(c.zero.chunkSizeMb * (1 << 20) / 2), hostTotal);
  auto whole = [](uint64_t n) { return plan::layoutElems(n, 0, 1); };
  // A model whose masters and chunks share the device: every master there.
  plan::MasterLayout small = plan::mastersAtLayout(c, whole(5'000'000'000), device, hostFree, hostTotal, 1);
  CHECK(small.fits);
  CHECK(small.hostBytes == 0);
  // 25B: the masters fit the host's free memory beyond its headroom.
  plan::MasterLayout host = plan::mastersAtLayout(c, whole(25'000'000'000), device, hostFree, hostTotal, 1);
  CHECK(host.fits);
  CHECK(host.hostBytes == host.masters);
  CHECK(host.hostRoom == hostFree - headroom);
  // 35.9B: 133.8 GiB of masters, more than the host's room: the device keeps what it can beside the chunks.
  uint64_t n = 35'928'914'688;
  plan::MasterLayout split = plan::mastersAtLayout(c, whole(n), device, hostFree, hostTotal, 1);
  CHECK(split.fits);
  CHECK(split.masters == n * 4);
  CHECK(split.deviceRoom == plan::usableDeviceBytes(device) - n * 2);
  CHECK(split.hostBytes == split.masters - split.deviceRoom);
  CHECK(split.hostBytes < split.hostRoom);
  // Eight ranks on the host, each making every master (stage 0): its share of the host is too small; at
  // stage 1 each makes an eighth of them, and they fit.
  CHECK(!plan::mastersAtLayout(c, whole(n), device, hostFree, hostTotal, 8).fits);
  CHECK(plan::mastersAtLayout(c, plan::layoutElems(n, 1, 8), device, hostFree, hostTotal, 8).fits);
  // The plan of the shipped config says how they are split.
  plan::PlanOptions options;
  options.calibration = plan::measuredH200();
  plan::ModelStatePlan p = plan::planModelState(c, options);
  INFO(plan::formatPlan(p));
  CHECK(p.fits);
  CHECK(plan::formatPlan(p).find("the fp32 masters (133.85 GiB) outgrow host memory") != std::string::npos);
}
