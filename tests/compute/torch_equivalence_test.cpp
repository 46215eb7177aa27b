// Our models against the equivalent torch.nn modules (bench/torch_compute.py)
// on the same parameters and batch: the same loss, gradients and BatchNorm
// running statistics, with parameters matched by name, which is also what
// makes exported weights load into PyTorch. Skipped without python3-torch.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <vector>

#include "compute/model.hpp"
#include "base/random.hpp"
#include "temp_dir.hpp"

namespace asgd {
namespace {

namespace fs = std::filesystem;

template <class T>
void write_raw(const fs::path& p, std::span<const T> values) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size_bytes()));
}

// With `logits`, also the inference-mode logits after the training step
// (our running statistics loaded into torch's), as an exported model gives.
void check_against_torch(const std::string& name, const Shape& sample = {1, 28, 28}, bool logits = false) {
  SCOPED_TRACE(name);
  const asgd_test::TempDir dir;
  auto built = Model::build(name, sample, 10);
  ASSERT_TRUE(built.ok());
  Model& model = built.value();
  model.init_params(21);
  Rng rng(22);
  constexpr std::size_t kBatch = 16;
  std::vector<float> x(kBatch * numel(sample));
  std::vector<std::int32_t> y(kBatch);
  for (float& v : x) v = rng.uniform(-0.5f, 2.5f);
  for (auto& l : y) l = static_cast<std::int32_t>(rng.below(10));
  const float loss = model.compute_gradients(x, y);
  const std::vector<float> gradients(model.grads().begin(), model.grads().end());
  if (logits) write_raw<float>(dir.path() / "logits.f32", std::span<const float>(model.scores(x)));

  nlohmann::json c = {{"model", name}, {"loss", loss}, {"x_shape", {kBatch, sample[0], sample[1], sample[2]}}};
  for (const ParamEntry& e : model.layout())
    c["layout"].push_back({{"name", e.name}, {"shape", e.shape}, {"offset", e.offset}, {"size", e.size}});
  std::vector<float> buffers;
  c["buffers"] = nlohmann::json::array();
  for (const LayerBuffer& b : model.buffers()) {
    c["buffers"].push_back({{"name", b.name}, {"size", b.values.size()}});
    buffers.insert(buffers.end(), b.values.begin(), b.values.end());
  }
  std::ofstream(dir.path() / "case.json") << c.dump();
  write_raw<float>(dir.path() / "params.f32", std::as_const(model).params());
  write_raw<float>(dir.path() / "grads.f32", std::span<const float>(gradients));
  write_raw<float>(dir.path() / "buffers.f32", buffers);
  write_raw<float>(dir.path() / "x.f32", x);
  write_raw<std::int32_t>(dir.path() / "y.i32", y);

  const fs::path out = dir.path() / "out.json";
  const std::string cmd = "/usr/bin/python3 " + std::string(ASGD_SOURCE_DIR) + "/tests/compute/torch_reference.py " +
                          dir.path().string() + " >" + out.string() + " 2>" + (dir.path() / "err").string();
  const int status = std::system(cmd.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::stringstream err;
  err << std::ifstream(dir.path() / "err").rdbuf();
  if (code == 77) GTEST_SKIP() << err.str();
  ASSERT_EQ(code, 0) << err.str();
  const auto r = nlohmann::json::parse(std::ifstream(out));

  EXPECT_NEAR(r["loss_ours"].get<double>(), r["loss_torch"].get<double>(), 1e-5 * std::abs(loss) + 1e-6);
  // float32 sums in a different order: relative to each tensor's largest
  // gradient, differences stay near 1e-6 (measured up to 4e-6).
  for (const auto& [tensor, rel] : r["grad_rel"].items()) EXPECT_LT(rel.get<double>(), 1e-4) << tensor;
  for (const auto& [buffer, rel] : r["buffer_rel"].items()) EXPECT_LT(rel.get<double>(), 1e-5) << buffer;
  EXPECT_EQ(r["grad_rel"].size(), model.layout().size());
  if (logits) {
    ASSERT_TRUE(r["logits_rel"].is_number()) << r.dump();
    EXPECT_LT(r["logits_rel"].get<double>(), 1e-4);
  }
}

TEST(TorchEquivalence, MlpMatchesTorchGradientsByName) { check_against_torch("mlp"); }
TEST(TorchEquivalence, LenetMatchesTorchGradientsByName) { check_against_torch("lenet"); }
// On 3x8x8 inputs, where every stage still has pixels (8, 4, 2, 1), in a
// few seconds instead of a 32x32 batch's minute.
TEST(TorchEquivalence, Resnet18MatchesTorchGradientsRunningStatisticsAndInferenceLogitsByName) {
  check_against_torch("resnet18", {3, 8, 8}, true);
}

TEST(TorchEquivalence, ResnetMiniMatchesTorchGradientsAndRunningStatisticsByName) {
  check_against_torch("resnet-mini");
}

}  // namespace
}  // namespace asgd
