// Strata's public API in one include.
#pragma once

#include "strata/autograd/Checkpoint.h"
#include "strata/autograd/Engine.h"
#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"
#include "strata/autograd/Node.h"
#include "strata/core/Allocator.h"
#include "strata/core/DType.h"
#include "strata/core/Device.h"
#include "strata/core/Error.h"
#include "strata/core/Generator.h"
#include "strata/core/Profiler.h"
#include "strata/core/Stream.h"
#include "strata/core/Tensor.h"
#include "strata/nn/Module.h"
#include "strata/ops/Ops.h"
