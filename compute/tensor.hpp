#pragma once
// float32 tensors: an owning Tensor and non-owning views over someone else's
// memory (a model's single parameter allocation, a message payload).
// Row-major; the first dimension is the batch where there is one.

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace asgd {

using Shape = std::vector<std::size_t>;

inline std::size_t numel(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>());
}

/// The most parameters a model may have (8 GiB of floats), and the most
/// values one sample may become in any layer: checked before anything of
/// that size is allocated.
inline constexpr std::size_t kMaxParams = std::size_t{1} << 31;
inline constexpr std::size_t kMaxValuesPerSample = std::size_t{1} << 31;

/// numel(shape) when it is at most `limit`; nullopt when it is larger (or
/// would overflow on the way).
inline std::optional<std::size_t> numel_within(const Shape& shape, std::size_t limit) {
  std::size_t n = 1;
  for (const std::size_t d : shape)
    if (__builtin_mul_overflow(n, d, &n) || n > limit) return std::nullopt;
  return n;
}

std::string shape_string(const Shape& shape);  // "(64, 784)"

/// Whether every value is finite (no NaN, no infinity). One pass, branch-free
/// per block, about memory speed.
bool all_finite(std::span<const float> values);

/// Owning, contiguous float32 tensor. Copyable and movable; not thread-safe.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape, float fill = 0.0f) : shape_(std::move(shape)), data_(numel(shape_), fill) {}

  const Shape& shape() const { return shape_; }
  std::size_t dim(std::size_t i) const { return shape_[i]; }
  std::size_t rank() const { return shape_.size(); }
  std::size_t size() const { return data_.size(); }

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  std::span<float> span() { return data_; }
  std::span<const float> span() const { return data_; }
  float& operator[](std::size_t i) { return data_[i]; }
  float operator[](std::size_t i) const { return data_[i]; }

  /// Changes the shape, keeping (and growing if needed) the storage: layers
  /// call this every step, so a steady batch size never reallocates.
  void resize(Shape shape) {
    shape_ = std::move(shape);
    data_.resize(numel(shape_));
  }

 private:
  Shape shape_;
  std::vector<float> data_;
};

/// A non-owning view: pointer plus shape. The viewed memory must outlive it.
template <class T>
struct BasicView {
  T* data = nullptr;
  Shape shape;
  std::size_t size() const { return numel(shape); }
  std::span<T> span() const { return {data, size()}; }
};
using TensorView = BasicView<float>;
using ConstTensorView = BasicView<const float>;

}  // namespace asgd
