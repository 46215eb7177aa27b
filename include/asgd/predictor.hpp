#pragma once
// Answers "which class is this image?" with a trained model: built from a
// checkpoint (`asgd train --checkpoint-dir DIR`, JobConfig::checkpoint_dir)
// or from the flat parameters a job hands to JobCallbacks::on_final_params.

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "asgd/model_spec.hpp"
#include "asgd/status.hpp"

namespace asgd {

/// A trained model on the CPU, ready to classify samples.
///
/// Inputs come one sample after another, each laid out as the model's
/// sample_size() values ((C, H, W) for images), before normalisation: for
/// the built-in datasets raw pixel values in [0, 1] (an 8-bit image divided
/// by 255); for a model trained on a UserDataset, the values as that data
/// held them (its normalisation is mean 0, stddev 1). The predictor applies
/// the normalisation training used, (x - mean) / stddev, itself, so callers
/// never need the dataset's statistics.
///
/// Owns its model (a private copy of the parameters). Move-only; a
/// moved-from Predictor's predict() answers invalid_argument and its
/// accessors empty values (0, ""). Not thread-safe: predict() reuses scratch buffers, so one thread at a time
/// per Predictor (guard it with a mutex, or give each thread its own).
/// Different Predictors share nothing.
class Predictor {
 public:
  /// Loads DIR/model.ckpt (or DIR itself when it is a file): the model
  /// (by name, or rebuilt from the ModelSpec the checkpoint records), its
  /// parameters, BatchNorm statistics and input normalisation.
  /// Errors: not_found (no checkpoint there), corruption (a damaged file,
  /// one whose layout does not match the model it names, or a parameter
  /// or buffer that is not finite),
  /// invalid_argument (a model name this build does not know).
  static Result<Predictor> from_checkpoint(const std::string& dir);

  /// Builds `model` ("mlp", "lenet", "resnet-mini" or "resnet18", as in
  /// JobConfig::model) for samples of `sample_shape`
  /// (C, H, W) and `classes` outputs, with `params` in the model's flat
  /// layout (copied) and the normalisation training used, one value for
  /// every channel (for MNIST and Fashion-MNIST jobs it is measured on the
  /// training split: the job's JobSummary::input_mean and input_stddev
  /// hold it; a checkpoint records it, per channel for colour images such
  /// as CIFAR-10's, which from_checkpoint applies). BatchNorm statistics keep their initial values (mean 0,
  /// variance 1), so for models with BatchNorm (resnet-mini, resnet18) prefer
  /// from_checkpoint, which carries the trained statistics.
  /// Errors: invalid_argument for an unknown model, a bad shape, a
  /// parameter count that does not match, a parameter that is not finite,
  /// input_stddev <= 0 or a mean or stddev that is not finite.
  static Result<Predictor> from_params(const std::string& model, const std::vector<std::size_t>& sample_shape,
                                       std::size_t classes, std::span<const float> params,
                                       float input_mean = 0.0f, float input_stddev = 1.0f);

  /// As above for a model built from `spec` (JobConfig::model_spec). For
  /// a job on user data pass its UserDataset::sample_shape ((N) vectors
  /// are accepted) and mean 0, stddev 1: such a job normalises nothing.
  /// Errors: as above, and invalid_argument when `spec` does not fit the
  /// shape and classes.
  static Result<Predictor> from_params(const ModelSpec& spec, const std::vector<std::size_t>& sample_shape,
                                       std::size_t classes, std::span<const float> params,
                                       float input_mean = 0.0f, float input_stddev = 1.0f);

  Predictor(Predictor&&) noexcept;
  Predictor& operator=(Predictor&&) noexcept;
  ~Predictor();

  /// The class (in [0, classes())) with the largest score for each of the
  /// n = samples.size() / sample_size() samples in `samples` (n, C, H, W),
  /// before normalisation (raw pixels in [0, 1] for the built-in datasets;
  /// see above). An empty span gives an empty vector. Errors:
  /// invalid_argument when samples.size() is not a multiple of
  /// sample_size(), or when a value is not finite. Cost: one inference
  /// forward pass over the samples, in chunks that keep its activations
  /// within about 256 MiB (1000 samples for small models, about 40 for
  /// resnet18 on 28x28 images).
  Result<std::vector<int>> predict(std::span<const float> samples);

  /// The model's name (ModelSpec's, or a built-in model's: "mlp", ...).
  const std::string& model() const;
  /// Classes the model scores: predictions are in [0, classes()).
  std::size_t classes() const;
  /// Values per sample: C * H * W.
  std::size_t sample_size() const;
  /// A sample's shape, (C, H, W).
  const std::vector<std::size_t>& sample_shape() const;

 private:
  struct Impl;
  explicit Predictor(std::unique_ptr<Impl> impl);
  static Result<Predictor> from_params_impl(const std::string& model, const ModelSpec* spec,
                                            const std::vector<std::size_t>& sample_shape, std::size_t classes,
                                            std::span<const float> params, float input_mean, float input_stddev);
  std::unique_ptr<Impl> impl_;
};

}  // namespace asgd
