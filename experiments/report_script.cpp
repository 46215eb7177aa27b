#include "experiments/report_script.hpp"

namespace asgd::experiments {
namespace {

// The script that draws every chart from the data block. Plain ES5 plus
// Chart.js, so any browser of the last years opens the report.
constexpr std::string_view kDrawJs = R"JS(
(function () {
  'use strict';
  var summaries = [];
  try {
    draw(JSON.parse(document.getElementById('asgd-data').textContent));
  } catch (e) {
    window.asgdErrors.push('drawing the charts failed: ' + (e && e.stack ? e.stack : e));
  } finally {
    asgdWriteStatus(summaries);
  }

  function draw(data) {
    var DASHES = [[], [7, 4], [2, 3], [12, 4, 2, 4], [4, 4]];
    var multi = data.workers.length > 1;
    // A policy's runs side by side in legends and bars.
    data.runs.sort(function (a, b) {
      return data.policies.indexOf(a.policy) - data.policies.indexOf(b.policy) || a.workers - b.workers || a.repeat - b.repeat;
    });
    Chart.defaults.font.family = '-apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans", sans-serif';
    Chart.defaults.font.size = 12;
    Chart.defaults.color = '#334155';
    Chart.defaults.borderColor = '#e2e8f0';

    function rgb(hex) {
      var n = parseInt(hex.slice(1), 16);
      return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
    }
    function policyColor(policy) {
      var i = Math.max(data.policies.indexOf(policy), 0);
      return data.palette[i % data.palette.length];
    }
    // Several worker counts: one hue per policy, lighter for fewer workers.
    function groupColor(policy, workers) {
      var base = policyColor(policy);
      if (!multi) return base;
      var i = data.workers.indexOf(workers), k = data.workers.length;
      var mix = 0.55 * (1 - i / (k - 1));
      return 'rgb(' + rgb(base).map(function (v) { return Math.round(v + (255 - v) * mix); }).join(',') + ')';
    }
    function translucent(color, alpha) {
      var c = color.charAt(0) === '#' ? rgb(color) : color.replace(/[^0-9,]/g, '').split(',');
      return 'rgba(' + c[0] + ',' + c[1] + ',' + c[2] + ',' + alpha + ')';
    }
    function groupLabel(policy, workers) {
      return multi ? policy + ', ' + workers + (workers === 1 ? ' worker' : ' workers') : policy;
    }
    function runLabel(r) { return r.policy + (multi ? ' \u00d7' + r.workers : '') + ' \u00b7 r' + r.repeat; }
    function fmt(v, digits) { return v === null || v === undefined ? '\u2013' : Number(v).toFixed(digits); }
    function sum(a) { return a.reduce(function (s, v) { return s + v; }, 0); }

    function options(xTitle, yTitle, extra) {
      var o = {
        animation: false, responsive: true, maintainAspectRatio: false,
        interaction: {mode: 'nearest', intersect: false},
        plugins: {
          legend: {position: 'bottom', labels: {boxWidth: 22, boxHeight: 2, padding: 10}},
          tooltip: {}
        },
        scales: {
          x: {type: 'linear', title: {display: true, text: xTitle, font: {weight: '600'}}, grid: {color: '#f1f5f9'}},
          y: {title: {display: true, text: yTitle, font: {weight: '600'}}, grid: {color: '#f1f5f9'}}
        }
      };
      return Object.assign(o, extra || {});
    }
    function make(id, config, why) {
      var canvas = document.getElementById(id);
      if (!canvas) return null;
      var points = sum(config.data.datasets.filter(function (d) { return !d.asgdGuide; }).map(function (d) {
        return d.data.filter(function (v) { return v !== null && v !== undefined; }).length;
      }));
      if (points === 0) {
        var p = document.createElement('p');
        p.className = 'empty';
        p.textContent = 'No data: ' + why;
        canvas.parentNode.replaceWith(p);
        summaries.push({id: id, datasets: 0, points: 0, painted: false, note: why});
        return null;
      }
      var chart = new Chart(canvas, config);
      summaries.push(asgdChartSummary(id, chart));
      return chart;
    }

    // One line per run over its curve points; epoch ends drawn larger.
    function curveChart(id, xTitle, yTitle, xOf, yOf, yDigits, extraScales, guides, why) {
      var datasets = data.runs.map(function (r) {
        var color = groupColor(r.policy, r.workers);
        var pts = r.curve.filter(function (p) { return xOf(p) !== null && yOf(p) !== null; })
                         .map(function (p) { return {x: xOf(p), y: yOf(p), epoch: p.epoch}; });
        return {label: runLabel(r), data: pts, borderColor: color, backgroundColor: color,
                borderDash: DASHES[r.repeat % DASHES.length], borderWidth: 1.8, tension: 0,
                pointRadius: function (c) { return c.raw && c.raw.epoch ? 3.5 : 1.5; }, pointHoverRadius: 5};
      });
      var o = options(xTitle, yTitle);
      // A line sample per run in the legend, dashed like its line (Chart.js
      // leaves the dash out of point-style legend items).
      o.plugins.legend.labels = {
        usePointStyle: true, pointStyle: 'line', pointStyleWidth: 30, padding: 12,
        generateLabels: function (chart) {
          return Chart.defaults.plugins.legend.labels.generateLabels(chart).map(function (item) {
            var d = chart.data.datasets[item.datasetIndex];
            item.lineDash = d.borderDash || [];
            item.lineWidth = 2;
            item.strokeStyle = d.borderColor;
            return item;
          });
        }
      };
      Object.keys(extraScales || {}).forEach(function (axis) { Object.assign(o.scales[axis], extraScales[axis]); });
      o.plugins.tooltip.callbacks = {
        label: function (c) {
          return c.dataset.label + ': ' + fmt(c.parsed.y, yDigits) + ' at ' + Number(c.parsed.x).toLocaleString() +
                 (c.raw && c.raw.epoch ? ' (end of epoch ' + c.raw.epoch + ')' : '');
        }
      };
      return make(id, {type: 'line', data: {datasets: datasets.concat(guides || [])}, options: o}, why);
    }
    function targetGuide(xMax) {
      if (!data.target) return [];
      return [{label: 'target ' + data.target.accuracy.toFixed(3), data: [{x: 0, y: data.target.accuracy}, {x: xMax, y: data.target.accuracy}],
               borderColor: '#64748b', borderDash: [5, 5], borderWidth: 1.2, pointRadius: 0, asgdGuide: true}];
    }
    function maxOf(xOf) {
      var m = 0;
      data.runs.forEach(function (r) { r.curve.forEach(function (p) { var x = xOf(p); if (x !== null && x > m) m = x; }); });
      return m;
    }

    var wall = function (p) { return p.wall_s; };
    var updates = function (p) { return p.updates; };
    var acc = function (p) { return p.val_accuracy; };
    curveChart('acc-vs-time', 'training time (s)', 'validation accuracy', wall, acc, 4,
               {x: {min: 0}}, targetGuide(maxOf(wall)), 'no run has a validation point yet');
    curveChart('acc-vs-updates', 'updates applied (gradient pushes or optimizer steps)', 'validation accuracy', updates, acc, 4,
               {x: {min: 0}}, targetGuide(maxOf(updates)), 'the runtime did not report updates with the evaluations');
    // An epoch's line holds the mean over the whole epoch; an evaluation's
    // the mean since the previous point. An epoch's mean is left out of
    // this curve where an evaluation with a loss came since the epoch
    // before (the curve jumped up at each epoch's end).
    data.runs.forEach(function (r) {
      var since = false;
      r.curve.forEach(function (p) {
        p.interval_loss = p.kind === 'epoch' && since ? null : p.train_loss;
        if (p.kind === 'epoch') since = false;
        else if (p.train_loss !== null) since = true;
      });
    });
    curveChart('loss', 'training time (s)', 'training loss (cross-entropy)', wall, function (p) { return p.interval_loss; }, 4,
               {x: {min: 0}}, [], 'no training loss was reported');

    // Time to target: each group's min..max as a bar, its mean as a tick,
    // every run as a dot.
    var groups = data.groups;
    var glabels = groups.map(function (g) { return groupLabel(g.policy, g.workers); });
    var tttRange = {type: 'bar', label: 'min \u2013 max over repeats', borderSkipped: false, borderRadius: 3, barPercentage: 0.5,
                    data: groups.map(function (g) { return g.time_to_target_s ? [g.time_to_target_s.min, g.time_to_target_s.max] : null; }),
                    backgroundColor: groups.map(function (g) { return translucent(groupColor(g.policy, g.workers), 0.28); }),
                    borderColor: groups.map(function (g) { return groupColor(g.policy, g.workers); }), borderWidth: 1.5};
    var tttMean = {type: 'line', label: 'mean', showLine: false, pointStyle: 'line', pointRadius: 18, pointBorderWidth: 3,
                   borderColor: '#0f172a', backgroundColor: '#0f172a',
                   data: groups.map(function (g) { return g.time_to_target_s ? g.time_to_target_s.mean : null; })};
    var dots = [];
    data.runs.forEach(function (r) {
      if (r.time_to_target_s !== null) dots.push({x: groupLabel(r.policy, r.workers), y: r.time_to_target_s, run: r.id});
    });
    var tttRuns = {type: 'line', label: 'one run', showLine: false, pointRadius: 4, pointHoverRadius: 6,
                   borderColor: '#0f172a', backgroundColor: '#ffffff', pointBorderWidth: 1.5, data: dots};
    var tttOptions = options('', 'time to target (training s)');
    tttOptions.scales.x = {type: 'category', grid: {display: false}};
    tttOptions.scales.y.beginAtZero = true;
    tttOptions.interaction = {mode: 'nearest', intersect: true};
    tttOptions.plugins.legend = {display: false};  // the description says what bar, dash and dot are
    tttOptions.plugins.tooltip.callbacks = {
      label: function (c) {
        if (c.raw && c.raw.run) return c.raw.run + ': ' + fmt(c.parsed.y, 2) + ' s';
        if (Array.isArray(c.raw)) return 'min ' + fmt(c.raw[0], 2) + ' s, max ' + fmt(c.raw[1], 2) + ' s';
        return c.dataset.label + ': ' + fmt(c.parsed.y, 2) + ' s';
      }
    };
    make('time-to-target-chart', {type: 'bar', data: {labels: glabels, datasets: [tttRange, tttMean, tttRuns]}, options: tttOptions},
         data.target ? 'no run reached the target' : 'there is no target yet');

    // Throughput: one bar per run, one color per policy.
    var runLabels = data.runs.map(runLabel);
    var rateSets = groups.map(function (g) {
      var color = groupColor(g.policy, g.workers);
      return {label: groupLabel(g.policy, g.workers), backgroundColor: translucent(color, 0.75), borderColor: color, borderWidth: 1,
              borderRadius: 3, data: data.runs.map(function (r) { return r.policy === g.policy && r.workers === g.workers ? r.samples_per_s : null; })};
    });
    var rateOptions = options('', 'training samples per second');
    rateOptions.scales.x = {type: 'category', grid: {display: false}, ticks: {autoSkip: false, maxRotation: 60}};
    rateOptions.scales.y.beginAtZero = true;
    rateOptions.datasets = {bar: {skipNull: true}};
    rateOptions.plugins.tooltip.callbacks = { label: function (c) { return Math.round(c.parsed.y).toLocaleString() + ' samples/s'; } };
    make('throughput', {type: 'bar', data: {labels: runLabels, datasets: rateSets}, options: rateOptions}, 'no run finished');

    // Staleness: each group's histogram merged over its repeats, as a share
    // of its updates. 0 to 9 keep a bar each (bsp's and a small ssp bound's
    // whole story); beyond, bins widen so that a long async tail still fits
    // in ~24 bars, and a log scale keeps the tail's small shares visible.
    var merged = groups.map(function (g) {
      var h = [];
      data.runs.forEach(function (r) {
        if (r.policy !== g.policy || r.workers !== g.workers) return;
        r.staleness_histogram.forEach(function (c, s) { h[s] = (h[s] || 0) + c; });
      });
      for (var s = 0; s < h.length; ++s) h[s] = h[s] || 0;
      return h;
    });
    var longest = Math.max.apply(null, merged.map(function (h) { return h.length; }).concat([1]));
    var bins = [];
    for (var one = 0; one < Math.min(longest, 10); ++one) bins.push({lo: one, hi: one});
    var width = Math.max(1, Math.ceil((longest - 10) / 14));
    for (var lo = 10; lo < longest; lo += width) bins.push({lo: lo, hi: Math.min(lo + width - 1, longest - 1)});
    var sLabels = bins.map(function (b) { return b.lo === b.hi ? String(b.lo) : b.lo + '\u2013' + b.hi; });
    var sSets = [], smallest = 100;
    groups.forEach(function (g, i) {
      var h = merged[i], total = sum(h);
      if (total === 0) return;
      var color = groupColor(g.policy, g.workers);
      var counts = bins.map(function (b) { return sum(h.slice(b.lo, b.hi + 1)); });
      var shares = counts.map(function (c) { return c > 0 ? 100 * c / total : null; });
      shares.forEach(function (v) { if (v !== null && v < smallest) smallest = v; });
      sSets.push({label: groupLabel(g.policy, g.workers), backgroundColor: translucent(color, 0.75), borderColor: color, borderWidth: 1,
                  data: shares, counts: counts});
    });
    var sOptions = options('staleness of an applied update (clocks)', 'share of the updates (%, log scale)');
    sOptions.scales.x = {type: 'category', title: sOptions.scales.x.title, grid: {display: false}};
    sOptions.scales.y.type = 'logarithmic';
    // A decade at least: with every update at one staleness (bsp) the only
    // share is 100%, and an axis from 100 to 100 drew no bar.
    sOptions.scales.y.min = Math.min(10, Math.pow(10, Math.floor(Math.log10(smallest))));
    sOptions.scales.y.max = 100;
    sOptions.scales.y.ticks = {callback: function (v) {
      var e = Math.log10(v);
      return Math.abs(e - Math.round(e)) < 1e-9 ? (v >= 1 ? v : v.toPrecision(1)) + '%' : '';
    }};
    sOptions.datasets = {bar: {skipNull: true}};
    sOptions.plugins.tooltip.callbacks = {
      label: function (c) {
        return c.dataset.label + ': ' + fmt(c.parsed.y, c.parsed.y < 1 ? 3 : 1) + '% (' + c.dataset.counts[c.dataIndex].toLocaleString() + ' updates)';
      }
    };
    make('staleness', {type: 'bar', data: {labels: sLabels, datasets: sSets}, options: sOptions}, 'the runs recorded no staleness');

    // Per-worker wait: each group's mean over its repeats.
    var maxWorkers = Math.max.apply(null, data.workers);
    var wLabels = [];
    for (var w = 0; w < maxWorkers; ++w) wLabels.push('worker ' + w);
    var waitSets = groups.map(function (g) {
      var mine = data.runs.filter(function (r) { return r.policy === g.policy && r.workers === g.workers; });
      var color = groupColor(g.policy, g.workers);
      return {label: groupLabel(g.policy, g.workers), backgroundColor: translucent(color, 0.75), borderColor: color, borderWidth: 1,
              data: wLabels.map(function (_, k) {
                var v = mine.filter(function (r) { return k < r.worker_wait_s.length; }).map(function (r) { return r.worker_wait_s[k]; });
                return v.length ? sum(v) / v.length : null;
              })};
    });
    var waitOptions = options('', 'time the policy held reads back (s)');
    waitOptions.scales.x = {type: 'category', grid: {display: false}};
    waitOptions.scales.y.beginAtZero = true;
    waitOptions.plugins.tooltip.callbacks = { label: function (c) { return c.dataset.label + ': ' + fmt(c.parsed.y, 3) + ' s'; } };
    make('wait', {type: 'bar', data: {labels: wLabels, datasets: waitSets}, options: waitOptions}, 'the runs recorded no wait times');

    // Where the time goes: each group's mean worker, phase by phase, stacked.
    var phases = [['data_wait_s', 'data wait', '#94a3b8'], ['forward_s', 'forward', '#2563eb'],
                  ['backward_s', 'backward', '#7c3aed'], ['copy_s', 'host-device copies', '#06b6d4'],
                  ['device_s', 'rest of the GPU step', '#0e7490'],
                  ['delay_s', 'straggler delay', '#f59e0b'], ['push_pull_s', 'push/pull', '#16a34a'],
                  ['other_s', 'other', '#cbd5e1']];
    var phaseSets = phases.map(function (ph) {
      return {label: ph[1], backgroundColor: ph[2], borderColor: ph[2], borderWidth: 1,
              data: groups.map(function (g) {
                var mine = data.runs.filter(function (r) {
                  return r.policy === g.policy && r.workers === g.workers && r.worker_phases.length;
                });
                if (!mine.length) return null;
                return sum(mine.map(function (r) {
                  return sum(r.worker_phases.map(function (p) { return p[ph[0]]; })) / r.worker_phases.length;
                })) / mine.length;
              })};
    }).filter(function (set) { return set.data.some(function (v) { return v > 0; }); });
    var phOptions = options('', 'seconds of the mean worker');
    phOptions.scales.x = {type: 'category', stacked: true, grid: {display: false}};
    phOptions.scales.y.stacked = true;
    phOptions.scales.y.beginAtZero = true;
    phOptions.plugins.tooltip.callbacks = { label: function (c) { return c.dataset.label + ': ' + fmt(c.parsed.y, 3) + ' s'; } };
    make('phases', {type: 'bar', data: {labels: groups.map(function (g) { return groupLabel(g.policy, g.workers); }),
                                        datasets: phaseSets}, options: phOptions}, 'the runs recorded no phase times');

    // Speedup over worker counts, against the ideal line.
    if (data.scaling.length) {
      var policies = [];
      data.scaling.forEach(function (row) { if (policies.indexOf(row.policy) < 0) policies.push(row.policy); });
      var base = data.scaling[0].base_workers;
      var spSets = policies.map(function (p) {
        var color = policyColor(p);
        return {label: p, borderColor: color, backgroundColor: color, borderWidth: 2, pointRadius: 4, tension: 0,
                data: data.scaling.filter(function (row) { return row.policy === p; })
                                  .map(function (row) { return {x: row.workers, y: row.speedup, e: row.efficiency, m: row.measure}; })};
      });
      spSets.push({label: 'ideal (E = 100%)', borderColor: '#94a3b8', borderDash: [5, 5], borderWidth: 1.2, pointRadius: 0, asgdGuide: true,
                   data: data.workers.map(function (n) { return {x: n, y: n / base}; })});
      var spOptions = options('workers', 'speedup over ' + base + (base === 1 ? ' worker' : ' workers') + ' (\u00d7)');
      spOptions.scales.x.ticks = {stepSize: 1};
      spOptions.scales.y.beginAtZero = true;
      spOptions.plugins.tooltip.callbacks = {
        label: function (c) {
          return c.raw.e === undefined ? 'ideal ' + fmt(c.parsed.y, 2) + '\u00d7'
                 : c.dataset.label + ': ' + fmt(c.parsed.y, 2) + '\u00d7, efficiency ' + Math.round(100 * c.raw.e) + '% (' + c.raw.m + ')';
        }
      };
      make('speedup', {type: 'line', data: {datasets: spSets}, options: spOptions}, 'no policy ran at two worker counts');
    }
  }
})();
)JS";

}  // namespace

std::string_view report_draw_js() { return kDrawJs; }

}  // namespace asgd::experiments
