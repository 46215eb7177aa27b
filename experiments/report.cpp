#include "experiments/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>

#include "base/json_text.hpp"
#include "experiments/report_script.hpp"
#include "runtime/chartjs.hpp"
#include "runtime/metrics.hpp"
#include "runtime/page_common.hpp"

namespace asgd::experiments {

namespace {

using nlohmann::json;

std::string printf_string(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string seconds(double s) { return printf_string(s < 10 ? "%.2f" : "%.1f", s); }
std::string accuracy(double a) { return printf_string("%.4f", a); }

// 152183.4 -> "152,183"
std::string count(double v) {
  std::string digits = printf_string("%.0f", v);
  std::string out;
  const std::size_t lead = digits[0] == '-' ? 1 : 0;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > lead && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string plural(std::size_t n, const std::string& word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string policy_color(const ReportInput& in, const std::string& policy) {
  const auto& colors = pages::palette();
  const auto it = std::find(in.policies.begin(), in.policies.end(), policy);
  const std::size_t i = it == in.policies.end() ? 0 : static_cast<std::size_t>(it - in.policies.begin());
  return colors[i % colors.size()];
}

std::string swatch(const ReportInput& in, const std::string& policy) {
  return "<span class=\"swatch\" style=\"background:" + policy_color(in, policy) + "\"></span>";
}

template <class T>
json optional_json(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

json to_json(const CurvePoint& p) {
  return {{"kind", p.kind == CurvePoint::Kind::epoch ? "epoch" : "eval"},
          {"epoch", optional_json(p.epoch)},
          {"wall_s", p.wall_s},
          {"updates", optional_json(p.updates)},
          {"samples", optional_json(p.samples)},
          {"train_loss", optional_json(p.train_loss)},
          {"val_accuracy", p.val_accuracy},
          {"samples_per_s", optional_json(p.samples_per_s)}};
}

json to_json(const Spread& s) { return {{"mean", s.mean}, {"min", s.min}, {"max", s.max}, {"n", s.n}}; }

// The first reason a run's meter gave ("" for none): of the runs that
// measured, what they left out; else why nothing was measured. (An
// unmeasured run's reason read as a gap in the others.)
std::string energy_reason(const ReportInput& in, bool of_measured) {
  for (const RunRecord& r : in.runs)
    if (r.summary.energy.measured == of_measured && !r.summary.energy.reason.empty()) return r.summary.energy.reason;
  return "";
}

// The devices the runs' meters read ("cpu package 0, dram 0, gpu 0"): the
// note said RAPL and NVML whatever had been read (a run that read one GPU
// and no CPU claimed both).
std::string measured_devices(const ReportInput& in) {
  std::vector<std::string> seen;
  for (const RunRecord& r : in.runs)
    for (const DeviceEnergy& d : r.summary.energy.devices)
      if (std::find(seen.begin(), seen.end(), d.device) == seen.end()) seen.push_back(d.device);
  std::string out;
  for (const std::string& d : seen) out += (out.empty() ? "" : ", ") + d;
  return out.empty() ? "no device named" : out;
}

// Energy and EDP, the EDP also as a multiple of the first group's (the
// baseline: the first policy at the fewest workers).
std::string energy_text(const GroupStats& g, const std::optional<Spread>& baseline_edp) {
  if (!g.energy_j) return "not measured";
  std::string out = count(g.energy_j->mean) + " J";
  if (g.edp_js) {
    out += ", EDP " + count(g.edp_js->mean) + " J&middot;s";
    if (baseline_edp && baseline_edp->mean > 0) out += " (" + printf_string("%.2f", g.edp_js->mean / baseline_edp->mean) + "&times;)";
  }
  return out;
}

// One of the settings whose default depends on the policy and the worker
// count (lr, batch): the value when every run has the same, else each value
// with the runs that take it, "0.04 (bsp), 0.02 (async, ssp:3)"; with
// several worker counts a run is named "bsp x2".
std::string per_run_setting(const ReportInput& in, const std::function<std::string(const TrainingSettings&)>& value) {
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;  // value -> runs, in first-seen order
  for (std::uint32_t w : in.workers)
    for (const std::string& p : in.policies) {
      const std::string v = value(training_settings(config_for_run(in.config, p, w, 0), in.placement));
      const std::string label = in.workers.size() > 1 ? p + " x" + std::to_string(w) : p;
      auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == v; });
      if (g == groups.end()) groups.push_back({v, {label}});
      else g->second.push_back(label);
    }
  if (groups.size() <= 1) return groups.empty() ? "" : groups.front().first;
  std::vector<std::string> parts;
  for (const auto& [v, runs] : groups) parts.push_back(v + " (" + join(runs, ", ") + ")");
  return join(parts, ", ");
}

// The header: what ran, where, when.
std::string header_html(const ReportInput& in) {
  const JobConfig& c = in.config;
  std::vector<std::string> workers;
  for (auto w : in.workers) workers.push_back(std::to_string(w));
  std::string seeds = std::to_string(c.seed);
  if (in.repeats > 1) seeds += "&ndash;" + std::to_string(c.seed + in.repeats - 1);
  std::vector<std::pair<std::string, std::string>> items = {
      {"Model", html_escape(c.model)},
      {"Dataset", html_escape(c.dataset)},
      {"Workers", html_escape(join(workers, ", "))},
      {"Shards", std::to_string(c.shards)},
      {"Device", html_escape(c.device)},
      {"Epochs", std::to_string(c.epochs)},
      {"Batch per worker",
       html_escape(per_run_setting(in, [](const TrainingSettings& t) { return std::to_string(t.batch); }))},
      {"Optimizer", html_escape(c.optimizer) + " (" + html_escape(c.lr_schedule) + "), lr " +
                        html_escape(per_run_setting(in, [](const TrainingSettings& t) {
                          return printf_string("%g", t.lr);
                        }))},
      {"Repeats", std::to_string(in.repeats) + " (seeds " + seeds + ")"},
      {"Evaluated", c.eval_every_s > 0 ? "every " + html_escape(printf_string("%g", c.eval_every_s)) + " s and each epoch"
                                       : std::string("after each epoch")},
      {"Generated", html_escape(in.generated_at)},
      {"Machine", html_escape(in.host)},
  };
  std::vector<std::string> labels;
  for (const auto& p : in.policies) labels.push_back(html_escape(p));
  std::string out = "<header>\n<h1>Consistency policies compared: " + join(labels, " &middot; ") + "</h1>\n";
  const std::string policies =
      in.policies.size() == 1 ? "1 policy" : std::to_string(in.policies.size()) + " policies";
  out += "<p class=\"sub\">" + html_escape(c.model) + " on " + html_escape(c.dataset) + ": " +
         plural(in.runs.size(), "run") + " (" + policies + " &times; " + plural(in.workers.size(), "worker count") +
         " &times; " + plural(in.repeats, "repeat") + ")</p>\n<dl>\n";
  for (const auto& [k, v] : items) out += "<div><dt>" + k + "</dt><dd>" + v + "</dd></div>\n";
  out += "</dl>\n";
  if (!in.command.empty()) out += "<code>" + html_escape(in.command) + "</code>\n";
  out += "</header>\n";
  return out;
}

std::string target_sentence(const ReportInput& in) {
  if (!in.target) return "No target: no run has a validation point yet.";
  return "Target: validation accuracy &ge; <b>" + html_escape(printf_string("%g", in.target->accuracy)) +
         "</b>, " + html_escape(in.target->how) +
         ". Time to target is the training time (from the first step) of the first evaluation at or above it" +
         (in.config.eval_every_s > 0
              ? "; evaluations come every " + html_escape(printf_string("%g", in.config.eval_every_s)) +
                    " s and at the end of each epoch, so times are only as fine as that."
              : "; evaluations come at the end of each epoch only, so times are only as fine as an epoch.");
}

std::string stats_table_html(const ReportInput& in, const std::vector<GroupStats>& groups) {
  const bool multi = in.workers.size() > 1;
  std::string out = "<section class=\"card\" id=\"time-to-target\">\n<h2>Time to target</h2>\n<p class=\"lead\">" +
                    target_sentence(in) + "</p>\n<div class=\"table-scroll\"><table>\n<thead><tr>";
  out += "<th class=\"name\" rowspan=\"2\">Policy</th>";
  if (multi) out += "<th rowspan=\"2\">Workers</th>";
  out += "<th rowspan=\"2\">Runs</th><th class=\"group\" colspan=\"3\">Time to target (s)</th>"
         "<th class=\"group\" colspan=\"3\">Final test accuracy</th><th rowspan=\"2\">Training time (s), mean</th>"
         "<th rowspan=\"2\">Samples/s, mean</th><th rowspan=\"2\">Energy</th></tr>\n<tr><th>mean</th><th>min</th>"
         "<th>max</th><th>mean</th><th>min</th><th>max</th></tr></thead>\n<tbody>\n";
  for (const GroupStats& g : groups) {
    out += "<tr><td class=\"name\">" + swatch(in, g.policy) + html_escape(g.policy) + "</td>";
    if (multi) out += "<td>" + std::to_string(g.workers) + "</td>";
    out += "<td>" + std::to_string(g.runs) + "</td>";
    if (g.time_to_target_s) {
      std::string mean = seconds(g.time_to_target_s->mean);
      if (g.reached < g.runs) mean += " (" + std::to_string(g.reached) + " of " + std::to_string(g.runs) + " reached)";
      out += "<td>" + mean + "</td><td>" + seconds(g.time_to_target_s->min) + "</td><td>" +
             seconds(g.time_to_target_s->max) + "</td>";
    } else {
      out += "<td class=\"note\" colspan=\"3\">not reached</td>";
    }
    out += "<td>" + accuracy(g.final_test_accuracy.mean) + "</td><td>" + accuracy(g.final_test_accuracy.min) +
           "</td><td>" + accuracy(g.final_test_accuracy.max) + "</td><td>" + seconds(g.train_s.mean) + "</td><td>" +
           count(g.samples_per_s.mean) + "</td>";
    out += std::string("<td") + (g.energy_j ? ">" : " class=\"note\">") + energy_text(g, groups.front().edp_js) +
           "</td></tr>\n";
  }
  out += "</tbody></table></div>\n</section>\n";
  return out;
}

std::string scaling_table_html(const ReportInput& in, const std::vector<ScalingRow>& rows) {
  if (rows.empty()) return "";
  std::uint32_t base = rows.front().base_workers;
  std::string out =
      "<section class=\"card\" id=\"scaling\">\n<h2>Speedup and parallel efficiency</h2>\n<p class=\"lead\">"
      "Speedup S = T<sub>base</sub> / T<sub>N</sub> and efficiency E = S / (N / base), where T is a policy's mean "
      "time to target over its repeats when every one of its runs reached the target, else its mean training time "
      "(the column says which), and the base is the smallest worker count that ran";
  if (base == 1) out += " (1 worker, so E = S / N).";
  else out += ": <b>" + std::to_string(base) + " workers, not 1</b>, so S and E are relative to " +
              std::to_string(base) + " workers.";
  out += "</p>\n<div class=\"table-scroll\"><table>\n<thead><tr><th class=\"name\">Policy</th><th>Workers</th>"
         "<th class=\"name\">T is</th><th>T (s)</th><th>Speedup S</th><th>Efficiency E</th></tr></thead>\n<tbody>\n";
  for (const ScalingRow& r : rows) {
    out += "<tr><td class=\"name\">" + swatch(in, r.policy) + html_escape(r.policy) + "</td><td>" +
           std::to_string(r.workers) + "</td><td class=\"name\">" + r.measure + "</td><td>" + seconds(r.time_s) +
           "</td><td>" + printf_string("%.2f&times;", r.speedup) + "</td><td>" +
           printf_string("%.0f%%", 100.0 * r.efficiency) + "</td></tr>\n";
  }
  out += "</tbody></table></div>\n</section>\n";
  return out;
}

std::string runs_table_html(const ReportInput& in) {
  std::string out =
      "<section class=\"card\" id=\"runs\">\n<h2>Every run</h2>\n<p class=\"desc\">One row per run, as in "
      "results.csv; each run's epochs and evaluations are in curves.csv and runs/&lt;run&gt;.jsonl.</p>\n"
      "<div class=\"table-scroll\"><table>\n<thead><tr><th class=\"name\">Run</th><th>Seed</th><th>Training (s)</th>"
      "<th>Wall (s)</th><th>Samples/s</th><th>Test accuracy</th><th>Time to target (s)</th><th>Updates</th>"
      "<th>Staleness mean / p99 / max</th><th>Mean wait (s)</th></tr></thead>\n<tbody>\n";
  for (const RunRecord& r : in.runs) {
    const JobSummary& s = r.summary;
    std::optional<double> ttt;
    if (in.target) ttt = time_to_target(r.curve, in.target->accuracy);
    const double wait = s.worker_wait_s.empty() ? 0.0
                                                : std::accumulate(s.worker_wait_s.begin(), s.worker_wait_s.end(), 0.0) /
                                                      static_cast<double>(s.worker_wait_s.size());
    out += "<tr><td class=\"name\">" + swatch(in, r.policy) + html_escape(run_id(r)) + "</td><td>" +
           std::to_string(r.seed) + "</td><td>" + seconds(s.train_s) + "</td><td>" + seconds(s.wall_s) + "</td><td>" +
           count(s.samples_per_s) + "</td><td>" + accuracy(s.final_test_accuracy) + "</td>" +
           (ttt ? "<td>" + seconds(*ttt) + "</td>" : "<td class=\"note\">not reached</td>") + "<td>" +
           count(static_cast<double>(s.updates_applied)) + "</td><td>" +
           printf_string("%.2f", s.staleness_mean) + " / " + printf_string("%.0f", s.staleness_p99) + " / " +
           printf_string("%.0f", s.staleness_max) + "</td><td>" + seconds(wait) + "</td></tr>\n";
  }
  out += "</tbody></table></div>\n</section>\n";
  return out;
}

struct Figure {
  const char* id;
  const char* title;
  const char* desc;
};

std::string figure_html(const Figure& f) {
  return std::string("<section class=\"card\" id=\"fig-") + f.id + "\">\n<h2>" + f.title + "</h2>\n<p class=\"desc\">" +
         f.desc + "</p>\n<div class=\"chart-box\"><canvas id=\"" + f.id + "\" role=\"img\" aria-label=\"" + f.title +
         "\"></canvas></div>\n</section>\n";
}

std::string notes_html(const ReportInput& in) {
  std::string out = "<section class=\"card notes\" id=\"reading\">\n<h2>Reading this report</h2>\n<ul>\n";
  out += "<li>Every policy ran " + plural(in.repeats, "time") + " at each worker count, repeat <i>r</i> with seed " +
         std::to_string(in.config.seed) + " + <i>r</i> under every policy, so the policies start from the same "
         "parameters and see the data in the same order; what differs between repeats is the seed and the "
         "timing of the threads.</li>\n";
  out += "<li>Spread: the min and max columns show how far repeats of one policy land from each other. A "
         "difference between two policies that is smaller than that spread is not a difference this comparison "
         "can see; run more repeats (--repeats) to narrow it.</li>\n";
  out += "<li>Times are training seconds, counted from the first step; wall time in results.csv adds loading the "
         "data and the final test evaluation. Timings depend on everything else the machine (" +
         html_escape(in.host) + ") was doing while the runs ran.</li>\n";
  out += "<li>Staleness counts how many updates (clocks) a worker's parameters were behind when its gradient was "
         "applied: 0 for bsp, bounded by s for ssp:s, unbounded for async. Wait is the time the policy held a "
         "worker's reads back.</li>\n";
  bool measured = false;
  for (const RunRecord& r : in.runs) measured = measured || r.energy_j.has_value();
  const std::string why = energy_reason(in, measured);
  out += "<li>Energy: " +
         (measured ? "what the machine drew while each run trained and evaluated, as its devices measured it (" +
                         html_escape(measured_devices(in)) + ")" +
                         (why.empty() ? std::string() : "; left out: " + html_escape(why)) +
                         "; EDP is energy times that time, and the multiple is of the first row's EDP."
                   : "not measured: " + html_escape(why.empty() ? "no meter" : why) + ".") +
         " results.csv has energy_j and edp_js columns.</li>\n";
  out += "</ul>\n</section>\n";
  return out;
}


}  // namespace

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string script_json(const nlohmann::json& value) {
  const std::string text = json_text(value);  // invalid UTF-8 becomes U+FFFD
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '<': out += "\\u003c"; break;
      case '>': out += "\\u003e"; break;
      case '&': out += "\\u0026"; break;
      default: out += c;
    }
  }
  return out;
}

// A run's curve as the charts draw it: every epoch's point, and at most
// kChartEvals evaluations, every k-th (a comparison run for hours at the
// default --eval-every 0.5 made a report of tens of MB; curves.csv keeps
// every point).
constexpr std::size_t kChartEvals = 1024;

json chart_curve(const std::vector<CurvePoint>& curve) {
  std::size_t evals = 0;
  for (const CurvePoint& p : curve) evals += p.kind == CurvePoint::Kind::eval;
  const std::size_t every = (evals + kChartEvals - 1) / kChartEvals;
  json out = json::array();
  std::size_t seen = 0;
  for (const CurvePoint& p : curve)
    if (p.kind == CurvePoint::Kind::epoch || seen++ % std::max<std::size_t>(every, 1) == 0) out.push_back(to_json(p));
  return out;
}

nlohmann::json report_data(const ReportInput& in) {
  const auto groups = group_stats(in.runs, in.policies, in.target);
  json runs = json::array();
  for (const RunRecord& r : in.runs) {
    json phases = json::array();
    for (const WorkerPhases& p : r.summary.worker_phases) phases.push_back(to_json(p));
    json curve = chart_curve(r.curve);
    std::optional<double> ttt;
    if (in.target) ttt = time_to_target(r.curve, in.target->accuracy);
    runs.push_back({{"id", run_id(r)},
                    {"policy", r.policy},
                    {"workers", r.workers},
                    {"repeat", r.repeat},
                    {"seed", r.seed},
                    {"train_s", r.summary.train_s},
                    {"wall_s", r.summary.wall_s},
                    {"samples_per_s", r.summary.samples_per_s},
                    {"final_test_accuracy", r.summary.final_test_accuracy},
                    {"time_to_target_s", optional_json(ttt)},
                    {"updates_applied", r.summary.updates_applied},
                    {"staleness_histogram", r.summary.staleness_histogram},
                    {"worker_wait_s", r.summary.worker_wait_s},
                    {"worker_phases", phases},
                    {"energy_j", optional_json(r.energy_j)},
                    {"curve", std::move(curve)}});
  }
  json jgroups = json::array();
  for (const GroupStats& g : groups) {
    jgroups.push_back({{"policy", g.policy},
                       {"workers", g.workers},
                       {"runs", g.runs},
                       {"reached", g.reached},
                       {"time_to_target_s", g.time_to_target_s ? to_json(*g.time_to_target_s) : json(nullptr)},
                       {"final_test_accuracy", to_json(g.final_test_accuracy)},
                       {"train_s", to_json(g.train_s)},
                       {"samples_per_s", to_json(g.samples_per_s)}});
  }
  json scaling = json::array();
  for (const ScalingRow& r : scaling_rows(groups)) {
    scaling.push_back({{"policy", r.policy},
                       {"workers", r.workers},
                       {"base_workers", r.base_workers},
                       {"measure", r.measure},
                       {"time_s", r.time_s},
                       {"speedup", r.speedup},
                       {"efficiency", r.efficiency}});
  }
  json target = nullptr;
  if (in.target) target = {{"accuracy", in.target->accuracy}, {"given", in.target->given}, {"how", in.target->how}};
  return {{"policies", in.policies}, {"workers", in.workers}, {"repeats", in.repeats}, {"palette", pages::palette()},
          {"target", target},        {"runs", runs},          {"groups", jgroups},    {"scaling", scaling}};
}

std::string report_html(const ReportInput& in) {
  const auto groups = group_stats(in.runs, in.policies, in.target);
  const auto scaling = scaling_rows(groups);
  std::vector<std::string> labels;
  for (const auto& p : in.policies) labels.push_back(p);

  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
                    // Nothing on this page may come from anywhere but the page itself.
                    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
                    "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n";
  out += "<script>" + std::string(pages::error_capture_js()) + "</script>\n";
  out += "<title>asgd compare: " + html_escape(join(labels, ", ")) + " (" + html_escape(in.config.model) + " on " +
         html_escape(in.config.dataset) + ")</title>\n<style>" + std::string(pages::base_css()) + "</style>\n</head>\n<body>\n";
  out += header_html(in);
  out += "<main>\n";
  if (!in.incomplete.empty()) out += "<p class=\"banner\"><b>Incomplete:</b> " + html_escape(in.incomplete) + "</p>\n";
  out += stats_table_html(in, groups);
  out += scaling_table_html(in, scaling);

  const std::string ttt_desc =
      "Each policy's fastest and slowest run to the target (bar), their mean (dash) and every run (dot). "
      "Shorter is better; overlapping bars mean the repeats cannot tell the policies apart.";
  std::vector<Figure> figures = {
      {"acc-vs-time", "Validation accuracy over training time",
       "One line per run: color is the policy, dash pattern the repeat; large dots end an epoch, small ones are "
       "evaluations between epochs. The dashed gray line is the target."},
      {"acc-vs-updates", "Validation accuracy over updates applied",
       "The same points against the number of updates the shards had applied (gradient pushes; allreduce and "
       "gossip: the optimizer steps in the copies the workers published): how much each update was worth, "
       "independent of how fast the machine ran them. Stale updates make a policy's line lie lower."},
      {"loss", "Training loss", "Mean cross-entropy of the batches trained since the previous point (an "
                                 "epoch's mean over the whole epoch is left out where evaluations came within it)."},
      {"time-to-target-chart", "Time to target", ttt_desc.c_str()},
      {"throughput", "Throughput per run",
       "Training samples per second over the whole run (all workers together). Waiting for a slower worker or a "
       "clock lowers it."},
      {"staleness", "Staleness of applied updates",
       "How many clocks behind the freshest parameters each applied update was, merged over a policy's repeats, "
       "as a share of its updates. Log scale: a bar at 0.1% is one update in a thousand."},
      {"wait", "Wait per worker",
       "Seconds the policy held each worker's reads back (mean over repeats): what synchronisation cost each "
       "worker."},
      {"phases", "Where the time goes",
       "One bar per policy and worker count: the mean worker's seconds (mean over repeats), phase by phase. The "
       "phases do not overlap and add up to the worker's wall time; push/pull includes the time the policy held "
       "reads back (the wait figure)."},
  };
  if (!scaling.empty())
    figures.push_back({"speedup", "Speedup over worker counts",
                       "Speedup of each policy over its own smallest worker count; the dashed line is linear "
                       "(ideal) speedup."});
  out += "<div class=\"grid\">\n";
  for (const Figure& f : figures) {
    out += figure_html(f);
  }
  out += "</div>\n";
  out += runs_table_html(in);
  out += notes_html(in);
  out += "</main>\n<footer>Written by asgd compare &middot; Chart.js " + std::string(pages::chartjs_version()) +
         " (MIT) is inlined, so this file opens offline &middot; the numbers are in results.csv and curves.csv "
         "beside it</footer>\n";
  out += "<pre id=\"asgd-render-status\" hidden></pre>\n";
  out += "<script type=\"application/json\" id=\"asgd-data\">" + script_json(report_data(in)) + "</script>\n";
  out += pages::chartjs_script_element();
  out += "<script>" + std::string(pages::chart_helpers_js()) + std::string(report_draw_js()) + "</script>\n</body>\n</html>\n";
  return out;
}

}  // namespace asgd::experiments
