// One include for Catch2 2.x (Debian 12) and 3.x (Ubuntu 24.04).
#pragma once

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#endif

// GPU tests carry the [cuda] tag and call this first: it skips (passes with a note) without a GPU.
#include "strata/core/Device.h"
#define STRATA_REQUIRE_CUDA()          \
  do {                                 \
    if (!::strata::cudaAvailable()) {  \
      WARN("no CUDA device: skipped"); \
      return;                          \
    }                                  \
  } while (0)
