// report.html and the live status page as text: escaping, self-containment,
// the embedded Chart.js. (tests/experiments/report_in_browser.py and
// live_page_browser_test.cpp open them in a browser.)

#include "experiments/report.hpp"

#include <gtest/gtest.h>

#include <regex>

#include "cli/cli_run.hpp"
#include "runtime/chartjs.hpp"
#include "runtime/live_page.hpp"

namespace asgd::experiments {
namespace {

const char* const kHostile = "</script><script>alert('x')</script><!-- & \"quoted\"";

RunRecord sample_run(const std::string& policy, std::uint32_t workers, std::uint32_t repeat) {
  RunRecord r;
  r.policy = policy;
  r.workers = workers;
  r.repeat = repeat;
  r.seed = 1 + repeat;
  r.summary.policy = policy;
  r.summary.workers = workers;
  r.summary.device = "cpu";
  r.summary.epochs = 1;
  r.summary.train_s = 1.0 + repeat;
  r.summary.samples_per_s = 50000;
  r.summary.final_test_accuracy = 0.96;
  r.summary.staleness_histogram = {10, 5, 1};
  r.summary.worker_wait_s = std::vector<double>(workers, 0.1);
  CurvePoint p;
  p.kind = CurvePoint::Kind::epoch;
  p.epoch = 1;
  p.wall_s = 1.0;
  p.val_accuracy = 0.95;
  r.curve = {p};
  return r;
}

ReportInput sample_input() {
  ReportInput in;
  in.policies = {"bsp", "async"};
  in.workers = {2};
  in.repeats = 1;
  in.runs = {sample_run("bsp", 2, 0), sample_run("async", 2, 0)};
  in.target = choose_target(in.runs, std::nullopt);
  in.command = "asgd compare --policies bsp,async --out /tmp/x";
  in.generated_at = "2026-01-02 03:04 UTC";
  in.host = "2 CPU cores";
  return in;
}

// <script src=...>, <link href=...>, <img src=...>: anything a browser would fetch.
bool fetches_anything(const std::string& html) {
  static const std::regex tag(R"(<(script|link|img|iframe|object|embed|source|audio|video)\b[^>]*\b(src|href|data)\s*=)",
                              std::regex::icase);
  return std::regex_search(html, tag);
}

TEST(HtmlEscape, EscapesTheFiveCharactersThatMeanSomethingInHtml) {
  EXPECT_EQ(html_escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  EXPECT_EQ(html_escape("ssp:3"), "ssp:3");
}

TEST(ScriptJson, CannotCloseItsScriptElementAndParsesBackUnchanged) {
  const nlohmann::json value = {{"model", kHostile}, {"n", 3}};
  const std::string text = script_json(value);
  EXPECT_EQ(text.find("</"), std::string::npos) << text;
  EXPECT_EQ(text.find("<!--"), std::string::npos) << text;
  EXPECT_EQ(text.find('<'), std::string::npos) << text;
  EXPECT_EQ(nlohmann::json::parse(text), value);
}

TEST(ScriptJson, ReplacesInvalidUtf8InsteadOfThrowing) {
  const nlohmann::json value = {{"model", std::string("bad \xff byte")}};
  EXPECT_NO_THROW(nlohmann::json::parse(script_json(value)));
}

TEST(Report, ShowsJobTextOnlyEscaped) {
  ReportInput in = sample_input();
  in.config.model = kHostile;
  in.command = kHostile;
  in.runs[0].summary.device = kHostile;
  const std::string html = report_html(in);
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_EQ(html.find("<!-- &"), std::string::npos);
  EXPECT_NE(html.find("&lt;/script&gt;&lt;script&gt;alert"), std::string::npos);
}

TEST(Report, IsOneFileThatFetchesNothingAndInlinesChartJs) {
  const std::string html = report_html(sample_input());
  EXPECT_FALSE(fetches_anything(html));
  EXPECT_NE(html.find("default-src 'none'"), std::string::npos);  // and the browser refuses if it tried
  EXPECT_NE(html.find(std::string(pages::chartjs_source().substr(0, 200))), std::string::npos);
  EXPECT_EQ(html.find("sourceMappingURL"), std::string::npos);
}

TEST(Report, CollectsErrorsBeforeAnyOtherScriptRunsAndHasOneRenderStatus) {
  const std::string html = report_html(sample_input());
  const auto capture = html.find("window.onerror");
  ASSERT_NE(capture, std::string::npos);
  EXPECT_EQ(html.find("<script"), html.rfind("<script", capture));  // the first script of all
  EXPECT_LT(capture, html.find("Chart.js v"));
  EXPECT_NE(html.find("unhandledrejection"), std::string::npos);
  EXPECT_NE(html.find("console.error = "), std::string::npos);
  const std::string status = "id=\"asgd-render-status\"";
  EXPECT_NE(html.find(status), std::string::npos);
  EXPECT_EQ(html.find(status), html.rfind(status));
}

TEST(Report, HasACanvasForEveryChartAndTheDataForEveryRun) {
  const std::string html = report_html(sample_input());
  for (const char* id :
       {"acc-vs-time", "acc-vs-updates", "loss", "time-to-target-chart", "throughput", "staleness", "wait", "phases"})
    EXPECT_NE(html.find(std::string("<canvas id=\"") + id + "\""), std::string::npos) << id;
  EXPECT_EQ(html.find("<canvas id=\"speedup\""), std::string::npos);  // one worker count: no speedup
  const nlohmann::json data = report_data(sample_input());
  ASSERT_EQ(data["runs"].size(), 2u);
  EXPECT_EQ(data["runs"][0]["id"], "bsp-w2-r0");
  EXPECT_EQ(data["runs"][0]["staleness_histogram"], nlohmann::json({10, 5, 1}));
  EXPECT_EQ(data["target"]["accuracy"], 0.95);
  EXPECT_EQ(data["runs"][1]["time_to_target_s"], 1.0);
}

// Hours at --eval-every 0.5 made a report of tens of MB: the charts draw
// every epoch's point and at most 1024 evaluations a run, every k-th.
TEST(Report, ALongRunsChartsDrawEveryEpochAndAtMost1024Evaluations) {
  ReportInput in = sample_input();
  RunRecord& long_run = in.runs[0];
  long_run.curve.clear();
  for (int i = 0; i < 7200; ++i) {
    CurvePoint p;
    p.kind = i % 720 == 719 ? CurvePoint::Kind::epoch : CurvePoint::Kind::eval;
    if (p.kind == CurvePoint::Kind::epoch) p.epoch = static_cast<std::uint32_t>(i / 720 + 1);
    p.wall_s = 0.5 * (i + 1);
    p.val_accuracy = 0.9;
    long_run.curve.push_back(p);
  }
  const nlohmann::json curve = report_data(in)["runs"][0]["curve"];
  std::size_t epochs = 0, evals = 0;
  for (const auto& p : curve) (p["kind"] == "epoch" ? epochs : evals)++;
  EXPECT_EQ(epochs, 10u);
  EXPECT_LE(evals, 1024u);
  EXPECT_GE(evals, 700u);
  EXPECT_EQ(curve.back()["epoch"], 10);
  EXPECT_EQ(report_data(in)["runs"][1]["curve"].size(), 1u) << "a short run keeps every point";
}

TEST(Report, SaysHowTheTargetWasChosen) {
  ReportInput in = sample_input();
  EXPECT_NE(report_html(in).find("the highest validation accuracy that every run reached"), std::string::npos);
  in.target = choose_target(in.runs, 0.9);
  EXPECT_NE(report_html(in).find("the --target-accuracy that was given"), std::string::npos);
}

TEST(Report, SaysWhyEnergyWasNotMeasuredAndShowsEnergyAndEdpAgainstTheFirstRowWhereRunsHaveThem) {
  ReportInput in = sample_input();
  for (auto& r : in.runs) r.summary.energy.reason = "CPU: no RAPL counters under /sys/class/powercap";
  EXPECT_NE(report_html(in).find("not measured: CPU: no RAPL counters under /sys/class/powercap."), std::string::npos);
  in.runs[0].energy_j = 1500.0;
  in.runs[0].edp_js = 3000.0;
  in.runs[1].energy_j = 1000.0;
  in.runs[1].edp_js = 1500.0;
  const std::string html = report_html(in);
  EXPECT_NE(html.find("1,500 J, EDP 3,000 J&middot;s (1.00&times;)"), std::string::npos);
  EXPECT_NE(html.find("1,000 J, EDP 1,500 J&middot;s (0.50&times;)"), std::string::npos);
  // What the meters read, and what they left out: it said "RAPL for the
  // CPUs' packages and DRAM, NVML for GPUs" of a run that read one GPU.
  for (auto& r : in.runs) {
    r.summary.energy.measured = true;
    r.summary.energy.devices = {{"gpu 0", 1000.0}};
    r.summary.energy.reason = "CPU: no RAPL counters under /sys/class/powercap";
  }
  const std::string gpu_only = report_html(in);
  EXPECT_NE(gpu_only.find("as its devices measured it (gpu 0); left out: CPU: no RAPL counters"), std::string::npos);
  EXPECT_EQ(gpu_only.find("NVML for GPUs"), std::string::npos);
}

TEST(Report, ShowsSpeedupAndEfficiencyWithSeveralWorkerCountsNamingABaseThatIsNotOne) {
  ReportInput in = sample_input();
  in.workers = {2, 4};
  in.runs = {sample_run("bsp", 2, 0), sample_run("bsp", 4, 0)};
  in.runs[1].summary.train_s = 0.5;
  in.target = choose_target(in.runs, std::nullopt);
  const std::string html = report_html(in);
  EXPECT_NE(html.find("Speedup and parallel efficiency"), std::string::npos);
  EXPECT_NE(html.find("<canvas id=\"speedup\""), std::string::npos);
  EXPECT_NE(html.find("2 workers, not 1"), std::string::npos);
}

TEST(Report, SaysWhenItIsIncomplete) {
  ReportInput in = sample_input();
  EXPECT_EQ(report_html(in).find("Incomplete"), std::string::npos);
  in.incomplete = "interrupted after 2 of 6 runs.";
  EXPECT_NE(report_html(in).find("interrupted after 2 of 6 runs."), std::string::npos);
}

TEST(ChartJs, TheEmbeddedCopyIsTheVendoredFileWithoutItsSourceMapComment) {
  const std::string file = asgd_test::slurp(std::string(ASGD_SOURCE_DIR) + "/third_party/chartjs/chart.umd.min.js");
  ASSERT_FALSE(file.empty());
  const auto map = file.rfind("//# sourceMappingURL=");
  EXPECT_EQ(pages::chartjs_source(), file.substr(0, map));
  EXPECT_NE(file.find("Chart.js v" + std::string(pages::chartjs_version())), std::string::npos);
  const std::string readme = asgd_test::slurp(std::string(ASGD_SOURCE_DIR) + "/third_party/chartjs/README.md");
  EXPECT_NE(readme.find("| version | " + std::string(pages::chartjs_version()) + " |"), std::string::npos);
}

TEST(LivePage, PollsStatusEverySecondAndFetchesNothingElse) {
  const std::string html = pages::live_status_page_html();
  EXPECT_NE(html.find("fetch('status'"), std::string::npos);
  EXPECT_NE(html.find("setTimeout(poll, 1000)"), std::string::npos);
  EXPECT_NE(html.find("job not reachable"), std::string::npos);
  EXPECT_FALSE(fetches_anything(html));
  EXPECT_NE(html.find(std::string(pages::chartjs_source().substr(0, 200))), std::string::npos);
  EXPECT_LT(html.find("window.onerror"), html.find("Chart.js v"));
  EXPECT_EQ(html, pages::live_status_page_html());
}

}  // namespace
}  // namespace asgd::experiments
