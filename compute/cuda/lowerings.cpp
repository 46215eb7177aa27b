// The GPU version of every layer kind the CUDA backend runs: one GpuOps per
// kind, in kGpuOps at the end, found by the kind's name. cuDNN runs
// convolution, pooling, activations and batch normalisation, cuBLAS the
// dense layers, kernels.cu the rest; everything is queued on the model's
// stream.

#include <algorithm>
#include <array>
#include <string>

#include "compute/cuda/kernels.cuh"
#include "compute/cuda/nodes.hpp"
#include "compute/layers/batch_norm2d.hpp"
#include "compute/layers/conv2d.hpp"
#include "compute/layers/dense.hpp"
#include "compute/layers/dropout.hpp"
#include "compute/layers/leaky_relu.hpp"
#include "compute/layers/max_pool2d.hpp"
#include "compute/layers/residual.hpp"
#include "base/random.hpp"

namespace asgd::cuda {

namespace {

constexpr float kOne = 1.0f, kZero = 0.0f;
constexpr std::uint64_t kDropoutSeed = 0x5EEDD20F0u;

Status fail(const Node& n, const std::string& why) { return Status::InvalidArgument(n.name + ": " + why); }
Status need_image(const Node& n) { return fail(n, "needs (C, H, W) inputs, gets " + n.in.str()); }

// The CPU layer behind a node whose kind matched; the kind names one class.
template <class L>
L& as(Layer& layer) {
  return dynamic_cast<L&>(layer);
}

void set_4d(TensorDesc& desc, const Dims& d, std::size_t batch) {
  ASGD_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, to_int(batch),
                                              to_int(d.c), to_int(d.h), to_int(d.w)));
}

void describe_in_out(Gpu&, Node& n, std::size_t batch) {
  set_4d(n.x_desc, n.in, batch);
  set_4d(n.y_desc, n.out, batch);
}

// ---- dense: cuBLAS --------------------------------------------------------------

Status lower_dense(Layer& layer, Node& n, PlanBuilder&, std::vector<Shape>& params) {
  const auto& dense = as<Dense>(layer);
  if (dense.in() != n.in.numel())
    return fail(n, "expects " + std::to_string(dense.in()) + " inputs per sample, gets " + n.in.str());
  n.out = {dense.out(), 1, 1, false};
  params = {{dense.out(), dense.in()}, {dense.out()}};
  return {};
}

void dense_forward(Gpu& gpu, Node& n, const float* x, std::size_t batch, bool) {
  // Row-major y (B, out) = x (B, in) W^T is column-major y^T = W x^T,
  // and row-major W (out, in) is column-major W^T (in, out).
  const int in = to_int(n.in.numel()), out = to_int(n.out.numel());
  ASGD_CUBLAS_CHECK(cublasSgemm(gpu.cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, to_int(batch), in, &kOne, gpu.param(n), in,
                                x, in, &kZero, n.y, out));
  ASGD_CUDA_CHECK(
      kernels::add_row_bias(n.y, gpu.param(n) + n.in.numel() * n.out.numel(), batch, n.out.numel(), gpu.stream));
}

void dense_backward(Gpu& gpu, Node& n, const float* x, const float* dy, float* dx, std::size_t batch) {
  const int in = to_int(n.in.numel()), out = to_int(n.out.numel());
  // dW (out, in) = dy^T x, i.e. column-major dW^T (in, out) = x^T (in, B) dy (B, out).
  ASGD_CUBLAS_CHECK(cublasSgemm(gpu.cublas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, to_int(batch), &kOne, x, in, dy, out,
                                &kZero, gpu.grad(n), in));
  ASGD_CUDA_CHECK(
      kernels::channel_sum(dy, batch, n.out.numel(), 1, gpu.grad(n) + n.in.numel() * n.out.numel(), gpu.stream));
  // dx (B, in) = dy W, i.e. column-major dx^T (in, B) = W^T (in, out) dy^T (out, B).
  if (dx)
    ASGD_CUBLAS_CHECK(cublasSgemm(gpu.cublas, CUBLAS_OP_N, CUBLAS_OP_N, in, to_int(batch), out, &kOne, gpu.param(n),
                                  in, dy, out, &kZero, dx, in));
}

