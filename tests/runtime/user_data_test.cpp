// Jobs on the user's own data (asgd/dataset.hpp) and on models described
// from code (asgd/model_spec.hpp), through the public API.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stop_token>
#include <vector>

#include "asgd/asgd.hpp"
#include "dataset/dataset.hpp"
#include "actors/checkpoint.hpp"
#include "cli/cli_run.hpp"
#include "runtime/cluster.hpp"
#include "temp_dir.hpp"
#include "test_data.hpp"

namespace asgd {
namespace {

// Two Gaussian blobs in `dim` dimensions, centred at -1.5 and +1.5 on every
// axis with unit spread: a linear classifier separates them almost surely.
LabeledSamples blobs(std::size_t count, std::size_t dim, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  LabeledSamples s;
  for (std::size_t i = 0; i < count; ++i) {
    const std::int32_t label = static_cast<std::int32_t>(i % 2);
    for (std::size_t d = 0; d < dim; ++d) s.values.push_back((label ? 1.5f : -1.5f) + noise(rng));
    s.labels.push_back(label);
  }
  return s;
}

std::shared_ptr<UserDataset> blob_dataset() {
  auto data = std::make_shared<UserDataset>();
  data->name = "blobs";
  data->sample_shape = {8};
  data->classes = 2;
  data->train = blobs(600, 8, 1);
  data->validation = blobs(200, 8, 2);
  data->test = blobs(200, 8, 3);
  return data;
}

JobConfig small_job() {
  JobConfig c;
  c.workers = 2;
  c.epochs = 4;
  c.batch = 16;
  c.lr = 0.02;
  return c;
}

TEST(UserData, AJobTrainsOnVectorSamplesTheUserHandsIn) {
  std::vector<EpochMetrics> seen;
  JobCallbacks callbacks;
  callbacks.on_epoch = [&](const EpochMetrics& m) { seen.push_back(m); };
  auto result = run_job(small_job(), blob_dataset(), callbacks);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_GE(result->final_test_accuracy, 0.97);
  EXPECT_EQ(result->dataset, "blobs");
  EXPECT_EQ(result->model, "mlp");
  EXPECT_EQ(seen.size(), 4u);
}

// A name that is not UTF-8 (a host's bytes, a file name) ends neither the
// job nor the host: the metrics file, the checkpoint and the spec's JSON
// write U+FFFD for it (issue 27, items 4 and 6).
// A job stopped from its own epoch callback ends cancelled and calls back
// no more, even a job so small that every epoch's report was queued
// behind the stop (its later epochs were still called back, and it ended
// ok); the same through a Runtime handle.
TEST(UserData, AJobStoppedFromItsEpochCallbackEndsCancelledWithNoCallbackAfter) {
  std::stop_source stop;
  std::vector<std::uint32_t> epochs;
  JobCallbacks callbacks;
  callbacks.on_epoch = [&](const EpochMetrics& m) {
    epochs.push_back(m.epoch);
    stop.request_stop();
  };
  const auto result = run_job(small_job(), blob_dataset(), callbacks, stop.get_token());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::cancelled) << result.status().to_string();
  EXPECT_EQ(epochs, std::vector<std::uint32_t>{1});

