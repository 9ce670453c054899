// Deferred parameters (NOTE [Deferred parameters] in nn/DeferredInit.h).
#include "strata/nn/DeferredInit.h"

#include <mutex>
#include <set>
#include <unordered_map>

#include "strata/autograd/GradMode.h"
#include "strata/nn/Module.h"
#include "strata/ops/Ops.h"

namespace strata::nn {

namespace {

thread_local bool deferring = false;

// A placeholder's recipe, valid while the placeholder still holds the storage it was made with (a laid-out
// or materialized parameter holds other storage; a freed one's address may be reused).
struct Recipe {
  std::weak_ptr<StorageImpl> storage;
  std::function<Tensor()> make;
  uint64_t version = 0;  // the placeholder's content version when made: a write since is refused
};

struct Recipes {
  std::mutex mutex;
  std::unordered_map<const TensorImpl*, Recipe> byImpl;
  size_t insertsSincePurge = 0;
};

Recipes& recipes() {
  static Recipes r;
  return r;
}

}  // namespace

DeferParameters::DeferParameters() : previous_(deferring) {
  deferring = true;
}

DeferParameters::~DeferParameters() {
  deferring = previous_;
}

bool DeferParameters::active() {
  return deferring;
}

Tensor initialParameter(const Shape& shape, Device device, std::function<Tensor()> make) {
  STRATA_CHECK(make != nullptr, "initialParameter: no recipe");
  if (!deferring) return make();
  Storage storage = makeStorage(sizeof(float), device);
  storage->setLabel("deferred parameter");
  ops::fill(Tensor::fromStorage(storage, {1}, {1}, 0, DType::F32), 0.0);
  Tensor placeholder = Tensor::fromStorage(storage, shape, Shape(shape.size(), 0), 0, DType::F32);
  Recipes& r = recipes();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (++r.insertsSincePurge >= 4096) {
    r.insertsSincePurge = 0;
    std::erase_if(r.byImpl, [](const auto& kv) { return kv.second.storage.expired(); });
  }
  r.byImpl[&placeholder.impl()] = Recipe{storage, std::move(make), storage->version()};
  return placeholder;
}

Tensor normalParameter(const Shape& shape, Generator& gen, Device device, double mean, double std) {
  GeneratorState draws{gen.seed(), gen.reserve(uint64_t(numelOf(shape)))};
  return initialParameter(shape, device, [shape, draws, device, mean, std] {
    Generator replay(draws);
    return ops::randn(shape, replay, DType::F32, device, mean, std);
  });
}

Tensor filledParameter(const Shape& shape, Device device, double value) {
  return initialParameter(shape, device,
                          [shape, device, value] { return ops::full(shape, value, DType::F32, device); });
}

namespace {

std::function<Tensor()> recipeOf(const Tensor& p) {
  if (!p.defined()) return nullptr;
  Recipes& r = recipes();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.byImpl.find(&p.impl());
  if (it == r.byImpl.end()) return nullptr;
  if (it->second.storage.lock() != p.impl().storage) {
    r.byImpl.erase(it);
    return nullptr;
  }
  // A write into a placeholder (a load, a copy) would be lost to its recipe: refused.
  STRATA_CHECK(p.impl().storage->version() == it->second.version,
               "deferred parameter '{}' was written before its value was made (built within "
               "nn::DeferParameters): call nn::materializeParameters on the model before writing into its "
               "parameters, or build it outside the scope",
               p.name());
  return it->second.make;
}

}  // namespace

void editInitialValue(const Tensor& p, std::function<void(const Tensor& value)> edit) {
  {
    Recipes& r = recipes();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.byImpl.find(&p.impl());
    if (it != r.byImpl.end() && it->second.storage.lock() == p.impl().storage) {
      it->second.make = [make = std::move(it->second.make), edit = std::move(edit)] {
        Tensor v = make();
        edit(v);
        return v;
      };
      return;
    }
  }
  NoGradGuard noGrad;
  edit(p.detach());
}

bool isDeferred(const Tensor& p) {
  return recipeOf(p) != nullptr;
}

Tensor deferredValue(const Tensor& p) {
  std::function<Tensor()> make = recipeOf(p);
  if (!make) return p;
  NoGradGuard noGrad;
  Tensor v = make();
  STRATA_CHECK(
      v.shape() == p.shape() && v.dtype() == DType::F32 && v.device() == p.device() && v.isContiguous(),
      "deferred parameter '{}': its recipe made a {} {} tensor on {}, not fp32 {} on {}", p.name(), v.dtype(),
      toString(v.shape()), toString(v.device()), toString(p.shape()), toString(p.device()));
  return v;
}

bool hasDeferredParameters(const Module& model) {
  for (const auto& [name, p] : model.namedParameters())
    if (isDeferred(p)) return true;
  return false;
}

void materializeParameters(Module& model) {
  std::set<const TensorImpl*> done;
  for (auto& [name, p] : model.namedParameters()) {
    if (!done.insert(&p.impl()).second || !isDeferred(p)) continue;
    Tensor v = deferredValue(p);
    TensorImpl& impl = p.impl();
    impl.storage = v.storage();
    impl.offset = v.offset();
    impl.strides = v.strides();
  }
}

}  // namespace strata::nn
