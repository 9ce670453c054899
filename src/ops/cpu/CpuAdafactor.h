// The CPU Adafactor kernel (CpuAdafactor.cpp), registered by CpuOptim.cpp.
#pragma once

#include "strata/ops/Ops.h"

namespace strata::ops::cpu {

void adafactor(const std::vector<AdafactorTensors>& sets, const AdafactorHyper& hyper,
               const Tensor& gradScale);

}  // namespace strata::ops::cpu
