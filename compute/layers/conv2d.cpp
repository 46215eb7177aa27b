#include "compute/layers/conv2d.hpp"

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "compute/cpu_kernels.hpp"
#include "compute/im2col.hpp"
#include "compute/thread_pool.hpp"

namespace asgd {

using cpu::ceil_div;
using cpu::conv_out;
using cpu::ConvGeometry;
using cpu::dot_products;
using cpu::have_avx512;
using cpu::matmul;
using cpu::Strided;
using cpu::vectorised;

namespace {

// A leading dimension for n columns that keeps rows 64-byte aligned relative
// to each other and away from multiples of 4 KiB, where successive rows
// would contend for the same L1 sets (a 1024-float stride halved the speed
// of the product).
std::size_t padded_ld(std::size_t n) {
  std::size_t ld = ceil_div(n, 16) * 16;
  if (ld % 1024 == 0) ld += 16;
  return ld;
}

// How a call cuts its batch: groups of samples whose im2col buffer stays in
// the core's L2 cache, so that the group's products read it from there.
struct ConvPlan {
  std::size_t threads;
  std::size_t group;  // samples per product
  std::size_t ld;     // leading dimension of the group buffers
};

// Layers whose weights pass this many floats (1 MiB) are planned for their
// weights' traffic (plan_conv, conv_chunks).
constexpr std::size_t kLargeWeights = 256 * 1024;
bool large_weights(const ConvGeometry& g, std::size_t out) { return g.rows() * out >= kLargeWeights; }

// How backward cuts the batch into chunks whose shares of dW are summed in
// order. Each chunk writes a whole dW share, so a layer with large weights
// takes two chunks, not eight: a 512-channel layer's eight shares were 75 MB
// to write and read back for a batch. Either way the cut does not depend on
// the thread count (up to 4), so results do not either.
Chunks conv_chunks(const ConvGeometry& g, std::size_t out, std::size_t batch, std::size_t threads) {
  if (!large_weights(g, out)) return sample_chunks(batch, threads);
  const std::size_t size = std::max<std::size_t>(ceil_div(batch, 2), 1);
  return {size, ceil_div(batch, size)};
}

ConvPlan plan_conv(const ConvGeometry& g, std::size_t out, std::size_t batch, std::size_t threads) {
  // BLAS's products need packed leading dimensions: one sample per product.
  if (!have_avx512()) return {threads, 1, g.plane()};
  // About 512 KiB of im2col per group: enough columns for full register
  // tiles when planes are small (7x7), and inside a core's 2 MiB L2. No
  // larger than a chunk, so that forward's chunks (one group each) are as
  // many as backward's. Where the weights pass 1 MiB (a ResNet-18's 256- and
  // 512-channel layers, on 7x7 and 4x4 planes) a product of one sample's few
  // columns would read them from memory for little work: at least 256
  // columns then (ResNet-18 at batch 32: 1.1x). Layers whose weights stay in
  // cache keep their groups, which save a group's copy into place.
  constexpr std::size_t kColFloats = 128 * 1024;
  constexpr std::size_t kMinColumns = 256;
  std::size_t group = kColFloats / (g.rows() * g.plane());
  if (large_weights(g, out)) group = std::max(group, ceil_div(kMinColumns, g.plane()));
  group = std::clamp<std::size_t>(group, 1, conv_chunks(g, out, batch, threads).size);
  return {threads, group, padded_ld(group * g.plane())};
}

// What one thread needs, kept between calls.
struct ConvPart {
  std::vector<float> col;     // (rows, ld): im2col of a group of samples side by side
  std::vector<float> out;     // (O, ld): a group's product before it is scattered; a group's dy side by side
  std::vector<float> dyt;     // (group * OH*OW, O): a group's dy, transposed
  std::vector<float> dcol;    // (C*k*k, ld)
  std::vector<float> padded;  // one sample with its zero padding written out
};

template <class T>
void grow(std::vector<T>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
}

// The side of the tiles a transposing loop goes in (backward).
constexpr std::size_t kTile = 32;

// Calls fn(o, r) for tile `tile`'s kTile values of o (of `os`) and every r
// (of `rs`), kTile x kTile at a time, so that the lines a transposing loop
// reads and writes stay in L1.
template <class Fn>
void in_tile(std::size_t tile, std::size_t os, std::size_t rs, Fn&& fn) {
  const std::size_t o0 = tile * kTile;
  for (std::size_t r0 = 0; r0 < rs; r0 += kTile)
    for (std::size_t o = o0; o < std::min(o0 + kTile, os); ++o)
      for (std::size_t r = r0; r < std::min(r0 + kTile, rs); ++r) fn(o, r);
}

// Runs fn over `tiles` tiles of `elements` elements in all: on the pool when
// there is enough to share (a ResNet-18's 512-channel weights: 2.4M), else
// here (a lenet's 13K, where waking the pool's threads costs more).
template <class Fn>
void run_tiles(ThreadPool* pool, std::size_t tiles, std::size_t elements, Fn& fn) {
  constexpr std::size_t kShared = 64 * 1024;
  if (tiles > 1 && elements >= kShared) return run_chunks(pool, tiles, fn);
  for (std::size_t t = 0; t < tiles; ++t) fn(t, std::size_t{0});
}

std::size_t padded_size(const ConvGeometry& g) { return g.c * (g.h + 2 * g.pad) * (g.w + 2 * g.pad); }

// out (B, M, OH, OW) = [bias +] A (M, rows) * im2col(in) for the n samples
// from b0: the forward pass, and for a stride-1 conv also dx (a convolution
// of dy with the flipped kernel).
void convolve_group(const ConvGeometry& g, std::size_t ld, Strided a, std::size_t m, const float* bias,
                    const float* in, float* out, std::size_t b0, std::size_t n, ConvPart& part) {
  const std::size_t plane = g.plane(), rows = g.rows(), in_size = g.c * g.h * g.w;
  for (std::size_t j = 0; j < n; ++j)
    cpu::im2col(g, in + (b0 + j) * in_size, part.padded.data(), part.col.data() + j * plane, ld);
  if (n == 1) {
    // out_b (M, P) = [bias +] A (M, rows) * col (rows, P), straight into out.
    float* ob = out + b0 * m * plane;
    if (bias)
      for (std::size_t o = 0; o < m; ++o) std::fill(ob + o * plane, ob + (o + 1) * plane, bias[o]);
    matmul(m, plane, rows, a, part.col.data(), ld, ob, plane, bias != nullptr);
    return;
  }
  // (M, n*P) = A * col, then each sample's columns go to its place.
  matmul(m, n * plane, rows, a, part.col.data(), ld, part.out.data(), ld, false);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t o = 0; o < m; ++o) {
      const float* __restrict src = part.out.data() + o * ld + j * plane;
      float* __restrict dst = out + ((b0 + j) * m + o) * plane;
      const float shift = bias ? bias[o] : 0.0f;
      for (std::size_t p = 0; p < plane; ++p) dst[p] = src[p] + shift;
    }
}

// How one backward call computes dW, db and dx.
struct BackwardPlan {
  ConvGeometry g;        // the forward convolution
  ConvGeometry gd;       // dx as a convolution of dy with the flipped kernel
  ConvPlan plan, plan_dx;
  Chunks chunks;         // dW and db are summed per chunk of samples, then over chunks in order
  bool dx = false;
  bool dx_by_convolution = false;
  bool dw_by_dots = false;
};

BackwardPlan plan_backward(const ConvGeometry& g, std::size_t out, std::size_t batch, std::size_t threads,
                           bool dx) {
  BackwardPlan bp{g, {out, g.oh, g.ow, g.k, 1, g.k - 1 - std::min(g.pad, g.k - 1), g.h, g.w},
                  plan_conv(g, out, batch, threads), {}, conv_chunks(g, out, batch, threads), dx};
  // With stride 1, dx is the convolution of dy, padded by k - 1 - pad, with
  // the flipped kernel: the forward path, whose products reduce over O*k*k
  // instead of O and need no col2im (2x faster on the 3x3 layers), when the
  // conv has enough input channels to fill a register tile.
  bp.dx_by_convolution = dx && g.s == 1 && g.pad < g.k && g.c >= 8;
  bp.plan_dx = bp.dx_by_convolution ? plan_conv(bp.gd, g.c, batch, threads) : bp.plan;
  // With fewer columns (C*k*k) than a vector a register tile over them would
  // be mostly empty: dW as dot products of rows of dy and col instead (2x
  // faster for a 3x3 first layer on one channel; from 16 columns on, the
  // tile is faster).
  bp.dw_by_dots = g.rows() < 16;
  return bp;
}

// The operands of one backward call.
struct BackwardTensors {
  const float* w;   // (O, C, k, k)
  const float* x;   // (B, C, H, W)
  const float* dy;  // (B, O, OH, OW)
  float* dx;        // (B, C, H, W), or null
  bool bias;
};

void grow_for_backward(ConvPart& part, const BackwardPlan& bp, std::size_t out) {
  const std::size_t rows = bp.g.rows(), plane = bp.g.plane();
  grow(part.col, rows * bp.plan.ld);
  grow(part.padded, padded_size(bp.g));
  if (!bp.dw_by_dots) grow(part.dyt, bp.plan.group * plane * out);
  if (bp.plan.group > 1) grow(part.out, out * bp.plan.ld);
  if (bp.dx_by_convolution) {
    grow(part.col, bp.gd.rows() * bp.plan_dx.ld);
    grow(part.padded, padded_size(bp.gd));
    if (bp.plan_dx.group > 1) grow(part.out, bp.g.c * bp.plan_dx.ld);
  } else if (bp.dx) {
    grow(part.dcol, rows * bp.plan.ld);
  }
}

// The n samples from b0: adds their share of dW (O, C*k*k, or transposed
// unless by dot products) and db (O) into dw and db, and writes their dx by
// col2im unless dx is a convolution of its own.
void backward_group(const BackwardPlan& bp, const BackwardTensors& t, std::size_t out, std::size_t b0, std::size_t n,
                    float* dw, float* db, ConvPart& part) {
  const ConvGeometry& g = bp.g;
  const std::size_t plane = g.plane(), rows = g.rows(), in_size = g.c * g.h * g.w, ld = bp.plan.ld;
  const float* dy0 = t.dy + b0 * out * plane;
  if (t.bias)
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t o = 0; o < out; ++o)
        db[o] += static_cast<float>(vectorised<cpu::plane_sum>(dy0 + (j * out + o) * plane, plane));
  // The group's dy as (O, n*P).
  const float* dyg = dy0;
  std::size_t lddy = plane;
  const bool dx_by_col2im = t.dx && !bp.dx_by_convolution;
  if (n > 1 && (bp.dw_by_dots || dx_by_col2im)) {
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t o = 0; o < out; ++o) {
        const float* src = dy0 + (j * out + o) * plane;
        std::copy(src, src + plane, part.out.data() + o * ld + j * plane);
      }
    dyg = part.out.data();
    lddy = ld;
  }
  for (std::size_t j = 0; j < n; ++j)
    cpu::im2col(g, t.x + (b0 + j) * in_size, part.padded.data(), part.col.data() + j * plane, ld);
  if (bp.dw_by_dots) {
    // dW (O, C*k*k) += dy (O, n*P) . col (C*k*k, n*P), row by row.
    dot_products(out, rows, n * plane, dyg, lddy, part.col.data(), ld, dw, rows);
  } else {
    // dy transposed, (n*P, O), then dW^T (C*k*k, O) += col (C*k*k, n*P) * dy^T (n*P, O).
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t o = 0; o < out; ++o) {
        const float* src = dy0 + (j * out + o) * plane;
        float* dst = part.dyt.data() + j * plane * out + o;
        for (std::size_t p = 0; p < plane; ++p) dst[p * out] = src[p];
      }
    matmul(rows, out, n * plane, {part.col.data(), ld, 1}, part.dyt.data(), out, dw, out, true);
  }
  if (!dx_by_col2im) return;
  // dcol (C*k*k, n*P) = W^T (C*k*k, O) * dy (O, n*P), folded back onto dx.
  matmul(rows, n * plane, out, {t.w, 1, rows}, dyg, lddy, part.dcol.data(), ld, false);
  for (std::size_t j = 0; j < n; ++j)
    cpu::col2im(g, part.dcol.data() + j * plane, ld, part.padded.data(), t.dx + (b0 + j) * in_size);
}

}  // namespace

