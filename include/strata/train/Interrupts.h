// Interrupts of a training run: Ctrl-C, SIGTERM, and mpirun ending the job.
//
// NOTE [Interrupts]
// SIGINT and SIGTERM during Trainer::run only set a flag. The loop finishes the step it is in; on several
// ranks the flag is reduced (max) at every step boundary, so every rank stops after the same step, whichever
// rank the signal reached. Then the run saves a checkpoint when saving is configured and returns. A second
// SIGINT means "now": the process exits at once with status 130. The handlers are installed for the duration
// of run() and the previous ones restored after; SIGXFSZ is ignored meanwhile, so a write past the file-size
// limit (ulimit -f) fails with EFBIG and a named error instead of killing the process.
//
// Under mpirun the signals reach the ranks another way (Open MPI 4.1, observed): Ctrl-C or SIGTERM to mpirun
// is never forwarded (ess_base_forward_signals refuses SIGINT and SIGTERM; each rank is in a process group of
// its own, so the terminal's SIGINT reaches mpirun alone). mpirun sends each rank SIGCONT at once, SIGTERM
// odls_base_sigkill_timeout seconds later and SIGKILL as long again after that (T, default 1 s), and it does
// the same when a rank dies. So a rank takes a SIGCONT that does not end a stop as mpirun's notice that the
// job is ending (a stopped process wakes to find the monitor's heartbeat a second or more old, and ignores
// it) and stops as for SIGTERM: it has 2T to finish the step and save. Strata's launch line sets T
// (`mpirun --mca odls_base_sigkill_timeout 30`, docs/checkpoints.md); the trainer warns at start when it is
// unset, and once a step and a save have been timed, when they would not fit. mpirun itself may take up to
// 2T to return (it sleeps through its kill sequence), whatever the ranks do.
//
// The messages come from a monitor thread, not the handler: it checks first whether every rank on this host
// is alive (a rank killed with -9 is gone by the time mpirun's notice arrives). If one is not, no step can
// finish and nothing can be saved: the lowest surviving rank reports the lost rank and the last checkpoint
// that is good, and the process exits at once. Otherwise rank 0 says what will happen, and says "saving" only
// when a checkpoint will be written.
#pragma once

#include <atomic>
#include <csignal>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace strata::train {

// True when Open MPI's mpirun started this process (OMPI_COMM_WORLD_SIZE is set).
bool launchedByOpenMpi();

// Open MPI's odls_base_sigkill_timeout for this job: from the environment mpirun passes on to its ranks
// (`--mca odls_base_sigkill_timeout T` or OMPI_MCA_odls_base_sigkill_timeout), else the user's and the
// system's MCA parameter files, else Open MPI's default of 1 s.
struct KillTimeout {
  double seconds = 1;
  bool set = false;    // given by the user (else Open MPI's default)
  std::string source;  // where it came from, for messages
};
KillTimeout openMpiKillTimeout();

// A rank's process, as every rank reports it at the start of a run.
struct RankProcess {
  int rank = 0;
  long pid = 0;
  std::string host;
};

class InterruptMonitor {
 public:
  struct Options {
    int rank = 0, worldSize = 1;
    // Take mpirun's SIGCONT as the notice that the job is ending (NOTE [Interrupts]).
    bool openMpi = false;
    // Open MPI's kill timeout T: a notice leaves 2T until SIGKILL (0: no such limit).
    double killTimeoutSeconds = 0;
    // Every rank's process; the ones on this host are checked when a notice comes.
    std::vector<RankProcess> ranks;
  };
  enum class Phase { Training, Stopping, Finished };

  explicit InterruptMonitor(Options options);
  ~InterruptMonitor();
  InterruptMonitor(const InterruptMonitor&) = delete;
  InterruptMonitor& operator=(const InterruptMonitor&) = delete;

  // The signal asking this rank to stop: SIGINT, SIGTERM (mpirun's notice counts as SIGTERM), or 0.
  int pending() const;
  // The signal pending is mpirun's notice (Ctrl-C or a signal to mpirun).
  bool fromMpirun() const;

  // What the messages say, kept current by the trainer. `willSave`: a stop now writes a checkpoint (else
  // `noSaveReason` says why not); `stopSeconds`: how long the slowest step and the last save took (0:
  // unknown); `lastGood`: the newest complete checkpoint of this run ("" when none) and its iteration.
  void progress(int64_t done, bool willSave, const std::string& noSaveReason, double stopSeconds);
  void checkpointSaved(const std::string& lastGood, int64_t step);
  void setResumeCommand(const std::string& command);
  // Stopping: the ranks agreed to stop (a notice now changes nothing); Finished: training is over.
  void setPhase(Phase phase);

 private:
  void watch();
  // The first signal, and the phase the trainer was in when it came.
  void onNotice(int signal, Phase phase);
  std::vector<RankProcess> lostRanks() const;

  Options options_;
  struct sigaction previous_[4]{};  // SIGINT, SIGTERM, SIGCONT, SIGXFSZ as they were
  int wakeRead_ = -1, wakeWrite_ = -1;
  std::thread thread_;
  std::atomic<bool> quit_{false};
  bool noticed_ = false;  // the monitor thread's: the first notice was handled

  mutable std::mutex mutex_;  // guards the fields below
  bool willSave_ = false;
  std::string noSaveReason_ = "no save directory: set checkpoint.save";
  double stopSeconds_ = 0;
  std::string lastGood_, resumeCommand_;
  int64_t lastGoodStep_ = 0;
};

}  // namespace strata::train
