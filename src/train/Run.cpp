#include "strata/train/Run.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "models/Zoo.h"
#include "strata/core/Error.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Metrics.h"

namespace strata::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The settings that describe how this start loads, never taken from the checkpoint.
bool describesTheStart(const std::string& key) {
  return key == "checkpoint.load" || key == "checkpoint.load_model_only" || key == "checkpoint.resume" ||
         key == "checkpoint.allow_changes";
}

// Settings of this launch rather than of the run: where model state lives and how this machine runs it
// (none changes what a step computes: the ZeRO stage, the chunks, the tiers, the pipelined update and
// recomputation give the same numbers). A resume takes them from the command or its defaults, never from the
// checkpoint, so a run resumes at another world size or on another machine as that machine needs. PowerSGD's
// keys (dist.powersgd_*) change the step's numbers: they belong to the run.
bool isLaunchSetting(const std::string& key) {
  if (key.rfind("dist.powersgd_", 0) == 0) return false;
  for (const char* prefix : {"zero_optimization.", "dist."})
    if (key.rfind(prefix, 0) == 0) return true;
  for (const char* k :
       {"train.device", "train.threads", "train.recompute", "store.gpu_budget_gb", "store.host_budget_gb",
        "store.nvme_budget_gb", "store.arena", "store.parameter_home", "store.gradient_home",
        "optimizer.pipeline", "optimizer.pipeline_piece_mb", "model.moe_expert_parallel_size"})
    if (key == k) return true;
  return false;
}

// Settings of the run's course that a resume may change: how long it runs, how often it logs, evaluates and
// saves, where its output goes, and the training lengths (a model trained at 128 tokens goes on at 512).
bool isCourseSetting(const std::string& key) {
  for (const char* k :
       {"train.train_iters", "train.exit_interval", "train.log_interval", "train.eval_interval",
        "train.eval_iters", "train.sample_length", "train.sample_prompt", "train.out_dir",
        "train.max_nonfinite_steps", "model.init_std", "model.seq_length", "model.decoder_seq_length",
        "checkpoint.save", "checkpoint.save_interval", "checkpoint.keep_last"})
    if (key == k) return true;
  return false;
}

// The files' bytes are the same (the same data under another path, on another machine).
bool sameFileContents(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (!fs::is_regular_file(a, ec) || !fs::is_regular_file(b, ec) ||
      fs::file_size(a, ec) != fs::file_size(b, ec))
    return false;
  std::ifstream x(a, std::ios::binary), y(b, std::ios::binary);
  std::vector<char> bx(1 << 20), by(1 << 20);
  while (x && y) {
    x.read(bx.data(), std::streamsize(bx.size()));
    y.read(by.data(), std::streamsize(by.size()));
    if (x.gcount() != y.gcount() || std::memcmp(bx.data(), by.data(), size_t(x.gcount())) != 0) return false;
  }
  return x.eof() && y.eof();
}

bool sameSetting(const std::string& key, const std::string& a, const std::string& b) {
  if (config::sameConfigValue(a, b)) return true;
  bool dataFile = key == "data.path" || key == "data.vocab_file" || key == "data.merges_file";
  bool directory = key == "train.out_dir" || key == "checkpoint.save";
  if ((!dataFile && !directory) || a.empty() || b.empty()) return false;
  std::error_code ec1, ec2;
  fs::path x = fs::weakly_canonical(a, ec1), y = fs::weakly_canonical(b, ec2);
  if (!ec1 && !ec2 && x == y) return true;
  return dataFile && sameFileContents(a, b);
}

// A value for a message: numbers in their shortest form (0.1, not 0.10000000000000001), '' for nothing.
std::string shown(const std::string& value) {
  if (value.empty()) return "''";
  char* end = nullptr;
  double number = std::strtod(value.c_str(), &end);
  if (end && *end == '\0' && value.find_first_of("0123456789") != std::string::npos)
    return fmt::format("{}", number);
  return value;
}

