// One GPT forward and backward in fp32 for the PyTorch/HF parity check (tools/hf_parity.py).
//   gpt_parity --config C --tokens F --batch B --seq T [--import HF.safetensors] [--export HF.safetensors]
//              [--dump OUT.safetensors] [--device cuda]
// tokens: raw int64 [B, T + 1]. The dump holds "logits" [B, T, V], "loss" [], and every parameter's gradient
// under its HF name ("grad.<hf name>").
#include <cstdio>
#include <fstream>
#include <string>

#include "models/Zoo.h"
#include "models/gpt/GptHf.h"
#include "strata/config/Config.h"
#include "strata/strata.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Trainer.h"

using namespace strata;

int main(int argc, char** argv) {
  std::string config, tokens, importPath, exportPath, dumpPath, device = "auto";
  int64_t B = 2, T = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--config")
      config = v;
    else if (a == "--tokens")
      tokens = v;
    else if (a == "--import")
      importPath = v;
    else if (a == "--export")
      exportPath = v;
    else if (a == "--dump")
      dumpPath = v;
    else if (a == "--device")
      device = v;
    else if (a == "--batch")
      B = std::stoll(v);
    else if (a == "--seq")
      T = std::stoll(v);
  }
  try {
    config::Config c = config::loadConfig(config, {}, false);
    Device dev = config::resolveDevice(device);
    models::ModelSpec spec = config::modelSpecFrom(c, dev);
    auto model = models::buildModel(spec);
    model->eval();
    if (!importPath.empty()) {
      auto loaded = train::readSafetensors(importPath, dev);
      for (auto& [name, p] : model->namedParameters()) {
        auto it = loaded.find(models::gptNameToHf(name));
        STRATA_CHECK(it != loaded.end(), "{} has no '{}'", importPath, models::gptNameToHf(name));
        ops::copy(p, it->second);
      }
    }
    if (!exportPath.empty()) {
      train::NamedTensors hf;
      for (auto& [name, p] : model->namedParameters()) hf.emplace_back(models::gptNameToHf(name), p);
      train::writeSafetensors(exportPath, hf, {{"format", "pt"}});
    }
    if (tokens.empty()) return 0;
    std::vector<int64_t> ids(size_t(B * (T + 1)));
    std::ifstream in(tokens, std::ios::binary);
    in.read(reinterpret_cast<char*>(ids.data()), std::streamsize(ids.size() * 8));
    STRATA_CHECK(in.good(), "cannot read {} int64 tokens from {}", ids.size(), tokens);
    Tensor all = Tensor::fromVector(ids, {B, T + 1}, dev);
    Tensor x = all.narrow(1, 0, T).contiguous(), y = all.narrow(1, 1, T).contiguous();
    Tensor logits = model->logits(x, DType::F32);
    Tensor loss = crossEntropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
    backward(loss);
    train::NamedTensors dump{{"logits", logits.detach()}, {"loss", loss.detach()}};
    for (auto& [name, p] : model->namedParameters())
      dump.emplace_back("grad." + models::gptNameToHf(name), p.grad());
    train::writeSafetensors(dumpPath, dump);
    std::printf("loss %.6f\n", loss.item());
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
