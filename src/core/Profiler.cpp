#include "strata/core/Profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <unordered_map>
#include <vector>

#include "strata/core/Stream.h"

namespace strata::profiler {
namespace {

struct Bucket {
  double seconds = 0;
  int64_t calls = 0;
};

struct State {
  bool active = false;
  Mode mode = Mode::Synchronise;
  int held = 0;
  std::thread::id owner;  // the thread that started the profile: the only one whose marks count
  Device device;
  std::chrono::steady_clock::time_point last;
  std::unordered_map<std::string, Bucket> buckets;
  // Mode::Events: the event recorded at start, then one per mark with its bucket (empty name: skip()).
  std::vector<std::pair<std::string, Event>> events;
};

void recordEvent(State& s, std::string name) {
  Event e(s.device, true);
  e.record(currentStream(s.device));
  s.events.emplace_back(std::move(name), std::move(e));
}

State& state() {
  static State s;  // the profiler is for the training thread; marks from elsewhere are not expected
  return s;
}

}  // namespace

void start(Device device, Mode mode) {
  State& s = state();
  s.buckets.clear();
  s.events.clear();
  s.device = device;
  s.mode = mode;
  s.owner = std::this_thread::get_id();
  s.active = true;
  synchronizeDevice(device);
  s.last = std::chrono::steady_clock::now();
  if (mode == Mode::Events) recordEvent(s, "");
}

bool active() {
  return state().active;
}

static bool counts(const State& s) {
  return s.active && s.held == 0 && std::this_thread::get_id() == s.owner;
}

void mark(std::string_view name) {
  State& s = state();
  if (!counts(s)) return;
  if (s.mode == Mode::Events) {
    recordEvent(s, std::string(name));
    return;
  }
  synchronizeDevice(s.device);
  auto now = std::chrono::steady_clock::now();
  Bucket& b = s.buckets[std::string(name)];
  b.seconds += std::chrono::duration<double>(now - s.last).count();
  b.calls += 1;
  s.last = now;
}

void skip() {
  State& s = state();
  if (!counts(s)) return;
  if (s.mode == Mode::Events) {
    recordEvent(s, "");
    return;
  }
  synchronizeDevice(s.device);
  s.last = std::chrono::steady_clock::now();
}

Hold::Hold() {
  State& s = state();
  if (s.active && std::this_thread::get_id() == s.owner) ++s.held;
}

Hold::~Hold() {
  State& s = state();
  if (s.held > 0 && std::this_thread::get_id() == s.owner) --s.held;
}

std::string stop() {
  State& s = state();
  s.active = false;
  if (!s.events.empty()) {
    s.events.back().second.synchronize();
    for (size_t i = 1; i < s.events.size(); ++i) {
      const auto& [name, e] = s.events[i];
      if (name.empty()) continue;
      Bucket& b = s.buckets[name];
      b.seconds += double(s.events[i - 1].second.elapsedMs(e)) * 1e-3;
      b.calls += 1;
    }
    s.events.clear();
  }
  std::vector<std::pair<std::string, Bucket>> rows(s.buckets.begin(), s.buckets.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0;
  for (const auto& r : rows) total += r.second.seconds;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-34s %10s %8s %10s %7s\n", "bucket", "total ms", "calls", "us/call",
                "share");
  out += line;
  for (const auto& [name, b] : rows) {
    std::snprintf(line, sizeof line, "%-34s %10.2f %8lld %10.1f %6.1f%%\n", name.c_str(), b.seconds * 1e3,
                  static_cast<long long>(b.calls), b.seconds * 1e6 / double(std::max<int64_t>(b.calls, 1)),
                  total > 0 ? 100.0 * b.seconds / total : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "%-34s %10.2f\n", "total", total * 1e3);
  out += line;
  s.buckets.clear();
  return out;
}

}  // namespace strata::profiler
