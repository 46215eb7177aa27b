#pragma once
// Splitting a flag's list ("1,2,3", "0:4,random:0.1:4") into its items.

#include <string>
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

}  // namespace asgd
