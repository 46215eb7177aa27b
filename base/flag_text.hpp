#pragma once
// Reading a flag's text: a list ("1,2,3", "0:4,random:0.1:4") split into its
// items, and each item as a number.

#include <charconv>
#include <cmath>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

namespace asgd {

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
