#pragma once
// The user's own data, in memory: a job trains on it instead of loading
// JobConfig::dataset from disk (run_job(config, data, ...),
// Runtime::submit(config, data, ...)).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "asgd/status.hpp"

namespace asgd {

/// Samples of one split and their labels.
struct LabeledSamples {
  /// (count, sample...): count samples back to back, each numel(sample_shape)
  /// values, already normalised the way the user wants the model to see them
  /// (the runtime applies no normalisation of its own).
  std::vector<float> values;
  std::vector<std::int32_t> labels;  ///< (count,), each in [0, classes)

  std::size_t count() const { return labels.size(); }  ///< samples: labels.size()
};

/// A labelled dataset the user filled from their own source. Plain data:
/// run_job copies it once, when the job starts (into its own layout), and
/// Runtime::submit copies it before it returns (the job starts later, on
/// its own thread; for a moment the job holds both copies); neither keeps
/// a reference, so the caller may change or free it once the call returns.
struct UserDataset {
  std::string name = "user";  ///< for logs, JobSummary::dataset and checkpoints
  /// One sample's shape: (C, H, W) images, or (N) vectors. Vectors are
  /// handed to models as (1, 1, N), so Predictor::sample_shape() of a model
  /// trained on them reads (1, 1, N); models that start with dense layers
  /// (mlp, a ModelSpec) treat both alike.
  std::vector<std::size_t> sample_shape;
  std::size_t classes = 0;    ///< labels lie in [0, classes), classes >= 2
  LabeledSamples train;       ///< what workers train on, a contiguous slice each: at least a batch per worker
  LabeledSamples validation;  ///< evaluated after each epoch; at least one sample
  LabeledSamples test;        ///< evaluated once at the end; may be empty (final_test_accuracy is then 0)
};

/// Checks `data`: a sample shape of rank 1 or 3 with no zero dimension,
/// classes >= 2, values.size() == count x numel(sample_shape) in every
/// split, labels in [0, classes), every value finite, non-empty train and
/// validation splits. Errors: invalid_argument naming the split and the
/// problem ("user data 'blobs': validation: label 7 of sample 12 is not in
/// [0, 2)"). Cost: one pass over every value.
Status validate(const UserDataset& data);

}  // namespace asgd