// ---- cuDNN activations: relu, tanh, sigmoid ---------------------------------------

template <cudnnActivationMode_t Mode>
Status lower_activation(Layer&, Node& n, PlanBuilder&, std::vector<Shape>&) {
  n.activation = Mode;
  n.out = n.in;
  return {};
}

void activation_describe(Gpu& gpu, Node& n, std::size_t batch) {
  describe_in_out(gpu, n, batch);
  // A NaN goes through, as on the CPU and in torch: not propagated, ReLU
  // made max(NaN, 0) = 0 and a NaN inside the model trained on as a finite
  // loss, past the worker's check of it.
  ASGD_CUDNN_CHECK(cudnnSetActivationDescriptor(n.act_desc.get(), n.activation, CUDNN_PROPAGATE_NAN, 0.0));
}

void activation_forward(Gpu& gpu, Node& n, const float* x, std::size_t, bool) {
  ASGD_CUDNN_CHECK(
      cudnnActivationForward(gpu.cudnn, n.act_desc.get(), &kOne, n.x_desc.get(), x, &kZero, n.y_desc.get(), n.y));
}

void activation_backward(Gpu& gpu, Node& n, const float* x, const float* dy, float* dx, std::size_t) {
  if (dx)
    ASGD_CUDNN_CHECK(cudnnActivationBackward(gpu.cudnn, n.act_desc.get(), &kOne, n.y_desc.get(), n.y, n.y_desc.get(),
                                             dy, n.x_desc.get(), x, &kZero, n.x_desc.get(), dx));
}

constexpr GpuOps activation_ops(const char* kind, Status (*lower)(Layer&, Node&, PlanBuilder&, std::vector<Shape>&)) {
  return {.kind = kind,
          .lower = lower,
          .describe = activation_describe,
          .forward = activation_forward,
          .backward = activation_backward};
}

// ---- leaky_relu: kernels.cu ----------------------------------------------------------

Status lower_leaky_relu(Layer& layer, Node& n, PlanBuilder&, std::vector<Shape>&) {
  n.slope = as<LeakyReLU>(layer).negative_slope();
  n.out = n.in;
  return {};
}

void leaky_relu_forward(Gpu& gpu, Node& n, const float* x, std::size_t batch, bool) {
  ASGD_CUDA_CHECK(kernels::leaky_relu(x, n.y, batch * n.in.numel(), n.slope, gpu.stream));
}

void leaky_relu_backward(Gpu& gpu, Node& n, const float* x, const float* dy, float* dx, std::size_t batch) {
  if (dx) ASGD_CUDA_CHECK(kernels::leaky_relu_backward(x, dy, dx, batch * n.in.numel(), n.slope, gpu.stream));
}

// ---- conv2d: cuDNN ----------------------------------------------------------------

Status lower_conv(Layer& layer, Node& n, PlanBuilder&, std::vector<Shape>& params) {
  const auto& conv = as<Conv2D>(layer);
  const Dims& in = n.in;
  if (!in.image) return need_image(n);
  if (conv.in_channels() != in.c)
    return fail(n, "expects " + std::to_string(conv.in_channels()) + " channels, gets " + in.str());
  if (conv.kernel() == 0 || conv.stride() == 0) return fail(n, "kernel and stride must be positive");
  if (in.h + 2 * conv.pad() < conv.kernel() || in.w + 2 * conv.pad() < conv.kernel())
    return fail(n, "kernel larger than the padded input " + in.str());
  n.kernel = conv.kernel();
  n.stride = conv.stride();
  n.pad = conv.pad();
  n.bias = conv.has_bias();
  n.out = {conv.out_channels(), (in.h + 2 * n.pad - n.kernel) / n.stride + 1,
           (in.w + 2 * n.pad - n.kernel) / n.stride + 1, true};
  params = {{conv.out_channels(), conv.in_channels(), n.kernel, n.kernel}};
  if (n.bias) params.push_back({conv.out_channels()});
  return {};
}

