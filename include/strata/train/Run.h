// Runs across restarts: a run's id, how a run starts (fresh, or resumed with its checkpoint's settings), and
// which files of an output or save directory belong to which run.
//
// NOTE [Run lineage]
// A run has an id (newRunId()) made when it starts fresh and kept by every resume. It is written into each
// checkpoint's manifest ("run_id"), each metrics.jsonl record ("run_id") and its TensorBoard event files (the
// name ends ".run-<id>"; the session-start record says "run <id>"). A run owns those files in its
// train.out_dir and its save directory, and before it writes anything it checks that these directories hold
// no other run's files (claimRunDirectories): a run never truncates another's metrics, prunes another's
// checkpoints or points `latest` at its own step in another's directory. When they do, the run stops and
// offers the two ways on: resume that run (`--resume`, checkpoint.resume, or checkpoint.load: latest), or
// start over (`--overwrite`, which removes that run's files first). Files from before runs had ids belong to
// no known run ("" below): another run's for a fresh start, the run's own when it resumes a checkpoint that
// has no id either. pruneCheckpoints only ever deletes the run's own checkpoints.
//
// NOTE [Resume is a property of the run]
// A checkpoint's manifest records the effective value of every config key ("effective_config"). A resume
// starts from those: a setting that neither the config file nor --set gives is the run's, not today's
// default, and the global batch stays the run's at any world size. A setting that is given and differs from
// the run's is refused, all of them listed, unless it may change on resume (mayChangeOnResume), or
// checkpoint.allow_changes is true. Those that may change are of two kinds. The run's course (how long it
// runs, how often it logs, evaluates and saves, where its output goes, the training lengths) is the run's
// unless given. This launch's settings (where model state lives, the device, threads, the collective timeout,
// expert parallelism: none changes what a step computes) are the command's, given or default, never the
// checkpoint's, so a run resumes at another world size or on another machine. checkpoint.load,
// load_model_only, resume and allow_changes describe the start itself and are never taken from the
// checkpoint. A data file under another path with the same bytes is no change. A resume from checkpoint.load
// with load_model_only is a fresh run that starts from those weights.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "strata/config/Config.h"

namespace strata::train {

// A new run id: the UTC start time and 32 random bits, "20260101-120000-1a2b3c4d".
std::string newRunId();

// Where a config's checkpoints go: checkpoint.save, else <out_dir>/checkpoints when save_interval is set,
// else "" (none).
std::string saveDirectoryOf(const config::Config& config);

// The model section with its defaults spelt out, so a checkpoint's and a config's compare by meaning:
// ffn_hidden_size 0 is 4 x hidden_size, decoder_seq_length 0 a quarter of seq_length, activation default
// the architecture's own (`convert --from-hf` writes what HF's config.json says), and the keys HF
// checkpoints carry (max_position_embeddings 0, pad_token_id -1, T5's scale_decoder_outputs).
void spellOutModelDefaults(std::map<std::string, std::string>& values);

// Whether a setting may differ from the checkpoint's when a run resumes (NOTE [Resume is a property of the
// run]); resumeChangeableKeys() lists them, for messages and documentation.
bool mayChangeOnResume(const std::string& key);
std::vector<std::string> resumeChangeableKeys();

struct RunStart {
  config::Config config;           // what the run trains with
  std::string checkpoint;          // the step directory the run resumes; "" when it starts fresh
  int64_t step = 0;                // the iterations that checkpoint completed
  std::string runId;               // the resumed run's id; "" for a fresh start, or a checkpoint without one
  bool resumeRequested = false;    // checkpoint.resume (or load: latest) was given
  std::vector<std::string> notes;  // what the user should know: settings changed on resume, a load not used
};

// How a run given `config` starts. checkpoint.resume (or checkpoint.load: latest) continues from the save
// directory's `latest` when there is one, and otherwise starts as configured (checkpoint.load included, so a
// fine-tuning job script can be rerun as it is); checkpoint.load resumes that checkpoint, or with
// load_model_only starts a fresh run from its weights. A resume's settings are the checkpoint's (NOTE [Resume
// is a property of the run]); given settings that may not change are refused with the list.
RunStart planRunStart(const config::Config& config);

// The run files of an output and a save directory, grouped by run id ("" for files of no known run):
// metrics.jsonl (under every id its records carry), TensorBoard event files, checkpoint step directories.
struct RunFiles {
  std::string runId;
  std::vector<std::string> paths;
  std::vector<std::string> checkpoints;  // the step directories among them
};
std::vector<RunFiles> runFilesIn(const std::string& outDir, const std::string& saveDir);

// Before run `runId` that starts as `start` writes (NOTE [Run lineage]): the files of other runs in its
// out_dir and save directory stop it with a message offering --resume and --overwrite, or are removed when
// checkpoint.overwrite is set. Files of no known run are its own when it resumes a checkpoint without an id.
// When a resume was asked for and there was nothing to resume, the metrics and events of a run that has no
// checkpoint in the save directory (an attempt that never reached its first checkpoint, its job script rerun)
// are replaced. Returns what was removed, for the log.
std::vector<std::string> claimRunDirectories(const RunStart& start, const std::string& runId);

}  // namespace strata::train
