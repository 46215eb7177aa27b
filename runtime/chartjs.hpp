#pragma once
// Chart.js (third_party/chartjs), embedded into the library at build time so
// that every page we write or serve works without a network.

#include <string_view>

namespace asgd::pages {

/// The minified UMD build, ready to inline into a <script> element (the
/// build checks that it holds no "</script"). Static storage; never empty.
std::string_view chartjs_source();

/// Its version, "4.6.1".
std::string_view chartjs_version();

}  // namespace asgd::pages