struct Conv2D::Scratch {
  std::vector<ConvPart> parts;    // per thread
  std::vector<float> dw_partial;  // per chunk of samples, its share of dW: (O, C*k*k) by dot products, else transposed
  std::vector<float> db_partial;  // per chunk: its share of db
  std::vector<float> flipped;     // (C, O, k, k): W with in and out swapped and the kernel turned 180 degrees
};

Conv2D::Conv2D(std::size_t in_channels, std::size_t out_channels, std::size_t kernel, std::size_t stride,
               std::size_t pad, bool bias)
    : in_(in_channels),
      out_(out_channels),
      k_(kernel),
      stride_(stride),
      pad_(pad),
      bias_(bias),
      scratch_(std::make_unique<Scratch>()) {
  assert(in_ > 0 && out_ > 0 && k_ > 0 && stride_ > 0);
}

Conv2D::~Conv2D() = default;

Shape Conv2D::output_shape(const Shape& input) const {
  assert(input.size() == 3 && input[0] == in_);
  return {out_, conv_out(input[1], k_, stride_, pad_), conv_out(input[2], k_, stride_, pad_)};
}

std::vector<ParamSpec> Conv2D::param_specs() const {
  const std::size_t fan_in = in_ * k_ * k_;
  std::vector<ParamSpec> specs = {{"weight", {out_, in_, k_, k_}, Init::he_uniform, fan_in}};
  if (bias_) specs.push_back({"bias", {out_}, Init::zeros, fan_in});
  return specs;
}

