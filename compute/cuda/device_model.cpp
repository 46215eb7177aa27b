// The CUDA backend's DeviceModel. The CPU model's layers are mirrored as a
// tree of nodes (a Residual holds its two paths) that run on cuDNN
// (convolution, pooling, ReLU, batch normalisation, softmax), cuBLAS (dense
// layers) and the small kernels in kernels.cu, all queued on the model's own
// stream. Parameters and gradients stay in host memory in the model's flat
// layout; each step uploads the parameters and downloads the gradients
// through pinned buffers.
//
// Numerics: fp32 means fp32. cuDNN convolutions run with CUDNN_FMA_MATH and
// cuBLAS with CUBLAS_DEFAULT_MATH, so neither uses TF32 tensor cores (which
// Ampere and later would otherwise allow for float data and which would cost
// three decimal digits). Each convolution's algorithms are measured once per
// batch size (cudnnFind*) and the fastest GEMM-based or direct one is used
// (FFT and Winograd round differently), or a deterministic one when it is at
// most 10% slower (repeated steps then give the same gradients): the choice
// may differ between runs and GPUs, as in PyTorch with cudnn.benchmark.
//
// What differs from the CPU layers: dropout masks are a hash of (node,
// step), not draws from the Dropout layer's generator, so they follow
// neither its seed nor reseed(); BatchNorm's running statistics always move
// by `momentum` (the cumulative average of a recalibration is CPU work:
// Model::recalibrate_batchnorm runs its forwards there, and the next GPU
// step uploads the result).
//
// Errors: make_cuda_model returns a Status; the per-step calls throw
// asgd::cuda::Error (a std::runtime_error; see check.hpp).

#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "compute/conv_layers.hpp"
#include "compute/cuda/check.hpp"
#include "compute/cuda/kernels.cuh"
#include "compute/cuda/memory.hpp"
#include "compute/device.hpp"
#include "compute/random.hpp"

