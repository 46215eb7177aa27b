#pragma once
// The one header an embedding program needs: job configuration and
// results (job.hpp), the background Runtime (runtime.hpp), Status (status.hpp).

#include "asgd/job.hpp"     // IWYU pragma: export
#include "asgd/runtime.hpp" // IWYU pragma: export
#include "asgd/status.hpp"  // IWYU pragma: export
