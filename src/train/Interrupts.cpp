#include "strata/train/Interrupts.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>

#include "strata/core/Error.h"

namespace strata::train {

namespace {

// The handler's state: a signal handler can reach nothing else (one monitor exists at a time, during run()).
std::atomic<int> pendingSignal{0};
std::atomic<int> wakeFd{-1};
std::atomic<int64_t> heartbeatNs{0};
std::atomic<int64_t> stopEndedNs{0};
std::atomic<bool> takeContinue{false};
// What the handler records with the first signal, for the monitor's message: the trainer's phase and its
// iterations done then (the monitor may print after the loop has moved on).
std::atomic<int> currentPhase{0};
std::atomic<int64_t> iterationsDone{0}, iterationsAtSignal{0};
std::atomic<bool> mpirunNotice{false};

// The monitor's heartbeat is 10 per second; a SIGCONT that finds it older than this ends a stop. The monitor
// also notes a gap that long when it wakes (the stop it just woke from), in case it wakes before the
// handler runs on another thread: a SIGCONT that soon after one is the stop's end too.
constexpr int64_t kStoppedGapNs = 1'000'000'000;
constexpr int64_t kAfterStopNs = 2'000'000'000;
constexpr int kHeartbeatMs = 100;

int64_t monotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

extern "C" void onStopSignal(int sig) {
  int savedErrno = errno;
  if (sig == SIGCONT) {
    // A SIGCONT that ends a stop (Ctrl-Z, then fg) is no notice; nor is any outside Open MPI.
    int64_t now = monotonicNs();
    if (!takeContinue.load() || now - heartbeatNs.load() > kStoppedGapNs ||
        now - stopEndedNs.load() < kAfterStopNs) {
      errno = savedErrno;
      return;
    }
  } else if (sig == SIGINT && pendingSignal.load() != 0) {
    const char msg[] = "\nsecond interrupt: aborting now\n";
    ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)ignored;
    ::_exit(130);
  }
  int expected = 0;
  if (pendingSignal.compare_exchange_strong(expected, sig == SIGCONT ? SIGTERM : sig)) {
    iterationsAtSignal.store(iterationsDone.load());
    mpirunNotice.store(sig == SIGCONT);
  }
  // The signal and the phase it came in, in one byte (signals are below 64, phases 0 to 2).
  unsigned char byte = static_cast<unsigned char>(sig + 64 * currentPhase.load());
  int fd = wakeFd.load();
  if (fd >= 0) {
    ssize_t ignored = ::write(fd, &byte, 1);
    (void)ignored;
  }
  errno = savedErrno;
}

std::string hostName() {
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  return host;
}

// Alive: the process exists and is no zombie (a rank killed with -9 that mpirun has not reaped yet).
bool processAlive(long pid) {
  if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: the kill above is all there is
  size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

// "odls_base_sigkill_timeout = 30" in an MCA parameter file.
bool readMcaFile(const std::string& path, double* seconds) {
  std::ifstream in(path);
  std::string line;
  bool found = false;
  while (std::getline(in, line)) {
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = line.substr(0, eq);
    key.erase(0, key.find_first_not_of(" \t"));
    key.erase(key.find_last_not_of(" \t") + 1);
    if (key != "odls_base_sigkill_timeout") continue;
    char* end = nullptr;
    double v = std::strtod(line.c_str() + eq + 1, &end);
    if (end != line.c_str() + eq + 1) {
      *seconds = v;
      found = true;
    }
  }
  return found;
}

std::string seconds(double s) {
  return detail::format("{} s", s < 10 ? std::round(s * 10) / 10 : std::round(s));
}

}  // namespace

bool launchedByOpenMpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
}

