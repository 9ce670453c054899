// A recorder of what ZeRO will hang on a model's hooks: module forward/backward hooks, each parameter's uses
// in forward and backward, and gradient-complete notices. Used by the model tests to check NOTE [Module
// calls] (strata/nn/Module.h) and NOTE [Backward passes] (strata/autograd/Engine.h) on real models.
//
// How uses are seen, with public API only:
// - forward: after a micro-batch's forward, the graph is walked from the loss; a node with an edge into a
//   parameter's AccumulateGrad is a use of that parameter, and its sequence number says when it was made.
//   Forward hook events record Node::peekNextSequenceNr() when they fire, so "hook before use" is a
//   comparison of sequence numbers.
// - backward: each such node gets a pre-hook that logs a backward use (it produces the parameter's gradient)
//   right before it runs.
// Optionally (simulateZero) every parameter holds NaN except between its module's pre-hook and post-hook,
// forward and backward (and until its gradient-complete notice, for a module whose inputs take no gradient,
// so that it has no backward post-hook), as ZeRO-3 will gather and release it: a read of a parameter outside
// those windows turns the results into NaN, so they must equal an untouched model's bit for bit. (The
// bytes are swapped through the raw pointer. StorageImpl::repoint()/evict() would make a read outside the
// windows throw, but they bump the storage version, which the saved-weight checks of linear() and
// geluMlp() take for a write; DESIGN.md says moving bytes must not change the version.)
#pragma once

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "TestUtil.h"

namespace strata::test {

class HookTrace {
 public:
  enum class Kind { FwdPre, FwdPost, BwdPre, BwdPost, BwdUse, GradComplete };
  struct Event {
    Kind kind;
    std::string name;          // module name ("" is the root) or parameter name
    uint64_t seq = 0;          // FwdPre/FwdPost: the next node's sequence number when the hook fired
    uint64_t pass = 0;         // backward events: autograd::currentBackwardPass()
    bool gradDefined = false;  // GradComplete: whether the parameter had a gradient
  };
  struct Param {
    std::string name, owner;
    Tensor tensor;
    Tensor home;  // simulateZero: where the bytes live while evicted
  };

  HookTrace(nn::Module& model, bool simulateZero) : zero_(simulateZero) {
    for (auto& [name, m] : model.namedModules()) {
      std::string n = name;
      m->addForwardPreHook([this, n](nn::Module&, const std::vector<Tensor>&) {
        log({Kind::FwdPre, n, autograd::Node::peekNextSequenceNr()});
        gather(n);
      });
      m->addForwardHook([this, n](nn::Module&, const std::vector<Tensor>&, const std::vector<Tensor>&) {
        log({Kind::FwdPost, n, autograd::Node::peekNextSequenceNr()});
        release(n);
      });
      m->addBackwardPreHook([this, n](nn::Module&) {
        log({Kind::BwdPre, n, 0, autograd::currentBackwardPass()});
        gather(n);
      });
      m->addBackwardHook([this, n](nn::Module&) {
        log({Kind::BwdPost, n, 0, autograd::currentBackwardPass()});
        release(n);
      });
      modules.push_back(n);
    }
    for (auto& [name, p] : model.namedParameters()) {
      size_t dot = name.rfind('.');
      Param param{name, dot == std::string::npos ? "" : name.substr(0, dot), p, Tensor()};
      std::string n = name;
      p.registerGradCompleteHook([this, n](Tensor& t) {
        log({Kind::GradComplete, n, 0, autograd::currentBackwardPass(), t.grad().defined()});
        if (t.grad().defined()) gradStorages[n].insert(t.grad().storage().get());
        for (auto& q : params)
          if (q.name == n) evict(q);
      });
      params.push_back(param);
      if (zero_) {
        REQUIRE(p.isContiguous());
        REQUIRE(p.dtype() == DType::F32);
        params.back().home = p.detach().clone();
        evict(params.back());
      }
      byImpl[&p.impl()] = params.size() - 1;
    }
  }

  // After a forward: logs the forward uses of each parameter (replacing the last forward's) and arms the
  // backward-use pre-hooks.
  void recordGraph(const Tensor& root) {
    forwardUses.clear();
    std::set<autograd::Node*> seen;
    std::vector<autograd::Node*> stack{root.gradFn().get()};
    while (!stack.empty()) {
      autograd::Node* node = stack.back();
      stack.pop_back();
      if (node == nullptr || !seen.insert(node).second) continue;
      for (auto& e : node->nextEdges()) {
        if (!e.valid()) continue;
        stack.push_back(e.node.get());
        auto* acc = dynamic_cast<autograd::AccumulateGrad*>(e.node.get());
        if (acc == nullptr) continue;
        auto it = byImpl.find(acc->leaf().get());
        if (it == byImpl.end()) continue;
        std::string n = params[it->second].name;
        forwardUses[n].push_back(node->sequenceNr());
        node->addPreHook([this, n] { log({Kind::BwdUse, n, 0, autograd::currentBackwardPass()}); });
      }
    }
  }

