#include "strata/train/Trainer.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "models/Zoo.h"
#include "strata/autograd/Engine.h"
#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"
#include "strata/core/Philox.h"
#include "strata/core/Profiler.h"
#include "strata/ops/Ops.h"
#include "strata/optim/LossScaler.h"
#include "strata/optim/LrSchedule.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Metrics.h"

namespace strata::train {

namespace fs = std::filesystem;

Device resolveDevice(const std::string& name) {
  if (name == "auto") return cudaAvailable() ? Device::cuda(0) : Device::cpu();
  Device d = Device::parse(name);
  if (d.isCuda()) {
    STRATA_CHECK(builtWithCuda(), "train.device is '{}' but this build of Strata has no CUDA support", name);
    STRATA_CHECK(d.index < cudaDeviceCount(), "train.device is '{}' but {} CUDA device(s) are visible", name,
                 cudaDeviceCount());
  }
  return d;
}

models::ModelSpec modelSpecFrom(const Config& c, Device device) {
  models::ModelSpec s;
  s.arch = c.model.arch;
  s.numLayers = c.model.numLayers;
  s.hiddenSize = c.model.hiddenSize;
  s.numHeads = c.model.numAttentionHeads;
  s.ffnHiddenSize = c.model.ffnHiddenSize;
  s.seqLength = c.model.seqLength;
  s.vocabSize = c.model.vocabSize;
  s.dropout = c.model.dropout;
  s.layerNormEps = c.model.layerNormEps;
  s.initStd = c.model.initStd;
  s.bias = c.model.bias;
  s.seed = c.train.seed;
  s.device = device;
  return s;
}

namespace {

// Dense bf16 peak for MFU, by device name; 0 when unknown (MFU is then reported as 0).
double peakFlops(Device d, DType compute) {
  if (d.isCpu()) return 0;
  std::string name = deviceName(d);
  bool hopper = name.find("H100") != std::string::npos || name.find("H200") != std::string::npos;
  if (!hopper) return 0;
  return compute == DType::F32 ? 67e12 : 989e12;
}

double gib(size_t bytes) {
  return double(bytes) / double(1u << 30);
}

}  // namespace

Trainer::Trainer(Config config) : config_(std::move(config)) {
  device_ = resolveDevice(config_.train.device);
  model_ = models::buildModel(modelSpecFrom(config_, device_));
  setup();
}

Trainer::Trainer(Config config, std::shared_ptr<nn::CausalLM> model)
    : config_(std::move(config)), model_(std::move(model)) {
  device_ = resolveDevice(config_.train.device);
  STRATA_CHECK(model_ != nullptr, "Trainer: no model given");
  setup();
}

void Trainer::setup() {
  for (auto& [name, p] : model_->namedParameters())
    STRATA_CHECK(p.device() == device_, "parameter '{}' is on {} but train.device is {}", name,
                 toString(p.device()), toString(device_));
  const std::string& dt = config_.precision.dtype;
  if (dt == "fp16")
    compute_ = DType::F16;
  else if (dt == "bf16" && device_.isCuda())
    compute_ = DType::BF16;
  else
    compute_ = DType::F32;
  STRATA_CHECK(
      config_.zero.stage == 0 && config_.zero.offloadParamDevice == "none" &&
          config_.zero.offloadOptimizerDevice == "none",
      "{}: zero_optimization (stage {}, offload) is not available in this build yet; set stage 0 and no "
      "offload",
      config_.sourcePath, config_.zero.stage);
  tokenizer_ = makeTokenizer(config_);
  std::string cacheDir = (fs::path(config_.train.outDir) / "cache").string();
  if (config_.data.format == "random") {
    // 16M tokens: enough distinct windows for any benchmark length; drawn from the run's seed.
    data_ = std::make_unique<TokenDataset>(TokenDataset::random(
        model_->vocabSize(), int64_t(1) << 24, uint64_t(config_.train.seed), config_.data.valFraction));
  } else {
    data_ = std::make_unique<TokenDataset>(TokenDataset::open(
        config_.data.path, config_.data.format, *tokenizer_, cacheDir, config_.data.valFraction));
  }
  int64_t maxToken = data_->maxToken();
  STRATA_CHECK(maxToken < model_->vocabSize(), "{} holds token id {} but model.vocab_size is {}",
               config_.data.path, maxToken, model_->vocabSize());
}

double Trainer::evaluate(int64_t iters) {
  NoGradGuard noGrad;
  model_->eval();
  int64_t B = config_.train.microBatchSize, T = model_->contextLength();
  Tensor total = ops::zeros({}, DType::F32, device_);
  for (int64_t i = 0; i < iters; ++i) {
    auto [x, y] = data_->batch(Split::Val, i, B, T, config_.train.seed, device_);
    total = ops::add(total, ops::to(model_->loss(x, y, compute_), device_, DType::F32));
  }
  model_->train();
  return total.item() / double(iters);
}

std::string sampleText(nn::CausalLM& model, const Tokenizer& tokenizer, Device device, DType compute,
                       const std::string& prompt, int64_t length, double temperature, int64_t topK,
                       uint64_t seed) {
  NoGradGuard noGrad;
  bool wasTraining = model.isTraining();
  model.eval();
  std::vector<int32_t> ids = tokenizer.encode(prompt.empty() ? std::string("\n") : prompt);
  size_t promptLen = ids.size();
  int64_t V = model.vocabSize(), ctx = model.contextLength();
  for (int64_t step = 0; step < length; ++step) {
    size_t start = ids.size() > size_t(ctx) ? ids.size() - size_t(ctx) : 0;
    std::vector<int64_t> window(ids.begin() + std::ptrdiff_t(start), ids.end());
    Tensor x = Tensor::fromVector(window, {1, int64_t(window.size())}, device);
    Tensor logits = model.logits(x, compute);
    std::vector<float> last =
        logits.select(1, logits.size(1) - 1).to(Device::cpu(), DType::F32).toVector<float>();
    // Temperature, top-k, then a Philox draw.
    std::vector<std::pair<float, int32_t>> scored;
    for (int64_t v = 0; v < V; ++v)
      scored.emplace_back(last[size_t(v)] / float(std::max(temperature, 1e-6)), int32_t(v));
    std::sort(scored.begin(), scored.end(), [](auto& a, auto& b) { return a.first > b.first; });
    if (topK > 0 && topK < V) scored.resize(size_t(topK));
    double mx = scored[0].first, z = 0;
    for (auto& s : scored) z += std::exp(double(s.first) - mx);
    double u = double(philoxUniform(seed, uint64_t(step))) * z, acc = 0;
    int32_t next = scored.back().second;
    for (auto& s : scored) {
      acc += std::exp(double(s.first) - mx);
      if (acc >= u) {
        next = s.second;
        break;
      }
    }
    ids.push_back(next);
  }
  model.train(wasTraining);
  return tokenizer.decode(std::vector<int32_t>(ids.begin() + std::ptrdiff_t(promptLen), ids.end()));
}

std::unique_ptr<Tokenizer> makeTokenizer(const Config& config) {
  if (config.data.tokenizer == "gpt2")
    return std::make_unique<Gpt2Tokenizer>(config.data.vocabFile, config.data.mergesFile);
  return std::make_unique<ByteTokenizer>();
}

std::string Trainer::sample(const std::string& prompt, int64_t length, double temperature, int64_t topK,
                            uint64_t seed) {
  return sampleText(*model_, *tokenizer_, device_, compute_, prompt, length, temperature, topK, seed);
}

TrainResult Trainer::run() {
  const auto& c = config_;
  int64_t B = c.train.microBatchSize, T = model_->contextLength();
  int64_t accum = c.train.globalBatchSize / c.train.microBatchSize;
  STRATA_CHECK(T <= c.model.seqLength || c.model.arch != "gpt", "sequence length mismatch");

  optim::AdamW optimizer(model_->namedParameters(),
                         optim::AdamWConfig{c.optimizer.lr, c.optimizer.betas[0], c.optimizer.betas[1],
                                            c.optimizer.eps, c.optimizer.weightDecay});
  optim::LrSchedule schedule{optim::lrStyleFromName(c.lrSchedule.style), c.optimizer.lr, c.optimizer.minLr,
                             c.lrSchedule.warmupIters,
                             c.lrSchedule.decayIters > 0 ? c.lrSchedule.decayIters : c.train.trainIters};
  std::vector<Tensor> params = model_->parameters();
  if (compute_ != DType::F32) keepComputeCopies(params, c.precision.weightCopies);

  int64_t startStep = 0, dataIndex = 0;
  defaultGenerator().manualSeed(c.train.seed);
  if (!c.checkpoint.load.empty()) {
    CheckpointState st = loadCheckpoint(c.checkpoint.load, model_->namedParameters(), optimizer.namedState());
    startStep = st.step;
    dataIndex = st.dataIndex;
    optimizer.setStepCount(st.optimizerSteps);
    defaultGenerator().setState(st.rng);
    spdlog::info("resumed from {} at iteration {}", resolveCheckpoint(c.checkpoint.load), startStep);
  }
  std::string saveDir = c.checkpoint.save;
  if (saveDir.empty() && c.checkpoint.saveInterval > 0)
    saveDir = (fs::path(c.train.outDir) / "checkpoints").string();
  auto save = [&](int64_t step) {
    CheckpointState st;
    st.step = step;
    st.optimizerSteps = optimizer.stepCount();
    st.rng = defaultGenerator().state();
    st.dataIndex = dataIndex;
    st.config = c.values;
    std::string dir = saveCheckpoint(saveDir, model_->namedParameters(), optimizer.namedState(), st);
    spdlog::info("saved checkpoint {}", dir);
  };

  MetricsLogger logger(c.train.outDir);
  spdlog::info("training {} ({} parameters) on {} ({}) in {}: {} iterations of {} sequences x {} tokens",
               c.model.arch, model_->numParameters(), toString(device_), deviceName(device_),
               dtypeName(compute_), c.train.trainIters, c.train.globalBatchSize, T);

  std::unique_ptr<optim::LossScaler> scaler;
  if (compute_ == DType::F16)
    scaler = std::make_unique<optim::LossScaler>(optim::LossScalerConfig{
        c.precision.initialLossScale, c.precision.lossScaleWindow, c.precision.minLossScale});

  TrainResult result;
  result.valLoss = NAN;
  model_->train();
  Tensor lossSum = ops::zeros({}, DType::F32, device_);
  Tensor lastNorm;
  int64_t intervalSteps = 0;
  auto intervalStart = std::chrono::steady_clock::now();
  double flopsPerToken = model_->flopsPerToken(), peak = peakFlops(device_, compute_);
  // STRATA_PROFILE=1: profile a few steps after warm-up and print where the time went (core/Profiler.h).
  const char* profileEnv = std::getenv("STRATA_PROFILE");
  int64_t profileFrom = profileEnv && std::string(profileEnv) != "0" ? startStep + 3 : -1;
  int64_t profileSteps = std::max<int64_t>(1, std::min<int64_t>(5, c.train.trainIters - profileFrom));
  for (int64_t iter = startStep; iter < c.train.trainIters; ++iter) {
    if (iter == profileFrom) profiler::start(device_);
    double lr = schedule.at(iter);
    for (int64_t micro = 0; micro < accum; ++micro) {
      auto [x, y] = data_->batch(Split::Train, dataIndex++, B, T, c.train.seed, device_);
      profiler::mark("data");
      Tensor loss = model_->loss(x, y, compute_);
      Tensor scaled = accum > 1 ? loss * (1.0 / double(accum)) : loss;
      // fp16: scale the loss so small gradients stay representable; the update unscales them.
      backward(scaler ? scaled * scaler->scale() : scaled);
      NoGradGuard noGrad;
      lossSum = ops::add(lossSum, ops::to(scaled.detach(), device_, DType::F32));
      profiler::mark("loss bookkeeping");
    }
    {
      NoGradGuard noGrad;
      lastNorm = optim::gradNorm(params, device_);
      profiler::mark("grad norm");
      if (scaler) {
        // The overflow decision needs the norm on the host: one sync per step, fp16 only.
        double scale = scaler->scale();
        double scaledNorm = lastNorm.item();
        lastNorm = ops::affine(lastNorm, 1.0 / scale, 0.0);
        if (scaler->update(scaledNorm)) {
          // Unscale and clip in one factor handed to the fused update.
          double coef = 1.0 / scale;
          double norm = scaledNorm / scale;
          if (c.optimizer.clipGrad > 0 && norm > c.optimizer.clipGrad)
            coef *= c.optimizer.clipGrad / (norm + 1e-6);
          optimizer.step(lr, ops::full({}, coef, DType::F32, device_));
        } else {
          spdlog::warn(
              "iteration {}: gradient overflow at loss scale {:.0f}; step skipped, loss scale now {:.0f}",
              iter + 1, scale, scaler->scale());
        }
      } else {
        Tensor coef =
            c.optimizer.clipGrad > 0 ? optim::clipCoefficient(lastNorm, c.optimizer.clipGrad) : Tensor();
        optimizer.step(lr, coef);
      }
      profiler::mark("optimizer step");
      optimizer.zeroGrad();
      profiler::mark("zero grad");
    }
    if (profileFrom >= 0 && iter + 1 == profileFrom + profileSteps) {
      spdlog::info(
          "profile of {} steps (STRATA_PROFILE; each op synchronised, so the total exceeds a step):\n{}",
          profileSteps, profiler::stop());
    }
    ++intervalSteps;
    int64_t done = iter + 1;
    bool exiting = c.train.exitInterval > 0 && done % c.train.exitInterval == 0 && done < c.train.trainIters;
    bool last = done == c.train.trainIters || exiting;
    if (done % c.train.logInterval == 0 || last) {
      TrainRecord r;
      r.step = done;
      r.totalSteps = c.train.trainIters;
      r.loss = lossSum.item() / double(intervalSteps);  // syncs the device: the timing below covers all work
      r.gradNorm = lastNorm.item();
      r.lr = lr;
      r.lossScale = scaler ? scaler->scale() : 1.0;
      double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - intervalStart).count();
      r.msPerIter = 1000.0 * seconds / double(intervalSteps);
      r.tokensPerSec = double(intervalSteps * c.train.globalBatchSize * T) / seconds;
      r.tflops = r.tokensPerSec * flopsPerToken / 1e12;
      r.mfu = peak > 0 ? r.tflops * 1e12 / peak : 0.0;
      if (device_.isCuda()) {
        AllocatorStats gpu = deviceAllocator(device_).stats();
        r.memoryGb["gpu"] = gib(gpu.allocatedBytes);
        r.memoryGb["gpu_peak"] = gib(gpu.peakAllocatedBytes);
      }
      r.memoryGb["host"] = gib(cpuAllocator().stats().allocatedBytes);
      logger.train(r);
      result.trainLoss = r.loss;
      result.last = r;
      lossSum = ops::zeros({}, DType::F32, device_);
      intervalSteps = 0;
      intervalStart = std::chrono::steady_clock::now();
    }
    if (c.train.evalInterval > 0 && (done % c.train.evalInterval == 0 || last)) {
      result.valLoss = evaluate(c.train.evalIters);
      logger.eval(done, result.valLoss);
      intervalStart = std::chrono::steady_clock::now();  // evaluation time is not training time
    }
    if (!saveDir.empty() &&
        ((c.checkpoint.saveInterval > 0 && done % c.checkpoint.saveInterval == 0) || last)) {
      save(done);
      intervalStart = std::chrono::steady_clock::now();
    }
    result.steps = done;
    if (exiting) {
      spdlog::info("stopping at iteration {} (train.exit_interval {})", done, c.train.exitInterval);
      break;
    }
  }
  if (c.train.sampleLength > 0) {
    result.sample = sample(c.train.samplePrompt, c.train.sampleLength, 0.8, 40, c.train.seed);
    spdlog::info("sample:\n{}{}", c.train.samplePrompt, result.sample);
  }
  return result;
}

}  // namespace strata::train
