#pragma once
// The CUDA backend's mirror of a model: a tree of nodes (a Residual holds its
// two paths), one per CPU layer, each run by the GpuOps of its layer kind.
// Every kind's GPU version is one GpuOps entry in lowerings.cpp, found by
// the name Layer::kind() gives; CudaModel (device_model.cpp) walks the tree.
// Host code only: kernels are in kernels.cu.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "asgd/status.hpp"
#include "compute/cuda/cudnn.hpp"
#include "compute/cuda/memory.hpp"
#include "compute/layer.hpp"

namespace asgd {
class BatchNorm2D;
class Dropout;
}

namespace asgd::cuda {

/// A per-sample shape: (C, H, W) for images; a vector (N) is (N, 1, 1).
struct Dims {
  std::size_t c = 0, h = 1, w = 1;
  bool image = false;
  std::size_t numel() const { return c * h * w; }
  std::size_t plane() const { return h * w; }
  std::string str() const;  // "(C, H, W)" or "(N)"
};

/// The three algorithms a convolution uses at one batch size.
struct ConvAlgos {
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  std::size_t workspace = 0;  // bytes: the most any of the three needs
};

struct GpuOps;

struct Node {
  const GpuOps* ops = nullptr;  // its layer kind's GPU code
  std::string path;             // "4.main.1": where it sits in the model
  std::string name;             // "layer 4.main.1 (batchnorm2d)", for messages
  std::size_t index = 0;        // position in a walk over all nodes; seeds dropout
  Dims in, out;                 // per sample
  std::size_t params = 0;       // offset of the node's first parameter in the flat vector
  bool needs_dx = true;         // whether backward must produce dL/dx (not for the model's first layer)
  bool last = false;            // last of its sequence: its dL/dy belongs to the parent

  // Configuration read from the CPU layer.
  std::size_t kernel = 0, stride = 1, pad = 0;
  bool bias = false;
  float p = 0.0f;                     // dropout
  const Dropout* dropout = nullptr;   // dropout: its CPU layer, whose seed() the masks follow
  float eps = 0.0f, momentum = 0.0f;  // batchnorm
  float slope = 0.0f;                 // leaky_relu: the slope below zero
  cudnnActivationMode_t activation{};  // cuDNN activations
  std::size_t stats = 0;             // batchnorm: offset of running_mean (C), then running_var (C), in the stats vector
  std::vector<Node> main, shortcut;  // residual paths; an empty shortcut is the identity

  // cuDNN state for the batch size last described.
  TensorDesc x_desc, y_desc, bn_desc;
  FilterDesc w_desc;
  ConvDesc conv_desc;
  PoolDesc pool_desc;
  ActDesc act_desc;
  std::unordered_map<std::size_t, ConvAlgos> algos;  // by batch size: chosen once per shape
  const ConvAlgos* algo = nullptr;

  // Buffers for the prepared batch B, carved from the model's pool.
  float* y = nullptr;              // (B, out...); null where the node passes its input through
  float* dy = nullptr;             // (B, out...) dL/dy, unless last
  float* scratch = nullptr;        // (B, in...) residual: the shortcut's dL/dx; batchnorm: a dL/dx nobody reads
  float* saved_mean = nullptr;     // (C) batchnorm: this batch's mean, for backward
  float* saved_inv_std = nullptr;  // (C) batchnorm: this batch's 1 / sqrt(var + eps)
  std::uint64_t seed = 0;          // dropout: this step's mask
  const float* out_ptr = nullptr;  // what the next node reads (y, or the input passed through)
};

struct Plan {
  std::vector<Node> nodes;
  Dims sample;
  std::size_t classes = 0;
  std::size_t params = 0;                // flat parameter count
  std::size_t stats = 0;                 // running statistics, all batchnorms together
  std::size_t max_numel = 0;             // largest per-sample tensor anywhere
  std::vector<BatchNorm2D*> batchnorms;  // in stats order
};

template <class F>
void for_each_node(std::vector<Node>& seq, F&& f) {
  for (Node& n : seq) {
    f(n);
    for_each_node(n.main, f);
    for_each_node(n.shortcut, f);
  }
}

/// What the nodes' operations run with: the model's handles, its stream and
/// device buffers, and the walks over node sequences (for nested paths).
class Gpu {
 public:
  cudnnHandle_t cudnn = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaStream_t stream = nullptr;
  float* params_base = nullptr;  // (P) on the device
  float* grads_base = nullptr;   // (P)
  float* stats_base = nullptr;   // (S) every batchnorm's running statistics
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  std::uint64_t step = 0;   // training steps so far, this one included

