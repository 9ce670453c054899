// Grad mode: whether differentiable ops record the graph. Per thread, on by default.
#pragma once

namespace strata {

bool gradEnabled();
void setGradEnabled(bool enabled);

// Disables graph recording for the scope (inference, optimizer updates, the backward pass itself).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(gradEnabled()) { setGradEnabled(false); }
  ~NoGradGuard() { setGradEnabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Enables graph recording for the scope (activation recomputation inside a backward pass).
class EnableGradGuard {
 public:
  EnableGradGuard() : previous_(gradEnabled()) { setGradEnabled(true); }
  ~EnableGradGuard() { setGradEnabled(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace strata
