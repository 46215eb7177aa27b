// The CUDA backend's DeviceModel. The CPU model's layers are mirrored as a
// tree of nodes (nodes.hpp, plan.cpp), each run by its layer kind's GpuOps
// (lowerings.cpp) on cuDNN, cuBLAS and the small kernels in kernels.cu, all
// queued on the model's own stream; the loss is cuDNN's log-softmax and a
// kernel. Parameters and gradients stay in host memory in the model's flat
// layout; each training step uploads the parameters and downloads the
// gradients in place, the caller's buffers page-locked once
// (cudaHostRegister), or through pinned staging buffers where that fails.
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
// What differs from the CPU layers: dropout masks are a hash of the
// Dropout layer's seed (as last reseeded), the node and the step, not
// draws from the layer's generator; BatchNorm's running statistics always move
// by `momentum` (the cumulative average of a recalibration is CPU work:
// Model::recalibrate_batchnorm runs its forwards there, and the next GPU
// step uploads the result).
//
// Errors: make_model returns a Status; the per-step calls throw
// asgd::cuda::Error (a std::runtime_error; see check.hpp).

#include "base/log.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include "compute/cuda/check.hpp"
#include "compute/cuda/cudnn.hpp"
#include "compute/cuda/kernels.cuh"
#include "compute/cuda/memory.hpp"
#include "compute/cuda/nodes.hpp"
#include "compute/cuda_backend.hpp"
#include "compute/device.hpp"
#include "compute/layers/batch_norm2d.hpp"

namespace asgd {
namespace cuda {
namespace {

// Makes `index` the calling thread's device; first member of the model, so
// everything after it is created on that device.
struct CurrentDevice {
  explicit CurrentDevice(int i) : index(i) { ASGD_CUDA_CHECK(cudaSetDevice(index)); }
  int index;
};

// ---- Algorithm choice ------------------------------------------------------------

// Workspace beyond this is not worth an algorithm's speed.
constexpr std::size_t kWorkspaceLimit = std::size_t{1} << 30;

// How much slower than the fastest a deterministic algorithm may be and
// still be preferred (repeated steps then give the same gradients).
constexpr float kDeterminismSlack = 1.10f;

// FFT and Winograd algorithms compute in a transformed domain and round
// differently: on an H100 an FFT backward-filter pass put lenet's first
// gradients 0.5% off the CPU's, where the GEMM and direct algorithms agree
// to 1e-5. Only those take part, unless ASGD_CUDNN_ALGOS=all lets every
// fp32 algorithm compete (as PyTorch's cudnn.benchmark does).
bool all_algos_allowed() {
  static const bool all = [] {
    const char* v = std::getenv("ASGD_CUDNN_ALGOS");
    if (v == nullptr || std::strcmp(v, "exact") == 0 || *v == '\0') return false;
    if (std::strcmp(v, "all") == 0) return true;
    throw Error(std::string("ASGD_CUDNN_ALGOS='") + v + "': expected exact (the default) or all");
  }();
  return all;
}

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
        !(exact_fp32(perf.algo) || all_algos_allowed()))
      continue;
    if (fastest == nullptr) fastest = &perf;
    if (deterministic == nullptr && perf.determinism == CUDNN_DETERMINISTIC) deterministic = &perf;
  }
  if (fastest == nullptr) throw Error(what + ": cuDNN offers no GEMM-based or direct fp32 algorithm for this shape");
  const Perf* chosen =
      deterministic != nullptr && deterministic->time <= fastest->time * kDeterminismSlack ? deterministic : fastest;
  logger().debug("cuDNN {}: algorithm {} ({:.3f} ms{}, {} bytes of workspace); the fastest took {:.3f} ms", what,
                static_cast<int>(chosen->algo), chosen->time,
                chosen->determinism == CUDNN_DETERMINISTIC ? ", deterministic" : "", chosen->memory, fastest->time);
  workspace = std::max(workspace, chosen->memory);
  return chosen->algo;
}

