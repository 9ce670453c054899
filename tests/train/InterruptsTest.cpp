#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>

#include "TestUtil.h"
#include "strata/train/Interrupts.h"

using namespace strata;

namespace {

// Waits up to a second for the monitor's handler to have seen a signal.
int pendingAfter(const train::InterruptMonitor& monitor) {
  for (int i = 0; i < 100 && monitor.pending() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return monitor.pending();
}

void (*handlerOf(int sig))(int) {
  struct sigaction now {};
  sigaction(sig, nullptr, &now);
  return now.sa_handler;
}

}  // namespace

TEST_CASE("the interrupt monitor takes SIGINT and SIGTERM, ignores SIGXFSZ, and restores the handlers",
          "[train][interrupts]") {
  auto intBefore = handlerOf(SIGINT), xfszBefore = handlerOf(SIGXFSZ);
  {
    train::InterruptMonitor monitor(train::InterruptMonitor::Options{});
    REQUIRE(monitor.pending() == 0);
    REQUIRE(handlerOf(SIGXFSZ) == SIG_IGN);
    std::raise(SIGXFSZ);  // a write past `ulimit -f`: ignored, not the end of the process
    std::raise(SIGTERM);
    REQUIRE(pendingAfter(monitor) == SIGTERM);
    std::raise(SIGTERM);  // a later one changes nothing
    REQUIRE(monitor.pending() == SIGTERM);
  }
  REQUIRE(handlerOf(SIGINT) == intBefore);
  REQUIRE(handlerOf(SIGXFSZ) == xfszBefore);
}

TEST_CASE("under mpirun a SIGCONT that ends no stop is mpirun's notice; one that ends a stop is not",
          "[train][interrupts]") {
  {
    // Outside Open MPI, SIGCONT means nothing.
    train::InterruptMonitor monitor(train::InterruptMonitor::Options{});
    std::raise(SIGCONT);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    REQUIRE(monitor.pending() == 0);
  }
  train::InterruptMonitor::Options options;
  options.openMpi = true;
  options.killTimeoutSeconds = 30;
  {
    // Stopped for 1.5 s (as Ctrl-Z does) and continued: the heartbeat is old, so this is no notice.
    train::InterruptMonitor monitor(options);
    pid_t self = getpid();
    pid_t child = fork();
    if (child == 0) {
      usleep(100'000);
      kill(self, SIGSTOP);
      usleep(1'500'000);
      kill(self, SIGCONT);
      _exit(0);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    REQUIRE(monitor.pending() == 0);
    // mpirun's SIGCONT to a running rank (some seconds after any stop): the job is ending, stop as for
    // SIGTERM.
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    std::raise(SIGCONT);
    REQUIRE(pendingAfter(monitor) == SIGTERM);
  }
}

TEST_CASE("Open MPI's kill timeout is read from the environment mpirun passes on", "[train][interrupts]") {
  const char* before = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
  std::string saved = before ? before : "";
  setenv("OMPI_MCA_odls_base_sigkill_timeout", "45", 1);
  train::KillTimeout t = train::openMpiKillTimeout();
  REQUIRE(t.seconds == 45);
  REQUIRE(t.set);
  if (before)
    setenv("OMPI_MCA_odls_base_sigkill_timeout", saved.c_str(), 1);
  else
    unsetenv("OMPI_MCA_odls_base_sigkill_timeout");
}