namespace asgd {
namespace cuda {
namespace {

// Owns one cuDNN object (the handle or a descriptor), created on first use.
template <class T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class CudnnObject {
 public:
  CudnnObject() = default;
  ~CudnnObject() {
    if (h_) Destroy(h_);
  }
  CudnnObject(CudnnObject&& other) noexcept : h_(std::exchange(other.h_, nullptr)) {}
  CudnnObject& operator=(CudnnObject&&) = delete;
  CudnnObject(const CudnnObject&) = delete;
  CudnnObject& operator=(const CudnnObject&) = delete;

  T get() {
    if (!h_) ASGD_CUDNN_CHECK(Create(&h_));
    return h_;
  }

 private:
  T h_ = nullptr;
};
using CudnnHandle = CudnnObject<cudnnHandle_t, cudnnCreate, cudnnDestroy>;
using TensorDesc = CudnnObject<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc = CudnnObject<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc =
    CudnnObject<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;
using PoolDesc = CudnnObject<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor>;
using ActDesc =
    CudnnObject<cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor, cudnnDestroyActivationDescriptor>;

class CublasHandle {
 public:
  CublasHandle() { ASGD_CUBLAS_CHECK(cublasCreate(&h_)); }
  ~CublasHandle() { cublasDestroy(h_); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

// Makes `index` the calling thread's device; first member of the model, so
// everything after it is created on that device.
struct CurrentDevice {
  explicit CurrentDevice(int i) : index(i) { ASGD_CUDA_CHECK(cudaSetDevice(index)); }
  int index;
};

// cuDNN and cuBLAS take int sizes; plan and batch checks keep every size
// below INT_MAX, so this never truncates.
int to_int(std::size_t n) { return static_cast<int>(n); }

// ---- The plan: nodes mirroring the CPU layers ---------------------------------

// A per-sample shape: (C, H, W) for images; a vector (N) is (N, 1, 1).
struct Dims {
  std::size_t c = 0, h = 1, w = 1;
  bool image = false;
  std::size_t numel() const { return c * h * w; }
  std::size_t plane() const { return h * w; }
  std::string str() const {
    return image ? "(" + std::to_string(c) + ", " + std::to_string(h) + ", " + std::to_string(w) + ")"
                 : "(" + std::to_string(c) + ")";
  }
};

enum class Op { dense, relu, conv, maxpool, global_avg_pool, batchnorm, flatten, dropout, residual };

// The three algorithms a convolution uses at one batch size.
struct ConvAlgos {
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  std::size_t workspace = 0;  // bytes: the most any of the three needs
};

struct Node {
  Op op = Op::relu;
  std::string name;        // "layer 4.main.1 (batchnorm2d)", for messages
  std::size_t index = 0;   // position in a walk over all nodes; seeds dropout
  Dims in, out;            // per sample
  std::size_t params = 0;  // offset of the node's first parameter in the flat vector
  bool needs_dx = true;    // whether backward must produce dL/dx (not for the model's first layer)
  bool last = false;       // last of its sequence: its dL/dy belongs to the parent

  // Configuration read from the CPU layer.
  std::size_t kernel = 0, stride = 1, pad = 0;
  bool bias = false;
  float p = 0.0f;                     // dropout
  float eps = 0.0f, momentum = 0.0f;  // batchnorm
  std::size_t stats = 0;             // batchnorm: offset of running_mean (C), then running_var (C), in the stats vector
  std::vector<Node> main, shortcut;  // residual paths; an empty shortcut is the identity

  // cuDNN state for the batch size last described.
  TensorDesc x_desc, y_desc, bn_desc;
  FilterDesc w_desc;
  ConvDesc conv_desc;
  PoolDesc pool_desc;
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

std::size_t spec_count(const std::vector<ParamSpec>& specs) {
  std::size_t n = 0;
  for (const ParamSpec& s : specs) n += numel(s.shape);
  return n;
}

bool same_shapes(const std::vector<ParamSpec>& specs, const std::vector<Shape>& expected) {
  if (specs.size() != expected.size()) return false;
  for (std::size_t i = 0; i < specs.size(); ++i)
    if (specs[i].shape != expected[i]) return false;
  return true;
}

// Reads the CPU layers into a Plan, checking everything the GPU code relies
// on: known layer kinds, shapes that chain, the parameter layout. Host only.
class PlanBuilder {
 public:
  explicit PlanBuilder(Plan& plan) : plan_(plan) {}

  Status add_sequence(const std::vector<Layer*>& layers, Dims& shape, std::vector<Node>& out, bool first_needs_dx,
                      const std::string& prefix) {
    out.reserve(layers.size());
    for (std::size_t i = 0; i < layers.size(); ++i) {
      Node& node = out.emplace_back();
      node.needs_dx = i > 0 || first_needs_dx;
      node.last = i + 1 == layers.size();
      if (Status s = add_layer(*layers[i], shape, node, prefix + std::to_string(i)); !s.ok()) return s;
    }
    return {};
  }

 private:
  Status add_layer(Layer& layer, Dims& shape, Node& node, const std::string& path);

  Plan& plan_;
  std::size_t next_index_ = 0;
};

std::vector<Layer*> raw(const std::vector<std::unique_ptr<Layer>>& layers) {
  std::vector<Layer*> out;
  for (const auto& l : layers) out.push_back(l.get());
  return out;
}

Status PlanBuilder::add_layer(Layer& layer, Dims& shape, Node& node, const std::string& path) {
  node.name = "layer " + path + " (" + layer.kind() + ")";
  node.index = next_index_++;
  node.params = plan_.params;
  node.in = shape;
  const auto fail = [&](const std::string& why) { return Status::InvalidArgument(node.name + ": " + why); };
  const auto need_image = [&] { return fail("needs (C, H, W) inputs, gets " + shape.str()); };
  std::vector<Shape> expected_params;

  if (auto* dense = dynamic_cast<Dense*>(&layer)) {
    if (dense->in() != shape.numel())
      return fail("expects " + std::to_string(dense->in()) + " inputs per sample, gets " + shape.str());
    node.op = Op::dense;
    node.out = {dense->out(), 1, 1, false};
    expected_params = {{dense->out(), dense->in()}, {dense->out()}};
  } else if (dynamic_cast<ReLU*>(&layer)) {
    node.op = Op::relu;
    node.out = shape;
  } else if (auto* conv = dynamic_cast<Conv2D*>(&layer)) {
    if (!shape.image) return need_image();
    if (conv->in_channels() != shape.c)
      return fail("expects " + std::to_string(conv->in_channels()) + " channels, gets " + shape.str());
    if (conv->kernel() == 0 || conv->stride() == 0) return fail("kernel and stride must be positive");
    if (shape.h + 2 * conv->pad() < conv->kernel() || shape.w + 2 * conv->pad() < conv->kernel())
      return fail("kernel larger than the padded input " + shape.str());
    node.op = Op::conv;
    node.kernel = conv->kernel();
    node.stride = conv->stride();
    node.pad = conv->pad();
    node.bias = conv->has_bias();
    node.out = {conv->out_channels(), (shape.h + 2 * node.pad - node.kernel) / node.stride + 1,
                (shape.w + 2 * node.pad - node.kernel) / node.stride + 1, true};
    expected_params = {{conv->out_channels(), conv->in_channels(), node.kernel, node.kernel}};
    if (node.bias) expected_params.push_back({conv->out_channels()});
  } else if (auto* pool = dynamic_cast<MaxPool2D*>(&layer)) {
    if (!shape.image) return need_image();
    if (pool->kernel() == 0 || pool->stride() == 0) return fail("kernel and stride must be positive");
    if (shape.h < pool->kernel() || shape.w < pool->kernel())
      return fail("window larger than the input " + shape.str());
    node.op = Op::maxpool;
    node.kernel = pool->kernel();
    node.stride = pool->stride();
    node.out = {shape.c, (shape.h - node.kernel) / node.stride + 1, (shape.w - node.kernel) / node.stride + 1, true};
  } else if (dynamic_cast<GlobalAvgPool*>(&layer)) {
    if (!shape.image) return need_image();
    node.op = Op::global_avg_pool;
    node.out = {shape.c, 1, 1, false};
  } else if (auto* bn = dynamic_cast<BatchNorm2D*>(&layer)) {
    if (!shape.image) return need_image();
    if (bn->channels() != shape.c)
      return fail("expects " + std::to_string(bn->channels()) + " channels, gets " + shape.str());
    if (bn->running_mean().size() != shape.c || bn->running_var().size() != shape.c)
      return fail("running statistics do not have one value per channel");
    node.op = Op::batchnorm;
    node.eps = bn->eps();
    node.momentum = bn->momentum();
    node.stats = plan_.stats;
    plan_.stats += 2 * shape.c;
    plan_.batchnorms.push_back(bn);
    node.out = shape;
    expected_params = {{shape.c}, {shape.c}};
  } else if (dynamic_cast<Flatten*>(&layer)) {
    node.op = Op::flatten;
    node.out = {shape.numel(), 1, 1, false};
  } else if (auto* dropout = dynamic_cast<Dropout*>(&layer)) {
    if (!(dropout->p() >= 0.0f && dropout->p() <= 1.0f)) return fail("p must lie in [0, 1]");
    node.op = Op::dropout;
    node.p = dropout->p();
    node.out = shape;
  } else if (auto* residual = dynamic_cast<Residual*>(&layer)) {
    node.op = Op::residual;
    Dims main_shape = shape, short_shape = shape;
    if (Status s = add_sequence(raw(residual->main_path()), main_shape, node.main, node.needs_dx, path + ".main.");
        !s.ok())
      return s;
    if (Status s = add_sequence(raw(residual->shortcut_path()), short_shape, node.shortcut, node.needs_dx,
                                path + ".shortcut.");
        !s.ok())
      return s;
    if (main_shape.c != short_shape.c || main_shape.h != short_shape.h || main_shape.w != short_shape.w)
      return fail("main path gives " + main_shape.str() + " but shortcut gives " + short_shape.str());
    node.out = main_shape;
    // The paths' layers took their parameters in order, main's then shortcut's.
    if (plan_.params - node.params != spec_count(layer.param_specs()))
      return fail("parameters do not add up to main's then shortcut's");
  } else {
    return fail("the CUDA backend has no implementation of this layer kind");
  }

  if (node.op != Op::residual) {
    // The kernels assume each layer's documented layout (torch.nn's).
    if (!same_shapes(layer.param_specs(), expected_params)) return fail("unexpected parameter layout");
    plan_.params += spec_count(layer.param_specs());
  }
  plan_.max_numel = std::max({plan_.max_numel, node.in.numel(), node.out.numel()});
  if (plan_.max_numel > static_cast<std::size_t>(INT_MAX)) return fail("tensor too large for cuDNN");
  shape = node.out;
  return {};
}

Result<Plan> build_plan(const std::vector<Layer*>& layers, const Shape& sample_shape, std::size_t param_count) {
  Plan plan;
  if (sample_shape.size() == 3)
    plan.sample = {sample_shape[0], sample_shape[1], sample_shape[2], true};
  else if (sample_shape.size() == 1)
    plan.sample = {sample_shape[0], 1, 1, false};
  else
    return Status::InvalidArgument("CUDA backend: sample shape " + shape_string(sample_shape) +
                                   " is neither (C, H, W) nor (N)");
  Dims shape = plan.sample;
  plan.max_numel = shape.numel();
  PlanBuilder builder(plan);
  if (Status s = builder.add_sequence(layers, shape, plan.nodes, false, ""); !s.ok()) return s;
  if (shape.image)
    return Status::InvalidArgument("CUDA backend: the model must end in class scores (N), not " + shape.str());
  if (shape.numel() == 0) return Status::InvalidArgument("CUDA backend: the model has no outputs");
  if (plan.params != param_count)
    return Status::InvalidArgument("CUDA backend: the layers hold " + std::to_string(plan.params) +
                                   " parameters, the model says " + std::to_string(param_count));
  plan.classes = shape.numel();
  return plan;
}

// ---- Algorithm choice ------------------------------------------------------------

// Workspace beyond this is not worth an algorithm's speed.
constexpr std::size_t kWorkspaceLimit = std::size_t{1} << 30;

// How much slower than the fastest a deterministic algorithm may be and
// still be preferred (repeated steps then give the same gradients).
constexpr float kDeterminismSlack = 1.10f;

// FFT and Winograd algorithms compute in a transformed domain and round
// differently: on an H100 an FFT backward-filter pass put lenet's first
// gradients 0.5% off the CPU's, where the GEMM and direct algorithms agree
// to 1e-5. Only those take part.
bool exact_fp32(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}
bool exact_fp32(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}
bool exact_fp32(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

// Picks from cuDNN's measured ranking (cudnnFind*: every algorithm run once
// on this shape, fastest first) the fastest GEMM-based or direct algorithm
// (exact_fp32) that runs in FMA math (no TF32) within the workspace limit,
// or a deterministic one at most kDeterminismSlack slower. Raises
// `workspace` to what the choice needs; logs the choice at debug level.
template <class Perf, class Algo>
Algo pick_algo(const std::vector<Perf>& measured, int count, std::size_t& workspace, const std::string& what) {
  const Perf* fastest = nullptr;
  const Perf* deterministic = nullptr;
  for (int i = 0; i < count; ++i) {
    const Perf& perf = measured[static_cast<std::size_t>(i)];
    if (perf.status != CUDNN_STATUS_SUCCESS || perf.memory > kWorkspaceLimit || perf.mathType != CUDNN_FMA_MATH ||
        !exact_fp32(perf.algo))
      continue;
    if (fastest == nullptr) fastest = &perf;
    if (deterministic == nullptr && perf.determinism == CUDNN_DETERMINISTIC) deterministic = &perf;
  }
  if (fastest == nullptr) throw Error(what + ": cuDNN offers no GEMM-based or direct fp32 algorithm for this shape");
  const Perf* chosen =
      deterministic != nullptr && deterministic->time <= fastest->time * kDeterminismSlack ? deterministic : fastest;
  spdlog::debug("cuDNN {}: algorithm {} ({:.3f} ms{}, {} bytes of workspace); the fastest took {:.3f} ms", what,
                static_cast<int>(chosen->algo), chosen->time,
                chosen->determinism == CUDNN_DETERMINISTIC ? ", deterministic" : "", chosen->memory, fastest->time);
  workspace = std::max(workspace, chosen->memory);
  return chosen->algo;
}

// ---- The model ---------------------------------------------------------------------

constexpr std::uint64_t kDropoutSeed = 0x5EEDD20F0u;

class CudaModel final : public DeviceModel {
 public:
  CudaModel(Plan plan, int device);
  ~CudaModel() override;
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  std::string description() const override { return description_; }
  float compute_gradients(std::span<const float> params, std::span<float> grads, std::span<const float> x,
                          std::span<const std::int32_t> y) override;
  void infer(std::span<const float> params, std::span<const float> x, std::size_t batch,
             std::span<float> logits) override;
  void prefetch(std::span<const float> x, std::span<const std::int32_t> y) override;

 private:
  void check_batch(std::size_t batch, std::span<const float> x, const char* call) const;
  void prepare(std::size_t batch, bool training);
  void describe(Node& n, std::size_t batch);
  void choose_conv_algos(Node& n, std::size_t batch);
  void layout(std::vector<Node>& seq, Carver& carver, std::size_t batch, bool training);
  void upload_params_and_stats(std::span<const float> params);
  const float* forward(std::vector<Node>& seq, const float* x, std::size_t batch, bool training);
  void forward(Node& n, const float* x, std::size_t batch, bool training);
  void backward(std::vector<Node>& seq, const float* x, const float* dy, float* dx, std::size_t batch);
  void backward(Node& n, const float* x, const float* dy, float* dx, std::size_t batch);

  float* param(const Node& n) const { return params_.as<float>() + n.params; }
  float* grad(const Node& n) const { return grads_.as<float>() + n.params; }
  float* stat(const Node& n) const { return stats_.as<float>() + n.stats; }
  cudaStream_t stream() const { return stream_.get(); }

  CurrentDevice device_;
  std::string description_;
  Plan plan_;
  Stream stream_;
  CudnnHandle cudnn_;
  CublasHandle cublas_;
  ActDesc relu_;
  TensorDesc logits_desc_;  // (B, classes, 1, 1)
  BatchUploader uploader_;

  DeviceBuffer params_;     // (P)
  DeviceBuffer grads_;      // (P)
  DeviceBuffer stats_;      // (S) running statistics of every batchnorm
  DeviceBuffer pool_;       // activations, their gradients and step scratch, carved per batch size
  DeviceBuffer workspace_;  // cuDNN convolution workspace
  PinnedBuffer host_params_, host_grads_, host_stats_, host_out_;

  std::size_t prepared_batch_ = 0;
  bool prepared_training_ = false;
  float* logp_ = nullptr;      // (B, classes) log-softmax
  float* dlogits_ = nullptr;   // (B, classes)
  float* row_loss_ = nullptr;  // (B)
  float* loss_ = nullptr;      // (1)
  std::uint64_t steps_ = 0;
};

CudaModel::CudaModel(Plan plan, int device) : device_(device), plan_(std::move(plan)) {
  cudaDeviceProp prop{};
  ASGD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  description_ = "cuda:" + std::to_string(device) + " (" + prop.name + ")";

  ASGD_CUDNN_CHECK(cudnnSetStream(cudnn_.get(), stream()));
  ASGD_CUBLAS_CHECK(cublasSetStream(cublas_.get(), stream()));
  ASGD_CUBLAS_CHECK(cublasSetMathMode(cublas_.get(), CUBLAS_DEFAULT_MATH));  // no TF32
  ASGD_CUDNN_CHECK(cudnnSetActivationDescriptor(relu_.get(), CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));

  const std::size_t param_bytes = std::max<std::size_t>(plan_.params, 1) * sizeof(float);
  const std::size_t stat_bytes = std::max<std::size_t>(plan_.stats, 1) * sizeof(float);
  params_.reserve(param_bytes);
  grads_.reserve(param_bytes);
  stats_.reserve(stat_bytes);
  host_params_.reserve(param_bytes);
  host_grads_.reserve(param_bytes);
  host_stats_.reserve(stat_bytes);
}

CudaModel::~CudaModel() {
  // Members free their memory and handles after this; they need the device
  // current and nothing of ours still running.
  cudaSetDevice(device_.index);
  cudaStreamSynchronize(stream_.get());
}

void CudaModel::check_batch(std::size_t batch, std::span<const float> x, const char* call) const {
  if (x.size() != batch * plan_.sample.numel())
    throw Error(std::string(call) + ": x holds " + std::to_string(x.size()) + " floats, " + std::to_string(batch) +
                " samples of " + plan_.sample.str() + " need " + std::to_string(batch * plan_.sample.numel()));
}

void CudaModel::describe(Node& n, std::size_t batch) {
  const auto set_4d = [&](TensorDesc& desc, const Dims& d) {
    ASGD_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, to_int(batch),
                                                to_int(d.c), to_int(d.h), to_int(d.w)));
  };
  switch (n.op) {
    case Op::relu:
    case Op::maxpool:
    case Op::batchnorm:
    case Op::conv:
      set_4d(n.x_desc, n.in);
      set_4d(n.y_desc, n.out);
      break;
    default:
      return;
  }
  if (n.op == Op::maxpool) {
    ASGD_CUDNN_CHECK(cudnnSetPooling2dDescriptor(n.pool_desc.get(), CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN,
                                                 to_int(n.kernel), to_int(n.kernel), 0, 0, to_int(n.stride),
                                                 to_int(n.stride)));
  } else if (n.op == Op::batchnorm) {
    ASGD_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(n.bn_desc.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, to_int(n.in.c), 1, 1));
  } else if (n.op == Op::conv) {
    ASGD_CUDNN_CHECK(cudnnSetFilter4dDescriptor(n.w_desc.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, to_int(n.out.c),
                                                to_int(n.in.c), to_int(n.kernel), to_int(n.kernel)));
    ASGD_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(n.conv_desc.get(), to_int(n.pad), to_int(n.pad), to_int(n.stride),
                                                     to_int(n.stride), 1, 1, CUDNN_CROSS_CORRELATION,
                                                     CUDNN_DATA_FLOAT));
    // FMA, not DEFAULT: DEFAULT lets Ampere and later run float convolutions on TF32 tensor cores.
    ASGD_CUDNN_CHECK(cudnnSetConvolutionMathType(n.conv_desc.get(), CUDNN_FMA_MATH));
    choose_conv_algos(n, batch);
  }
}

void CudaModel::choose_conv_algos(Node& n, std::size_t batch) {
  if (const auto it = n.algos.find(batch); it != n.algos.end()) {
    n.algo = &it->second;
    return;
  }
  cudnnHandle_t h = cudnn_.get();
  cudnnTensorDescriptor_t x = n.x_desc.get(), y = n.y_desc.get();
  cudnnFilterDescriptor_t w = n.w_desc.get();
  cudnnConvolutionDescriptor_t conv = n.conv_desc.get();
  ConvAlgos a;
  int max_count = 0, count = 0;

  // cudnnFind* allocates its own buffers and runs every algorithm once:
  // tens of milliseconds, once per convolution and batch size.
  ASGD_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(static_cast<std::size_t>(max_count));
  ASGD_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, x, w, conv, y, max_count, &count, fwd.data()));
  a.fwd = pick_algo<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(fwd, count, a.workspace,
                                                                              n.name + " forward");