void conv_describe(Gpu& gpu, Node& n, std::size_t batch) {
  describe_in_out(gpu, n, batch);
  ASGD_CUDNN_CHECK(cudnnSetFilter4dDescriptor(n.w_desc.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, to_int(n.out.c),
                                              to_int(n.in.c), to_int(n.kernel), to_int(n.kernel)));
  ASGD_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(n.conv_desc.get(), to_int(n.pad), to_int(n.pad), to_int(n.stride),
                                                   to_int(n.stride), 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  // FMA, not DEFAULT: DEFAULT lets Ampere and later run float convolutions on TF32 tensor cores.
  ASGD_CUDNN_CHECK(cudnnSetConvolutionMathType(n.conv_desc.get(), CUDNN_FMA_MATH));
  gpu.choose_conv_algos(n, batch);
}

void conv_forward(Gpu& gpu, Node& n, const float* x, std::size_t batch, bool) {
  ASGD_CUDNN_CHECK(cudnnConvolutionForward(gpu.cudnn, &kOne, n.x_desc.get(), x, n.w_desc.get(), gpu.param(n),
                                           n.conv_desc.get(), n.algo->fwd, gpu.workspace, gpu.workspace_bytes, &kZero,
                                           n.y_desc.get(), n.y));
  if (n.bias)
    ASGD_CUDA_CHECK(kernels::add_channel_bias(n.y, gpu.param(n) + n.out.c * n.in.c * n.kernel * n.kernel, batch,
                                              n.out.c, n.out.plane(), gpu.stream));
}

void conv_backward(Gpu& gpu, Node& n, const float* x, const float* dy, float* dx, std::size_t batch) {
  ASGD_CUDNN_CHECK(cudnnConvolutionBackwardFilter(gpu.cudnn, &kOne, n.x_desc.get(), x, n.y_desc.get(), dy,
                                                  n.conv_desc.get(), n.algo->bwd_filter, gpu.workspace,
                                                  gpu.workspace_bytes, &kZero, n.w_desc.get(), gpu.grad(n)));
  if (n.bias)
    ASGD_CUDA_CHECK(kernels::channel_sum(dy, batch, n.out.c, n.out.plane(),
                                         gpu.grad(n) + n.out.c * n.in.c * n.kernel * n.kernel, gpu.stream));
  if (dx)
    ASGD_CUDNN_CHECK(cudnnConvolutionBackwardData(gpu.cudnn, &kOne, n.w_desc.get(), gpu.param(n), n.y_desc.get(), dy,
                                                  n.conv_desc.get(), n.algo->bwd_data, gpu.workspace,
                                                  gpu.workspace_bytes, &kZero, n.x_desc.get(), dx));
}

// ---- maxpool2d: cuDNN -------------------------------------------------------------

Status lower_maxpool(Layer& layer, Node& n, PlanBuilder&, std::vector<Shape>&) {
  const auto& pool = as<MaxPool2D>(layer);
  if (!n.in.image) return need_image(n);
  if (pool.kernel() == 0 || pool.stride() == 0) return fail(n, "kernel and stride must be positive");
  if (n.in.h < pool.kernel() || n.in.w < pool.kernel()) return fail(n, "window larger than the input " + n.in.str());
  n.kernel = pool.kernel();
  n.stride = pool.stride();
  n.out = {n.in.c, (n.in.h - n.kernel) / n.stride + 1, (n.in.w - n.kernel) / n.stride + 1, true};
  return {};
}

void maxpool_describe(Gpu& gpu, Node& n, std::size_t batch) {
  describe_in_out(gpu, n, batch);
  // The deterministic mode: plain CUDNN_POOLING_MAX may route an
  // overlapping window's gradient differently from run to run. A NaN wins
  // its window, as on the CPU (not propagated, it was skipped, and a window
  // of NaNs gave -FLT_MAX).
  ASGD_CUDNN_CHECK(cudnnSetPooling2dDescriptor(n.pool_desc.get(), CUDNN_POOLING_MAX_DETERMINISTIC,
                                               CUDNN_PROPAGATE_NAN, to_int(n.kernel), to_int(n.kernel), 0, 0,
                                               to_int(n.stride), to_int(n.stride)));
}

void maxpool_forward(Gpu& gpu, Node& n, const float* x, std::size_t, bool) {
  ASGD_CUDNN_CHECK(
      cudnnPoolingForward(gpu.cudnn, n.pool_desc.get(), &kOne, n.x_desc.get(), x, &kZero, n.y_desc.get(), n.y));
}

void maxpool_backward(Gpu& gpu, Node& n, const float* x, const float* dy, float* dx, std::size_t) {
  if (dx)
    ASGD_CUDNN_CHECK(cudnnPoolingBackward(gpu.cudnn, n.pool_desc.get(), &kOne, n.y_desc.get(), n.y, n.y_desc.get(),
                                          dy, n.x_desc.get(), x, &kZero, n.x_desc.get(), dx));
}

// ---- global_avg_pool: kernels.cu -------------------------------------------------

Status lower_global_avg_pool(Layer&, Node& n, PlanBuilder&, std::vector<Shape>&) {
  if (!n.in.image) return need_image(n);
  n.out = {n.in.c, 1, 1, false};
  return {};
}

void global_avg_pool_forward(Gpu& gpu, Node& n, const float* x, std::size_t batch, bool) {
  ASGD_CUDA_CHECK(kernels::row_mean(x, n.y, batch * n.in.c, n.in.plane(), gpu.stream));
}

void global_avg_pool_backward(Gpu& gpu, Node& n, const float*, const float* dy, float* dx, std::size_t batch) {
  if (dx) ASGD_CUDA_CHECK(kernels::row_mean_backward(dy, dx, batch * n.in.c, n.in.plane(), gpu.stream));
}

// ---- batchnorm2d: cuDNN -----------------------------------------------------------

Status lower_batchnorm(Layer& layer, Node& n, PlanBuilder& plan, std::vector<Shape>& params) {
  auto& bn = as<BatchNorm2D>(layer);
  if (!n.in.image) return need_image(n);
  if (bn.channels() != n.in.c)
    return fail(n, "expects " + std::to_string(bn.channels()) + " channels, gets " + n.in.str());
  if (bn.running_mean().size() != n.in.c || bn.running_var().size() != n.in.c)
    return fail(n, "running statistics do not have one value per channel");
  n.eps = bn.eps();
  n.momentum = bn.momentum();
  n.stats = plan.add_stats(bn, n.in.c);
  n.out = n.in;
  params = {{n.in.c}, {n.in.c}};
  return {};
}

void batchnorm_describe(Gpu& gpu, Node& n, std::size_t batch) {
  describe_in_out(gpu, n, batch);
  ASGD_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(n.bn_desc.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, to_int(n.in.c), 1, 1));
}

