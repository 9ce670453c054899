// HF import and export (interop/HfImport.h): every zoo architecture round-trips through an HF directory,
// including vocabularies smaller than the byte tokenizer's 256 (HF's tiny test models have 99 tokens); HF
// directories as transformers 4.x and 5.x write them (tests/interop/hf_fixtures: their config.json and the
// names and shapes of their tensors, written by tools/hf_fixtures.py; the weights are random here) import
// into the model they describe and export back key by key; a config.json key the zoo cannot build is refused
// by name; an imported checkpoint trains at lengths of its own.
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "TestUtil.h"
#include "models/ZooHf.h"
#include "strata/data/MaskedLmObjective.h"
#include "strata/interop/HfImport.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Trainer.h"

using namespace strata;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

models::ModelSpec smallVocabSpec(const std::string& arch) {
  return test::tinyZooSpec(arch, 99, 8);
}

const fs::path kFixtures = fs::path(STRATA_SOURCE_DIR) / "tests" / "interop" / "hf_fixtures";

json readJson(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return json::parse(in);
}

// The HF directory the fixture `name` ("transformers-5/t5-v1_1") describes, in `dir`: its config.json with
// `edit` applied, and model.safetensors with a random tensor of each name and shape transformers wrote; a
// vocabulary of `vocab` rows instead of the fixture's 99 when `vocab` > 0.
fs::path hfDirectory(const std::string& name, const fs::path& dir,
                     const std::function<void(json&)>& edit = {}, int64_t vocab = 0) {
  json config = readJson(kFixtures / name / "config.json");
  int64_t fixtureVocab = config.at("vocab_size").get<int64_t>();
  if (vocab > 0) config["vocab_size"] = vocab;
  if (edit) edit(config);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2) << "\n";
  Generator gen(uint64_t(std::hash<std::string>()(name)));
  train::NamedTensors tensors;
  json listing = readJson(kFixtures / name / "tensors.json");
  for (auto& [tensorName, entry] : listing.items()) {
    REQUIRE(entry.at("dtype") == "F32");
    Shape shape = entry.at("shape").get<std::vector<int64_t>>();
    for (auto& size : shape)
      if (vocab > 0 && size == fixtureVocab) size = vocab;
    tensors.emplace_back(tensorName, ops::randn(shape, gen, DType::F32, Device::cpu(), 0.0, 0.5));
  }
  train::writeSafetensors((dir / "model.safetensors").string(), tensors);
  return dir;
}

// What each fixture must import as.
struct Expected {
  std::string fixture, modelClass;
  std::map<std::string, std::string> keys;  // model.* values of the checkpoint's config
};