  ASGD_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> data(static_cast<std::size_t>(max_count));
  ASGD_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(h, w, y, conv, x, max_count, &count, data.data()));
  a.bwd_data = pick_algo<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      data, count, a.workspace, n.name + " backward data");

  ASGD_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> filter(static_cast<std::size_t>(max_count));
  ASGD_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(h, x, y, conv, w, max_count, &count, filter.data()));
  a.bwd_filter = pick_algo<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      filter, count, a.workspace, n.name + " backward filter");

  n.algo = &n.algos.emplace(batch, a).first->second;
}

// Every buffer a step needs, in one pass over the nodes: run once to
// measure (null base) and once to assign.
void CudaModel::layout(std::vector<Node>& seq, Carver& carver, std::size_t batch, bool training) {
  for (Node& n : seq) {
    const std::size_t in = batch * n.in.numel(), out = batch * n.out.numel();
    const bool passes_through = n.op == Op::flatten || (n.op == Op::dropout && !training);
    n.y = passes_through ? nullptr : carver.take<float>(out);
    n.dy = training && !n.last ? carver.take<float>(out) : nullptr;
    n.scratch = nullptr;
    n.saved_mean = n.saved_inv_std = nullptr;
    if (training && n.op == Op::residual && n.needs_dx && !n.shortcut.empty()) n.scratch = carver.take<float>(in);
    if (training && n.op == Op::batchnorm) {
      if (!n.needs_dx) n.scratch = carver.take<float>(in);  // cuDNN always writes dx
      n.saved_mean = carver.take<float>(n.in.c);
      n.saved_inv_std = carver.take<float>(n.in.c);
    }
    layout(n.main, carver, batch, training);
    layout(n.shortcut, carver, batch, training);
  }
}

