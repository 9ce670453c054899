// Stream fences a test completes by hand: an allocator sees other streams' work as running until it does.
#pragma once

#include <memory>
#include <vector>

#include "strata/core/Allocator.h"

namespace strata::test {

struct ManualFences {
  struct State {
    uint64_t stream = 0;
    bool complete = false;
  };
  std::vector<std::shared_ptr<State>> made;
  int waits = 0;

  struct Fence final : StreamFence {
    std::shared_ptr<State> state;
    ManualFences* owner;
    bool done() override { return state->complete; }
    void wait() override {
      owner->waits++;
      state->complete = true;  // the host "blocked" until the stream got there
    }
  };
  FenceFactory factory() {
    return [this](const Stream& stream) -> std::unique_ptr<StreamFence> {
      auto f = std::make_unique<Fence>();
      f->state = std::make_shared<State>(State{stream.id(), false});
      f->owner = this;
      made.push_back(f->state);
      return f;
    };
  }
  void completeAll() {
    for (auto& s : made) s->complete = true;
  }
};

}  // namespace strata::test