  // Every use of each parameter in forward lies inside a call of its module: between a pre-hook and the
  // matching post-hook (so the pre-hook comes before the first use). Checks the events since `from`.
  void checkForward(size_t from) const {
    for (const auto& p : params) {
      auto uses = forwardUses.find(p.name);
      if (uses == forwardUses.end()) continue;
      for (uint64_t use : uses->second) {
        INFO("forward use of " << p.name << " by node " << use << " outside a call of '" << p.owner << "'");
        bool inside = false;
        std::vector<uint64_t> open;  // pre-hook sequence numbers of the owner's calls still open
        for (size_t i = from; i < events.size(); ++i) {
          const Event& e = events[i];
          if (e.name != p.owner) continue;
          if (e.kind == Kind::FwdPre) open.push_back(e.seq);
          if (e.kind == Kind::FwdPost && !open.empty()) {
            inside = inside || (open.back() <= use && use < e.seq);
            open.pop_back();
          }
        }
        REQUIRE(inside);
      }
    }
  }

  // In each backward pass since `from`: every backward use of a parameter comes while its module is
  // "gathered" (after a backward pre-hook of the owner and no backward post-hook since), and every
  // parameter's gradient-complete notice fires exactly once, after its last backward use.
  // Returns the passes seen.
  std::vector<uint64_t> checkBackward(size_t from) const {
    std::vector<uint64_t> passes;
    for (size_t i = from; i < events.size(); ++i)
      if (events[i].pass != 0 && (passes.empty() || passes.back() != events[i].pass))
        passes.push_back(events[i].pass);
    for (uint64_t pass : passes) {
      std::map<std::string, bool> gathered;
      std::map<std::string, int> notices;
      std::set<std::string> used;
      for (size_t i = from; i < events.size(); ++i) {
        const Event& e = events[i];
        if (e.pass != pass) continue;
        if (e.kind == Kind::BwdPre) gathered[e.name] = true;
        if (e.kind == Kind::BwdPost) gathered[e.name] = false;
        if (e.kind == Kind::BwdUse) {
          const Param& p = param(e.name);
          INFO("backward use of " << p.name << " while '" << p.owner << "' had no backward pre-hook open");
          REQUIRE(gathered[p.owner]);
          INFO("backward use of " << p.name << " after its gradient-complete notice");
          REQUIRE(notices[p.name] == 0);
          used.insert(p.name);
        }
        if (e.kind == Kind::GradComplete) notices[e.name]++;
      }
      for (const auto& p : params) {
        INFO("gradient-complete notices of " << p.name << " in pass " << pass);
        REQUIRE(notices[p.name] == 1);
      }
    }
    return passes;
  }

  // Modules whose hook of `kind` fired since `from`.
  std::set<std::string> modulesWith(Kind kind, size_t from) const {
    std::set<std::string> out;
    for (size_t i = from; i < events.size(); ++i)
      if (events[i].kind == kind) out.insert(events[i].name);
    return out;
  }

  // Whether p holds NaN (released) rather than its values.
  static bool released(const Param& p) { return std::isnan(p.tensor.toVector<float>()[0]); }

  const Param& param(const std::string& name) const {
    for (const auto& p : params)
      if (p.name == name) return p;
    FAIL("no parameter " << name);
    return params.front();
  }

  std::vector<Event> events;
  std::vector<std::string> modules;
  std::vector<Param> params;
  std::map<std::string, std::vector<uint64_t>> forwardUses;
  std::map<std::string, std::set<StorageImpl*>> gradStorages;  // every storage a .grad had at a notice

 private:
  void log(Event e) { events.push_back(std::move(e)); }
  void gather(const std::string& module) {
    if (!zero_) return;
    for (auto& p : params)
      if (p.owner == module) std::memcpy(p.tensor.data(), p.home.data(), p.tensor.nbytes());
  }
  void release(const std::string& module) {
    for (auto& p : params)
      if (p.owner == module) evict(p);
  }
  void evict(Param& p) {
    if (!zero_) return;
    float* data = p.tensor.data<float>();
    std::fill(data, data + p.tensor.numel(), std::numeric_limits<float>::quiet_NaN());
  }

  bool zero_;
  std::unordered_map<const TensorImpl*, size_t> byImpl;
};

}  // namespace strata::test
