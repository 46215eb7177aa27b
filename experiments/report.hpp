#pragma once
// report.html of asgd compare: one self-contained page (Chart.js and the
// data inlined, no request to anywhere) with the learning curves, throughput,
// staleness and wait figures, and the time-to-target and scaling tables.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "asgd/job.hpp"
#include "experiments/compare.hpp"

namespace asgd::experiments {

/// Everything the report shows. Plain data.
struct ReportInput {
  JobConfig config;                    ///< the job every run shares (seed: repeat 0's)
  std::vector<std::string> policies;   ///< as given, in order
  std::vector<std::uint32_t> workers;  ///< every worker count, ascending
  std::uint32_t repeats = 1;
  Placement placement = Placement::one_process;  ///< where each run ran (the defaults differ)
  std::vector<RunRecord> runs;         ///< the finished runs, in the order they ran
  std::optional<Target> target;
  std::string command;                 ///< the command line, shown as run
  std::string generated_at;            ///< "2025-11-21 11:32 UTC"
  std::string host;                    ///< the machine, in words
  std::string incomplete;              ///< empty when every run finished; else why not, one sentence
};

/// Text for HTML element content and attribute values: & < > " ' escaped.
std::string html_escape(std::string_view text);

/// `value` as JSON that can sit inside <script type="application/json">:
/// every '<', '>' and '&' is written \u003c, \u003e, \u0026, so no text
/// from a job can close the element or open a comment; JSON.parse reads it
/// back unchanged.
std::string script_json(const nlohmann::json& value);

/// What the page's script draws: runs with their curves, histograms and
/// waits, the target, the scaling rows.
nlohmann::json report_data(const ReportInput& in);

/// The page. When it has drawn, its <pre id="asgd-render-status"> holds
/// {"charts": [{"id", "datasets", "points", "painted"}], "errors": [...]}:
/// what each chart got and every script error, for tests.
std::string report_html(const ReportInput& in);

}  // namespace asgd::experiments
