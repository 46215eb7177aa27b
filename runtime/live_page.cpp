#include "runtime/live_page.hpp"

#include <string_view>

#include "runtime/page_common.hpp"

namespace asgd::pages {

namespace {

constexpr std::string_view kLiveCss = R"CSS(
header { display: flex; flex-wrap: wrap; align-items: baseline; gap: 6px 16px; }
header h1 { margin: 0; }
#job { color: #94a3b8; font-size: 15px; }
.state { display: inline-block; padding: 2px 10px; border-radius: 999px; font-size: 12px; font-weight: 700;
  text-transform: uppercase; letter-spacing: 0.06em; background: #334155; color: #e2e8f0; }
.state.training { background: #16a34a; color: #fff; }
.state.finishing { background: #2563eb; color: #fff; }
.state.done { background: #e2e8f0; color: #0f172a; }
.state.failed { background: #dc2626; color: #fff; }
#unreachable { display: none; border-left: 4px solid #dc2626; background: #fef2f2; padding: 10px 14px; border-radius: 6px;
  margin: 0 0 20px; }
#unreachable.shown { display: block; }
.tiles { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 12px; margin: 0 0 20px; }
.tile { background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 12px 14px; }
.tile .k { font-size: 11px; text-transform: uppercase; letter-spacing: 0.06em; color: var(--muted); }
.tile .v { font-size: 22px; font-weight: 650; font-variant-numeric: tabular-nums; margin-top: 2px; }
.bar { height: 6px; background: #e2e8f0; border-radius: 3px; margin-top: 8px; overflow: hidden; }
.bar > div { height: 100%; width: 0; background: var(--accent); transition: width 0.4s; }
.chart-box { height: 260px; }
tr.lost td { color: #dc2626; }
)CSS";

constexpr std::string_view kBody = R"HTML(
<header>
  <h1>asgd job</h1><span id="state" class="state">connecting</span><span id="job"></span>
</header>
<main>
<p id="unreachable"><b>job not reachable</b> <span id="unreachable-detail"></span></p>
<div class="tiles">
  <div class="tile"><div class="k">Epoch</div><div class="v" id="t-epoch">&ndash;</div></div>
  <div class="tile"><div class="k">Progress</div><div class="v" id="t-progress">&ndash;</div><div class="bar"><div id="t-progress-bar"></div></div></div>
  <div class="tile"><div class="k">ETA</div><div class="v" id="t-eta">&ndash;</div></div>
  <div class="tile"><div class="k">Samples/s</div><div class="v" id="t-rate">&ndash;</div></div>
  <div class="tile"><div class="k">Training loss</div><div class="v" id="t-loss">&ndash;</div></div>
  <div class="tile"><div class="k">Val accuracy</div><div class="v" id="t-acc">&ndash;</div></div>
  <div class="tile"><div class="k">Updates</div><div class="v" id="t-updates">&ndash;</div></div>
  <div class="tile"><div class="k">Training time</div><div class="v" id="t-wall">&ndash;</div></div>
</div>
<div class="grid">
  <section class="card"><h2>Throughput</h2><p class="desc">Training samples per second, all workers together.</p><div class="chart-box"><canvas id="rate"></canvas></div></section>
  <section class="card"><h2>Training loss</h2><p class="desc">Mean cross-entropy of the recent batches.</p><div class="chart-box"><canvas id="loss"></canvas></div></section>
  <section class="card"><h2>Validation accuracy</h2><p class="desc">The latest evaluation on the held-out split.</p><div class="chart-box"><canvas id="acc"></canvas></div></section>
  <section class="card"><h2>Worker clocks</h2><p class="desc">Steps each worker has pushed; a short bar is a slow or stuck worker.</p><div class="chart-box"><canvas id="clock"></canvas></div></section>
  <section class="card"><h2>Updates applied per shard</h2><p class="desc">Gradient updates each parameter shard has applied.</p><div class="chart-box"><canvas id="shard-updates"></canvas></div></section>
  <section class="card"><h2>Workers</h2><p class="desc">Staleness: clocks behind, mean. Wait: seconds the policy held the worker's reads back.</p>
    <div class="table-scroll"><table><thead><tr><th class="name">Worker</th><th>Clock</th><th>Epoch</th><th>Samples</th><th>Staleness</th><th>Wait (s)</th><th>Last seen (s)</th><th class="name">Alive</th></tr></thead>
    <tbody id="workers"></tbody></table></div>
    <h2 style="margin-top:16px">Shards</h2>
    <div class="table-scroll"><table><thead><tr><th class="name">Shard</th><th>Keys</th><th>Updates applied</th><th>Rejected</th><th>Held</th><th>Queue</th></tr></thead>
    <tbody id="shards"></tbody></table></div>
  </section>
</div>
</main>
<footer>Polls <code>status</code> every second; the charts start from the run's <code>history</code>, so they show the whole run however late the page opened.</footer>
<pre id="asgd-render-status" hidden></pre>
)HTML";

constexpr std::string_view kLiveJs = R"JS(
(function () {
  'use strict';
  var MAX_POINTS = 4096;  // LiveStatus::kMaxHistory
  var history = [];      // {t, rate, loss, acc}: one per poll that moved wall_s
  var polls = 0, reachable = false, lastOk = null;
  var palette = ['#2563eb', '#ea580c', '#16a34a'];
  Chart.defaults.font.family = '-apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans", sans-serif';
  Chart.defaults.color = '#334155';
  Chart.defaults.borderColor = '#e2e8f0';

  function $(id) { return document.getElementById(id); }
  function has(v) { return v !== null && v !== undefined && !(typeof v === 'number' && isNaN(v)); }
  function num(v, digits) { return has(v) ? Number(v).toFixed(digits) : '\u2013'; }
  function big(v) { return has(v) ? Math.round(v).toLocaleString() : '\u2013'; }
  function duration(s) {
    if (!has(s)) return '\u2013';
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + ' s';
    if (s < 3600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
    return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
  }
  function lineChart(id, yTitle, color, digits, yMax) {
    return new Chart($(id), {
      type: 'line',
      data: {datasets: [{label: yTitle, data: [], borderColor: color, backgroundColor: color, borderWidth: 1.8,
                         // Dots only while there are too few points to draw a line.
                         pointRadius: function (c) { return c.dataset.data.length < 3 ? 3 : 0; },
                         pointHoverRadius: 4, tension: 0.15}]},
      options: {animation: false, responsive: true, maintainAspectRatio: false, interaction: {mode: 'nearest', intersect: false},
                plugins: {legend: {display: false},
                          tooltip: {callbacks: {label: function (c) { return Number(c.parsed.y).toFixed(digits) + ' at ' + c.parsed.x.toFixed(1) + ' s'; }}}},
                scales: {x: {type: 'linear', min: 0, title: {display: true, text: 'training time (s)', font: {weight: '600'}}, grid: {color: '#f1f5f9'}},
                         y: {max: yMax, title: {display: true, text: yTitle, font: {weight: '600'}}, grid: {color: '#f1f5f9'}}}}
    });
  }
  function barChart(id, xTitle, yTitle, color) {
    return new Chart($(id), {
      type: 'bar',
      data: {labels: [], datasets: [{label: yTitle, data: [], backgroundColor: color, borderRadius: 3}]},
      options: {animation: false, responsive: true, maintainAspectRatio: false, plugins: {legend: {display: false}},
                scales: {x: {title: {display: true, text: xTitle, font: {weight: '600'}}, grid: {display: false}},
                         y: {beginAtZero: true, title: {display: true, text: yTitle, font: {weight: '600'}}, grid: {color: '#f1f5f9'}}}}
    });
  }
  var charts = {
    rate: lineChart('rate', 'samples per second', palette[0], 0),
    loss: lineChart('loss', 'training loss (cross-entropy)', palette[1], 4),
    acc: lineChart('acc', 'validation accuracy', palette[2], 4, 1),
    clock: barChart('clock', 'worker', 'clock (steps pushed)', 'rgba(37,99,235,0.75)'),
    'shard-updates': barChart('shard-updates', 'shard', 'updates applied', 'rgba(234,88,12,0.75)')
  };

  function writeStatus() {
    var summaries = Object.keys(charts).map(function (id) { return asgdChartSummary(id, charts[id]); });
    var el = $('asgd-render-status');
    el.textContent = JSON.stringify({charts: summaries, errors: window.asgdErrors, polls: polls, reachable: reachable});
  }
  function cell(row, text, cls) {
    var td = document.createElement('td');
    td.textContent = text;
    if (cls) td.className = cls;
    row.appendChild(td);
  }
  function fillTable(id, rows, columns) {
    var body = $(id);
    while (body.firstChild) body.removeChild(body.firstChild);
    (rows || []).forEach(function (r) {
      var tr = document.createElement('tr');
      if (r.alive === false) tr.className = 'lost';
      columns.forEach(function (c, i) { cell(tr, c(r), i === 0 || i === columns.length - 1 && id === 'workers' ? 'name' : ''); });
      body.appendChild(tr);
    });
  }

  function show(s) {
    var state = has(s.state) ? String(s.state) : 'unknown';
    var badge = $('state');
    badge.textContent = state;
    badge.className = 'state ' + state.replace(/[^a-z]/g, '');
    var job = [s.model, s.dataset].filter(has).join(' on ');
    var parts = [job, has(s.policy) ? 'policy ' + s.policy : null,
                 has(s.workers) ? s.workers + (s.workers === 1 ? ' worker' : ' workers') : null,
                 has(s.shards) ? s.shards + (s.shards === 1 ? ' shard' : ' shards') : null].filter(function (p) { return p; });
    $('job').textContent = parts.join(' \u00b7 ');
    document.title = 'asgd: ' + state + (has(s.progress) ? ' ' + Math.round(100 * s.progress) + '%' : '');

    $('t-epoch').textContent = has(s.epoch) ? s.epoch + (has(s.epochs) ? ' / ' + s.epochs : '') : '\u2013';
    $('t-progress').textContent = has(s.progress) ? (100 * s.progress).toFixed(1) + '%' : '\u2013';
    $('t-progress-bar').style.width = has(s.progress) ? Math.min(100, Math.max(0, 100 * s.progress)) + '%' : '0';
    $('t-eta').textContent = duration(s.eta_s);
    $('t-rate').textContent = big(s.samples_per_s);
    $('t-loss').textContent = num(s.train_loss, 4);
    $('t-acc').textContent = num(s.val_accuracy, 4);
    $('t-updates').textContent = big(s.updates);
    $('t-wall').textContent = duration(s.wall_s);

    if (has(s.wall_s)) {
      var last = history[history.length - 1];
      if (last && s.wall_s < last.t) history = [];  // a new job behind the same address
      if (!last || s.wall_s > last.t || history.length === 0) {
        history.push({t: s.wall_s, rate: s.samples_per_s, loss: s.train_loss, acc: s.val_accuracy});
        if (history.length > MAX_POINTS) history.shift();
      }
    }
    function series(key) {
      return history.filter(function (p) { return has(p[key]); }).map(function (p) { return {x: p.t, y: p[key]}; });
    }
    charts.rate.data.datasets[0].data = series('rate');
    charts.loss.data.datasets[0].data = series('loss');
    charts.acc.data.datasets[0].data = series('acc');
    var workers = Array.isArray(s.worker) ? s.worker : [];
    var shards = Array.isArray(s.shard) ? s.shard : [];
    charts.clock.data.labels = workers.map(function (w) { return String(w.worker); });
    charts.clock.data.datasets[0].data = workers.map(function (w) { return has(w.clock) ? w.clock : null; });
    charts.clock.data.datasets[0].backgroundColor = workers.map(function (w) {
      return w.alive === false ? 'rgba(220,38,38,0.75)' : 'rgba(37,99,235,0.75)';
    });
    charts['shard-updates'].data.labels = shards.map(function (x) { return String(x.shard); });
    charts['shard-updates'].data.datasets[0].data = shards.map(function (x) { return has(x.updates_applied) ? x.updates_applied : null; });
    Object.keys(charts).forEach(function (id) { charts[id].update('none'); });

    fillTable('workers', workers, [
      function (w) { return String(w.worker); }, function (w) { return big(w.clock); }, function (w) { return has(w.epoch) ? String(w.epoch) : '\u2013'; },
      function (w) { return big(w.samples); }, function (w) { return num(w.staleness, 2); }, function (w) { return num(w.wait_s, 2); },
      function (w) { return num(w.last_seen_s, 1); }, function (w) { return w.alive === false ? 'no (lost)' : w.alive === true ? 'yes' : '\u2013'; }
    ]);
    fillTable('shards', shards, [
      function (x) { return String(x.shard); }, function (x) { return big(x.keys); }, function (x) { return big(x.updates_applied); },
      function (x) { return big(x.rejected); }, function (x) { return big(x.held); }, function (x) { return big(x.queue); }
    ]);
  }

  function poll() {
    polls += 1;
    fetch('status', {cache: 'no-store'})
      .then(function (r) {
        if (!r.ok) throw new Error('HTTP ' + r.status);
        return r.json();
      })
      .then(function (s) {
        reachable = true;
        lastOk = new Date();
        $('unreachable').className = '';
        show(s);
      }, function (e) {
        reachable = false;
        $('unreachable').className = 'shown';
        $('unreachable-detail').textContent = '(' + (e && e.message ? e.message : e) + ')' +
          (lastOk ? '; last answer at ' + lastOk.toLocaleTimeString() : '') + '; still trying every second.';
        var badge = $('state');
        badge.textContent = 'not reachable';
        badge.className = 'state failed';
      })
      .then(function () {
        try { writeStatus(); } catch (e) { window.asgdErrors.push(String(e && e.stack ? e.stack : e)); }
        setTimeout(poll, 1000);
      });
  }
  // The run so far (a page opened mid-run), then the polls.
  function start() {
    fetch('history', {cache: 'no-store'})
      .then(function (r) { return r.ok ? r.json() : {points: []}; })
      .then(function (h) {
        var points = Array.isArray(h.points) ? h.points : [];
        history = points.filter(function (p) { return has(p.t); }).slice(-MAX_POINTS);
      }, function () {})
      .then(poll);
  }
  writeStatus();
  start();
})();
)JS";

}  // namespace

std::string live_status_page_html() {
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
                    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
                    "script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:\">\n";
  out += "<script>" + std::string(pages::error_capture_js()) + "</script>\n";
  out += "<title>asgd job</title>\n<style>" + std::string(pages::base_css()) + std::string(kLiveCss) + "</style>\n";
  out += "</head>\n<body>\n";
  out += kBody;
  out += pages::chartjs_script_element();
  out += "<script>" + std::string(pages::chart_helpers_js()) + std::string(kLiveJs) + "</script>\n</body>\n</html>\n";
  return out;
}

}  // namespace asgd::pages
