// Catch2 2.x needs a translation unit that defines main; Catch2 3.x links Catch2WithMain instead.
#if !__has_include(<catch2/catch_test_macros.hpp>)
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#endif
