// Any zoo architecture's side of a parity check against another implementation (tools/hf_parity_zoo.py runs
// it against HF transformers): it builds the config's model and objective as `strata train` does, optionally
// loads a checkpoint's weights (`strata convert --from-hf` writes one from an HF model), and writes
//   --trace OUT.safetensors: one fp32 forward and backward on training micro-batch 0 (data/BatchTrace.h):
//       the model inputs by HF argument names ("input_ids", "labels"; BERT with the NSP head,
//       model.bert_binary_head, adds BertForPreTraining's "token_type_ids" and "next_sentence_label"), the
//       logits ("logits"; BERT with the NSP head: "prediction_logits" [B, S, vocab] and
//       "seq_relationship_logits" [B, 2] instead), "loss" (with the NSP head the MLM cross-entropy plus the
//       NSP one, as BertForPreTraining's loss) and "grad.<HF name>" of every parameter;
//   --inputs OUT.safetensors --batches N: the model inputs of training micro-batches 0 .. N-1, as
//       "<HF argument>.<i>": what `strata train` with the same config trains on at steps 1 .. N (one rank,
//       no gradient accumulation), so a reference can train on the same corrupted batches.
//   --compute bf16: the trace (or curve) in bf16, the model's parameters cast to it as training computes,
//       on the CPU too (strata train computes bf16 configs in fp32 there).
//   --curve OUT.json --steps N [--lr LR --warmup W]: N training steps on micro-batches 0 .. N-1, the losses
//       as a JSON list, through a plain loop: fp32 masters, torch's AdamW (decay on tensors of 2 or more
//       dims; the config's betas, eps, decay and clipping), a linear warm-up over W steps to LR. It is what
//       hf_parity_zoo.py's HF side computes, in the same order. With --engine the same steps go through
//       train::ZeroStepEngine (one rank), the engine of strata train: the two curves separate the model's
//       numerics from the engine's. --fp32-norms (plain loop only): the LayerNorms' parameters stay fp32.
// Usage: zoo_parity --config C [--set k=v]... [--load CHECKPOINT] [--trace F] [--compute fp32|bf16]
//                   [--inputs F --batches N] [--curve F --steps N --lr LR --warmup W [--engine |
//                   --fp32-norms]]
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "models/ZooHf.h"
#include "strata/config/Config.h"
#include "strata/data/BatchTrace.h"
#include "strata/nn/Norm.h"
#include "strata/strata.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/StepEngine.h"
#include "strata/train/Trainer.h"

using namespace strata;

namespace {

// On the host on purpose (a reference, not a fast path): every step moves the gradients and weights once.
std::vector<double> referenceCurve(train::Trainer& trainer, DType compute, int64_t steps, double lr,
                                   int64_t warmup, bool fp32Norms) {
  const config::Config& c = trainer.config();
  nn::Module& model = trainer.model();
  model.train();
  // The masters start from the fp32 weights, before the cast rounds the model's copy.
  std::vector<std::vector<float>> master, m, v;
  for (auto& [name, p] : model.namedParameters()) {
    master.push_back(p.to(Device::cpu(), DType::F32).contiguous().toVector<float>());
    m.emplace_back(master.back().size(), 0.0f);
    v.emplace_back(master.back().size(), 0.0f);
  }
  model.castParameters(compute);
  // The norms' parameters back in fp32 (the norm kernels read fp32 parameters beside 16-bit activations), as
  // HF's autocast computes its LayerNorms.
  if (fp32Norms)
    for (auto& [name, m] : model.namedModules())
      if (dynamic_cast<nn::LayerNorm*>(m) != nullptr) m->castParameters(DType::F32);
  auto params = model.namedParameters();
  double b1 = c.optimizer.betas[0], b2 = c.optimizer.betas[1];
  std::vector<double> losses;
  for (int64_t step = 0; step < steps; ++step) {
    model.zeroGrad();
    Tensor loss = trainer.objective().loss(trainer.batch(data::Split::Train, step), compute);
    backward(loss);
    losses.push_back(loss.item());
    std::vector<std::vector<float>> grads;
    double norm2 = 0;
    for (auto& [name, p] : params) {
      grads.push_back(p.grad().to(Device::cpu(), DType::F32).contiguous().toVector<float>());
      for (float g : grads.back()) norm2 += double(g) * double(g);
    }
    // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
    double clip =
        c.optimizer.clipGrad > 0 ? std::min(1.0, c.optimizer.clipGrad / (std::sqrt(norm2) + 1e-6)) : 1.0;
    double rate = lr * std::min(1.0, double(step + 1) / double(std::max<int64_t>(warmup, 1)));
    double bc1 = 1 - std::pow(b1, double(step + 1)), bc2 = 1 - std::pow(b2, double(step + 1));
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor& p = params[i].second;
      double decay = p.dim() >= 2 ? c.optimizer.weightDecay : 0.0;
      for (size_t j = 0; j < master[i].size(); ++j) {
        double g = double(grads[i][j]) * clip;
        double w = double(master[i][j]) * (1 - rate * decay);
        m[i][j] = float(b1 * m[i][j] + (1 - b1) * g);
        v[i][j] = float(b2 * v[i][j] + (1 - b2) * g * g);
        double denom = std::sqrt(double(v[i][j])) / std::sqrt(bc2) + c.optimizer.eps;
        master[i][j] = float(w - rate / bc1 * double(m[i][j]) / denom);
      }
      ops::copy(p, Tensor::fromVector<float>(master[i], p.shape(), Device::cpu()).to(p.device(), p.dtype()));
    }
  }
  return losses;
}

