#pragma once
// Where a model computes. The CPU path is the Model's own layers; a GPU is
// reached through a DeviceModel that the CUDA backend (compute/cuda/, built
// when ASGD_CUDA_ENABLED) makes from the same layers, so one model
// definition runs on either. Parameters and gradients stay in host memory,
// in the model's flat layout: that is what workers pull and push.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "asgd/status.hpp"
#include "compute/layer.hpp"

namespace asgd {

struct Device {
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;  ///< which GPU, for cuda

  /// "cpu", "cuda" (= cuda:0) or "cuda:K". Errors: invalid_argument.
  static Result<Device> parse(const std::string& text);
  std::string str() const;  // "cpu", "cuda:0"
};

/// A model's computation placed on a GPU. Not thread-safe: one per worker,
/// used from one thread at a time. Owns its stream, cuDNN and cuBLAS handles,
/// memory pool and pinned staging buffers; frees them on destruction.
class DeviceModel {
 public:
  virtual ~DeviceModel() = default;

  /// "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string description() const = 0;

  /// Training-mode forward and backward over x (B, sample...) with labels y
  /// (B,): uploads params (P,), writes dL/dparams of the mean softmax
  /// cross-entropy into grads (P,) and returns that loss. BatchNorm running
  /// statistics advance on the device and are copied back into the host
  /// layers' buffers, so the CPU layers always hold the current ones.
  virtual float compute_gradients(std::span<const float> params, std::span<float> grads,
                                  std::span<const float> x, std::span<const std::int32_t> y) = 0;

  /// Inference-mode forward over `batch` samples x (B, sample...), using the
  /// host layers' current running statistics; writes logits (B, classes).
  virtual void infer(std::span<const float> params, std::span<const float> x, std::size_t batch,
                     std::span<float> logits) = 0;

  /// Starts uploading the next training batch while the current one computes
  /// (asynchronous copy from a pinned buffer on the model's stream); a
  /// compute_gradients call with the same x and y then skips its upload.
  /// Optional: without it compute_gradients uploads synchronously.
  virtual void prefetch(std::span<const float> x, std::span<const std::int32_t> y) = 0;

  /// Where the last compute_gradients call's time went: copying parameters
  /// up and gradients down (with their pinned staging, where they stage), and the forward
  /// (with the loss) and backward passes on the device's clock.
  struct StepPhases {
    double copy_s = 0.0;
    double forward_s = 0.0;
    double backward_s = 0.0;
  };
  virtual StepPhases last_step_phases() const = 0;
};

/// How many CUDA devices this process can use. Any failure (built without
/// CUDA, no driver, no GPU) counts as none; `why`, when given, says which.
int cuda_device_count(std::string* why = nullptr);

/// The file the CUDA backend's plugin was loaded from (compute/cuda_backend.hpp),
/// loading it as cuda_device_count does; empty when it could not be loaded
/// and in a build without the backend.
std::string cuda_backend_location();

/// Builds the GPU version of a sequential model. `layers` are the model's
/// CPU layers (read for their configuration and buffers; they must outlive
/// the DeviceModel), `sample_shape` is (C, H, W) or (N,), `param_count` the
/// flat parameter count. Errors: unavailable when CUDA or the device cannot
/// be used, invalid_argument for a layer kind the backend lacks.
Result<std::unique_ptr<DeviceModel>> make_cuda_model(const std::vector<Layer*>& layers, const Shape& sample_shape,
                                                     std::size_t param_count, int device_index);

}  // namespace asgd
