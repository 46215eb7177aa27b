#include "experiments/compare.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <set>

#include "base/flag_text.hpp"
#include "policies/registry.hpp"

namespace asgd::experiments {

namespace {

// Six significant digits: more than any timing here is worth, and what a
// spreadsheet shows anyway.
std::string number(double v) {
  if (!std::isfinite(v)) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

template <class T>
std::string optional_number(const std::optional<T>& v) {
  if (!v) return "";
  if constexpr (std::is_integral_v<T>) return std::to_string(*v);
  else return number(*v);
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

double mean_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace

CurvePoint curve_point(const EpochMetrics& m, std::optional<std::uint64_t> samples) {
  CurvePoint p;
  p.kind = CurvePoint::Kind::epoch;
  p.epoch = m.epoch;
  p.wall_s = m.wall_s;
  p.updates = m.updates;
  p.samples = samples;
  if (std::isfinite(m.train_loss)) p.train_loss = m.train_loss;
  p.val_accuracy = m.val_accuracy;
  p.samples_per_s = m.samples_per_s;
  return p;
}

CurvePoint curve_point(const EvalPoint& e) {
  CurvePoint p;
  p.kind = CurvePoint::Kind::eval;
  p.wall_s = e.wall_s;
  p.val_accuracy = e.val_accuracy;
  // Evaluations run while training: none sees zero updates or samples, and
  // a cross-entropy of exactly zero does not happen, so zeros mean "not
  // reported".
  if (e.updates > 0) p.updates = e.updates;
  if (e.samples > 0) p.samples = e.samples;
  if (std::isfinite(e.train_loss) && e.train_loss > 0.0) p.train_loss = e.train_loss;
  return p;
}

std::string run_id(const RunRecord& run) {
  return run.policy + "-w" + std::to_string(run.workers) + "-r" + std::to_string(run.repeat);
}

void fill_epoch_samples(RunRecord& run, std::uint64_t total_samples) {
  const std::uint32_t epochs = run.summary.epochs;
  if (epochs == 0) return;
  for (CurvePoint& p : run.curve)
    if (p.kind == CurvePoint::Kind::epoch && p.epoch && !p.samples)
      p.samples = total_samples * *p.epoch / epochs;
}

JobConfig config_for_run(const JobConfig& base, const std::string& policy, std::uint32_t workers,
                         std::uint32_t repeat) {
  JobConfig c = base;
  c.policy = policy;
  c.workers = workers;
  c.seed = base.seed + repeat;
  // A device list longer than the run's workers: its first `workers` items,
  // so --workers 1,2 --device cuda:0,cpu compares the GPU alone with the
  // GPU and the CPU together (a shorter list is validate()'s to refuse).
  if (const auto items = split(base.device, ','); items.size() > workers) {
    c.device = items.front();
    for (std::uint32_t w = 1; w < workers; ++w) c.device += "," + items[w];
  }
  // Each run keeps the settings of its own policy only.
  const PolicyEntry* entry = find_policy(policy);
  std::erase_if(c.policy_options, [&](const auto& option) {
    return !entry || std::none_of(entry->knobs.begin(), entry->knobs.end(),
                                  [&](const PolicyKnob& k) { return k.name == option.first; });
  });
  if (!takes_staleness_aware_lr(policy)) c.staleness_aware_lr.reset();
  // Every run takes the defaults of its own policy and worker count, unless
  // the base job set a value (then every run uses it).
  return c;
}

Result<std::vector<std::string>> parse_policy_list(const std::string& text) {
  auto bad = [&](const std::string& why) { return Status::InvalidArgument("--policies " + text + ": " + why); };
  if (trim(text).empty()) return bad("expected a comma-separated list such as bsp,ssp:3,async");
  std::vector<std::string> out;
  for (const std::string& raw : split(text, ',')) {
    const std::string entry = trim(raw);
    if (entry.empty()) return bad("empty entry");
    if (std::find(out.begin(), out.end(), entry) != out.end()) return bad("'" + entry + "' is given twice");
    out.push_back(entry);
  }
  return out;
}

Result<std::vector<std::uint32_t>> parse_worker_list(const std::string& text) {
  auto bad = [&](const std::string& why) { return Status::InvalidArgument("--workers " + text + ": " + why); };
  if (trim(text).empty()) return bad("expected whole numbers >= 1 separated by commas, such as 1,2,4");
  std::vector<std::uint32_t> out;
  for (const std::string& raw : split(text, ',')) {
    const std::string entry = trim(raw);
    std::uint32_t n = 0;
    const auto [end, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), n);
    if (entry.empty() || ec != std::errc() || end != entry.data() + entry.size() || n == 0)
      return bad("expected whole numbers >= 1 separated by commas, such as 1,2,4");
    if (std::find(out.begin(), out.end(), n) != out.end()) return bad(entry + " is given twice");
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<double> highest_common_accuracy(const std::vector<RunRecord>& runs) {
  if (runs.empty()) return std::nullopt;
  double common = 1.0;
  for (const RunRecord& r : runs) {
    if (r.curve.empty()) return std::nullopt;
    double best = 0.0;
    for (const CurvePoint& p : r.curve) best = std::max(best, p.val_accuracy);
    common = std::min(common, best);
  }
  // Accuracies are k / validation_size: 0.97 must floor to 0.97, not 0.965.
  return std::floor(common * 200.0 + 1e-7) / 200.0;
}

std::optional<Target> choose_target(const std::vector<RunRecord>& runs, std::optional<double> given) {
  if (given) return Target{*given, true, "the --target-accuracy that was given"};
  const auto common = highest_common_accuracy(runs);
  if (!common) return std::nullopt;
  return Target{*common, false,
                "the highest validation accuracy that every run reached, rounded down to a multiple of 0.005 "
                "(no --target-accuracy was given)"};
}

std::optional<double> time_to_target(const std::vector<CurvePoint>& curve, double target) {
  for (const CurvePoint& p : curve)
    if (p.val_accuracy >= target - 1e-9) return p.wall_s;
  return std::nullopt;
}

std::optional<Spread> spread(const std::vector<double>& values) {
  if (values.empty()) return std::nullopt;
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  return Spread{mean_of(values), *lo, *hi, values.size()};
}

std::vector<GroupStats> group_stats(const std::vector<RunRecord>& runs, const std::vector<std::string>& policies,
                                    const std::optional<Target>& target) {
  std::vector<GroupStats> out;
  std::set<std::uint32_t> worker_counts;
  for (const RunRecord& r : runs) worker_counts.insert(r.workers);
  for (const std::string& policy : policies) {
    for (std::uint32_t workers : worker_counts) {
      std::vector<double> ttt, acc, train, rate, energy, edp;
      std::size_t n = 0;
      for (const RunRecord& r : runs) {
        if (r.policy != policy || r.workers != workers) continue;
        ++n;
        if (target)
          if (auto t = time_to_target(r.curve, target->accuracy)) ttt.push_back(*t);
        acc.push_back(r.summary.final_test_accuracy);
        train.push_back(r.summary.train_s);
        rate.push_back(r.summary.samples_per_s);
        if (r.energy_j) energy.push_back(*r.energy_j);
        if (r.edp_js) edp.push_back(*r.edp_js);
      }
      if (n == 0) continue;
      GroupStats g;
      g.policy = policy;
      g.workers = workers;
      g.runs = n;
      g.reached = ttt.size();
      g.time_to_target_s = spread(ttt);
      g.final_test_accuracy = *spread(acc);
      g.train_s = *spread(train);
      g.samples_per_s = *spread(rate);
      g.energy_j = spread(energy);
      g.edp_js = spread(edp);
      out.push_back(std::move(g));
    }
  }
  return out;
}

std::vector<ScalingRow> scaling_rows(const std::vector<GroupStats>& groups) {
  std::vector<ScalingRow> out;
  std::vector<std::string> policies;
  for (const GroupStats& g : groups)
    if (std::find(policies.begin(), policies.end(), g.policy) == policies.end()) policies.push_back(g.policy);
  for (const std::string& policy : policies) {
    std::vector<const GroupStats*> mine;
    for (const GroupStats& g : groups)
      if (g.policy == policy) mine.push_back(&g);
    if (mine.size() < 2) continue;
    std::sort(mine.begin(), mine.end(), [](auto* a, auto* b) { return a->workers < b->workers; });
    // One measure for every worker count of a policy, or the ratios mix two
    // different clocks.
    const bool all_reached =
        std::all_of(mine.begin(), mine.end(), [](auto* g) { return g->time_to_target_s && g->reached == g->runs; });
    auto time_of = [&](const GroupStats* g) { return all_reached ? g->time_to_target_s->mean : g->train_s.mean; };
    const GroupStats* base = mine.front();
    const double t_base = time_of(base);
    for (const GroupStats* g : mine) {
      ScalingRow row;
      row.policy = policy;
      row.workers = g->workers;
      row.base_workers = base->workers;
      row.measure = all_reached ? "time to target" : "training time";
      row.time_s = time_of(g);
      row.speedup = row.time_s > 0 ? t_base / row.time_s : 0.0;
      row.efficiency = row.speedup * base->workers / g->workers;
      out.push_back(row);
    }
  }
  return out;
}

std::string csv_field(std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(text);
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + '"';
}

std::string results_csv(const std::vector<RunRecord>& runs, const std::optional<Target>& target) {
  std::string out =
      "run,policy,staleness,workers,shards,device,model,dataset,epochs,seed,repeat,wall_s,train_s,samples_per_s,"
      "final_test_accuracy,target_accuracy,time_to_target_s,updates_applied,staleness_mean,staleness_p99,"
      "staleness_max,worker_wait_mean_s,energy_j,edp_js,lr,batch\n";
  for (const RunRecord& r : runs) {
    const JobSummary& s = r.summary;
    std::optional<double> ttt;
    if (target) ttt = time_to_target(r.curve, target->accuracy);
    const std::vector<std::string> fields = {
        csv_field(run_id(r)),
        csv_field(r.policy),
        optional_number(s.staleness),
        std::to_string(r.workers),
        std::to_string(s.shards),
        csv_field(s.device),
        csv_field(s.model),
        csv_field(s.dataset),
        std::to_string(s.epochs),
        std::to_string(r.seed),
        std::to_string(r.repeat),
        number(s.wall_s),
        number(s.train_s),
        number(s.samples_per_s),
        number(s.final_test_accuracy),
        target ? number(target->accuracy) : "",
        optional_number(ttt),
        std::to_string(s.updates_applied),
        number(s.staleness_mean),
        number(s.staleness_p99),
        number(s.staleness_max),
        s.worker_wait_s.empty() ? "" : number(mean_of(s.worker_wait_s)),
        optional_number(r.energy_j),
        optional_number(r.edp_js),
        number(r.lr),
        std::to_string(r.batch),
    };
    for (std::size_t i = 0; i < fields.size(); ++i) out += (i ? "," : "") + fields[i];
    out += '\n';
  }
  return out;
}

std::string curves_csv(const std::vector<RunRecord>& runs) {
  std::string out = "run,policy,workers,repeat,kind,epoch,wall_s,updates,samples,train_loss,val_accuracy,samples_per_s\n";
  for (const RunRecord& r : runs) {
    const std::string prefix =
        csv_field(run_id(r)) + "," + csv_field(r.policy) + "," + std::to_string(r.workers) + "," + std::to_string(r.repeat);
    for (const CurvePoint& p : r.curve) {
      out += prefix;
      out += p.kind == CurvePoint::Kind::epoch ? ",epoch," : ",eval,";
      out += optional_number(p.epoch) + "," + number(p.wall_s) + "," + optional_number(p.updates) + "," +
             optional_number(p.samples) + "," + optional_number(p.train_loss) + "," + number(p.val_accuracy) + "," +
             optional_number(p.samples_per_s) + "\n";
    }
  }
  return out;
}

Status write_file(const std::string& path, std::string_view content) {
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::IOError("cannot write " + path + ": " + std::strerror(errno));
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return Status::IOError("writing " + path + " failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return Status::IOError("cannot write " + path + ": " + why);
  }
  return {};
}

}  // namespace asgd::experiments