// step-<N>, nothing else.
bool isStepDirectoryName(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return false;
  return std::all_of(name.begin() + 5, name.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

std::string runName(const std::string& id) {
  return id.empty() ? "a run of unknown id (files from before runs had ids)" : "run " + id;
}

// "metrics.jsonl, 2 event files, checkpoints step-3, step-6"
std::string describeFiles(const RunFiles& files) {
  std::string metrics;
  int events = 0;
  for (const auto& p : files.paths) {
    std::string name = fs::path(p).filename().string();
    if (name == "metrics.jsonl") metrics = p;
    if (name.rfind("events.out.tfevents", 0) == 0) ++events;
  }
  std::vector<std::string> parts;
  if (!metrics.empty()) parts.push_back(metrics);
  if (events > 0)
    parts.push_back(detail::format("{} TensorBoard event file{}", events, events == 1 ? "" : "s"));
  if (!files.checkpoints.empty()) {
    std::vector<std::pair<int64_t, std::string>> steps;
    for (const auto& c : files.checkpoints) {
      std::string name = fs::path(c).filename().string();
      steps.emplace_back(std::stoll(name.substr(5)), name);
    }
    std::sort(steps.begin(), steps.end());
    std::string list;
    for (const auto& [step, name] : steps) list += (list.empty() ? "" : ", ") + name;
    parts.push_back(detail::format("checkpoint{} {} in {}", steps.size() == 1 ? "" : "s", list,
                                   fs::path(files.checkpoints.front()).parent_path().string()));
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

// Removes run `files.runId`'s records from metrics.jsonl (the file, and the chart drawn from it, when none
// is left), its event files and its step directories, and `latest` when it named one of them.
void removeRunFiles(const RunFiles& files) {
  for (const auto& p : files.paths) {
    fs::path path(p);
    if (path.filename() == "metrics.jsonl") {
      std::string kept, line;
      {
        std::ifstream in(path);
        while (std::getline(in, line)) {
          json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
          std::string id = record.is_object() ? record.value("run_id", std::string()) : std::string();
          if (id != files.runId) kept += line + "\n";
        }
      }
      if (kept.empty()) {
        fs::remove(path);
        fs::remove(path.parent_path() / "loss.svg");
      } else {
        std::string tmp = p + ".tmp";
        {
          std::ofstream out(tmp, std::ios::trunc);
          out << kept;
          out.flush();
          STRATA_USER_CHECK(out.good(), "cannot write {}", tmp);
        }
        fs::rename(tmp, path);
      }
    } else if (std::find(files.checkpoints.begin(), files.checkpoints.end(), p) != files.checkpoints.end()) {
      fs::path latest = path.parent_path() / "latest";
      std::string named;
      if (fs::exists(latest)) std::getline(std::ifstream(latest), named);
      fs::remove_all(path);
      if (named == path.filename().string()) fs::remove(latest);
    } else {
      fs::remove(path);
    }
  }
}

// The config a resume of `saved` (the checkpoint `dir`) trains with: NOTE [Resume is a property of the run].
config::Config resumeConfig(const config::Config& given, const CheckpointState& saved, const std::string& dir,
                            std::vector<std::string>& notes) {
  // Checkpoints older than the effective settings recorded the keys their run set, as YAML text, and the
  // model section: the given config stays, and is checked against those.
  bool legacy = saved.effective.empty();
  std::map<std::string, std::string> recorded = legacy ? saved.config : saved.effective;
  if (legacy)
    for (const auto& [key, value] : saved.model) recorded.emplace(key, value);
  std::map<std::string, std::string> now = legacy ? given.values : config::effectiveValues(given);
  std::map<std::string, std::string> merged = recorded;
  // Compared by meaning (defaults spelt out), merged as written.
  std::map<std::string, std::string> recordedMeaning = recorded, nowMeaning = now;
  if (!legacy) {
    spellOutModelDefaults(recordedMeaning);
    spellOutModelDefaults(nowMeaning);
  }
  std::vector<std::string> refused, changed;
  // This launch's settings are the command's, given or not.
  for (const auto& [key, value] : now)
    if (isLaunchSetting(key)) merged[key] = value;
  for (const auto& [key, text] : given.values) {
    if (describesTheStart(key)) continue;
    auto it = recorded.find(key);
    const std::string& value = now[key];
    if (it == recorded.end()) {
      merged[key] = value;  // a key the checkpoint does not know
      continue;
    }
    if (sameSetting(key, recordedMeaning[key], nowMeaning[key])) continue;
    std::string line =
        detail::format("{}: {} in the checkpoint, {} now", key, shown(it->second), shown(value));
    if (mayChangeOnResume(key) || given.checkpoint.allowChanges) {
      merged[key] = value;
      changed.push_back(line);
    } else {
      refused.push_back(line);
    }
  }
  std::string list;
  for (const auto& line : refused) list += "\n  " + line;
  STRATA_USER_CHECK(
      refused.empty(),
      "resuming {} with settings that differ from the run's:{}\nA resume takes the run's settings from its "
      "checkpoint: drop these from the command line (or set them back in {}); or resume with them anyway, "
      "--set checkpoint.allow_changes=true; or start a new run from the checkpoint's weights, --set "
      "checkpoint.load_model_only=true. Settings that may change on resume: docs/checkpoints.md.",
      dir, list, given.sourcePath.empty() ? std::string("the config") : given.sourcePath);
  for (const auto& line : changed) notes.push_back("resuming with a changed setting: " + line);
  if (legacy) return given;
  merged["checkpoint.load"] = given.checkpoint.load;
  merged["checkpoint.load_model_only"] = "false";
  merged["checkpoint.resume"] = given.checkpoint.resume ? "true" : "false";
  merged["checkpoint.allow_changes"] = given.checkpoint.allowChanges ? "true" : "false";
  config::Config config = config::configFromValues(merged, dir + "/manifest.json");
  config.sourcePath = given.sourcePath;
  config.checkpoint.overwrite = given.checkpoint.overwrite;
  return config;
}

}  // namespace

void spellOutModelDefaults(std::map<std::string, std::string>& values) {
  std::map<std::string, std::string>* m = &values;
  auto ffn = m->find("model.ffn_hidden_size");
  auto hidden = m->find("model.hidden_size");
  if (ffn != m->end() && hidden != m->end() && config::sameConfigValue(ffn->second, "0"))
    ffn->second = std::to_string(4 * std::stoll(hidden->second));
  auto decoder = m->find("model.decoder_seq_length");
  auto seq = m->find("model.seq_length");
  if (decoder != m->end() && seq != m->end() && config::sameConfigValue(decoder->second, "0"))
    decoder->second = std::to_string(std::max<int64_t>(1, std::stoll(seq->second) / 4));
  auto activation = m->find("model.activation");
  auto arch = m->find("model.arch");
  if (activation != m->end() && arch != m->end()) {
    models::ModelSpec spec;
    spec.arch = arch->second;
    spec.activation = activation->second;
    activation->second = models::activationName(spec);
  }
  // What HF checkpoints carry (models::ModelSpec): max_position_embeddings 0, or absent in a checkpoint
  // from before the key, is seq_length's table (gpt, bert); pad_token_id -1 is vocab_size - 4 (bert); T5's
  // scale_decoder_outputs default follows the head's tying. A section without seq_length (`convert
  // --from-hf` records no training length) keeps its table size as written.
  if (arch != m->end() && arch->second != "t5" && seq != m->end()) {
    std::string& positions = (*m)["model.max_position_embeddings"];
    if (positions.empty() || config::sameConfigValue(positions, "0")) positions = seq->second;
  }
  auto pad = m->find("model.pad_token_id"), vocab = m->find("model.vocab_size");
  if (arch != m->end() && arch->second == "bert" && pad != m->end() && vocab != m->end() &&
      config::sameConfigValue(pad->second, "-1"))
    pad->second = std::to_string(std::stoll(vocab->second) - 4);
  auto untie = m->find("model.untie_embeddings_and_output_weights");
  if (arch != m->end() && arch->second == "t5" && untie != m->end()) {
    std::string& scale = (*m)["model.scale_decoder_outputs"];
    if (scale.empty() || scale == "default") scale = untie->second == "true" ? "false" : "true";
  }
}

std::string newRunId() {
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &utc);
  std::random_device device;
  uint32_t bits = device();
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "%08x", bits);
  return std::string(stamp) + "-" + suffix;
}

std::string saveDirectoryOf(const config::Config& config) {
  if (!config.checkpoint.save.empty()) return config.checkpoint.save;
  if (config.checkpoint.saveInterval > 0) return (fs::path(config.train.outDir) / "checkpoints").string();
  return "";
}

std::vector<std::string> resumeChangeableKeys() {
  std::vector<std::string> keys;
  for (const auto& key : config::configKeys())
    if (mayChangeOnResume(key)) keys.push_back(key);
  return keys;
}

bool mayChangeOnResume(const std::string& key) {
  return describesTheStart(key) || isLaunchSetting(key) || isCourseSetting(key);
}

RunStart planRunStart(const config::Config& config) {
  RunStart start;
  config::Config c = config;
  if (c.checkpoint.load == "latest") {
    c.checkpoint.resume = true;
    c.checkpoint.load.clear();
  }
  start.resumeRequested = c.checkpoint.resume;
  if (c.checkpoint.resume) {
    std::string saveDir = saveDirectoryOf(c);
    STRATA_USER_CHECK(
        !saveDir.empty(),
        "{}: --resume (checkpoint.resume) continues from the save directory's latest checkpoint, "
        "but this config saves none: set checkpoint.save, or checkpoint.save_interval (which "
        "saves under <train.out_dir>/checkpoints)",
        c.sourcePath.empty() ? std::string("the config") : c.sourcePath);
    if (fs::exists(fs::path(saveDir) / "latest")) {
      std::string dir = resolveCheckpoint(saveDir);
      if (!c.checkpoint.load.empty() && !sameSetting("checkpoint.save", c.checkpoint.load, dir))
        start.notes.push_back(detail::format("checkpoint.load {} is not used: resuming the run in {}",
                                             c.checkpoint.load, saveDir));
      c.checkpoint.load = dir;
      c.checkpoint.loadModelOnly = false;
    } else {
      start.notes.push_back(detail::format(
          "no checkpoint in {} yet: starting the run{}", saveDir,
          c.checkpoint.load.empty() ? std::string() : " from checkpoint.load " + c.checkpoint.load));
    }
  }
  if (c.checkpoint.load.empty() || c.checkpoint.loadModelOnly) {
    start.config = c;
    return start;
  }
  std::string dir = resolveCheckpoint(c.checkpoint.load);
  CheckpointState saved = readCheckpointState(dir);
  start.checkpoint = dir;
  start.step = saved.step;
  start.runId = saved.runId;
  start.config = resumeConfig(c, saved, dir, start.notes);
  return start;
}

std::vector<RunFiles> runFilesIn(const std::string& outDir, const std::string& saveDir) {
  std::map<std::string, RunFiles> byRun;
  auto add = [&](const std::string& id, const std::string& path) {
    RunFiles& files = byRun[id];
    files.runId = id;
    files.paths.push_back(path);
  };
  std::error_code ec;
  if (!outDir.empty() && fs::is_directory(outDir, ec)) {
    fs::path metrics = fs::path(outDir) / "metrics.jsonl";
    if (fs::is_regular_file(metrics, ec)) {
      std::set<std::string> ids;
      std::ifstream in(metrics);
      std::string line;
      while (std::getline(in, line)) {
        json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (record.is_object()) ids.insert(record.value("run_id", std::string()));
      }
      for (const auto& id : ids) add(id, metrics.string());
    }
    for (const auto& entry : fs::directory_iterator(outDir, ec)) {
      std::string name = entry.path().filename().string();
      if (name.rfind("events.out.tfevents.", 0) == 0 && entry.is_regular_file())
        add(eventFileRunId(name), entry.path().string());
    }
  }
  if (!saveDir.empty() && fs::is_directory(saveDir, ec)) {
    for (const auto& entry : fs::directory_iterator(saveDir, ec)) {
      std::string name = entry.path().filename().string();
      fs::path manifest = entry.path() / "manifest.json";
      if (!entry.is_directory() || !isStepDirectoryName(name) || !fs::exists(manifest)) continue;
      std::string id;
      try {
        json m = json::parse(std::ifstream(manifest));
        if (m.is_object()) id = m.value("run_id", std::string());
      } catch (const std::exception&) {
        // A corrupted manifest still marks a checkpoint of some run.
      }
      add(id, entry.path().string());
      byRun[id].checkpoints.push_back(entry.path().string());
    }
  }
  std::vector<RunFiles> out;
  for (auto& [id, files] : byRun) out.push_back(std::move(files));
  return out;
}

std::vector<std::string> claimRunDirectories(const RunStart& start, const std::string& runId) {
  const config::Config& c = start.config;
  std::string saveDir = saveDirectoryOf(c);
  bool resuming = !start.checkpoint.empty();
  bool legacyIsOwn = resuming && start.runId.empty();
  std::vector<RunFiles> others;
  for (auto& files : runFilesIn(c.train.outDir, saveDir))
    if (files.runId != runId && !(legacyIsOwn && files.runId.empty())) others.push_back(std::move(files));
  std::vector<std::string> removed;
  auto removeAll = [&](const std::vector<RunFiles>& runs) {
    for (const auto& files : runs) {
      removeRunFiles(files);
      removed.push_back(runName(files.runId) + ": " + describeFiles(files));
    }
  };
  if (others.empty()) return removed;
  if (c.checkpoint.overwrite) {
    removeAll(others);
    return removed;
  }
  bool anyCheckpoints = std::any_of(others.begin(), others.end(),
                                    [](const RunFiles& files) { return !files.checkpoints.empty(); });
  if (start.resumeRequested && !resuming && !anyCheckpoints) {
    removeAll(others);
    return removed;
  }
  std::string list;
  for (const auto& files : others) list += "\n  " + runName(files.runId) + ": " + describeFiles(files);
  std::string places =
      "train.out_dir " + c.train.outDir + (saveDir.empty() ? "" : " and the save directory " + saveDir);
  if (resuming)
    STRATA_USER_FAIL(
        "{} hold files of another run than the one this resumes ({} from {}):{}\nGive this run another "
        "train.out_dir or checkpoint.save, or add --overwrite to remove those files first.",
        places, runName(start.runId), start.checkpoint, list);
  STRATA_USER_FAIL(
      "{} hold another run's files:{}\nA new run here would mix its metrics and checkpoints with that run's. "
      "{}start over with --overwrite (it removes those files first); or give this run another train.out_dir "
      "or "
      "checkpoint.save.",
      places, list,
      anyCheckpoints ? "Resume that run with --resume (or checkpoint.load: latest), or "
                     : "Nothing there can be resumed (no checkpoint): ");
}

}  // namespace strata::train