// Descriptors, algorithms and buffers for `batch` samples. The pool grows
// only when a batch needs more than any before; a steady batch size (or a
// smaller one) reuses it without allocating.
void CudaModel::prepare(std::size_t batch, bool training) {
  if (batch == prepared_batch_ && training == prepared_training_) return;
  if (batch > static_cast<std::size_t>(INT_MAX) / std::max<std::size_t>(plan_.max_numel, 1))
    throw Error("CUDA backend: a batch of " + std::to_string(batch) + " is too large for cuDNN");
  prepared_batch_ = 0;  // until this succeeds

  std::size_t workspace = 0;
  for_each_node(plan_.nodes, [&](Node& n) {
    describe(n, batch);
    if (n.op == Op::conv) workspace = std::max(workspace, n.algo->workspace);
  });
  ASGD_CUDNN_CHECK(cudnnSetTensor4dDescriptor(logits_desc_.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, to_int(batch),
                                              to_int(plan_.classes), 1, 1));

  const auto carve_step = [&](Carver& carver) {
    layout(plan_.nodes, carver, batch, training);
    logp_ = training ? carver.take<float>(batch * plan_.classes) : nullptr;
    dlogits_ = training ? carver.take<float>(batch * plan_.classes) : nullptr;
    row_loss_ = training ? carver.take<float>(batch) : nullptr;
    loss_ = training ? carver.take<float>(1) : nullptr;
  };
  Carver measure(nullptr);
  carve_step(measure);
  pool_.reserve(measure.used());
  Carver carver(pool_.as<std::byte>());
  carve_step(carver);
  workspace_.reserve(workspace);
  host_out_.reserve(std::max<std::size_t>(batch * plan_.classes, 1) * sizeof(float));

  prepared_batch_ = batch;
  prepared_training_ = training;
}