  Runtime rt;
  std::optional<JobHandle> handle;
  std::mutex mu;
  epochs.clear();
  JobCallbacks cancel_in_callback;
  cancel_in_callback.on_epoch = [&](const EpochMetrics& m) {
    epochs.push_back(m.epoch);
    std::lock_guard lock(mu);
    handle->cancel();
  };
  {
    std::lock_guard lock(mu);
    auto job = rt.submit(small_job(), blob_dataset(), cancel_in_callback);
    ASSERT_TRUE(job.ok()) << job.status().to_string();
    handle = *job;
  }
  EXPECT_EQ(handle->wait().status().code(), StatusCode::cancelled);
  EXPECT_EQ(epochs, std::vector<std::uint32_t>{1});
}

TEST(UserData, NamesThatAreNotUtf8AreWrittenWithReplacementCharactersNotThrown) {
  const asgd_test::TempDir dir;
  auto data = blob_dataset();
  data->name = "blobs\xff\xfe";
  JobConfig c = small_job();
  c.epochs = 1;
  c.metrics_out = (dir / "m.jsonl").string();
  c.checkpoint_dir = (dir / "ckpt").string();
  c.model_spec = std::make_shared<const ModelSpec>(ModelSpec("spec\xc3").dense(16).relu().dense(2));
  auto result = run_job(c, data, {});
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  const std::string metrics = asgd_test::slurp(dir / "m.jsonl");
  EXPECT_NE(metrics.find("blobs\xef\xbf\xbd"), std::string::npos) << metrics;
  EXPECT_NO_THROW((void)ModelSpec("\xff").dense(2).to_json());
  EXPECT_NE(ModelSpec("\xff").dense(2).to_json().find("\xef\xbf\xbd"), std::string::npos);
}

TEST(UserData, ARuntimeRunsAJobOnUserDataAndTheCallerMayDropItsCopyAtOnce) {
  Runtime runtime;
  auto data = blob_dataset();
  auto handle = runtime.submit(small_job(), data);
  ASSERT_TRUE(handle.ok()) << handle.status().to_string();
  data.reset();
  const auto& result = handle->wait();
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_GE(result->final_test_accuracy, 0.97);
}

// The docs promise the data is the caller's again once submit returns; the
// job started later, on its thread, and read whatever the caller had put
// there by then (a race: trained on the negated values, or refused the
// cleared ones as "no samples"). From the embedding API audit, 2026-11-28.
TEST(UserData, WhatTheCallerDoesToItsDataAfterSubmitReturnsDoesNotReachTheJob) {
  Runtime runtime;
  auto data = blob_dataset();
  auto handle = runtime.submit(small_job(), data);
  ASSERT_TRUE(handle.ok()) << handle.status().to_string();
  for (float& v : data->train.values) v = -v;  // would teach the opposite labels
  data->validation = {};
  data->test.labels.clear();
  const auto& result = handle->wait();
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_GE(result->final_test_accuracy, 0.97);
  EXPECT_EQ(result->input_mean, std::vector<float>{0.0f}) << "user data is taken as normalised";
  EXPECT_EQ(result->input_stddev, std::vector<float>{1.0f});
}

// What validate(config, data) promises ("checks every field"): no setting
// that a job on this data refuses once started passes it, and the one
// setting such a job ignores (validation_size) is not checked.
TEST(UserData, ValidateRefusesWhatTheJobWouldAndIgnoresTheValidationSize) {
  auto data = blob_dataset();
  JobConfig c = small_job();
  c.validation_size = 0;
  EXPECT_TRUE(validate(c, *data).ok()) << validate(c, *data).to_string();
  struct Case {
    const char* what;
    std::function<void(JobConfig&)> spoil;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"a status address that is none", [](JobConfig& j) { j.status_port = 1; j.status_address = "not an address"; },
       "--status-address not an address: not an IP address"},
      {"crops of vectors", [](JobConfig& j) { j.augment = "crop,flip"; }, "this job's own samples are vectors"},
      // Under a ModelSpec too (it was taken, and blanked two samples in three).
      {"crops of vectors under a model spec",
       [](JobConfig& j) {
         j.augment = "crop";
         j.model_spec = std::make_shared<const ModelSpec>(ModelSpec("vec").dense(8).relu().dense(2));
       },
       "this job's own samples are vectors"},
      {"lenet on vectors", [](JobConfig& j) { j.model = "lenet"; }, "model 'lenet' needs image samples"},
  };
  for (const Case& k : cases) {
    JobConfig bad = small_job();
    k.spoil(bad);
    const Status s = validate(bad, *data);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << k.what;
    EXPECT_NE(s.message().find(k.expected), std::string::npos) << k.what << ": " << s.message();
    Runtime runtime;
    EXPECT_EQ(runtime.submit(bad, data).status().code(), StatusCode::invalid_argument) << k.what;
  }
  // The default for a job's own data is none, whatever config.dataset
  // names (cifar10's crop,flip refused vectors the job never asked to crop).
  JobConfig cifar_named = small_job();
  cifar_named.dataset = "cifar10";
  EXPECT_TRUE(validate(cifar_named, *data).ok()) << validate(cifar_named, *data).to_string();
  // Images under 8 pixels on a side: a crop's pixel is too much of them.
  UserDataset rows = *data;
  rows.sample_shape = {1, 1, 8};
  JobConfig crop = small_job();
  crop.augment = "crop";
  EXPECT_NE(validate(crop, rows).message().find("images are 1x8, under 8 on a side"), std::string::npos)
      << validate(crop, rows).message();
  JobConfig named;
  named.status_port = 1;
  named.status_address = "localhost";  // a name, not an address: the server binds addresses
  EXPECT_EQ(validate(named).code(), StatusCode::invalid_argument);
  named.status_address = "::1";
  EXPECT_TRUE(validate(named).ok()) << validate(named).to_string();
}