std::vector<Expected> expectations() {
  std::map<std::string, std::string> gpt2 = {{"model.arch", "gpt"},
                                             {"model.num_layers", "2"},
                                             {"model.hidden_size", "24"},
                                             {"model.num_attention_heads", "3"},
                                             {"model.max_position_embeddings", "40"},
                                             {"model.layer_norm_eps", "1e-05"}};
  std::map<std::string, std::string> bert = {{"model.arch", "bert"},
                                             {"model.max_position_embeddings", "40"},
                                             {"model.pad_token_id", "0"},
                                             {"model.activation", "gelu"},
                                             {"model.num_tokentypes", "2"},
                                             {"model.layer_norm_eps", "1e-12"},
                                             {"model.bert_binary_head", "false"}};
  std::map<std::string, std::string> bertNsp = {{"model.arch", "bert"},
                                                {"model.max_position_embeddings", "48"},
                                                {"model.pad_token_id", "95"},
                                                {"model.activation", "gelu_tanh"},
                                                {"model.num_tokentypes", "3"},
                                                {"model.layer_norm_eps", "1e-07"},
                                                {"model.bert_binary_head", "true"}};
  std::map<std::string, std::string> t5 = {{"model.arch", "t5"},
                                           {"model.num_layers", "2"},
                                           {"model.decoder_num_layers", "1"},
                                           {"model.num_attention_heads", "3"},
                                           {"model.kv_channels", "6"},
                                           {"model.relative_attention_num_buckets", "8"},
                                           {"model.relative_attention_max_distance", "20"},
                                           {"model.layer_norm_eps", "1e-06"}};
  auto with = [](std::map<std::string, std::string> base, std::map<std::string, std::string> more) {
    for (auto& [k, v] : more) base[k] = v;
    return base;
  };
  auto head = [&](const char* activation, bool untied, bool scaled) {
    return with(t5, {{"model.activation", activation},
                     {"model.untie_embeddings_and_output_weights", untied ? "true" : "false"},
                     {"model.scale_decoder_outputs", scaled ? "true" : "false"}});
  };
  std::vector<Expected> out;
  for (std::string v : {"transformers-4/", "transformers-5/"}) {
    out.push_back({v + "gpt2", "GPT2LMHeadModel", gpt2});
    out.push_back({v + "bert", "BertForMaskedLM", bert});
    out.push_back({v + "bert-nsp", "BertForPreTraining", bertNsp});
    out.push_back({v + "t5-v1_0", "T5ForConditionalGeneration", head("relu", false, true)});
  }
  // v1.1: 4.x writes a head of its own, 5.x ties it; neither scales.
  out.push_back({"transformers-4/t5-v1_1", "T5ForConditionalGeneration", head("gated_gelu", true, false)});
  out.push_back({"transformers-5/t5-v1_1", "T5ForConditionalGeneration", head("gated_gelu", false, false)});
  // A 4.x v1.1 checkpoint saved again by 5.x: tie_word_embeddings true, and an lm_head.weight of its own.
  out.push_back(
      {"transformers-5/t5-v1_1-untied", "T5ForConditionalGeneration", head("gated_gelu", true, false)});
  return out;
}

// A config.json value as HF reads it: the file's, or HF's default where the file leaves the key out (T5's
// scale_decoder_outputs, which 4.x does not write, is its tie_word_embeddings).
json hfValue(const json& config, const std::string& key) {
  if (config.contains(key)) return config[key];
  if (key == "n_inner") return nullptr;
  if (key == "tie_word_embeddings") return true;
  if (key == "scale_decoder_outputs") return hfValue(config, "tie_word_embeddings");
  return json();
}

// Collects the log lines spdlog writes while it lives.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string text() const {
    std::string all;
    for (const auto& line : sink_->last_formatted()) all += line;
    return all;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

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

      interop::HfImportResult r = interop::importHfCheckpoint(hf.string(), save.string());
      REQUIRE(r.spec.vocabSize == 99);
      REQUIRE(r.parameters == model->numParameters());
      // The checkpoint holds the HF weights bit for bit, and its config describes the model again.
      std::map<std::string, Tensor> saved = train::loadModelShards(r.checkpointDir);
      for (auto& [name, p] : model->namedParameters()) {
        REQUIRE(saved.count(name) == 1);
        REQUIRE(saved.at(name).toVector<float>() == p.contiguous().toVector<float>());
      }
      config::Config c = interop::checkpointConfig(r.checkpointDir);
      REQUIRE(c.model.vocabSize == 99);
      REQUIRE(c.model.arch == arch);
      // Generating with the byte tokenizer would read ids past the vocabulary: refused, naming both sizes.
      std::string e = test::errorOf([&] {
        auto objective = data::makeObjective(c, Device::cpu());
        objective->generate("ab", {2, 0, 1, 1}, DType::F32);
      });
      REQUIRE(e.find("256") != std::string::npos);
      REQUIRE(e.find("vocab_size") != std::string::npos);
    }
  }
}

