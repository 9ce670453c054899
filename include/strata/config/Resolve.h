// What a config names, resolved on this machine: the device, the dtype training computes in, and the zoo's
// model spec for its model section. The trainer, the planner and the HF import all start from these.
#pragma once

#include <string>

#include "models/Zoo.h"
#include "strata/config/Config.h"
#include "strata/core/DType.h"
#include "strata/core/Device.h"

namespace strata::config {

// "auto" -> cuda:0 when a GPU is present, else cpu.
Device resolveDevice(const std::string& name);
// The dtype training computes in, and the parameters' dtype once laid out in chunks: precision.dtype, with
// bf16 on the CPU computing in fp32.
DType computeDTypeFor(const Config& config, Device device);
// The zoo's model spec for a config's model section, built on `device` with the config's seed.
models::ModelSpec modelSpecFrom(const Config& config, Device device);

}  // namespace strata::config