TEST(UserData, BadDataIsRefusedWithAMessageNamingTheProblem) {
  struct Case {
    const char* what;
    std::function<void(UserDataset&)> spoil;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"a rank-2 shape", [](UserDataset& d) { d.sample_shape = {2, 4}; }, "must be (C, H, W) for images or (N)"},
      {"a zero dimension", [](UserDataset& d) { d.sample_shape = {1, 0, 8}; }, "has a zero dimension"},
      {"one class", [](UserDataset& d) { d.classes = 1; }, "classes must be >= 2"},
      {"a missing value", [](UserDataset& d) { d.train.values.pop_back(); }, "train: 4799 values for 600 labels"},
      {"a label out of range", [](UserDataset& d) { d.validation.labels[12] = 7; },
       "validation: label 7 of sample 12 is not in [0, 2)"},
      {"a negative label", [](UserDataset& d) { d.test.labels[0] = -1; }, "test: label -1 of sample 0"},
      {"a NaN", [](UserDataset& d) { d.train.values[8 * 5 + 3] = std::numeric_limits<float>::quiet_NaN(); },
       "train: value 3 of sample 5 is not finite"},
      {"an infinity", [](UserDataset& d) { d.test.values[0] = std::numeric_limits<float>::infinity(); },
       "test: value 0 of sample 0 is not finite"},
      {"no training samples", [](UserDataset& d) { d.train = {}; }, "train: no samples"},
      {"no validation samples", [](UserDataset& d) { d.validation = {}; }, "validation: no samples"},
      {"a shape whose size overflows", [](UserDataset& d) { d.sample_shape = {(std::size_t{1} << 61) + 1, 8, 1}; },
       "has more than 2147483648 values per sample"},
  };
  for (const Case& c : cases) {
    auto data = blob_dataset();
    c.spoil(*data);
    const Status s = validate(*data);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << c.what;
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << c.what << ": " << s.message();
    EXPECT_NE(s.message().find("user data 'blobs'"), std::string::npos) << s.message();
    // run_job and Runtime::submit refuse it before starting anything.
    auto result = run_job(small_job(), data);
    EXPECT_EQ(result.status().code(), StatusCode::invalid_argument) << c.what;
    Runtime runtime;
    EXPECT_EQ(runtime.submit(small_job(), data).status().code(), StatusCode::invalid_argument) << c.what;
  }
  EXPECT_EQ(run_job(small_job(), std::shared_ptr<const UserDataset>()).status().code(),
            StatusCode::invalid_argument);
  Runtime runtime;  // a null dataset is refused, not taken for config.dataset (issue 27)
  EXPECT_EQ(runtime.submit(small_job(), std::shared_ptr<const UserDataset>()).status().code(),
            StatusCode::invalid_argument);
  auto empty_test = blob_dataset();
  empty_test->test = {};
  EXPECT_TRUE(validate(*empty_test).ok()) << "a test split is optional";
}