// ---- The model ---------------------------------------------------------------------

class CudaModel final : public DeviceModel, public Gpu {
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
  StepPhases last_step_phases() const override { return phases_; }

  const float* forward(std::vector<Node>& seq, const float* x, std::size_t batch, bool training) override;
  void backward(std::vector<Node>& seq, const float* x, const float* dy, float* dx, std::size_t batch) override;
  void choose_conv_algos(Node& n, std::size_t batch) override;

 private:
  void check_batch(std::size_t batch, std::span<const float> x, const char* call) const;
  void prepare(std::size_t batch, bool training);
  void layout(std::vector<Node>& seq, Carver& carver, std::size_t batch, bool training);
  void upload_params_and_stats(std::span<const float> params, bool direct);
  // Host memory that the copies read and write in place, page-locked
  // (cudaHostRegister), saving the pass through the pinned staging buffers;
  // where registering fails, they stage. A worker's buffers rotate (its
  // gradient goes out as a push, a reply's parameters come back in another
  // buffer): the last few registrations are kept, for both directions, so
  // each buffer is registered once, not at every step (one registration a
  // direction unregistered and registered a buffer each step, and the
  // parameters, in a buffer the gradients' record held, always staged).
  struct InPlace {
    void* ptr = nullptr;
    std::size_t bytes = 0;
    bool registered = false;
  };
  static constexpr std::size_t kKeptRegistrations = 4;
  bool in_place(const void* ptr, std::size_t bytes);

  CurrentDevice device_;
  std::string description_;
  Plan plan_;
  Stream stream_;
  CudnnHandle cudnn_;
  CublasHandle cublas_;
  TensorDesc logits_desc_;  // (B, classes, 1, 1)
  BatchUploader uploader_;

  DeviceBuffer params_;     // (P)
  DeviceBuffer grads_;      // (P)
  DeviceBuffer stats_;      // (S) running statistics of every batchnorm
  DeviceBuffer pool_;       // activations, their gradients and step scratch, carved per batch size
  DeviceBuffer workspace_;  // cuDNN convolution workspace
  PinnedBuffer host_params_, host_grads_, host_stats_, host_out_;
  // A training step's moments on the device: before the parameters go up,
  // after they are up, after the forward pass and loss, after the backward
  // pass, after the gradients are down.
  Event began_{true}, uploaded_{true}, forwarded_{true}, backwarded_{true}, downloaded_{true};
  StepPhases phases_;
  std::vector<InPlace> in_place_;  // most recently used first, kKeptRegistrations at most

  std::size_t prepared_batch_ = 0;
  bool prepared_training_ = false;
  float* logp_ = nullptr;      // (B, classes) log-softmax
  float* dlogits_ = nullptr;   // (B, classes)
  float* row_loss_ = nullptr;  // (B)
  float* loss_ = nullptr;      // (1)
};

CudaModel::CudaModel(Plan plan, int device) : device_(device), plan_(std::move(plan)) {
  cudaDeviceProp prop{};
  ASGD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  description_ = "cuda:" + std::to_string(device) + " (" + prop.name + ")";

  ASGD_CUDNN_CHECK(cudnnSetStream(cudnn_.get(), stream_.get()));
  ASGD_CUBLAS_CHECK(cublasSetStream(cublas_.get(), stream_.get()));
  ASGD_CUBLAS_CHECK(cublasSetMathMode(cublas_.get(), CUBLAS_DEFAULT_MATH));  // no TF32

  const std::size_t param_bytes = std::max<std::size_t>(plan_.params, 1) * sizeof(float);
  const std::size_t stat_bytes = std::max<std::size_t>(plan_.stats, 1) * sizeof(float);
  params_.reserve(param_bytes);
  grads_.reserve(param_bytes);
  stats_.reserve(stat_bytes);
  // What every node's operations run with (Gpu).
  cudnn = cudnn_.get();
  cublas = cublas_.get();
  stream = stream_.get();
  params_base = params_.as<float>();
  grads_base = grads_.as<float>();
  stats_base = stats_.as<float>();
  host_params_.reserve(param_bytes);
  host_grads_.reserve(param_bytes);
  host_stats_.reserve(stat_bytes);
}