KillTimeout openMpiKillTimeout() {
  KillTimeout t;
  if (const char* env = std::getenv("OMPI_MCA_odls_base_sigkill_timeout")) {
    char* end = nullptr;
    double v = std::strtod(env, &end);
    if (end != env) {
      t.seconds = v;
      t.set = true;
      t.source = "OMPI_MCA_odls_base_sigkill_timeout";
      return t;
    }
  }
  std::vector<std::string> files;
  if (const char* home = std::getenv("HOME"))
    files.push_back(std::string(home) + "/.openmpi/mca-params.conf");
  files.push_back("/etc/openmpi/openmpi-mca-params.conf");
  for (const auto& file : files) {
    double v = 0;
    if (readMcaFile(file, &v)) {
      t.seconds = v;
      t.set = true;
      t.source = file;
      return t;
    }
  }
  t.source = "Open MPI's default";
  return t;
}

InterruptMonitor::InterruptMonitor(Options options) : options_(std::move(options)) {
  int fds[2];
  STRATA_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "interrupts: pipe2 failed: {}", std::strerror(errno));
  wakeRead_ = fds[0];
  wakeWrite_ = fds[1];
  // The handler must never block on a full pipe.
  ::fcntl(wakeWrite_, F_SETFL, ::fcntl(wakeWrite_, F_GETFL) | O_NONBLOCK);
  pendingSignal.store(0);
  mpirunNotice.store(false);
  currentPhase.store(int(Phase::Training));
  iterationsDone.store(0);
  heartbeatNs.store(monotonicNs());
  stopEndedNs.store(0);
  wakeFd.store(wakeWrite_);
  takeContinue.store(options_.openMpi);
  thread_ = std::thread([this] { watch(); });
  struct sigaction action {};
  action.sa_handler = onStopSignal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &previous_[0]);
  sigaction(SIGTERM, &action, &previous_[1]);
  sigaction(SIGCONT, &action, &previous_[2]);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGXFSZ, &ignore, &previous_[3]);
}

InterruptMonitor::~InterruptMonitor() {
  sigaction(SIGINT, &previous_[0], nullptr);
  sigaction(SIGTERM, &previous_[1], nullptr);
  sigaction(SIGCONT, &previous_[2], nullptr);
  sigaction(SIGXFSZ, &previous_[3], nullptr);
  takeContinue.store(false);
  wakeFd.store(-1);
  quit_.store(true);
  unsigned char zero = 0;
  ssize_t ignored = ::write(wakeWrite_, &zero, 1);
  (void)ignored;
  thread_.join();
  ::close(wakeRead_);
  ::close(wakeWrite_);
}

int InterruptMonitor::pending() const {
  return pendingSignal.load();
}

bool InterruptMonitor::fromMpirun() const {
  return mpirunNotice.load();
}

void InterruptMonitor::progress(int64_t done, bool willSave, const std::string& noSaveReason,
                                double stopSeconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  train::iterationsDone.store(done);
  willSave_ = willSave;
  noSaveReason_ = noSaveReason;
  stopSeconds_ = stopSeconds;
}

void InterruptMonitor::checkpointSaved(const std::string& lastGood, int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  lastGood_ = lastGood;
  lastGoodStep_ = step;
}

void InterruptMonitor::setResumeCommand(const std::string& command) {
  std::lock_guard<std::mutex> lock(mutex_);
  resumeCommand_ = command;
}

void InterruptMonitor::setPhase(Phase phase) {
  currentPhase.store(int(phase));
}

void InterruptMonitor::watch() {
  while (!quit_.load()) {
    pollfd p{wakeRead_, POLLIN, 0};
    int ready = ::poll(&p, 1, kHeartbeatMs);
    int64_t now = monotonicNs();
    if (now - heartbeatNs.load() > kStoppedGapNs) stopEndedNs.store(now);
    heartbeatNs.store(now);
    if (ready <= 0 || !(p.revents & POLLIN)) continue;
    unsigned char bytes[64];
    ssize_t n = ::read(wakeRead_, bytes, sizeof(bytes));
    for (ssize_t i = 0; i < n; ++i) {
      if (bytes[i] == 0 || noticed_) continue;
      noticed_ = true;
      onNotice(bytes[i] % 64, Phase(bytes[i] / 64));
    }
  }
}

