// The CPU test executable: the reference and host-side conversions, and argument validation.
#include "harness.hpp"

HARNESS_MAIN()
