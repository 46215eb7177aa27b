#include "runtime/page_common.hpp"

#include "runtime/chartjs.hpp"

namespace asgd::pages {

std::string_view error_capture_js() {
  return R"JS(
window.asgdErrors = [];
(function () {
  function note(text) { window.asgdErrors.push(String(text)); }
  window.onerror = function (message, source, line, column, error) {
    note(error && error.stack ? error.stack : message + ' (line ' + line + ', column ' + column + ')');
  };
  window.addEventListener('unhandledrejection', function (e) {
    var r = e.reason;
    note('unhandled rejection: ' + (r && r.stack ? r.stack : r));
  });
  var consoleError = console.error;
  console.error = function () {
    note(Array.prototype.map.call(arguments, String).join(' '));
    return consoleError.apply(console, arguments);
  };
})();
)JS";
}

std::string_view chart_helpers_js() {
  return R"JS(
function asgdPainted(canvas) {
  if (!canvas.width || !canvas.height) return false;
  var pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  for (var i = 3; i < pixels.length; i += 4) if (pixels[i] !== 0) return true;
  return false;
}
function asgdChartSummary(id, chart) {
  var datasets = 0, points = 0;
  chart.data.datasets.forEach(function (d) {
    if (d.asgdGuide) return;
    var n = d.data.filter(function (v) { return v !== null && v !== undefined; }).length;
    if (n > 0) datasets += 1;
    points += n;
  });
  var y = chart.scales && chart.scales.y;
  return {id: id, datasets: datasets, points: points, painted: asgdPainted(chart.canvas),
          y_min: y && typeof y.min === 'number' ? y.min : null, y_max: y && typeof y.max === 'number' ? y.max : null};
}
function asgdWriteStatus(summaries) {
  var el = document.getElementById('asgd-render-status');
  if (el) el.textContent = JSON.stringify({charts: summaries, errors: window.asgdErrors});
}
)JS";
}

const std::vector<std::string>& palette() {
  static const std::vector<std::string> colors = {"#2563eb", "#ea580c", "#16a34a", "#9333ea",
                                                   "#dc2626", "#0891b2", "#ca8a04", "#db2777"};
  return colors;
}

std::string_view base_css() {
  return R"CSS(
:root { --ink: #0f172a; --muted: #64748b; --line: #e2e8f0; --card: #ffffff; --page: #f1f5f9; --accent: #2563eb; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--page); color: var(--ink);
  font: 14px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans", sans-serif; }
header { background: #0f172a; color: #e2e8f0; padding: 24px 32px 20px; }
header h1 { margin: 0 0 4px; font-size: 24px; font-weight: 650; color: #fff; letter-spacing: -0.01em; }
header .sub { margin: 0 0 16px; color: #94a3b8; font-size: 15px; }
header dl { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 8px 20px; margin: 0; }
header dt { font-size: 11px; text-transform: uppercase; letter-spacing: 0.06em; color: #94a3b8; }
header dd { margin: 0; font-weight: 600; color: #f8fafc; overflow-wrap: anywhere; }
header code { display: block; margin-top: 16px; padding: 8px 12px; background: #1e293b; border-radius: 6px;
  color: #cbd5e1; font: 12.5px/1.5 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; white-space: pre-wrap;
  overflow-wrap: anywhere; }
main { max-width: 1360px; margin: 0 auto; padding: 24px 32px 40px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 18px 20px;
  margin: 0 0 20px; box-shadow: 0 1px 2px rgba(15, 23, 42, 0.04); }
.card h2 { margin: 0 0 4px; font-size: 16px; font-weight: 650; }
.card p.desc { margin: 0 0 12px; color: var(--muted); font-size: 13px; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 20px; margin-bottom: 20px; }
.grid .card { margin: 0; }
.chart-box { position: relative; height: 320px; }
.empty { color: var(--muted); font-style: italic; margin: 40px 0; text-align: center; }
.banner { border-left: 4px solid #ea580c; background: #fff7ed; padding: 10px 14px; border-radius: 6px; margin: 0 0 20px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; font-variant-numeric: tabular-nums; }
th, td { padding: 6px 10px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th { font-weight: 600; color: var(--muted); font-size: 12px; background: #f8fafc; }
th.group { text-align: center; border-bottom: 1px solid #cbd5e1; }
td.name, th.name { text-align: left; }
td.note { color: var(--muted); font-style: italic; }
tbody tr:hover { background: #f8fafc; }
.table-scroll { overflow-x: auto; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 7px; vertical-align: baseline; }
.lead { margin: 0 0 12px; }
.notes { color: #334155; }
.notes li { margin: 4px 0; }
footer { color: var(--muted); font-size: 12px; text-align: center; padding: 8px 0 32px; }
#asgd-render-status { display: none; }
)CSS";
}

std::string chartjs_script_element() {
  std::string out = "<script>/* Chart.js ";
  out += chartjs_version();
  out += ", MIT license, https://www.chartjs.org (third_party/chartjs) */\n";
  out += chartjs_source();
  out += "\n</script>\n";
  return out;
}

}  // namespace asgd::pages
