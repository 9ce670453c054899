#include "strata/interop/HfImport.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "models/ZooHf.h"
#include "models/t5/T5.h"
#include "strata/config/Resolve.h"
#include "strata/ops/Ops.h"
#include "strata/train/Checkpoint.h"

namespace strata::interop {
namespace {

// A config described by `overrides` alone, for a command that reads no data: data.format random keeps the
// byte tokenizer's vocabulary check (config/Config.cpp) off a model that never meets it.
config::Config modelOnlyConfig(std::vector<std::string> overrides, const std::string& origin) {
  overrides.push_back("data.format=random");
  return config::parseConfig("", origin, overrides, /*requireData=*/false);
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
  std::map<std::string, Tensor> weights = train::readSafetensors(weightsPath.string());
  std::map<std::string, std::string> values;
  try {
    values = models::modelConfigFromHf(text.str(), &weights);
  } catch (const Error& e) {
    if (!e.userFacing()) throw;
    STRATA_USER_FAIL("convert --from-hf {}: {}", configPath.string(), e.message());
  }
  std::vector<std::string> overrides;
  for (const auto& [key, value] : values) overrides.push_back(key + "=" + value);
  config::Config c = modelOnlyConfig(overrides, configPath.string());
  HfImportResult result;
  result.weightsPath = weightsPath.string();
  result.spec = config::modelSpecFrom(c, Device::cpu());
  result.modelClass = models::hfModelClass(result.spec);
  std::shared_ptr<nn::Module> model = models::buildModule(result.spec);
  models::importHf(*model, models::hfLayout(result.spec), weights, &result.unused);
  train::CheckpointState state;
  state.config = values;
  state.model = config::effectiveValues(c, "model.");
  // HF's config.json has no training length (GPT-2's n_positions and BERT's max_position_embeddings are the
  // table's rows, model.max_position_embeddings): the run that loads this checkpoint picks its own.
  state.model.erase("model.seq_length");
  state.model.erase("model.decoder_seq_length");
  result.parameters = model->numParameters();
  result.checkpointDir = train::saveCheckpoint(saveDir, model->namedParameters(), {}, state);
  return result;
}

HfExportResult exportHfCheckpoint(const std::string& checkpoint, const std::string& output) {
  namespace fs = std::filesystem;
  std::string dir = train::resolveCheckpoint(checkpoint);
  config::Config c = checkpointConfig(dir);
  bool toFile = output.size() > 12 && output.substr(output.size() - 12) == ".safetensors";
  fs::path file = toFile ? fs::path(output) : fs::path(output) / "model.safetensors";
  models::ModelSpec spec = config::modelSpecFrom(c, Device::cpu());
  HfExportResult result;
  // Everything that can refuse the model runs before a file is written.
  result.modelClass = models::hfModelClass(spec);
  std::string configJson = models::hfConfigJson(spec, c.data.tokenizer == "gpt2" ? 50256 : -1);
  models::HfLayout layout = models::hfLayout(spec);
  if (!file.parent_path().empty()) fs::create_directories(file.parent_path());
  std::map<std::string, std::string> metadata{{"format", "pt"}, {"source", dir}};
  if (models::isRenameOnly(layout)) {
    // Tensor by tensor, renamed: the model is never whole in memory.
    std::map<std::string, std::string> names;
    for (const models::HfTensor& t : layout) names[t.param] = t.hfName;
    auto rename = [&](const std::string& name) {
      auto it = names.find(name);
      STRATA_USER_CHECK(it != names.end(), "{}: tensor '{}' has no {} counterpart", dir, name,
                        result.modelClass);
      return it->second;
    };
    train::MergeStats stats = train::mergeModelShards(dir, file.string(), rename, metadata);
    result.tensors = stats.tensors;
    result.bytes = stats.bytes;
    result.peakBufferBytes = stats.peakBufferBytes;
  } else {
    // HF splits or transposes some parameters: build the model, then cut its tensors HF's way.
    std::shared_ptr<nn::Module> model = models::buildModule(spec);
    auto weights = train::loadModelShards(dir);
    for (auto& [name, p] : model->namedParameters()) {
      auto it = weights.find(name);
      STRATA_USER_CHECK(it != weights.end(), "checkpoint {} has no tensor '{}'", dir, name);
      ops::copy(p, it->second);
    }
    auto tensors = models::exportHf(*model, layout);
    for (const auto& [name, t] : tensors) result.bytes += t.nbytes();
    result.tensors = tensors.size();
    train::writeSafetensors(file.string(), tensors, metadata);
  }
  fs::path configPath = file.parent_path() / "config.json";
  std::ofstream(configPath) << configJson;
  STRATA_USER_CHECK(fs::exists(configPath), "cannot write {}", configPath.string());
  result.weightsPath = file.string();
  result.configPath = configPath.string();
  if (file.filename() != "model.safetensors")
    result.notes.push_back(
        "from_pretrained looks for model.safetensors, so rename the weights or convert to a directory");
  if (spec.arch == "t5" && spec.moeNumExperts == 0) {
    models::T5Config t = models::t5Config(spec);
    if (t.tieWordEmbeddings != t.scaleDecoderOutputs)
      result.notes.push_back(detail::format(
          "a {} head with {} decoder output is read right by transformers 5 and later only (4.x scales "
          "exactly when the head is tied)",
          t.tieWordEmbeddings ? "tied" : "untied", t.scaleDecoderOutputs ? "a scaled" : "an unscaled"));
  }
  return result;
}

config::Config checkpointConfig(const std::string& dir) {
  std::vector<std::string> overrides;
  for (auto& [key, value] : train::readCheckpointState(dir).config) overrides.push_back(key + "=" + value);
  return modelOnlyConfig(overrides, dir + "/manifest.json");
}

}  // namespace strata::interop