CudaModel::~CudaModel() {
  // Members free their memory and handles after this; they need the device
  // current and nothing of ours still running.
  cudaSetDevice(device_.index);
  cudaStreamSynchronize(stream_.get());
  for (const InPlace& r : in_place_)
    if (r.registered) cudaHostUnregister(r.ptr);
  // What failed here (a buffer freed while registered) must not be the
  // next launch's error on this thread, which reads cudaGetLastError.
  cudaGetLastError();
}

bool CudaModel::in_place(const void* ptr, std::size_t bytes) {
  if (ptr == nullptr || bytes == 0) return false;
  const auto* begin = static_cast<const std::byte*>(ptr);
  const auto found = std::find_if(in_place_.begin(), in_place_.end(),
                                  [&](const InPlace& r) { return r.ptr == ptr && r.bytes == bytes; });
  if (found != in_place_.end()) {
    std::rotate(in_place_.begin(), found, found + 1);
    return in_place_.front().registered;
  }
  // A kept range this one overlaps (the same address, another size) goes
  // first: CUDA refuses to register a page twice. So does the oldest when
  // all are taken.
  const auto overlaps = [&](const InPlace& r) {
    const auto* at = static_cast<const std::byte*>(r.ptr);
    return at < begin + bytes && begin < at + r.bytes;
  };
  const auto let_go = [](const InPlace& r) {
    if (r.registered && cudaHostUnregister(r.ptr) != cudaSuccess) cudaGetLastError();  // freed since
  };
  std::erase_if(in_place_, [&](const InPlace& r) {
    if (!overlaps(r)) return false;
    let_go(r);
    return true;
  });
  if (in_place_.size() >= kKeptRegistrations) {
    let_go(in_place_.back());
    in_place_.pop_back();
  }
  InPlace r{const_cast<void*>(ptr), bytes, false};
  r.registered = cudaHostRegister(r.ptr, bytes, cudaHostRegisterDefault) == cudaSuccess;
  if (!r.registered) {
    cudaGetLastError();  // not sticky: clear it and stage instead
    logger().debug("cuda:{}: {} bytes at {} stay pageable; their copies go through pinned buffers", device_.index,
                   bytes, ptr);
  }
  in_place_.insert(in_place_.begin(), r);
  return r.registered;
}

