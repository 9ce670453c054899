// ProcessGroup: a named set of ranks that communicate together (the world, or later an expert-parallel or a
// tensor-parallel group), with this process's rank in it and its Communicator. ParallelContext makes and owns
// them; a group lives as long as its context.
#pragma once

#include <memory>
#include <string>

#include "strata/distributed/Communicator.h"

namespace strata::dist {

class ProcessGroup {
 public:
  explicit ProcessGroup(std::unique_ptr<Communicator> communicator)
      : communicator_(std::move(communicator)) {}

  const std::string& name() const { return communicator_->info().name; }
  int rank() const { return communicator_->rank(); }
  int size() const { return communicator_->size(); }
  Communicator& communicator() const { return *communicator_; }

 private:
  std::unique_ptr<Communicator> communicator_;
};

}  // namespace strata::dist