  float* param(const Node& n) const { return params_base + n.params; }
  float* grad(const Node& n) const { return grads_base + n.params; }
  float* stat(const Node& n) const { return stats_base + n.stats; }

  /// Runs `seq` forward from x; returns its output.
  virtual const float* forward(std::vector<Node>& seq, const float* x, std::size_t batch, bool training) = 0;
  /// Backpropagates dy through `seq`; dx (or null: not needed) receives dL/dx.
  virtual void backward(std::vector<Node>& seq, const float* x, const float* dy, float* dx, std::size_t batch) = 0;
  /// Picks (once per batch size) the algorithms of a described convolution.
  virtual void choose_conv_algos(Node& n, std::size_t batch) = 0;

 protected:
  ~Gpu() = default;
};

class PlanBuilder;

/// One layer kind on the GPU. Null hooks do nothing.
struct GpuOps {
  const char* kind;  ///< what the CPU layer's kind() says
  /// Reads `layer` into `node`, whose `in` is set: its configuration and
  /// `out`, and the parameter shapes the kernels assume (torch.nn's layout)
  /// into `params`; or invalid_argument naming the node and why it cannot
  /// run.
  Status (*lower)(Layer& layer, Node& node, PlanBuilder& plan, std::vector<Shape>& params);
  /// How the node's output is stored: its own buffer, the input itself
  /// (flatten), or the input itself at inference only (dropout).
  enum class Output { own, input, input_at_inference } output = Output::own;
  /// cuDNN descriptors (and algorithms) for `batch` samples.
  void (*describe)(Gpu& gpu, Node& node, std::size_t batch) = nullptr;
  /// Buffers beyond y and dy, from the model's pool.
  void (*carve)(Node& node, Carver& carver, std::size_t batch, bool training) = nullptr;
  /// y (B, out...) from x (B, in...), into node.y; sets node.out_ptr when
  /// it passes x through.
  void (*forward)(Gpu& gpu, Node& node, const float* x, std::size_t batch, bool training) = nullptr;
  /// The node's parameter gradients (overwritten) and, when dx is not
  /// null, dL/dx (B, in...) from dy (B, out...).
  void (*backward)(Gpu& gpu, Node& node, const float* x, const float* dy, float* dx, std::size_t batch) = nullptr;
};

/// The GPU version of the layer kind `kind`, or null where the backend has
/// none (lowerings.cpp).
const GpuOps* find_gpu_ops(std::string_view kind);

/// Reads the CPU layers into a Plan, checking everything the GPU code relies
/// on: known layer kinds, shapes that chain, the parameter layout.
class PlanBuilder {
 public:
  explicit PlanBuilder(Plan& plan) : plan_(plan) {}

  /// Lowers `layers` from per-sample shape `shape` (which ends as their
  /// output) into `out`, naming them "<prefix>I".
  Status add_sequence(const std::vector<Layer*>& layers, Dims& shape, std::vector<Node>& out, bool first_needs_dx,
                      const std::string& prefix);

  /// Reserves a batchnorm's running statistics (2 x channels) in the stats
  /// vector; returns their offset.
  std::size_t add_stats(BatchNorm2D& bn, std::size_t channels);

  std::size_t params() const { return plan_.params; }

 private:
  Status add_layer(Layer& layer, Dims& shape, Node& node, const std::string& path);

  Plan& plan_;
  std::size_t next_index_ = 0;
};

Result<Plan> build_plan(const std::vector<Layer*>& layers, const Shape& sample_shape, std::size_t param_count);

}  // namespace asgd::cuda