void CudaModel::check_batch(std::size_t batch, std::span<const float> x, const char* call) const {
  if (x.size() != batch * plan_.sample.numel())
    throw Error(std::string(call) + ": x holds " + std::to_string(x.size()) + " floats, " + std::to_string(batch) +
                " samples of " + plan_.sample.str() + " need " + std::to_string(batch * plan_.sample.numel()));
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
  using Output = GpuOps::Output;
  for (Node& n : seq) {
    const Output output = n.ops->output;
    const bool passes_through = output == Output::input || (output == Output::input_at_inference && !training);
    n.y = passes_through ? nullptr : carver.take<float>(batch * n.out.numel());
    n.dy = training && !n.last ? carver.take<float>(batch * n.out.numel()) : nullptr;
    n.scratch = nullptr;
    n.saved_mean = n.saved_inv_std = nullptr;
    if (n.ops->carve) n.ops->carve(n, carver, batch, training);
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

  std::size_t workspace_needed = 0;
  for_each_node(plan_.nodes, [&](Node& n) {
    if (n.ops->describe) n.ops->describe(*this, n, batch);
    if (n.algo) workspace_needed = std::max(workspace_needed, n.algo->workspace);
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
  workspace_.reserve(workspace_needed);
  workspace = workspace_.data();
  workspace_bytes = workspace_.bytes();
  host_out_.reserve(std::max<std::size_t>(batch * plan_.classes, 1) * sizeof(float));

  prepared_batch_ = batch;
  prepared_training_ = training;
}

void CudaModel::upload_params_and_stats(std::span<const float> params, bool direct) {
  if (direct && in_place(params.data(), params.size_bytes())) {
    ASGD_CUDA_CHECK(cudaMemcpyAsync(params_.data(), params.data(), params.size_bytes(), cudaMemcpyHostToDevice,
                                    stream_.get()));
  } else if (!params.empty()) {
    std::memcpy(host_params_.data(), params.data(), params.size_bytes());
    ASGD_CUDA_CHECK(cudaMemcpyAsync(params_.data(), host_params_.data(), params.size_bytes(), cudaMemcpyHostToDevice,
                                    stream_.get()));
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
                                  cudaMemcpyHostToDevice, stream_.get()));
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
  // As every argument check, before anything is queued (a batchnorm's ran
  // inside the forward pass, with the parameters' upload in flight).
  for_each_node(plan_.nodes, [&](const Node& n) {
    if (std::string_view(n.ops->kind) == "batchnorm2d") BatchNorm2D::check_values_per_channel(batch * n.in.h * n.in.w);
  });

  ASGD_CUDA_CHECK(cudaSetDevice(device_.index));
  prepare(batch, true);
  const BatchUploader::DeviceBatch in = uploader_.acquire(x, y, stream_.get());
  // Where the parameters stage through the pinned buffer, the upload's
  // interval on the device includes the host's copy into it: the stream has
  // nothing to do until the copy is queued.
  ASGD_CUDA_CHECK(cudaEventRecord(began_.get(), stream_.get()));
  // The caller's parameters and gradients (a worker's, the same buffers
  // every step) are copied in place; the stream is synchronized before this
  // returns, so the caller never sees them in flight.
  upload_params_and_stats(params, true);
  ASGD_CUDA_CHECK(cudaEventRecord(uploaded_.get(), stream_.get()));
  ++step;

  const float* logits = forward(plan_.nodes, in.x, batch, true);
  const float one = 1.0f, zero = 0.0f;
  ASGD_CUDNN_CHECK(cudnnSoftmaxForward(cudnn_.get(), CUDNN_SOFTMAX_LOG, CUDNN_SOFTMAX_MODE_INSTANCE, &one,
                                       logits_desc_.get(), logits, &zero, logits_desc_.get(), logp_));
  ASGD_CUDA_CHECK(kernels::softmax_xent(logp_, in.y, batch, plan_.classes, dlogits_, row_loss_, loss_, stream_.get()));
  ASGD_CUDA_CHECK(cudaEventRecord(forwarded_.get(), stream_.get()));
  backward(plan_.nodes, in.x, dlogits_, nullptr, batch);
  ASGD_CUDA_CHECK(cudaEventRecord(backwarded_.get(), stream_.get()));

  const bool grads_direct = in_place(grads.data(), grads.size_bytes());
  ASGD_CUDA_CHECK(cudaMemcpyAsync(grads_direct ? static_cast<void*>(grads.data()) : host_grads_.data(), grads_.data(),
                                  grads.size_bytes(), cudaMemcpyDeviceToHost, stream_.get()));
  if (plan_.stats > 0)
    ASGD_CUDA_CHECK(cudaMemcpyAsync(host_stats_.data(), stats_.data(), plan_.stats * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_.get()));
  ASGD_CUDA_CHECK(cudaMemcpyAsync(host_out_.data(), loss_, sizeof(float), cudaMemcpyDeviceToHost, stream_.get()));
  ASGD_CUDA_CHECK(cudaEventRecord(downloaded_.get(), stream_.get()));
  stream_.synchronize();

  using Clock = std::chrono::steady_clock;
  const Clock::time_point unstaging = Clock::now();
  if (!grads_direct && !grads.empty()) std::memcpy(grads.data(), host_grads_.data(), grads.size_bytes());
  const float* host = host_stats_.as<float>();
  for (BatchNorm2D* bn : plan_.batchnorms) {
    std::copy(host, host + bn->channels(), bn->running_mean().begin());
    host += bn->channels();
    std::copy(host, host + bn->channels(), bn->running_var().begin());
    host += bn->channels();
  }
  phases_.forward_s = elapsed_s(uploaded_, forwarded_);
  phases_.backward_s = elapsed_s(forwarded_, backwarded_);
  phases_.copy_s = elapsed_s(began_, uploaded_) + elapsed_s(backwarded_, downloaded_) +
                   std::chrono::duration<double>(Clock::now() - unstaging).count();
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
  const BatchUploader::DeviceBatch in = uploader_.acquire(x, {}, stream_.get());
  upload_params_and_stats(params, false);
  const float* out = forward(plan_.nodes, in.x, batch, false);
  ASGD_CUDA_CHECK(cudaMemcpyAsync(host_out_.data(), out, logits.size_bytes(), cudaMemcpyDeviceToHost, stream_.get()));
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
    n.out_ptr = n.y;
    n.ops->forward(*this, n, x, batch, training);
    x = n.out_ptr;
  }
  return x;
}

// dy is dL/d(output of seq), dx receives dL/dx (or null: not needed).
void CudaModel::backward(std::vector<Node>& seq, const float* x, const float* dy, float* dx, std::size_t batch) {
  for (std::size_t i = seq.size(); i-- > 0;) {
    Node& n = seq[i];
    const float* in = i == 0 ? x : seq[i - 1].out_ptr;
    const float* grad_out = n.last ? dy : n.dy;
    float* grad_in = i == 0 ? dx : seq[i - 1].dy;
    n.ops->backward(*this, n, in, grad_out, grad_in, batch);
  }
}

}  // namespace