void batchnorm_carve(Node& n, Carver& carver, std::size_t batch, bool training) {
  if (!training) return;
  if (!n.needs_dx) n.scratch = carver.take<float>(batch * n.in.numel());  // cuDNN always writes dx
  n.saved_mean = carver.take<float>(n.in.c);
  n.saved_inv_std = carver.take<float>(n.in.c);
}

void batchnorm_forward(Gpu& gpu, Node& n, const float* x, std::size_t, bool training) {
  // (Its values per channel were checked before the step queued anything.)
  // cuDNN moves running_var towards the unbiased batch variance, as the
  // CPU layer and PyTorch do, and normalises with the biased one.
  float* gamma = gpu.param(n);
  float* beta = gamma + n.in.c;
  float* mean = gpu.stat(n);
  float* var = mean + n.in.c;
  if (training) {
    ASGD_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
        gpu.cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, n.x_desc.get(), x, n.y_desc.get(), n.y, n.bn_desc.get(),
        gamma, beta, static_cast<double>(n.momentum), mean, var, static_cast<double>(n.eps), n.saved_mean,
        n.saved_inv_std));
  } else {
    ASGD_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(gpu.cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero,
                                                             n.x_desc.get(), x, n.y_desc.get(), n.y, n.bn_desc.get(),
                                                             gamma, beta, mean, var, static_cast<double>(n.eps)));
  }
}

