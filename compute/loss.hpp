#pragma once
// The loss that ends every model: softmax cross-entropy over class scores.

#include <cstdint>
#include <span>

#include "compute/tensor.hpp"

namespace asgd {

/// Mean softmax cross-entropy over a batch of logits (B, C) and labels (B,).
/// Not a Layer: it ends the graph and owns the labels.
class SoftmaxCrossEntropy {
 public:
  /// Returns the mean loss over the batch and keeps the probabilities for
  /// backward(). Labels must lie in [0, C).
  float forward(ConstTensorView logits, std::span<const std::int32_t> labels);

  /// dL/dlogits = (softmax - onehot) / B, resized to (B, C).
  void backward(std::span<const std::int32_t> labels, Tensor& dlogits) const;

  /// How many rows of the last forward() had their largest logit at the label.
  std::size_t correct(std::span<const std::int32_t> labels) const;

 private:
  Tensor probs_;  // (B, C)
};

}  // namespace asgd
