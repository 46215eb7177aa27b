#pragma once
// A small, fully specified pseudo-random generator so that a seed gives the
// same numbers with every compiler and standard library (std::*_distribution
// is implementation-defined, which would break bitwise reproducibility).

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace asgd {

/// SplitMix64: used to expand one seed into independent streams.
inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// Mixes several integers (seed, worker, epoch, ...) into one stream seed.
inline std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0) {
  std::uint64_t s = a;
  std::uint64_t x = splitmix64(s) ^ (b * 0xD1B54A32D192ED03ULL);
  s = x;
  x = splitmix64(s) ^ (c * 0x8CB92BA72F3D8DD7ULL);
  s = x;
  return splitmix64(s);
}

/// xoshiro256** (Blackman and Vigna). Not thread-safe: one per thread.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    std::uint64_t s = seed;
    for (auto& w : s_) w = splitmix64(s);
  }

  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  /// Uniform in [0, 1) with 24 random bits (exactly representable in float).
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }

  /// Uniform in [lo, hi).
  float uniform(float lo, float hi) {
    // Rounding can land exactly on hi when |lo| dwarfs hi - lo; keep [lo, hi).
    const float v = lo + (hi - lo) * uniform();
    return v < hi ? v : std::nextafter(hi, lo);
  }

  /// Standard normal via Box-Muller (one value per call; simple over fast).
  float normal() {
    double u1 = (static_cast<double>(next() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

  /// Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; bias < 2^-32
  /// for the n this project uses).
  std::size_t below(std::size_t n) {
    __extension__ using u128 = unsigned __int128;
    return static_cast<std::size_t>((static_cast<u128>(next()) * n) >> 64);
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

}  // namespace asgd