void batchnorm_backward(Gpu& gpu, Node& n, const float* x, const float* dy, float* dx, std::size_t) {
  ASGD_CUDNN_CHECK(cudnnBatchNormalizationBackward(
      gpu.cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne, &kZero, n.x_desc.get(), x, n.y_desc.get(), dy,
      n.x_desc.get(), dx ? dx : n.scratch, n.bn_desc.get(), gpu.param(n), gpu.grad(n), gpu.grad(n) + n.in.c,
      static_cast<double>(n.eps), n.saved_mean, n.saved_inv_std));
}

// ---- flatten ------------------------------------------------------------------------

Status lower_flatten(Layer&, Node& n, PlanBuilder&, std::vector<Shape>&) {
  n.out = {n.in.numel(), 1, 1, false};
  return {};
}

void pass_forward(Gpu&, Node& n, const float* x, std::size_t, bool) { n.out_ptr = x; }

void copy_backward(Gpu& gpu, Node& n, const float*, const float* dy, float* dx, std::size_t batch) {
  if (dx)
    ASGD_CUDA_CHECK(cudaMemcpyAsync(dx, dy, batch * n.in.numel() * sizeof(float), cudaMemcpyDeviceToDevice,
                                    gpu.stream));
}

// ---- dropout: kernels.cu --------------------------------------------------------

Status lower_dropout(Layer& layer, Node& n, PlanBuilder&, std::vector<Shape>&) {
  const auto& dropout = as<Dropout>(layer);
  if (!(dropout.p() >= 0.0f && dropout.p() <= 1.0f)) return fail(n, "p must lie in [0, 1]");
  n.p = dropout.p();
  n.dropout = &dropout;
  n.out = n.in;
  return {};
}

void dropout_forward(Gpu& gpu, Node& n, const float* x, std::size_t batch, bool training) {
  if (!training) return pass_forward(gpu, n, x, batch, training);
  // The layer's seed (the job's, through Model::init_params) folds in:
  // the masks were the same for every --seed.
  n.seed = mix_seed(kDropoutSeed ^ n.dropout->seed(), n.index, gpu.step);
  ASGD_CUDA_CHECK(kernels::dropout(x, n.y, batch * n.in.numel(), n.p, n.seed, gpu.stream));
}

void dropout_backward(Gpu& gpu, Node& n, const float*, const float* dy, float* dx, std::size_t batch) {
  if (dx) ASGD_CUDA_CHECK(kernels::dropout(dy, dx, batch * n.in.numel(), n.p, n.seed, gpu.stream));
}

// ---- residual: two paths -------------------------------------------------------------

std::vector<Layer*> raw(const std::vector<std::unique_ptr<Layer>>& layers) {
  std::vector<Layer*> out;
  for (const auto& l : layers) out.push_back(l.get());
  return out;
}

Status lower_residual(Layer& layer, Node& n, PlanBuilder& plan, std::vector<Shape>&) {
  auto& residual = as<Residual>(layer);
  Dims main_shape = n.in, short_shape = n.in;
  if (Status s = plan.add_sequence(raw(residual.main_path()), main_shape, n.main, n.needs_dx, n.path + ".main.");
      !s.ok())
    return s;
  if (Status s = plan.add_sequence(raw(residual.shortcut_path()), short_shape, n.shortcut, n.needs_dx,
                                   n.path + ".shortcut.");
      !s.ok())
    return s;
  if (main_shape.c != short_shape.c || main_shape.h != short_shape.h || main_shape.w != short_shape.w)
    return fail(n, "main path gives " + main_shape.str() + " but shortcut gives " + short_shape.str());
  n.out = main_shape;
  return {};
}