std::vector<RankProcess> InterruptMonitor::lostRanks() const {
  std::vector<RankProcess> lost;
  std::string host = hostName();
  for (const auto& r : options_.ranks)
    if (r.rank != options_.rank && r.host == host && !processAlive(r.pid)) lost.push_back(r);
  return lost;
}

void InterruptMonitor::onNotice(int signal, Phase phase) {
  bool main = options_.rank == 0;
  std::unique_lock<std::mutex> lock(mutex_);
  if (phase != Phase::Training) {
    // It came when the ranks had agreed to stop, or were done training (the checkpoint is written): it
    // changes nothing, and a rank that has gone since is no loss.
    if (main && signal == SIGINT)
      spdlog::warn("interrupt: {}; interrupt again to exit now",
                   phase == Phase::Stopping ? "already stopping" : "training is over");
    return;
  }
  std::vector<RankProcess> lost = lostRanks();
  if (!lost.empty()) {
    // No step can finish without them, so nothing can be saved: say so once (the lowest surviving rank of
    // this host) and end now instead of waiting for mpirun's SIGKILL.
    int speaker = options_.rank;
    std::string host = hostName();
    for (const auto& r : options_.ranks) {
      bool isLost = false;
      for (const auto& l : lost) isLost = isLost || l.rank == r.rank;
      if (r.host == host && !isLost) speaker = std::min(speaker, r.rank);
    }
    if (speaker == options_.rank) {
      std::string names;
      for (const auto& l : lost)
        names += detail::format("{}rank {} (pid {})", names.empty() ? "" : ", ", l.rank, l.pid);
      std::string last =
          lastGood_.empty()
              ? std::string("This run has no checkpoint yet.")
              : detail::format(
                    "The last good checkpoint is {} (iteration {}){}", lastGood_, lastGoodStep_,
                    resumeCommand_.empty() ? std::string(".") : "; resume with:\n  " + resumeCommand_);
      std::string text = detail::format(
          "{} lost: its process ended while the job ran (mpirun's message says how). The other ranks cannot "
          "finish the step without it, so nothing is saved now. {}",
          names, last);
      std::fprintf(stderr, "\n[strata] rank %d: %s\n", options_.rank, text.c_str());
      std::fflush(stderr);
    }
    std::fflush(stdout);
    ::_exit(1);
  }
  if (!main) return;  // rank 0 speaks for the job; a signal to another rank shows at the step's end
  int64_t next = iterationsAtSignal.load() + 1;
  std::string saving =
      willSave_ ? " and saving a checkpoint" : ", then stopping without a checkpoint (" + noSaveReason_ + ")";
  if (signal == SIGCONT) {
    double window = 2 * options_.killTimeoutSeconds;
    std::string fit;
    if (willSave_ && stopSeconds_ > 0.8 * window)
      fit = detail::format(
          ", though the last step and save took {} and Open MPI kills the ranks {} after its notice (2 x "
          "odls_base_sigkill_timeout): it may not finish; see docs/checkpoints.md",
          seconds(stopSeconds_), seconds(window));
    else
      fit = detail::format("; Open MPI kills the ranks {} after its notice (2 x odls_base_sigkill_timeout)",
                           seconds(window));
    spdlog::warn(
        "mpirun is ending the job (Ctrl-C or a signal to mpirun): every rank is finishing iteration {}{}{}",
        next, saving, fit);
  } else {
    spdlog::warn("interrupt ({}): finishing iteration {}{}{}", signal == SIGINT ? "SIGINT" : "SIGTERM", next,
                 saving, signal == SIGINT ? " (interrupt again to abort now)" : "");
  }
}

}  // namespace strata::train