void Conv2D::bind(std::span<float> params, std::span<float> grads) {
  const std::size_t wsize = out_ * in_ * k_ * k_;
  assert(params.size() == wsize + (bias_ ? out_ : 0) && grads.size() == params.size());
  w_ = params.data();
  dw_ = grads.data();
  b_ = bias_ ? w_ + wsize : nullptr;
  db_ = bias_ ? dw_ + wsize : nullptr;
}

void Conv2D::forward(ConstTensorView x, Tensor& y) {
  assert(x.shape.size() == 4 && x.shape[1] == in_);
  const std::size_t batch = x.shape[0];
  const ConvGeometry g{in_, x.shape[2], x.shape[3], k_, stride_, pad_, conv_out(x.shape[2], k_, stride_, pad_),
                       conv_out(x.shape[3], k_, stride_, pad_)};
  y.resize({batch, out_, g.oh, g.ow});
  const ConvPlan plan = plan_conv(g, out_, batch, threads_of(pool_));
  scratch_->parts.resize(std::max(scratch_->parts.size(), plan.threads));
  for (ConvPart& part : scratch_->parts) {
    grow(part.col, g.rows() * plan.ld);
    grow(part.padded, padded_size(g));
    if (plan.group > 1) grow(part.out, out_ * plan.ld);
  }
  auto work = [&](std::size_t group, std::size_t thread) {
    const std::size_t b0 = group * plan.group;
    convolve_group(g, plan.ld, {w_, g.rows(), 1}, out_, b_, x.data, y.data(), b0, std::min(plan.group, batch - b0),
                   scratch_->parts[thread]);
  };
  run_chunks(pool_, ceil_div(batch, plan.group), work);
}

