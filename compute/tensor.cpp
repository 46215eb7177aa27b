#include "compute/tensor.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <sstream>

namespace asgd {

std::string shape_string(const Shape& shape) {
  std::ostringstream out;
  out << '(';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ')';
  return out.str();
}

bool all_finite(std::span<const float> values) {
  // A float is NaN or infinite exactly when its exponent bits are all set.
  // OR-ing a per-value flag over a block vectorises; checking once per
  // block keeps an early exit without a branch per value.
  constexpr std::uint32_t kExponent = 0x7F800000u;
  constexpr std::size_t kBlock = 1024;
  const float* p = values.data();
  const std::size_t n = values.size();
  for (std::size_t start = 0; start < n; start += kBlock) {
    const std::size_t end = std::min(n, start + kBlock);
    std::uint32_t bad = 0;
    for (std::size_t i = start; i < end; ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, p + i, sizeof bits);
      bad |= static_cast<std::uint32_t>((bits & kExponent) == kExponent);
    }
    if (bad) return false;
  }
  return true;
}

}  // namespace asgd
