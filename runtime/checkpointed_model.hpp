// A checkpoint's model, built and checked against the checkpoint's tensors
// (Predictor::from_checkpoint, asgd export).
#pragma once

#include <string>

#include "actors/checkpoint.hpp"
#include "asgd/status.hpp"
#include "compute/model.hpp"

namespace asgd {

/// The model `c` names (or its ModelSpec), holding its parameters and
/// buffers: the same names, shapes and order as this build's model, every
/// value finite. Errors: corruption naming `where` (a layout that does not
/// match, a value that is not finite, a bad normalisation or model_spec),
/// invalid_argument (a model name this build does not know).
Result<Model> checkpointed_model(const Checkpoint& c, const std::string& where);

}  // namespace asgd