TEST_CASE(
    "HF checkpoints as transformers 4.x and 5.x write them import as the model they describe and export "
    "back key by key",
    "[train][hf]") {
  for (const Expected& expected : expectations()) {
    DYNAMIC_SECTION(expected.fixture) {
      std::string tag =
          expected.fixture.substr(expected.fixture.find('/') + 1) + expected.fixture.substr(13, 1);
      fs::path work = test::freshDir("strata-hf-fixture-" + tag);
      fs::path hf = hfDirectory(expected.fixture, work / "hf");
      interop::HfImportResult r = interop::importHfCheckpoint(hf.string(), (work / "ckpt").string());
      REQUIRE(r.modelClass == expected.modelClass);
      // The model the config.json describes, key by key.
      config::Config c = interop::checkpointConfig(r.checkpointDir);
      std::map<std::string, std::string> values = config::effectiveValues(c, "model.");
      for (const auto& [key, value] : expected.keys) {
        INFO(key);
        REQUIRE(config::sameConfigValue(values.at(key), value));
      }

      // Exported with --hf: the tensors transformers wrote, bit for bit, and no other.
      interop::HfExportResult out = interop::exportHfCheckpoint(r.checkpointDir, (work / "back").string());
      REQUIRE(out.modelClass == expected.modelClass);
      std::map<std::string, Tensor> original = train::readSafetensors((hf / "model.safetensors").string());
      std::map<std::string, Tensor> exported = train::readSafetensors(out.weightsPath);
      std::vector<std::string> originalNames, exportedNames;
      for (auto& [name, t] : original) originalNames.push_back(name);
      for (auto& [name, t] : exported) exportedNames.push_back(name);
      REQUIRE(exportedNames == originalNames);
      for (auto& [name, t] : original) {
        INFO(name);
        REQUIRE(exported.at(name).shape() == t.shape());
        REQUIRE(exported.at(name).toVector<float>() == t.toVector<float>());
      }
      // The config.json: every key both files have holds one value (the versions' own bookkeeping and GPT-2's
      // <|endoftext|> ids, which a byte-level export leaves unset, aside), and every key that changes the
      // computation is there with HF's reading of the original. T5's tying is the exception: 5.x writes
      // tie_word_embeddings true for every head and unties by the weights, Strata false for a head of its
      // own, which 4.x and 5.x both read as untied.
      json a = readJson(hf / "config.json"), b = readJson(out.configPath);
      if (r.spec.arch == "t5")
        REQUIRE(b.at("tie_word_embeddings") == (original.count("lm_head.weight") == 0));
      for (auto& [key, value] : a.items()) {
        if (!b.contains(key) || key == "transformers_version" || key == "dtype" || key == "torch_dtype" ||
            key == "bos_token_id" || key == "eos_token_id" ||
            (r.spec.arch == "t5" && key == "tie_word_embeddings"))
          continue;
        INFO(key << ": " << value.dump() << " written by transformers, " << b[key].dump() << " by Strata");
        REQUIRE(b[key] == value);
      }
      std::map<std::string, std::vector<std::string>> computation = {
          {"gpt",
           {"n_layer", "n_embd", "n_head", "n_positions", "vocab_size", "activation_function",
            "layer_norm_epsilon", "scale_attn_weights", "tie_word_embeddings"}},
          {"bert",
           {"num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
            "hidden_act", "type_vocab_size", "pad_token_id", "max_position_embeddings", "layer_norm_eps",
            "architectures"}},
          {"t5",
           {"num_layers", "num_decoder_layers", "d_model", "d_kv", "num_heads", "d_ff", "vocab_size",
            "feed_forward_proj", "relative_attention_num_buckets", "relative_attention_max_distance",
            "layer_norm_epsilon", "scale_decoder_outputs"}}};
      for (const std::string& key : computation.at(r.spec.arch)) {
        INFO(key);
        REQUIRE(b.contains(key));
        REQUIRE(b[key] == hfValue(a, key));
      }
      // And it imports again as the same model.
      interop::HfImportResult again =
          interop::importHfCheckpoint((work / "back").string(), (work / "again").string());
      REQUIRE(config::effectiveValues(interop::checkpointConfig(again.checkpointDir), "model.") == values);
    }
  }
}

