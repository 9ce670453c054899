#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "TestUtil.h"
#include "strata/core/Profiler.h"

using namespace strata;

namespace {

// The calls column of bucket `name` in a profile table (-1: no such row).
long callsOf(const std::string& table, const std::string& name) {
  size_t at = table.find(name + " ");
  if (at == std::string::npos) return -1;
  double ms = 0;
  long calls = 0;
  std::sscanf(table.c_str() + at + name.size(), "%lf %ld", &ms, &calls);
  return calls;
}

}  // namespace

TEST_CASE("the profiler charges time to marks; a Hold folds its marks into the next one", "[profiler]") {
  // Both modes: synchronising at each mark, and timing events (host clock on the CPU) read at stop().
  auto mode = GENERATE(profiler::Mode::Synchronise, profiler::Mode::Events);
  profiler::start(Device::cpu(), mode);
  profiler::mark("a");
  {
    profiler::Hold hold;
    profiler::mark("inside");  // ignored: the held work is charged to the next mark
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    {
      profiler::Hold nested;
      profiler::mark("inside");
    }
    profiler::mark("inside");
  }
  // Marks from another thread are ignored too (the delayed SSD update's worker runs ops beside the step).
  std::thread([] { profiler::mark("worker"); }).join();
  profiler::mark("after");
  std::string table = profiler::stop();
  INFO(table);
  REQUIRE(callsOf(table, "a") == 1);
  REQUIRE(callsOf(table, "inside") == -1);
  REQUIRE(callsOf(table, "worker") == -1);
  REQUIRE(callsOf(table, "after") == 1);
  // "after" holds the held sleep.
  double ms = 0;
  std::sscanf(table.c_str() + table.find("after ") + 6, "%lf", &ms);
  REQUIRE(ms >= 15);
  REQUIRE_FALSE(profiler::active());
}

TEST_CASE("the event profiler charges skipped time to nothing", "[profiler]") {
  profiler::start(Device::cpu(), profiler::Mode::Events);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  profiler::skip();
  profiler::mark("quick");
  std::string table = profiler::stop();
  INFO(table);
  REQUIRE(callsOf(table, "quick") == 1);
  double ms = 100;
  std::sscanf(table.c_str() + table.find("quick ") + 6, "%lf", &ms);
  REQUIRE(ms < 15);
}