TEST(UserData, MoreWorkersThanTrainingSamplesIsRefused) {
  auto data = blob_dataset();
  data->train = blobs(3, 8, 1);
  JobConfig c = small_job();
  c.workers = 4;
  auto result = run_job(c, data);
  EXPECT_EQ(result.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(result.status().message().find("more workers than the 3 training samples"), std::string::npos)
      << result.status().message();
  // validate() and Runtime::submit say it too, before anything starts (they
  // said ok, and the job failed once started); so for a batch larger than a
  // worker's share.
  EXPECT_EQ(validate(c, *data).code(), StatusCode::invalid_argument);
  Runtime rt;
  EXPECT_EQ(rt.submit(c, data).status().code(), StatusCode::invalid_argument);
  data->train = blobs(600, 8, 1);
  c.workers = 2;
  c.batch = 400;
  const Status share = validate(c, *data);
  EXPECT_NE(share.message().find("worker 0's share of the 600 training samples is 300, less than its batch of 400"),
            std::string::npos)
      << share.message();
}

TEST(ModelSpec, SizesAreInferredSoALenetSpecHasLenetsParameterCount) {
  const ModelSpec lenet = ModelSpec("my-lenet")
                              .conv2d(16, 5).relu().max_pool(2)
                              .conv2d(32, 5).relu().max_pool(2)
                              .flatten().dense(128).relu().dense(10);
  auto n = validate(lenet, {1, 28, 28}, 10);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(*n, 80'202u);  // Model::build("lenet")'s count
}

// A spec with nothing to train, or one that does not fit a named
// dataset's images or classes, is refused when the job is submitted,
// nothing started (the job failed at wait(), or was told "--shards 1
// exceeds the model's 0 parameters").
TEST(ModelSpec, ASpecWithNothingToTrainOrNotFittingTheDatasetIsRefusedAtSubmit) {
  const auto flat = validate(ModelSpec("flat").relu().flatten(), {10}, 10);  // 10 values in, 10 classes out
  ASSERT_FALSE(flat.ok());
  EXPECT_NE(flat.status().message().find("model spec 'flat' has no parameters to train"), std::string::npos)
      << flat.status().message();
  JobConfig c;
  c.model_spec = std::make_shared<const ModelSpec>(ModelSpec("three-classes").dense(16).relu().dense(3));
  Runtime rt;
  const auto job = rt.submit(c);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(job.status().message().find("model spec 'three-classes' on mnist: "), std::string::npos)
      << job.status().message();
}

TEST(ModelSpec, DenseFlattensImagesItselfAndVectorsNeedNoFlatten) {
  auto images = validate(ModelSpec().dense(10), {1, 28, 28}, 10);
  ASSERT_TRUE(images.ok()) << images.status().to_string();
  EXPECT_EQ(*images, 784u * 10 + 10);
  auto vectors = validate(ModelSpec().dense(4).relu().dropout(0.5).dense(2), {8}, 2);
  ASSERT_TRUE(vectors.ok()) << vectors.status().to_string();
  EXPECT_EQ(*vectors, 8u * 4 + 4 + 4 * 2 + 2);
}

TEST(ModelSpec, AResidualBlockBuildsWhenBothPathsAgree) {
  const ModelSpec block_main = ModelSpec().conv2d(8, 3, 2, 1, false).batch_norm().relu().conv2d(8, 3, 1, 1, false).batch_norm();
  const ModelSpec projection = ModelSpec().conv2d(8, 1, 2, 0, false).batch_norm();
  const ModelSpec net = ModelSpec("tiny-resnet").conv2d(4, 3, 1, 1).relu().residual(block_main, projection).relu()
                            .global_avg_pool().dense(10);
  auto n = validate(net, {1, 28, 28}, 10);
  EXPECT_TRUE(n.ok()) << n.status().to_string();
  const ModelSpec mismatched = ModelSpec().residual(block_main).global_avg_pool().dense(10);  // identity shortcut
  auto bad = validate(mismatched, {1, 28, 28}, 10);
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(bad.status().message().find("the main path gives (8, 14, 14), the shortcut (1, 28, 28)"),
            std::string::npos)
      << bad.status().message();
}

TEST(ModelSpec, MisuseIsRefusedWithTheLayerNamed) {
  struct Case {
    ModelSpec spec;
    std::vector<std::size_t> shape;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {ModelSpec("empty"), {1, 28, 28}, "the spec has no layers"},
      {ModelSpec().flatten().conv2d(8, 3).dense(10), {1, 28, 28}, "layer 1 (conv2d): needs (C, H, W) input"},
      {ModelSpec().dense(32).max_pool(2).dense(10), {1, 28, 28}, "layer 1 (max_pool): needs (C, H, W) input"},
      {ModelSpec().dense(32).batch_norm().dense(10), {8}, "layer 1 (batch_norm): needs (C, H, W) input"},
      {ModelSpec().conv2d(8, 29).flatten().dense(10), {1, 28, 28}, "layer 0 (conv2d): kernel 29 is larger"},
      {ModelSpec().max_pool(30).flatten().dense(10), {1, 28, 28}, "layer 0 (max_pool): window 30 is larger"},
      {ModelSpec().conv2d(0, 3).flatten().dense(10), {1, 28, 28}, "layer 0 (conv2d): out_channels, kernel and stride"},
      {ModelSpec().dense(0).dense(10), {8}, "layer 0 (dense): needs at least 1 output"},
      {ModelSpec().dense(16).dropout(1.0).dense(10), {8}, "layer 1 (dropout): p must be in [0, 1)"},
      {ModelSpec("short").dense(16).relu(), {8}, "the last layer gives (16), the data has 10 classes"},
  };
  for (const Case& c : cases) {
    auto n = validate(c.spec, c.shape, 10);
    EXPECT_EQ(n.status().code(), StatusCode::invalid_argument) << c.expected;
    EXPECT_NE(n.status().message().find(c.expected), std::string::npos) << n.status().message();
  }
  // A job checks its spec against the data before it starts.
  JobConfig c = small_job();
  c.model_spec = std::make_shared<const ModelSpec>(ModelSpec().conv2d(4, 3).flatten().dense(2));
  auto data = blob_dataset();
  auto result = run_job(c, data);
  EXPECT_EQ(result.status().code(), StatusCode::invalid_argument);
  EXPECT_NE(result.status().message().find("kernel 3 is larger"), std::string::npos) << result.status().message();
  c.model_spec = std::make_shared<const ModelSpec>("nothing");
  EXPECT_EQ(validate(c).code(), StatusCode::invalid_argument);
}

TEST(ModelSpec, JsonRoundTripsEveryLayerKind) {
  const ModelSpec spec = ModelSpec("all")
                             .conv2d(4, 3, 2, 1, false).batch_norm().relu().max_pool(2, 1)
                             .residual(ModelSpec().conv2d(4, 3, 1, 1).relu())
                             .dropout(0.25).global_avg_pool().flatten().dense(3);
  auto back = ModelSpec::from_json(spec.to_json());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->name(), "all");
  EXPECT_EQ(back->to_json(), spec.to_json());
  EXPECT_EQ(ModelSpec::from_json("{\"name\": \"x\", \"layers\": [{\"kind\": \"lstm\"}]}").status().code(),
            StatusCode::invalid_argument);
  EXPECT_EQ(ModelSpec::from_json("not json").status().code(), StatusCode::invalid_argument);
}

TEST(ModelSpec, ACheckpointRecordsTheSpecSoAPredictorRebuildsIt) {
  const asgd_test::TempDir scratch;
  JobConfig c = small_job();
  c.model_spec = std::make_shared<const ModelSpec>(ModelSpec("blob-net").dense(16).relu().dense(2));
  c.checkpoint_dir = scratch.path().string();
  auto data = blob_dataset();
  std::vector<float> final_params;
  JobCallbacks callbacks;
  callbacks.on_final_params = [&](std::span<const float> p) { final_params.assign(p.begin(), p.end()); };
  auto result = run_job(c, data, callbacks);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->model, "blob-net");
  EXPECT_GE(result->final_test_accuracy, 0.97);

  auto ckpt = read_checkpoint(c.checkpoint_dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  auto recorded = ModelSpec::from_json(ckpt->model_spec);
  ASSERT_TRUE(recorded.ok()) << recorded.status().to_string();
  EXPECT_EQ(recorded->to_json(), c.model_spec->to_json());
  EXPECT_EQ(ckpt->dataset, "blobs");
  EXPECT_TRUE(write_safetensors((scratch.path() / "model.safetensors").string(), *ckpt).ok()) << "asgd export";

  auto predictor = Predictor::from_checkpoint(c.checkpoint_dir);
  ASSERT_TRUE(predictor.ok()) << predictor.status().to_string();
  EXPECT_EQ(predictor->model(), "blob-net");
  EXPECT_EQ(predictor->sample_size(), 8u);
  auto from_params = Predictor::from_params(*c.model_spec, data->sample_shape, 2, final_params);
  ASSERT_TRUE(from_params.ok()) << from_params.status().to_string();
  auto a = predictor->predict(data->test.values);
  auto b = from_params->predict(data->test.values);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  std::size_t hits = 0;
  for (std::size_t i = 0; i < a->size(); ++i) hits += (*a)[i] == data->test.labels[i];
  EXPECT_GE(static_cast<double>(hits) / static_cast<double>(a->size()), 0.97);
}

TEST(ModelSpec, AClusterJobRefusesASpecBecauseItIsNotCarriedAcrossProcesses) {
  JobConfig c;
  c.model_spec = std::make_shared<const ModelSpec>(ModelSpec().dense(10));
  const Status s = validate_for_cluster(c, WorkersOn::their_hosts);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("not carried across processes"), std::string::npos) << s.message();
}