// The same steps through ZeroStepEngine: the chunks, fp32 masters and AdamW of `strata train`.
std::vector<double> engineCurve(train::Trainer& trainer, DType compute, int64_t steps, double lr,
                                int64_t warmup) {
  trainer.model().train();
  train::ZeroStepEngine engine(trainer.objective(), trainer.config(), trainer.device(), compute);
  std::vector<double> losses;
  for (int64_t step = 0; step < steps; ++step) {
    double rate = lr * std::min(1.0, double(step + 1) / double(std::max<int64_t>(warmup, 1)));
    train::StepOutcome outcome =
        engine.step([&] { return trainer.batch(data::Split::Train, step); }, 1, rate);
    losses.push_back(outcome.loss);
  }
  return losses;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config, load, tracePath, inputsPath, curvePath, computeName = "fp32";
  std::vector<std::string> overrides;
  int64_t batches = 0, steps = 0, warmup = 10;
  bool useEngine = false, fp32Norms = false;
  double lr = 1e-3;
  // Every option but the two flags takes a value. A missing one (the end of the line, or the next option
  // where the value should be) is an error, not an empty path that writes nothing.
  const std::map<std::string, std::function<void(const std::string&)>> options = {
      {"--config", [&](const std::string& v) { config = v; }},
      {"--set", [&](const std::string& v) { overrides.push_back(v); }},
      {"--load", [&](const std::string& v) { load = v; }},
      {"--trace", [&](const std::string& v) { tracePath = v; }},
      {"--inputs", [&](const std::string& v) { inputsPath = v; }},
      {"--compute", [&](const std::string& v) { computeName = v; }},
      {"--curve", [&](const std::string& v) { curvePath = v; }},
      {"--steps", [&](const std::string& v) { steps = std::stoll(v); }},
      {"--lr", [&](const std::string& v) { lr = std::stod(v); }},
      {"--warmup", [&](const std::string& v) { warmup = std::stoll(v); }},
      {"--batches", [&](const std::string& v) { batches = std::stoll(v); }}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--engine" || a == "--fp32-norms") {
      (a == "--engine" ? useEngine : fp32Norms) = true;
      continue;
    }
    auto option = options.find(a);
    if (option == options.end()) {
      std::fprintf(stderr, "zoo_parity: unknown argument %s\n", a.c_str());
      return 2;
    }
    if (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0) {
      std::fprintf(stderr, "zoo_parity: %s needs a value\n", a.c_str());
      return 2;
    }
    try {
      option->second(argv[++i]);
    } catch (const std::logic_error&) {  // std::stoll, std::stod
      std::fprintf(stderr, "zoo_parity: %s takes a number, got '%s'\n", a.c_str(), argv[i]);
      return 2;
    }
  }
  try {
    STRATA_USER_CHECK(!config.empty(), "zoo_parity: --config is required");
    STRATA_USER_CHECK(computeName == "fp32" || computeName == "bf16",
                      "zoo_parity: --compute is fp32 or bf16, got {}", computeName);
    DType compute = computeName == "bf16" ? DType::BF16 : DType::F32;
    if (!load.empty()) {
      // The trainer checks that the checkpoint holds this config's model; the weights are copied below.
      overrides.push_back("checkpoint.load=" + load);
      overrides.push_back("checkpoint.load_model_only=true");
    }
    config::Config c = config::loadConfig(config, overrides);
    train::Trainer trainer(c);
    nn::Module& model = trainer.model();
    if (!load.empty()) {
      std::string dir = train::resolveCheckpoint(load);
      auto weights = train::loadModelShards(dir);
      for (auto& [name, p] : model.namedParameters()) {
        auto it = weights.find(name);
        STRATA_USER_CHECK(it != weights.end(), "checkpoint {} has no tensor '{}'", dir, name);
        ops::copy(p, it->second);
      }
    }
    if (!inputsPath.empty()) {
      STRATA_USER_CHECK(batches > 0, "zoo_parity: --inputs needs --batches N");
      train::NamedTensors all;
      for (int64_t i = 0; i < batches; ++i)
        for (auto& [name, t] : trainer.objective().modelInputs(trainer.batch(data::Split::Train, i)))
          all.emplace_back(name + "." + std::to_string(i), t.to(Device::cpu()));
      train::writeSafetensors(inputsPath, all);
      std::printf("wrote the model inputs of %ld training micro-batches to %s\n", long(batches),
                  inputsPath.c_str());
    }
    if (!tracePath.empty()) {
      model.train();  // as training runs it (the parity configs set dropout 0)
      model.castParameters(compute);
      models::HfLayout layout = models::hfLayout(config::modelSpecFrom(trainer.config(), trainer.device()));
      data::BatchTrace trace =
          data::traceBatch(trainer.objective(), trainer.batch(data::Split::Train, 0), compute, layout);
      train::writeSafetensors(tracePath, trace.all());
      std::printf("loss %.6f\n", trace.loss.item());
    }
    if (!curvePath.empty()) {
      STRATA_USER_CHECK(steps > 0 && tracePath.empty(),
                        "zoo_parity: --curve needs --steps N (and no --trace)");
      std::vector<double> losses = useEngine ? engineCurve(trainer, compute, steps, lr, warmup)
                                             : referenceCurve(trainer, compute, steps, lr, warmup, fp32Norms);
      std::ofstream out(curvePath);
      out << "[";
      for (size_t i = 0; i < losses.size(); ++i) out << (i ? ", " : "") << fmt::format("{:.6f}", losses[i]);
      out << "]\n";
      std::printf("wrote %zu losses to %s (last %.4f)\n", losses.size(), curvePath.c_str(), losses.back());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