void residual_carve(Node& n, Carver& carver, std::size_t batch, bool training) {
  if (training && n.needs_dx && !n.shortcut.empty()) n.scratch = carver.take<float>(batch * n.in.numel());
}

void residual_forward(Gpu& gpu, Node& n, const float* x, std::size_t batch, bool training) {
  const float* a = gpu.forward(n.main, x, batch, training);
  const float* b = gpu.forward(n.shortcut, x, batch, training);  // x itself when the shortcut is empty
  ASGD_CUDA_CHECK(kernels::add(a, b, n.y, batch * n.out.numel(), gpu.stream));
}

void residual_backward(Gpu& gpu, Node& n, const float* x, const float* dy, float* dx, std::size_t batch) {
  const std::size_t count = batch * n.in.numel();
  // dL/dx = main's dL/dx + shortcut's (dy itself for the identity).
  if (n.main.empty()) {
    if (dx) ASGD_CUDA_CHECK(cudaMemcpyAsync(dx, dy, count * sizeof(float), cudaMemcpyDeviceToDevice, gpu.stream));
  } else {
    gpu.backward(n.main, x, dy, dx, batch);
  }
  if (!n.shortcut.empty()) gpu.backward(n.shortcut, x, dy, dx ? n.scratch : nullptr, batch);
  if (dx) ASGD_CUDA_CHECK(kernels::add(dx, n.shortcut.empty() ? dy : n.scratch, dx, count, gpu.stream));
}

using Output = GpuOps::Output;

// One entry per kind, by the name its CPU layer's kind() gives.
const std::array kGpuOps = {
    GpuOps{.kind = "dense", .lower = lower_dense, .forward = dense_forward, .backward = dense_backward},
    activation_ops("relu", lower_activation<CUDNN_ACTIVATION_RELU>),
    GpuOps{.kind = "conv2d",
           .lower = lower_conv,
           .describe = conv_describe,
           .forward = conv_forward,
           .backward = conv_backward},
    GpuOps{.kind = "maxpool2d",
           .lower = lower_maxpool,
           .describe = maxpool_describe,
           .forward = maxpool_forward,
           .backward = maxpool_backward},
    GpuOps{.kind = "global_avg_pool",
           .lower = lower_global_avg_pool,
           .forward = global_avg_pool_forward,
           .backward = global_avg_pool_backward},
    GpuOps{.kind = "batchnorm2d",
           .lower = lower_batchnorm,
           .describe = batchnorm_describe,
           .carve = batchnorm_carve,
           .forward = batchnorm_forward,
           .backward = batchnorm_backward},
    GpuOps{.kind = "flatten",
           .lower = lower_flatten,
           .output = Output::input,
           .forward = pass_forward,
           .backward = copy_backward},
    GpuOps{.kind = "dropout",
           .lower = lower_dropout,
           .output = Output::input_at_inference,
           .forward = dropout_forward,
           .backward = dropout_backward},
    GpuOps{.kind = "residual",
           .lower = lower_residual,
           .carve = residual_carve,
           .forward = residual_forward,
           .backward = residual_backward},
    activation_ops("tanh", lower_activation<CUDNN_ACTIVATION_TANH>),
    activation_ops("sigmoid", lower_activation<CUDNN_ACTIVATION_SIGMOID>),
    GpuOps{.kind = "leaky_relu",
           .lower = lower_leaky_relu,
           .forward = leaky_relu_forward,
           .backward = leaky_relu_backward},
};

}  // namespace

const GpuOps* find_gpu_ops(std::string_view kind) {
  for (const GpuOps& ops : kGpuOps)
    if (kind == ops.kind) return &ops;
  return nullptr;
}

}  // namespace asgd::cuda