// MNIST through the user-data path: the test takes it from the internal
// loader (already normalised) and hands a subset in as a UserDataset.
TEST(UserData, ACnnFromAModelSpecTrainsOnMnistHandedInAsUserData) {
  ASGD_REQUIRE_DATASET(dir, "mnist");
  auto loaded = data::load_dataset("mnist", dir, 1000, 1);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  auto take = [](const data::LabeledImages& from, std::size_t n) {
    n = std::min(n, from.count);
    LabeledSamples s;
    s.values = from.samples(0, n);
    s.labels.assign(from.labels.begin(), from.labels.begin() + static_cast<std::ptrdiff_t>(n));
    return s;
  };
  auto data = std::make_shared<UserDataset>();
  data->name = "mnist-subset";
  data->sample_shape = {1, 28, 28};
  data->classes = 10;
  data->train = take(loaded->train, 12000);
  data->validation = take(loaded->validation, 1000);
  data->test = take(loaded->test, 2000);

  JobConfig c;
  c.workers = 2;
  c.epochs = 1;
  c.batch = 32;
  c.policy = "bsp";  // bitwise reproducible: the accuracy cannot depend on how busy the machine is
  c.model_spec = std::make_shared<const ModelSpec>(
      ModelSpec("small-cnn").conv2d(8, 5).relu().max_pool(2).flatten().dense(64).relu().dense(10));
  auto result = run_job(c, data);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->model, "small-cnn");
  EXPECT_EQ(result->dataset, "mnist-subset");
  EXPECT_GE(result->final_test_accuracy, 0.90);
}

}  // namespace
}  // namespace asgd