void CudaModel::upload_params_and_stats(std::span<const float> params) {
  if (!params.empty()) {
    std::memcpy(host_params_.data(), params.data(), params.size_bytes());
    ASGD_CUDA_CHECK(
        cudaMemcpyAsync(params_.data(), host_params_.data(), params.size_bytes(), cudaMemcpyHostToDevice, stream()));
  }
  if (plan_.stats == 0) return;
  // The host layers hold the current running statistics (they may have been
  // loaded or changed on the CPU since the last step), so they go up each time.
  float* host = host_stats_.as<float>();
  for (BatchNorm2D* bn : plan_.batchnorms) {
    host = std::copy(bn->running_mean().begin(), bn->running_mean().end(), host);
    host = std::copy(bn->running_var().begin(), bn->running_var().end(), host);
  }
  ASGD_CUDA_CHECK(cudaMemcpyAsync(stats_.data(), host_stats_.data(), plan_.stats * sizeof(float),
                                  cudaMemcpyHostToDevice, stream()));
}

float CudaModel::compute_gradients(std::span<const float> params, std::span<float> grads, std::span<const float> x,
                                   std::span<const std::int32_t> y) {
  const std::size_t batch = y.size();
  if (params.size() != plan_.params || grads.size() != plan_.params)
    throw Error("compute_gradients: params and grads must hold " + std::to_string(plan_.params) + " floats");
  check_batch(batch, x, "compute_gradients");
  if (batch == 0) {  // as the CPU model: no samples, no gradient
    std::fill(grads.begin(), grads.end(), 0.0f);
    return 0.0f;
  }
  for (std::size_t r = 0; r < batch; ++r)
    if (y[r] < 0 || static_cast<std::size_t>(y[r]) >= plan_.classes)
      throw Error("compute_gradients: label " + std::to_string(y[r]) + " of sample " + std::to_string(r) +
                  " is outside [0, " + std::to_string(plan_.classes) + ")");

  ASGD_CUDA_CHECK(cudaSetDevice(device_.index));
  prepare(batch, true);
  const BatchUploader::DeviceBatch in = uploader_.acquire(x, y, stream());
  upload_params_and_stats(params);
  ++steps_;

  const float* logits = forward(plan_.nodes, in.x, batch, true);
  const float one = 1.0f, zero = 0.0f;
  ASGD_CUDNN_CHECK(cudnnSoftmaxForward(cudnn_.get(), CUDNN_SOFTMAX_LOG, CUDNN_SOFTMAX_MODE_INSTANCE, &one,
                                       logits_desc_.get(), logits, &zero, logits_desc_.get(), logp_));
  ASGD_CUDA_CHECK(kernels::softmax_xent(logp_, in.y, batch, plan_.classes, dlogits_, row_loss_, loss_, stream()));
  backward(plan_.nodes, in.x, dlogits_, nullptr, batch);

  ASGD_CUDA_CHECK(
      cudaMemcpyAsync(host_grads_.data(), grads_.data(), grads.size_bytes(), cudaMemcpyDeviceToHost, stream()));
  if (plan_.stats > 0)
    ASGD_CUDA_CHECK(cudaMemcpyAsync(host_stats_.data(), stats_.data(), plan_.stats * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream()));
  ASGD_CUDA_CHECK(cudaMemcpyAsync(host_out_.data(), loss_, sizeof(float), cudaMemcpyDeviceToHost, stream()));
  stream_.synchronize();

  if (!grads.empty()) std::memcpy(grads.data(), host_grads_.data(), grads.size_bytes());
  const float* host = host_stats_.as<float>();
  for (BatchNorm2D* bn : plan_.batchnorms) {
    std::copy(host, host + bn->channels(), bn->running_mean().begin());
    host += bn->channels();
    std::copy(host, host + bn->channels(), bn->running_var().begin());
    host += bn->channels();
  }
  return *host_out_.as<float>();
}