TEST_CASE("convert --from-hf refuses, by name, a config.json key whose value the zoo cannot build",
          "[train][hf]") {
  struct Case {
    std::string fixture, key;
    json value;
    std::string says;  // besides the key
  };
  std::vector<Case> cases = {
      {"transformers-5/gpt2", "activation_function", "gelu", "tanh GELU"},
      {"transformers-5/gpt2", "scale_attn_by_inverse_layer_idx", true, "1/(layer + 1)"},
      {"transformers-5/gpt2", "scale_attn_weights", false, "1/sqrt(head dim)"},
      {"transformers-5/gpt2", "add_cross_attention", true, "cross-attention"},
      {"transformers-5/gpt2", "tie_word_embeddings", false, "ties its head"},
      {"transformers-5/gpt2", "attn_pdrop", 0.2, "one rate"},
      {"transformers-5/gpt2", "n_layer", "two", "not a number"},
      {"transformers-5/bert", "hidden_act", "silu", "gelu, gelu_new"},
      {"transformers-4/bert", "position_embedding_type", "relative_key", "absolute"},
      {"transformers-5/bert", "is_decoder", true, "encoder"},
      {"transformers-5/bert", "tie_word_embeddings", false, "ties its MLM decoder"},
      {"transformers-5/bert", "pad_token_id", nullptr, "[PAD]"},
      {"transformers-5/bert", "hidden_dropout_prob", 0.3, "one rate"},
      {"transformers-5/t5-v1_1", "feed_forward_proj", "gated-silu", "gated-gelu (v1.1)"},
      {"transformers-5/t5-v1_1", "dense_act_fn", "relu", "contradicts feed_forward_proj"},
      {"transformers-4/t5-v1_0", "is_gated_act", true, "contradicts feed_forward_proj"},
      {"transformers-4/t5-v1_0", "decoder_start_token_id", 2, "starts the decoder with [PAD]"},
      {"transformers-5/t5-v1_1", "d_kv", "six", "not a number"},
      // A v1.1 head of its own with a config.json that ties it, written by 4.x: 4.x and 5.x build two
      // different models from it.
      {"transformers-4/t5-v1_1", "tie_word_embeddings", true, "lm_head.weight"},
  };
  for (const Case& c : cases) {
    INFO(c.fixture << ": " << c.key << " = " << c.value.dump());
    fs::path work = test::freshDir("strata-hf-refused");
    fs::path hf = hfDirectory(c.fixture, work / "hf", [&](json& j) { j[c.key] = c.value; });
    std::string e =
        test::errorOf([&] { interop::importHfCheckpoint(hf.string(), (work / "ckpt").string()); });
    INFO(e);
    REQUIRE(e.find("'" + c.key + "'") != std::string::npos);
    REQUIRE(e.find(c.says) != std::string::npos);
    REQUIRE(e.find(".cpp") == std::string::npos);  // a user error: no source location
    REQUIRE(!fs::exists(work / "ckpt"));
  }
  // HF's defaults, not Strata's, where the file leaves a key out: BERT's LayerNorm epsilon is 1e-12.
  fs::path work = test::freshDir("strata-hf-defaults");
  fs::path hf = hfDirectory("transformers-5/bert", work / "hf", [](json& j) {
    j.erase("layer_norm_eps");
    j.erase("pad_token_id");
  });
  config::Config c = interop::checkpointConfig(
      interop::importHfCheckpoint(hf.string(), (work / "ckpt").string()).checkpointDir);
  REQUIRE(c.model.layerNormEps == 1e-12);
  REQUIRE(c.model.padTokenId == 0);
}

