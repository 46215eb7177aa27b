#pragma once
// Reading a flag's text: a list ("1,2,3", "0:4,random:0.1:4") split into its
// items, and each item as a number; the known name nearest a misspelt one.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

namespace asgd {

/// The edit distance between two names, for "did you mean".
inline std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

/// Of `names`, the nearest to `given` within two edits; empty when none is.
inline std::string nearest(const std::string& given, const std::vector<std::string>& names) {
  std::string best;
  std::size_t best_distance = 3;  // farther than this is no suggestion
  for (const std::string& name : names)
    if (const std::size_t d = edit_distance(given, name); d < best_distance) {
      best_distance = d;
      best = name;
    }
  return best;
}

/// The pieces of `text` between `sep`s, empty ones included: "a,,b" gives
/// {"a", "", "b"} and "" gives {""}.
inline std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const auto end = text.find(sep, start);
    out.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

/// Reads all of `text` as a number of type T (a floating-point one must be
/// finite); false, with `out` unspecified, for anything else ("", "1x", "nan").
template <class T>
bool parse_number(const std::string& text, T& out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  if (text.empty() || ec != std::errc() || ptr != end) return false;
  if constexpr (std::is_floating_point_v<T>) return std::isfinite(out);
  return true;
}

}  // namespace asgd
