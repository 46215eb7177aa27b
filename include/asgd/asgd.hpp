#pragma once
// The one header an embedding program needs: job configuration and
// results (job.hpp), the background Runtime (runtime.hpp), predictions from a
// trained model (predictor.hpp), the user's own data (dataset.hpp), models
// described from code (model_spec.hpp), Status (status.hpp).

#include "asgd/dataset.hpp"    // IWYU pragma: export
#include "asgd/job.hpp"        // IWYU pragma: export
#include "asgd/log.hpp"        // IWYU pragma: export
#include "asgd/model_spec.hpp" // IWYU pragma: export
#include "asgd/predictor.hpp" // IWYU pragma: export
#include "asgd/runtime.hpp"   // IWYU pragma: export
#include "asgd/status.hpp"    // IWYU pragma: export