void CudaModel::infer(std::span<const float> params, std::span<const float> x, std::size_t batch,
                      std::span<float> logits) {
  if (params.size() != plan_.params) throw Error("infer: params must hold " + std::to_string(plan_.params) + " floats");
  check_batch(batch, x, "infer");
  if (logits.size() != batch * plan_.classes)
    throw Error("infer: logits must hold " + std::to_string(batch) + " x " + std::to_string(plan_.classes) +
                " floats, not " + std::to_string(logits.size()));
  if (batch == 0) return;

  ASGD_CUDA_CHECK(cudaSetDevice(device_.index));
  prepare(batch, false);
  const BatchUploader::DeviceBatch in = uploader_.acquire(x, {}, stream());
  upload_params_and_stats(params);
  const float* out = forward(plan_.nodes, in.x, batch, false);
  ASGD_CUDA_CHECK(cudaMemcpyAsync(host_out_.data(), out, logits.size_bytes(), cudaMemcpyDeviceToHost, stream()));
  stream_.synchronize();
  std::memcpy(logits.data(), host_out_.data(), logits.size_bytes());
}

void CudaModel::prefetch(std::span<const float> x, std::span<const std::int32_t> y) {
  check_batch(y.size(), x, "prefetch");
  if (y.empty()) return;
  ASGD_CUDA_CHECK(cudaSetDevice(device_.index));
  uploader_.prefetch(x, y);
}

