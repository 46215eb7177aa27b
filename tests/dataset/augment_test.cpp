// Augmentation: what --augment accepts, that a crop is a shift with a black
// border and a flip a mirror, and that the data feeder's batches are the
// same for the same seed.

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "actors/data_feeder.hpp"
#include "dataset/augment.hpp"

namespace asgd::data {
namespace {

TEST(Augment, ParsesItsItemsWithADefaultPerDataset) {
  EXPECT_EQ(to_string(*parse_augment("", "cifar10")), "crop,flip");
  EXPECT_EQ(to_string(*parse_augment("", "mnist")), "none");
  EXPECT_EQ(to_string(*parse_augment("none", "cifar10")), "none");
  EXPECT_EQ(to_string(*parse_augment("flip,crop", "mnist")), "crop,flip");
  EXPECT_EQ(to_string(*parse_augment("flip", "mnist")), "flip");
  const auto bad = parse_augment("crop,rotate", "mnist");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown item 'rotate'"), std::string::npos) << bad.status().message();
  EXPECT_NE(parse_augment("crop,crop", "mnist").status().message().find("'crop' given twice"), std::string::npos);
  EXPECT_NE(parse_augment("crop,none", "mnist").status().message().find("'none' stands alone"), std::string::npos);
}

// A batch of `n` 2-channel 6x5 images whose every pixel value is distinct
// (and none is the black value), with normalisation mean 0.5, stddev 0.25
// (black: -2).
struct Images {
  LabeledImages like;
  Normalization norm{{0.5f}, {0.25f}};
  Batch batch;
};
Images images(std::size_t n) {
  Images im;
  im.like.channels = 2;
  im.like.rows = 6;
  im.like.cols = 5;
  im.batch.size = n;
  im.batch.x.resize(n * 60);
  for (std::size_t i = 0; i < im.batch.x.size(); ++i) im.batch.x[i] = static_cast<float>(i + 1);
  im.batch.y.assign(n, 0);
  return im;
}

// Is `out` the image `in` shifted by (dy, dx), optionally mirrored first,
// with `black` where the shift uncovers the border?
bool shifted(const float* in, const float* out, long dy, long dx, bool mirror, float black) {
  for (long c = 0; c < 2; ++c)
    for (long y = 0; y < 6; ++y)
      for (long x = 0; x < 5; ++x) {
        const long sx = (mirror ? 4 - x : x) + dx, sy = y + dy;
        const bool inside = sy >= 0 && sx >= 0 && sy < 6 && sx < 5;
        if (out[c * 30 + y * 5 + x] != (inside ? in[c * 30 + sy * 5 + sx] : black)) return false;
      }
  return true;
}

TEST(Augment, ACropIsAShiftOfAtMostFourPixelsWithABlackBorderAndAFlipAMirror) {
  const Images before = images(64);
  for (const char* what : {"crop", "flip", "crop,flip"}) {
    Images im = images(64);
    Rng rng(11);
    augment_batch(im.batch, im.like, im.norm, *parse_augment(what, "mnist"), rng);
    const bool crop = std::string(what) != "flip", flip = std::string(what) != "crop";
    int mirrored = 0, moved = 0;
    for (std::size_t k = 0; k < 64; ++k) {
      const float* in = before.batch.x.data() + k * 60;
      const float* out = im.batch.x.data() + k * 60;
      bool explained = false;
      for (long dy = -4; dy <= 4 && !explained; ++dy)
        for (long dx = -4; dx <= 4 && !explained; ++dx)
          for (bool mirror : {false, true}) {
            if ((!crop && (dy != 0 || dx != 0)) || (!flip && mirror)) continue;
            if (shifted(in, out, dy, dx, mirror, -2.0f)) {
              explained = true;
              mirrored += mirror;
              moved += dy != 0 || dx != 0;
              break;
            }
          }
      EXPECT_TRUE(explained) << what << ": sample " << k << " is not a shift or mirror of its input";
    }
    // Over 64 samples both outcomes of each draw occur.
    if (flip) {
      EXPECT_GT(mirrored, 10) << what;
      EXPECT_LT(mirrored, 54) << what;
    }
    if (crop) {
      EXPECT_GT(moved, 40) << what;
    }
  }
}

TEST(Augment, TheDataFeedersBatchesAreTheSameForTheSameSeedAndDifferForAnother) {
  auto data = std::make_shared<DatasetSplits>();
  data->train = images(40).like;
  data->train.count = 40;
  data->train.pixels = images(40).batch.x;
  data->train.labels.assign(40, 1);
  data->normalization = {{0.5f}, {0.25f}};
  const Augment augment = *parse_augment("crop,flip", "cifar10");
  auto batches = [&](std::uint64_t seed, const Augment& a) {
    BatchSource source({data, {0, 40}, 2, 8, 1, seed, 1, 0, a});
    std::vector<float> all;
    while (!source.exhausted()) {
      const Batch b = source.next();
      all.insert(all.end(), b.x.begin(), b.x.end());
    }
    return all;
  };
  const auto first = batches(5, augment);
  EXPECT_EQ(first, batches(5, augment));
  EXPECT_NE(first, batches(6, augment));
  EXPECT_NE(first, batches(5, Augment{}));
  EXPECT_EQ(first.size(), batches(5, Augment{}).size());
}

}  // namespace
}  // namespace asgd::data