void Conv2D::backward(ConstTensorView x, const Tensor& /*y*/, const Tensor& dy, Tensor* dx) {
  const std::size_t batch = x.shape[0];
  if (dx) dx->resize(x.shape);
  const ConvGeometry g{in_, x.shape[2], x.shape[3], k_, stride_, pad_, conv_out(x.shape[2], k_, stride_, pad_),
                       conv_out(x.shape[3], k_, stride_, pad_)};
  const BackwardPlan bp = plan_backward(g, out_, batch, threads_of(pool_), dx != nullptr);
  const std::size_t rows = g.rows();
  Scratch& sc = *scratch_;
  grow(sc.dw_partial, bp.chunks.count * rows * out_);
  grow(sc.db_partial, bp.chunks.count * out_);
  if (bp.dx_by_convolution) {
    // In tiles of (o, c) (row by row, a 512-channel layer's writes missed
    // every time).
    const std::size_t kk = k_ * k_;
    sc.flipped.resize(in_ * out_ * kk);
    auto flip = [&](std::size_t tile, std::size_t /*thread*/) {
      in_tile(tile, out_, in_, [&](std::size_t o, std::size_t c) {
        const float* from = &w_[(o * in_ + c) * kk];
        float* to = &sc.flipped[(c * out_ + o) * kk];
        for (std::size_t i = 0; i < kk; ++i) to[i] = from[kk - 1 - i];
      });
    };
    run_tiles(pool_, ceil_div(out_, kTile), sc.flipped.size(), flip);
  }
  sc.parts.resize(std::max(sc.parts.size(), bp.plan.threads));
  for (ConvPart& part : sc.parts) grow_for_backward(part, bp, out_);
  const BackwardTensors t{w_, x.data, dy.data(), dx ? dx->data() : nullptr, bias_};
  auto weight_grads = [&](std::size_t chunk, std::size_t thread) {
    float* dw = sc.dw_partial.data() + chunk * rows * out_;
    float* db = sc.db_partial.data() + chunk * out_;
    std::fill(dw, dw + rows * out_, 0.0f);
    std::fill(db, db + out_, 0.0f);
    const auto [begin, end] = bp.chunks.range(chunk, batch);
    for (std::size_t b0 = begin; b0 < end; b0 += bp.plan.group)
      backward_group(bp, t, out_, b0, std::min(bp.plan.group, end - b0), dw, db, sc.parts[thread]);
  };
  run_chunks(pool_, bp.chunks.count, weight_grads);
  if (bp.dx_by_convolution) {
    auto input_grads = [&](std::size_t group, std::size_t thread) {
      const std::size_t b0 = group * bp.plan_dx.group;
      convolve_group(bp.gd, bp.plan_dx.ld, {sc.flipped.data(), bp.gd.rows(), 1}, in_, nullptr, dy.data(), dx->data(),
                     b0, std::min(bp.plan_dx.group, batch - b0), sc.parts[thread]);
    };
    run_chunks(pool_, ceil_div(batch, bp.plan_dx.group), input_grads);
  }
  // dW (O, C*k*k) = the sum of the chunks' shares, in chunk order; db
  // likewise. The shares of products are transposed, (C*k*k, O): read and
  // written in tiles, as the flip above.
  auto sum_shares = [&](std::size_t tile, std::size_t /*thread*/) {
    in_tile(tile, out_, rows, [&](std::size_t o, std::size_t r) {
      float sum = 0.0f;
      for (std::size_t c = 0; c < bp.chunks.count; ++c)
        sum += sc.dw_partial[c * rows * out_ + (bp.dw_by_dots ? o * rows + r : r * out_ + o)];
      dw_[o * rows + r] = sum;
    });
  };
  run_tiles(pool_, ceil_div(out_, kTile), rows * out_ * bp.chunks.count, sum_shares);
  if (bias_)
    for (std::size_t o = 0; o < out_; ++o) {
      float sum = 0.0f;
      for (std::size_t c = 0; c < bp.chunks.count; ++c) sum += sc.db_partial[c * out_ + o];
      db_[o] = sum;
    }
}

}  // namespace asgd
