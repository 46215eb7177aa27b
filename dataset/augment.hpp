#pragma once
// Data augmentation for image batches, done by the data feeder as it makes
// each batch: a random crop with padding (the image shifted by up to an
// eighth of its side each way, the uncovered border black) and a horizontal flip with
// chance 1/2, as torchvision's RandomCrop(32, padding=4) and
// RandomHorizontalFlip. Seeded: the same generator state gives the same
// batch, so a run is reproducible.

#include <string>

#include "asgd/status.hpp"
#include "base/random.hpp"
#include "dataset/dataset.hpp"

namespace asgd::data {

struct Augment {
  bool crop = false;
  bool flip = false;
  /// The largest shift of a crop, in pixels; 0: an eighth of the image's
  /// smaller side (4 on CIFAR-10's 32x32, 3 on 28x28), at least 1.
  std::size_t pad = 0;
  bool any() const { return crop || flip; }
};

/// "crop", "flip", "crop,flip" (either order), or "none". Empty: the
/// default for `dataset`, crop and flip for cifar10 and none for the
/// grayscale sets (a flipped digit is another digit, or none).
/// Errors: invalid_argument naming the unknown item.
Result<Augment> parse_augment(const std::string& text, const std::string& dataset);

/// "crop,flip", "crop", "flip" or "none".
std::string to_string(const Augment& a);

/// Augments each sample of `batch` (images shaped as `like`'s, normalised
/// by `norm`) in place, drawing from `rng`.
void augment_batch(Batch& batch, const LabeledImages& like, const Normalization& norm, const Augment& a, Rng& rng);

}  // namespace asgd::data
