// Deferred parameters: a model built without its parameters' values, each made where it is laid out.
#pragma once

#include <functional>

#include "strata/core/Generator.h"
#include "strata/core/Tensor.h"

namespace strata::nn {

class Module;

// NOTE [Deferred parameters]
// Training lays every parameter out in chunks of the compute dtype, with fp32 masters beside them
// (zero/ChunkManager.h). Built the usual way, the whole fp32 model exists first: 4 bytes per parameter on
// the device before any chunk is made, which alone bounds the model one GPU can start (37.5B on 139 GiB),
// and on every rank of a ZeRO job.
//
// Within a DeferParameters scope a layer's parameters are placeholders: tensors of their shape, dtype and
// device whose elements all read one zero (stride 0, four bytes). Each carries the recipe of its starting
// value: the generator's seed and the counters its constructor reserved (NOTE in core/Generator.h), and the
// tensor-parallel slice it keeps. deferredValue makes that value on demand, bit for bit the tensor the
// constructor would have made, so the chunk manager fills each parameter's place in its chunk and its master
// one parameter at a time, and no fp32 copy of the model ever exists.
//
// The trainer builds the zoo's models this way. A model of one's own built within the scope and handed to the
// trainer is laid out the same way; its layers must draw their values from one seed on every rank of a ZeRO
// group, since each rank makes its own shards and none is broadcast (a model built eagerly is laid out whole
// and broadcast from rank 0). Layers of one's own defer their parameters through initialParameter (or
// normalParameter, filledParameter); a value made eagerly inside the scope is laid out as it is.
//
// A placeholder runs through a forward (the layout's first-use trace does, in eval mode without gradients;
// the values it computes are not used). Anything that reads a parameter's values outside the layout calls
// materializeParameters first; Module::castParameters does.
class DeferParameters {
 public:
  DeferParameters();
  ~DeferParameters();
  DeferParameters(const DeferParameters&) = delete;
  DeferParameters& operator=(const DeferParameters&) = delete;
  // Whether the calling thread is within a scope.
  static bool active();

 private:
  bool previous_;
};

// A layer's starting value for a parameter of `shape`: make() (fp32, contiguous, on `device`) now, or,
// within a DeferParameters scope, a placeholder that makes it when asked. make must not draw from a
// generator: it replays counters reserved before the call. Nor may it hold tensors: a recipe is kept until
// its placeholder is gone, which may be after the device is.
Tensor initialParameter(const Shape& shape, Device device, std::function<Tensor()> make);

// The common starting values through initialParameter: N(mean, std) drawn by `gen` (its counters reserved
// now), and a constant.
Tensor normalParameter(const Shape& shape, Generator& gen, Device device, double mean, double std);
Tensor filledParameter(const Shape& shape, Device device, double value);

// Applies `edit` to a parameter's starting value (a model's own rule for part of it): now, or, for a
// placeholder, after its recipe makes the value. Like make, edit must not draw from a generator.
void editInitialValue(const Tensor& p, std::function<void(const Tensor& value)> edit);

// Whether `p` is a placeholder whose value has not been made.
bool isDeferred(const Tensor& p);
// The starting value of a placeholder (fp32, contiguous, on its device), made now; `p` itself otherwise.
Tensor deferredValue(const Tensor& p);
// Whether any parameter of `model` is a placeholder.
bool hasDeferredParameters(const Module& model);
// Gives every placeholder of `model` its value in place (each tensor keeps its identity).
void materializeParameters(Module& model);

}  // namespace strata::nn