int device_count(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it, so later calls do not report it again
    if (!why) return 0;
    std::error_code ec;
    // Without a driver's device node CUDA's own words ("driver version is
    // insufficient") mislead: there is no NVIDIA GPU (or driver) at all.
    if (!std::filesystem::exists("/dev/nvidiactl", ec)) {
      *why = "no NVIDIA GPU found (no NVIDIA driver: /dev/nvidiactl does not exist)";
    } else if (err == cudaErrorInsufficientDriver) {
      *why = "the NVIDIA driver is older than this build's CUDA runtime (CUDA " + std::to_string(CUDART_VERSION / 1000) +
             " needs driver R580 or newer): cudaErrorInsufficientDriver";
    } else {
      *why = std::string("CUDA cannot be used: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    }
    return 0;
  }
  if (count == 0 && why) *why = "no CUDA device found";
  return count;
}

Result<std::unique_ptr<DeviceModel>> make_model(const std::vector<Layer*>& layers, const Shape& sample_shape,
                                                 std::size_t param_count, int device_index) {
  // The model is checked first: a layer the backend lacks is a mistake on
  // any machine, with or without a GPU.
  Result<Plan> plan = build_plan(layers, sample_shape, param_count);
  if (!plan.ok()) return plan.status();

  std::string why;
  const int count = device_count(&why);
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
    std::unique_ptr<DeviceModel> model = std::make_unique<CudaModel>(std::move(plan).value(), device_index);
    return Result<std::unique_ptr<DeviceModel>>(std::move(model));
  } catch (const Error& e) {
    return Status::Internal(name + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return Status::Internal(name + ": out of host memory");
  }
}

}  // namespace cuda
}  // namespace asgd

// The plugin's two exports (compute/cuda_backend.hpp); the rest of the
// library is local to it (compute/cuda/exports.map).
extern "C" __attribute__((visibility("default"))) const char asgd_cuda_backend_build[] = ASGD_BUILD_ID;

extern "C" __attribute__((visibility("default"))) const asgd::CudaBackendApi* asgd_cuda_backend(
    spdlog::logger* host_logger) {
  asgd::use_host_logger(host_logger);
  static const asgd::CudaBackendApi api{asgd::kCudaBackendVersion, &asgd::cuda::device_count, &asgd::cuda::make_model};
  return &api;
}
