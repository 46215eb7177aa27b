#pragma once
// Internal to the report (report.cpp): the script that draws its charts.

#include <string_view>

namespace asgd::experiments {

/// The script that draws every chart of report.html from its data block
/// (report_data): plain ES5 plus Chart.js.
std::string_view report_draw_js();

}  // namespace asgd::experiments
