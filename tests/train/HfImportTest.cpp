// HF import (train/HfImport.h): every zoo architecture round-trips through an HF directory, including
// vocabularies smaller than the byte tokenizer's 256 (HF's tiny test models have 99 tokens).
#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "models/ZooHf.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/HfImport.h"
#include "strata/train/Trainer.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

models::ModelSpec smallVocabSpec(const std::string& arch) {
  models::ModelSpec s;
  s.arch = arch;
  s.numLayers = 1;
  s.hiddenSize = 16;
  s.numHeads = 2;
  s.ffnHiddenSize = 32;
  s.seqLength = 16;
  s.vocabSize = 99;
  s.bias = arch != "t5";
  s.kvChannels = arch == "t5" ? 8 : 0;
  s.decoderSeqLength = arch == "t5" ? 8 : 0;
  return s;
}

}  // namespace

TEST_CASE("convert --from-hf takes vocabularies smaller than the byte tokenizer's", "[train][hf]") {
  for (const std::string arch : {"gpt", "bert", "t5"}) {
    DYNAMIC_SECTION(arch) {
      models::ModelSpec spec = smallVocabSpec(arch);
      std::shared_ptr<nn::Module> model = models::buildModule(spec);
      fs::path hf = test::freshDir("strata-hf-import-" + arch), save = hf / "ckpt";
      train::writeSafetensors((hf / "model.safetensors").string(),
                              models::exportHf(*model, models::hfLayout(spec)));
      std::ofstream(hf / "config.json") << models::hfConfigJson(spec);

      train::HfImportResult r = train::importHfCheckpoint(hf.string(), save.string());
      REQUIRE(r.spec.vocabSize == 99);
      REQUIRE(r.parameters == model->numParameters());
      // The checkpoint holds the HF weights bit for bit, and its config describes the model again.
      std::map<std::string, Tensor> saved = train::loadModelShards(r.checkpointDir);
      for (auto& [name, p] : model->namedParameters()) {
        REQUIRE(saved.count(name) == 1);
        REQUIRE(saved.at(name).toVector<float>() == p.contiguous().toVector<float>());
      }
      train::Config c = train::checkpointConfig(r.checkpointDir);
      REQUIRE(c.model.vocabSize == 99);
      REQUIRE(c.model.arch == arch);
      // Generating with the byte tokenizer would read ids past the vocabulary: refused, naming both sizes.
      std::string e = test::errorOf([&] {
        auto objective = train::makeObjective(c, Device::cpu());
        objective->generate("ab", {2, 0, 1, 1}, DType::F32);
      });
      REQUIRE(e.find("256") != std::string::npos);
      REQUIRE(e.find("vocab_size") != std::string::npos);
    }
  }
}
