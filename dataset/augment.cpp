#include "dataset/augment.hpp"

#include <algorithm>
#include <vector>

#include "base/flag_text.hpp"

namespace asgd::data {

Result<Augment> parse_augment(const std::string& text, const std::string& dataset) {
  Augment a;
  if (text.empty()) {
    a.crop = a.flip = dataset == "cifar10";
    return a;
  }
  if (text == "none") return a;
  for (const std::string& item : split(text, ',')) {
    if (item == "none")
      return Status::InvalidArgument("--augment " + text + ": 'none' stands alone (no crop, no flip)");
    if (item != "crop" && item != "flip")
      return Status::InvalidArgument("--augment " + text + ": unknown item '" + item +
                                     "' (known: crop, flip, or none; join them with ',')");
    bool& on = item == "crop" ? a.crop : a.flip;
    if (on) return Status::InvalidArgument("--augment " + text + ": '" + item + "' given twice");
    on = true;
  }
  return a;
}

std::string to_string(const Augment& a) {
  if (a.crop && a.flip) return "crop,flip";
  if (a.crop) return "crop";
  if (a.flip) return "flip";
  return "none";
}

void augment_batch(Batch& batch, const LabeledImages& like, const Normalization& norm, const Augment& a, Rng& rng) {
  const std::size_t channels = like.channels, rows = like.rows, cols = like.cols;
  const std::size_t plane = rows * cols, sample = channels * plane;
  // The value a black pixel (byte 0) has after normalisation: what the
  // border a shift uncovers is filled with.
  std::vector<float> black(channels);
  for (std::size_t c = 0; c < channels; ++c) {
    black[c] = -channel_value(norm.mean, c) / channel_value(norm.stddev, c);
  }
  const std::size_t shift = a.pad > 0 ? a.pad : std::max<std::size_t>(1, std::min(rows, cols) / 8);
  const long pad = static_cast<long>(shift);
  std::vector<float> copy(sample);
  for (std::size_t k = 0; k < batch.size; ++k) {
    float* x = batch.x.data() + k * sample;
    // Every draw is made whether or not it is used, so "crop" and
    // "crop,flip" shift the same samples the same way.
    const long dy = static_cast<long>(rng.below(2 * shift + 1)) - pad;
    const long dx = static_cast<long>(rng.below(2 * shift + 1)) - pad;
    const bool mirror = rng.below(2) == 1;
    if (!a.crop && !(a.flip && mirror)) continue;
    std::copy(x, x + sample, copy.begin());
    for (std::size_t c = 0; c < channels; ++c)
      for (std::size_t y = 0; y < rows; ++y)
        for (std::size_t xo = 0; xo < cols; ++xo) {
          // Output (y, xo) shows input (y + dy, x + dx), x mirrored first.
          const std::size_t from_x = a.flip && mirror ? cols - 1 - xo : xo;
          const long sy = static_cast<long>(y) + (a.crop ? dy : 0);
          const long sx = static_cast<long>(from_x) + (a.crop ? dx : 0);
          const bool inside = sy >= 0 && sx >= 0 && sy < static_cast<long>(rows) && sx < static_cast<long>(cols);
          x[c * plane + y * cols + xo] =
              inside ? copy[c * plane + static_cast<std::size_t>(sy) * cols + static_cast<std::size_t>(sx)] : black[c];
        }
  }
}

}  // namespace asgd::data
