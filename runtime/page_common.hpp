#pragma once
// Pieces both of our pages share (report.html and the status server's live
// page): the script that collects errors before anything else runs, chart
// helpers that record what each chart drew, the palette, the base style.

#include <string>
#include <string_view>
#include <vector>

namespace asgd::pages {

/// Goes first in <head>: window.onerror, unhandledrejection and a wrapped
/// console.error push onto window.asgdErrors.
std::string_view error_capture_js();

/// Defines asgdChartSummary(id, chart) -> {id, datasets, points, painted}
/// (datasets flagged asgdGuide, such as a target line, are not counted) and
/// asgdWriteStatus(summaries), which writes {charts, errors} as JSON into
/// <pre id="asgd-render-status">.
std::string_view chart_helpers_js();

/// Colors for policies, in the order given; the tables' swatches and the
/// charts use the same ones.
const std::vector<std::string>& palette();

/// Fonts, colors, cards, tables, the chart boxes.
std::string_view base_css();

/// <script>Chart.js</script>.
std::string chartjs_script_element();

}  // namespace asgd::pages
