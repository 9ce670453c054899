#include "strata/train/HfImport.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "models/ZooHf.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Trainer.h"

namespace strata::train {
namespace {

// A config described by `overrides` alone, for a command that reads no data: data.format random keeps the
// byte tokenizer's vocabulary check (Config.cpp) off a model that never meets it.
Config modelOnlyConfig(std::vector<std::string> overrides, const std::string& origin) {
  overrides.push_back("data.format=random");
  return parseConfig("", origin, overrides, /*requireData=*/false);
}

}  // namespace

HfImportResult importHfCheckpoint(const std::string& hfPath, const std::string& saveDir) {
  namespace fs = std::filesystem;
  fs::path configPath = fs::path(hfPath) / "config.json",
           weightsPath = fs::path(hfPath) / "model.safetensors";
  if (fs::is_regular_file(hfPath) && fs::path(hfPath).extension() == ".safetensors") {
    weightsPath = hfPath;
    configPath = fs::path(hfPath).parent_path() / "config.json";
  }
  STRATA_USER_CHECK(fs::is_regular_file(configPath), "convert --from-hf: no {}", configPath.string());
  STRATA_USER_CHECK(fs::is_regular_file(weightsPath),
                    "convert --from-hf: no {} (sharded or .bin checkpoints: save them with "
                    "save_pretrained(safe_serialization=True, max_shard_size=\"100GB\") first)",
                    weightsPath.string());
  std::ifstream in(configPath);
  std::stringstream text;
  text << in.rdbuf();
  std::map<std::string, std::string> values = models::modelConfigFromHf(text.str());
  std::vector<std::string> overrides;
  for (const auto& [key, value] : values) overrides.push_back(key + "=" + value);
  Config c = modelOnlyConfig(overrides, configPath.string());
  HfImportResult result;
  result.weightsPath = weightsPath.string();
  result.spec = modelSpecFrom(c, Device::cpu());
  std::shared_ptr<nn::Module> model = models::buildModule(result.spec);
  models::importHf(*model, models::hfLayout(result.spec), readSafetensors(weightsPath.string()),
                   &result.unused);
  CheckpointState state;
  state.config = values;
  state.model = effectiveValues(c, "model.");
  result.parameters = model->numParameters();
  result.checkpointDir = saveCheckpoint(saveDir, model->namedParameters(), {}, state);
  return result;
}

Config checkpointConfig(const std::string& dir) {
  std::vector<std::string> overrides;
  for (auto& [key, value] : readCheckpointState(dir).config) overrides.push_back(key + "=" + value);
  return modelOnlyConfig(overrides, dir + "/manifest.json");
}

}  // namespace strata::train