// ---- Forward and backward walks ----------------------------------------------

const float* CudaModel::forward(std::vector<Node>& seq, const float* x, std::size_t batch, bool training) {
  for (Node& n : seq) {
    forward(n, x, batch, training);
    x = n.out_ptr;
  }
  return x;
}

void CudaModel::forward(Node& n, const float* x, std::size_t batch, bool training) {
  const float one = 1.0f, zero = 0.0f;
  cudnnHandle_t h = cudnn_.get();
  n.out_ptr = n.y;
  switch (n.op) {
    case Op::dense: {
      // Row-major y (B, out) = x (B, in) W^T is column-major y^T = W x^T,
      // and row-major W (out, in) is column-major W^T (in, out).
      const int in = to_int(n.in.numel()), out = to_int(n.out.numel());
      ASGD_CUBLAS_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, out, to_int(batch), in, &one, param(n), in,
                                    x, in, &zero, n.y, out));
      ASGD_CUDA_CHECK(
          kernels::add_row_bias(n.y, param(n) + n.in.numel() * n.out.numel(), batch, n.out.numel(), stream()));
      break;
    }
    case Op::relu:
      ASGD_CUDNN_CHECK(cudnnActivationForward(h, relu_.get(), &one, n.x_desc.get(), x, &zero, n.y_desc.get(), n.y));
      break;
    case Op::conv:
      ASGD_CUDNN_CHECK(cudnnConvolutionForward(h, &one, n.x_desc.get(), x, n.w_desc.get(), param(n), n.conv_desc.get(),
                                               n.algo->fwd, workspace_.data(), workspace_.bytes(), &zero,
                                               n.y_desc.get(), n.y));
      if (n.bias)
        ASGD_CUDA_CHECK(kernels::add_channel_bias(n.y, param(n) + n.out.c * n.in.c * n.kernel * n.kernel, batch,
                                                  n.out.c, n.out.plane(), stream()));
      break;
    case Op::maxpool:
      ASGD_CUDNN_CHECK(cudnnPoolingForward(h, n.pool_desc.get(), &one, n.x_desc.get(), x, &zero, n.y_desc.get(), n.y));
      break;
    case Op::global_avg_pool:
      ASGD_CUDA_CHECK(kernels::row_mean(x, n.y, batch * n.in.c, n.in.plane(), stream()));
      break;
    case Op::batchnorm:
      // cuDNN moves running_var towards the unbiased batch variance, as the
      // CPU layer and PyTorch do, and normalises with the biased one.
      if (training) {
        ASGD_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
            h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, n.x_desc.get(), x, n.y_desc.get(), n.y, n.bn_desc.get(), param(n),
            param(n) + n.in.c, static_cast<double>(n.momentum), stat(n), stat(n) + n.in.c, static_cast<double>(n.eps),
            n.saved_mean, n.saved_inv_std));
      } else {
        ASGD_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
            h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, n.x_desc.get(), x, n.y_desc.get(), n.y, n.bn_desc.get(), param(n),
            param(n) + n.in.c, stat(n), stat(n) + n.in.c, static_cast<double>(n.eps)));
      }
      break;
    case Op::flatten:
      n.out_ptr = x;
      break;
    case Op::dropout:
      if (!training) {
        n.out_ptr = x;
        break;
      }
      n.seed = mix_seed(kDropoutSeed, n.index, steps_);
      ASGD_CUDA_CHECK(kernels::dropout(x, n.y, batch * n.in.numel(), n.p, n.seed, stream()));
      break;
    case Op::residual: {
      const float* a = forward(n.main, x, batch, training);
      const float* b = forward(n.shortcut, x, batch, training);  // x itself when the shortcut is empty
      ASGD_CUDA_CHECK(kernels::add(a, b, n.y, batch * n.out.numel(), stream()));
      break;
    }
  }
}

// dy is dL/d(output of seq), dx receives dL/dx (or null: not needed).
void CudaModel::backward(std::vector<Node>& seq, const float* x, const float* dy, float* dx, std::size_t batch) {
  for (std::size_t i = seq.size(); i-- > 0;) {
    Node& n = seq[i];
    const float* in = i == 0 ? x : seq[i - 1].out_ptr;
    const float* grad_out = n.last ? dy : n.dy;
    float* grad_in = i == 0 ? dx : seq[i - 1].dy;
    backward(n, in, grad_out, grad_in, batch);
  }
}