TEST_CASE(
    "an imported checkpoint fine-tunes at lengths of its own: seq_length, decoder_seq_length and the "
    "position table are separate",
    "[train][hf]") {
  auto zoo = [](const std::string& name, const fs::path& out, const std::string& checkpoint,
                std::vector<std::string> sets) {
    std::vector<std::string> all = {"train.device=cpu",
                                    "train.out_dir=" + out.string(),
                                    "checkpoint.save=",
                                    "checkpoint.load=" + checkpoint,
                                    "checkpoint.load_model_only=true",
                                    "train.micro_batch_size=2",
                                    "train.train_iters=2",
                                    "train.eval_interval=0",
                                    "train.sample_length=0",
                                    "lr_schedule.warmup_iters=0"};
    // The model section as the imported checkpoint's config has it: what a user's YAML copies.
    for (auto& [key, value] : interop::checkpointConfig(checkpoint).values)
      if (key.rfind("model.", 0) == 0 && key != "model.seq_length") all.push_back(key + "=" + value);
    all.insert(all.end(), sets.begin(), sets.end());
    return config::loadConfig(std::string(STRATA_SOURCE_DIR) + "/configs/zoo/" + name + ".yaml", all);
  };
  SECTION("t5: transformers 5.x writes no n_positions, and HF has no decoder length") {
    fs::path work = test::freshDir("strata-hf-lengths-t5");
    fs::path hf = hfDirectory("transformers-5/t5-v1_1", work / "hf", {}, 384);
    std::string ckpt = interop::importHfCheckpoint(hf.string(), (work / "ckpt").string()).checkpointDir;
    // The manifest's model section records no training length, so none is a changed setting.
    train::CheckpointState state = train::readCheckpointState(ckpt);
    REQUIRE(state.model.count("model.seq_length") == 0);
    REQUIRE(state.model.count("model.decoder_seq_length") == 0);
    LogCapture log;
    train::Trainer t(
        zoo("t5-mini", work / "run", ckpt, {"model.seq_length=48", "model.decoder_seq_length=12"}));
    REQUIRE(log.text().find("changed setting") == std::string::npos);
    REQUIRE(t.run().steps == 2);
  }
  SECTION("bert: 40 positions, trained at 16") {
    fs::path work = test::freshDir("strata-hf-lengths-bert");
    fs::path hf = hfDirectory("transformers-5/bert", work / "hf", {}, 260);
    std::string ckpt = interop::importHfCheckpoint(hf.string(), (work / "ckpt").string()).checkpointDir;
    LogCapture log;
    train::Trainer t(zoo("bert-mini", work / "run", ckpt, {"model.seq_length=16"}));
    REQUIRE(log.text().find("changed setting") == std::string::npos);
    REQUIRE(t.run().steps == 2);
    // [PAD] is the checkpoint's pad_token_id (HF's default 0), not vocab_size - 4.
    auto& objective = dynamic_cast<data::MaskedLmObjective&>(t.objective());
    REQUIRE(objective.specialTokens().pad == 0);
    REQUIRE(objective.specialTokens().cls == 257);
    // A table of another size is another model: refused, naming the key.
    std::string e = test::errorOf(
        [&] { train::Trainer(zoo("bert-mini", work / "other", ckpt, {"model.max_position_embeddings=0"})); });
    REQUIRE(e.find("model.max_position_embeddings: 40 in the checkpoint, 128 in this config") !=
            std::string::npos);
  }
}

TEST_CASE("convert --hf of a GPT with experts says that HF has no such model and what to use instead",
          "[train][hf][moe]") {
  fs::path work = test::freshDir("strata-hf-gpt-moe");
  config::Config c = config::loadConfig(std::string(STRATA_SOURCE_DIR) + "/configs/zoo/gpt-moe-nano.yaml",
                                        {"model.num_layers=2", "model.hidden_size=32", "model.seq_length=16"},
                                        /*requireData=*/false);
  models::ModelSpec spec = config::modelSpecFrom(c, Device::cpu());
  REQUIRE(spec.moeNumExperts > 0);
  auto model = models::buildModule(spec);
  train::CheckpointState state;
  for (auto& [key, value] : c.values)
    if (key.rfind("model.", 0) == 0) state.config[key] = value;
  state.config["data.format"] = "random";
  state.model = config::effectiveValues(c, "model.");
  std::string ckpt = train::saveCheckpoint((work / "ckpt").string(), model->namedParameters(), {}, state);
  std::string e = test::errorOf([&] { interop::exportHfCheckpoint(ckpt, (work / "hf").string()); });
  INFO(e);
  REQUIRE(e.find("no HF transformers architecture") != std::string::npos);
  REQUIRE(e.find("strata convert CHECKPOINT OUT.safetensors") != std::string::npos);
  REQUIRE(e.find(".cpp") == std::string::npos);
  REQUIRE(!fs::exists(work / "hf" / "config.json"));
  // The merge it names works.
  train::MergeStats stats = train::mergeModelShards(ckpt, (work / "moe.safetensors").string());
  REQUIRE(stats.tensors == model->namedParameters().size());
}