void CudaModel::backward(Node& n, const float* x, const float* dy, float* dx, std::size_t batch) {
  const float one = 1.0f, zero = 0.0f;
  cudnnHandle_t h = cudnn_.get();
  const std::size_t in_count = batch * n.in.numel();
  switch (n.op) {
    case Op::dense: {
      const int in = to_int(n.in.numel()), out = to_int(n.out.numel());
      // dW (out, in) = dy^T x, i.e. column-major dW^T (in, out) = x^T (in, B) dy (B, out).
      ASGD_CUBLAS_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_T, in, out, to_int(batch), &one, x, in, dy,
                                    out, &zero, grad(n), in));
      ASGD_CUDA_CHECK(
          kernels::channel_sum(dy, batch, n.out.numel(), 1, grad(n) + n.in.numel() * n.out.numel(), stream()));
      // dx (B, in) = dy W, i.e. column-major dx^T (in, B) = W^T (in, out) dy^T (out, B).
      if (dx)
        ASGD_CUBLAS_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, in, to_int(batch), out, &one, param(n),
                                      in, dy, out, &zero, dx, in));
      break;
    }
    case Op::relu:
      if (dx)
        ASGD_CUDNN_CHECK(cudnnActivationBackward(h, relu_.get(), &one, n.y_desc.get(), n.y, n.y_desc.get(), dy,
                                                 n.x_desc.get(), x, &zero, n.x_desc.get(), dx));
      break;
    case Op::conv:
      ASGD_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, n.x_desc.get(), x, n.y_desc.get(), dy, n.conv_desc.get(),
                                                      n.algo->bwd_filter, workspace_.data(), workspace_.bytes(), &zero,
                                                      n.w_desc.get(), grad(n)));
      if (n.bias)
        ASGD_CUDA_CHECK(kernels::channel_sum(dy, batch, n.out.c, n.out.plane(),
                                             grad(n) + n.out.c * n.in.c * n.kernel * n.kernel, stream()));
      if (dx)
        ASGD_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, n.w_desc.get(), param(n), n.y_desc.get(), dy,
                                                      n.conv_desc.get(), n.algo->bwd_data, workspace_.data(),
                                                      workspace_.bytes(), &zero, n.x_desc.get(), dx));
      break;
    case Op::maxpool:
      if (dx)
        ASGD_CUDNN_CHECK(cudnnPoolingBackward(h, n.pool_desc.get(), &one, n.y_desc.get(), n.y, n.y_desc.get(), dy,
                                              n.x_desc.get(), x, &zero, n.x_desc.get(), dx));
      break;
    case Op::global_avg_pool:
      if (dx) ASGD_CUDA_CHECK(kernels::row_mean_backward(dy, dx, batch * n.in.c, n.in.plane(), stream()));
      break;
    case Op::batchnorm:
      ASGD_CUDNN_CHECK(cudnnBatchNormalizationBackward(
          h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, n.x_desc.get(), x, n.y_desc.get(), dy, n.x_desc.get(),
          dx ? dx : n.scratch, n.bn_desc.get(), param(n), grad(n), grad(n) + n.in.c, static_cast<double>(n.eps),
          n.saved_mean, n.saved_inv_std));
      break;
    case Op::flatten:
      if (dx) ASGD_CUDA_CHECK(cudaMemcpyAsync(dx, dy, in_count * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
      break;
    case Op::dropout:
      if (dx) ASGD_CUDA_CHECK(kernels::dropout(dy, dx, in_count, n.p, n.seed, stream()));
      break;
    case Op::residual:
      // dL/dx = main's dL/dx + shortcut's (dy itself for the identity).
      if (n.main.empty()) {
        if (dx) ASGD_CUDA_CHECK(cudaMemcpyAsync(dx, dy, in_count * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
      } else {
        backward(n.main, x, dy, dx, batch);
      }
      if (!n.shortcut.empty()) backward(n.shortcut, x, dy, dx ? n.scratch : nullptr, batch);
      if (dx) ASGD_CUDA_CHECK(kernels::add(dx, n.shortcut.empty() ? dy : n.scratch, dx, in_count, stream()));
      break;
  }
}

}  // namespace
}  // namespace cuda

int cuda_device_count(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it, so later calls do not report it again
    if (why) *why = std::string("CUDA cannot be used: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    return 0;
  }
  if (count == 0 && why) *why = "no CUDA device found";
  return count;
}

Result<std::unique_ptr<DeviceModel>> make_cuda_model(const std::vector<Layer*>& layers, const Shape& sample_shape,
                                                     std::size_t param_count, int device_index) {
  // The model is checked first: a layer the backend lacks is a mistake on
  // any machine, with or without a GPU.
  Result<cuda::Plan> plan = cuda::build_plan(layers, sample_shape, param_count);
  if (!plan.ok()) return plan.status();

  std::string why;
  const int count = cuda_device_count(&why);
  const std::string name = "cuda:" + std::to_string(device_index);
  if (count == 0) return Status::Unavailable(name + ": " + why);
  if (device_index < 0 || device_index >= count)
    return Status::Unavailable(name + " does not exist (" + std::to_string(count) + " CUDA device(s))");
  // Creating the context is where a busy, prohibited or broken device shows.
  cudaError_t err = cudaSetDevice(device_index);
  if (err == cudaSuccess) err = cudaFree(nullptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::Unavailable(name + " cannot be used: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                               ")");
  }
  try {
    std::unique_ptr<DeviceModel> model = std::make_unique<cuda::CudaModel>(std::move(plan).value(), device_index);
    return Result<std::unique_ptr<DeviceModel>>(std::move(model));
  } catch (const cuda::Error& e) {
    return Status::Internal(name + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return Status::Internal(name + ": out of host memory");
  }
}

}  // namespace asgd
