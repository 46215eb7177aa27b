#!/usr/bin/python3
"""Time to accuracy under bsp, ssp:1, ssp:3 and async, with and without stragglers.

One run of this script trains the same job (MNIST, mlp, 4 workers) under each
policy and each straggler scenario R times and compares the training seconds
until validation accuracy first reaches the target (`time_to_target_s` in
asgd's metrics summary). The scenarios (--scenarios) are asgd --straggler
values, "none" for no straggler; by default none, a persistent one (0:4,
worker 0 always 4x slow) and a transient one (random:0.1:4, each step of
every worker 4x slow with chance 0.1, seeded):

  * runs are interleaved (for each repeat, each scenario: bsp, ssp:1, ssp:3,
    async) so that machine noise falls on every policy alike;
  * repeat r (0-based) uses --seed r+1 under every policy, so the policies see
    the same initialisation, validation split and data order;
  * per policy it prints the median, min and max time to target, the epoch of
    each run in which the target was crossed, final test accuracy, samples/s,
    staleness (in clocks) and the seconds each worker's reads were held back
    by the policy; then for pairs of policies the ratio of medians, whether
    their min-max spreads overlap, and a verdict from an exact two-sided
    Mann-Whitney rank test on the two sets of times: "faster" or "slower"
    at p < 0.05, "not distinguishable" otherwise;
  * with --settle-to N (more than --repeats), a pair with 0.01 <= p < 0.2
    is unsettled: its scenario gets more runs of the pair's two policies
    (seeds R+1, R+2, ...; one round over every unsettled scenario at a
    time, so drift falls on them alike) until no pair there is unsettled
    (then p < 0.01 is faster or slower, p >= 0.2 not distinguishable) or
    each side has N runs, where p < 0.05 decides and the verdict is marked
    unsettled (~). Off by default: it gives a pair the runs it needs to be
    told apart within one run of the script, but two runs of the script
    with N = 12 agreed on 12 of 15 verdicts (2026-11-27, docs/policies.md),
    no better than fixed repeats, because the differences that moved
    (10-20%) moved between the runs themselves, beyond their spread within
    a run.

Measure (--measure). The VM's speed drifts by up to 2.5x between runs a
few seconds apart, and a run's seconds to target move with it. "compute"
(the default) divides each run's seconds to target by what one sample's
forward and backward pass cost in that same run (the workers' compute
seconds over the samples they trained on): the time to target in units of
one sample's compute, in which a uniformly slower machine cancels, while
waits for a straggler, a policy's holds and the straggler's own delays
(made as a multiple of its compute) still count. "seconds" compares the
seconds themselves. Both are printed.

Runs stop at the target (asgd --stop-at-target; the learning-rate schedule
is still the one for --epochs, so the time to target is what a full run
would have shown), which makes a run about a third as long as training
every epoch and buys repeats; the final test accuracy printed is then the
model's at the stop. --full-runs trains every epoch.

Footing (--footing). "per-sample" (the default) gives every policy the same
learning rate per sample: each applies momentum SGD at --lr to every
worker's gradient, except bsp, which averages the N workers' gradients into
one update and so takes N x --lr (the summed gradient at --lr); staleness-
aware steps and warm-up are off for all. "defaults" runs each policy with the
product's defaults (which scale lr with the workers and damp stale steps:
docs/policies.md), which answers "which default should I use", not "which
consistency model is faster".

A run that never reaches the target is reported as such; a policy with such a
run has no median time, and a ratio involving it is "not measurable". No
number is ever filled in for a run that did not reach the target.

Why these defaults (measured on the 2-core development VM, 2026-11-21):

  * --eval-every 0.1. Without it validation runs only when the *slowest*
    worker finishes an epoch, so under async (whose fast workers run far
    ahead of the straggler) the first look at the model comes when the
    straggler ends its first epoch, and the "time to target" is that moment,
    not when the model got there. Every policy pays the same evaluation cost
    (one snapshot and 5000 validation images every 0.1 s; at 0.25 s the
    times were quantised coarsely enough to move the ssp:3 ratio by 0.05).
  * --lr-schedule cosine, --epochs 8: the product's default schedule, over a
    budget long enough that bsp reaches 0.97 with every seed tried (it
    averages the 4 workers' gradients into one update per clock, a quarter of
    the updates ssp and async apply, and crosses in epoch 3 or 4). The
    schedule's length is the epoch budget, so the figures belong to
    --epochs 8. With --lr-schedule constant (rate independent of the budget)
    ssp:3 gains less over bsp; both results are in docs/benchmarks.md.
  * A straggler that is slow every step paces ssp as it paces bsp once the
    fast workers are s clocks ahead; ssp's gain here comes from applying each
    worker's gradient as its own update (4 per clock against bsp's 1) and
    from the slack at the start, not from escaping the straggler.

Usage: /usr/bin/python3 bench/policy_straggler.py [--repeats 5] [--settle-to N] [--epochs 8]
           [--workers 4] [--scenarios none,0:4,random:0.1:4] [--footing per-sample|defaults]
           [--lr 0.01] [--target 0.97] [--lr-schedule constant]
           [--asgd build/bin/asgd] [--data-dir DIR] [--out DIR] [--json]
Exit status: 0 every run completed (whatever the verdict), 1 a run failed,
2 bad options, or the binary or the data is missing.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = ["bsp", "ssp:1", "ssp:3", "async"]
# (policy, compared with): the verdicts printed for each scenario.
PAIRS = [("ssp:1", "bsp"), ("ssp:3", "bsp"), ("async", "bsp"), ("ssp:3", "ssp:1"), ("async", "ssp:3")]
RUN_TIMEOUT_S = 600
# Verdicts: faster or slower when a rank test's p is below ALPHA, else not
# distinguishable. A pair with SETTLED_BELOW <= p < SETTLED_FROM is
# unsettled: with --settle-to its scenario gets more runs of its two
# policies (up to --settle-to a side) before ALPHA decides.
ALPHA = 0.05
SETTLED_BELOW = 0.01
SETTLED_FROM = 0.2
# --measure: the run's figure its verdicts compare.
MEASURES = {"compute": "time_to_target_units", "seconds": "time_to_target_s"}


def fail(code, message):
    print(f"policy_straggler: {message}", file=sys.stderr)
    sys.exit(code)


def has_mnist(directory):
    return any(os.path.isfile(os.path.join(directory, "train-images-idx3-ubyte" + ext)) for ext in (".gz", ""))


def default_data_dir():
    env = os.environ.get("ASGD_DATA_DIR")
    if env:
        return os.path.join(env, "mnist")
    return os.path.join(REPO_ROOT, "..", "shared", "data", "mnist")


def read_metrics(path):
    """(epoch records, summary record or None) from a JSON Lines metrics file."""
    epochs, summary = [], None
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                rec = json.loads(line)
                if rec.get("event") == "epoch":
                    epochs.append(rec)
                elif rec.get("event") == "summary":
                    summary = rec
    except (OSError, ValueError):
        pass
    return epochs, summary


def footing_flags(a, policy):
    """The optimizer flags that put `policy` on the chosen footing."""
    if a.footing == "defaults":
        return []
    lr = a.lr * a.workers if policy == "bsp" else a.lr
    flags = ["--lr", repr(lr), "--momentum", repr(a.momentum), "--lr-warmup", "0"]
    if policy == "async" or policy.startswith("ssp"):  # (asgd refuses it for the others)
        flags += ["--staleness-aware-lr", "false"]
    return flags


def train_command(a, policy, scenario, seed, metrics_path):
    """The asgd train command of one run."""
    cmd = [a.asgd, "train", "--data-dir", a.data_dir, "--policy", policy, "--workers", str(a.workers),
           "--epochs", str(a.epochs), "--lr-schedule", a.lr_schedule,
           "--seed", str(seed), "--target-accuracy", repr(a.target), "--metrics-out", metrics_path,
           "--eval-every", repr(a.eval_every), "--log-level", "warn"] + footing_flags(a, policy)
    if scenario != "none":
        cmd += ["--straggler", scenario]
    if not a.full_runs:
        cmd += ["--stop-at-target", "true"]
    return cmd


def refuse_bad_runs(a, scenarios, out_dir):
    """Exits 2 with asgd's own message when a run's flags would be refused
    (a bad --scenarios item, --eval-every, ...): asgd checks them without
    training (`asgd cluster --print-layout`), so that no run starts only
    for every one to fail."""
    for sc in scenarios:
        for pol in POLICIES:
            cmd = train_command(a, pol, sc, 1, os.path.join(out_dir, "check.jsonl"))
            cmd[1:2] = ["cluster", "--print-layout"]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                detail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
                fail(2, (detail[-1] if detail else f"asgd exited with {proc.returncode}") +
                     (f" (scenario {sc})" if sc != "none" else ""))


def run_one(a, policy, scenario, seed, metrics_path):
    """Trains once; returns a dict describing the run (with "error" if it failed)."""
    cmd = train_command(a, policy, scenario, seed, metrics_path)
    run = {"policy": policy, "scenario": scenario, "seed": seed, "command": " ".join(cmd)}
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        run["error"] = f"did not finish within {RUN_TIMEOUT_S} s"
        return run
    run["process_s"] = round(time.monotonic() - start, 2)
    epochs, summary = read_metrics(metrics_path)
    if proc.returncode != 0 or summary is None:
        detail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        run["error"] = f"exit {proc.returncode}: " + (detail[-1] if detail else "no output")
        return run
    ttt = summary.get("time_to_target_s")
    # What one sample's forward and backward pass cost in this run: the
    # workers' compute seconds over the samples they trained on.
    compute = sum(w["forward_s"] + w["backward_s"] for w in summary.get("worker_phases", []))
    samples = summary["samples_per_s"] * summary["train_s"]
    per_sample = compute / samples if compute > 0 and samples > 0 else None
    # The epoch during which the target was first seen (by an epoch's or an
    # --eval-every evaluation): the first that ended at it or later; a run
    # stopped at the target has no record of the epoch it stopped in.
    crossing = next((e["epoch"] for e in epochs if ttt is not None and e["wall_s"] >= ttt - 1e-9),
                    len(epochs) + 1 if ttt is not None and summary.get("stopped_at_target") else None)
    run.update({
        "time_to_target_s": ttt,
        "compute_s_per_sample": per_sample,
        "time_to_target_units": ttt / per_sample if ttt is not None and per_sample else None,
        "target_epoch": crossing if ttt is not None else None,
        "val_accuracy": [e["val_accuracy"] for e in epochs],
        "epoch_end_s": [round(e["wall_s"], 3) for e in epochs],
        "train_s": summary["train_s"],
        "final_test_accuracy": summary["final_test_accuracy"],
        "samples_per_s": summary["samples_per_s"],
        "updates_applied": summary["updates_applied"],
        "staleness_mean": summary["staleness_mean"],
        "staleness_p99": summary["staleness_p99"],
        "staleness_max": summary["staleness_max"],
        "worker_wait_s": summary.get("worker_wait_s", []),
        "worker_batch": summary.get("worker_batch", []),
    })
    return run


def describe(run, target):
    if "error" in run:
        return f"FAILED ({run['error']})"
    if run["time_to_target_s"] is None:
        best = max(run["val_accuracy"], default=0.0)
        return (f"did NOT reach {target} in {len(run['val_accuracy'])} epochs (best val {best:.4f}); "
                f"train {run['train_s']:.1f} s")
    return (f"reached {target} in epoch {run['target_epoch']} after {run['time_to_target_s']:.2f} s; "
            f"train {run['train_s']:.1f} s, test {run['final_test_accuracy']:.4f}")


def summarize(policy, runs, key):
    """Aggregates of one policy's runs; medians only over figures that exist.
    `key`: the time the ttt_* figures are of (time_to_target_s, or
    time_to_target_units: the same in units of one sample's compute)."""
    done = [r for r in runs if "error" not in r]
    reached = [r[key] for r in done if r.get(key) is not None]
    s = {"policy": policy, "runs": len(runs), "failed_runs": len(runs) - len(done),
         "reached_runs": len(reached), "measure": key, "time_to_target": [r.get(key) for r in runs],
         "time_to_target_s": [r.get("time_to_target_s") for r in runs],
         "target_epoch": [r.get("target_epoch") for r in runs]}
    # A median time exists only when every run got there: a run that did not
    # is not "slow", it is unmeasured, and any stand-in value would be made up.
    all_reached = len(reached) == len(runs) and runs
    s["ttt_median"] = statistics.median(reached) if all_reached else None
    s["ttt_min"] = min(reached) if all_reached else None
    s["ttt_max"] = max(reached) if all_reached else None
    seconds = [t for t in s["time_to_target_s"] if t is not None]
    s["ttt_median_s"] = statistics.median(seconds) if all_reached else None
    if done:
        s["final_test_accuracy_median"] = statistics.median(r["final_test_accuracy"] for r in done)
        s["final_test_accuracy_min"] = min(r["final_test_accuracy"] for r in done)
        s["final_test_accuracy_max"] = max(r["final_test_accuracy"] for r in done)
        s["samples_per_s_median"] = statistics.median(r["samples_per_s"] for r in done)
        s["train_s_median"] = statistics.median(r["train_s"] for r in done)
        firsts = [r["epoch_end_s"][0] for r in done if r["epoch_end_s"]]
        s["first_eval_s_median"] = statistics.median(firsts) if firsts else None
        s["staleness_mean_median"] = statistics.median(r["staleness_mean"] for r in done)
        s["staleness_max"] = max(r["staleness_max"] for r in done)
        workers = max(len(r["worker_wait_s"]) for r in done)
        s["worker_wait_s_median"] = [
            statistics.median(r["worker_wait_s"][w] for r in done if len(r["worker_wait_s"]) > w)
            for w in range(workers)]
    return s


def fmt_time(x, key):
    """A time to target: seconds, or (time_to_target_units) thousands of one sample's compute."""
    return f"{x:.2f} s" if key == "time_to_target_s" else f"{x / 1000:.0f}k"


def fmt_ttt(s, target):
    if s["ttt_median"] is not None:
        k = s["measure"]
        text = f"{fmt_time(s['ttt_median'], k)} (min {fmt_time(s['ttt_min'], k)}, max {fmt_time(s['ttt_max'], k)})"
        return text if k == "time_to_target_s" else text + f"; {s['ttt_median_s']:.2f} s"
    parts = []
    missed = s["runs"] - s["failed_runs"] - s["reached_runs"]
    if missed:
        parts.append(f"{missed} of {s['runs']} runs did NOT reach {target}")
    if s["failed_runs"]:
        parts.append(f"{s['failed_runs']} of {s['runs']} runs FAILED")
    got = [f"{t:.2f}" for t in s["time_to_target_s"] if t is not None]
    if got:
        parts.append("reached in the others after " + ", ".join(got) + " s")
    return "not measurable: " + "; ".join(parts)


def rank_test(a, b):
    """Exact two-sided Mann-Whitney p-value for times `a` against `b`, and
    whether `a` tends to be the smaller: the sum of a's ranks in the pooled
    times (ties take their mean rank, so a tie counts as half a win) against
    its distribution over every way of splitting the pooled times into
    groups of those sizes, counted by dynamic programming rather than
    enumerated (12 runs a side are 2.7 million splits)."""
    pooled = sorted(list(a) + list(b))
    twice_rank = {}  # time -> twice its mean rank (1-based): an integer even with ties
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1] == pooled[i]:
            j += 1
        twice_rank[pooled[i]] = i + j + 2
        i = j + 1
    ranks = [twice_rank[x] for x in pooled]
    m = len(a)
    observed = sum(twice_rank[x] for x in a)
    # ways[k][s]: subsets of k of the pooled times whose doubled ranks sum to s
    ways = [dict() for _ in range(m + 1)]
    ways[0][0] = 1
    for r in ranks:
        for k in range(m, 0, -1):
            for total, n in ways[k - 1].items():
                ways[k][total + r] = ways[k].get(total + r, 0) + n
    splits = sum(ways[m].values())
    at_most = sum(n for total, n in ways[m].items() if total <= observed)
    at_least = sum(n for total, n in ways[m].items() if total >= observed)
    p = min(1.0, 2.0 * min(at_most, at_least) / splits)
    return p, observed < m * (len(pooled) + 1)  # a's mean rank below the pooled mean: a tends to be smaller


def compare(summaries, policy, other, target):
    """(ratio of medians or None, verdict, text) for `policy` against `other`."""
    a, b = summaries[policy], summaries[other]
    if a["ttt_median"] is None or b["ttt_median"] is None:
        who = " and ".join(p for p, s in ((policy, a), (other, b)) if s["ttt_median"] is None)
        return None, "not measurable", f"not measurable ({who}: no median time to {target}, see above)", None, None
    value = a["ttt_median"] / b["ttt_median"]
    p, a_smaller = rank_test(a["time_to_target"], b["time_to_target"])
    verdict = ("faster" if a_smaller else "slower") if p < ALPHA else "not distinguishable"
    overlap = not (a["ttt_max"] < b["ttt_min"] or a["ttt_min"] > b["ttt_max"])
    k = a["measure"]
    spreads = (f"{fmt_time(a['ttt_min'], k)}-{fmt_time(a['ttt_max'], k)} against "
               f"{fmt_time(b['ttt_min'], k)}-{fmt_time(b['ttt_max'], k)}, "
               f"{'overlapping' if overlap else 'apart'}; rank test p = {p:.3f}, {a['runs']} and {b['runs']} runs"
               f"{'; UNSETTLED' if unsettled(p) else ''}")
    return value, verdict, f"{value:.3f}  {verdict} ({spreads})", p, overlap


def unsettled(p):
    """A p-value between the settled verdicts: more runs could move it either way."""
    return p is not None and SETTLED_BELOW <= p < SETTLED_FROM


def unsettled_policies(a, runs_of_scenario):
    """The policies of a scenario's unsettled pairs that may take another run."""
    summaries = {pol: summarize(pol, runs_of_scenario[pol], MEASURES[a.measure]) for pol in POLICIES}
    wanted = set()
    for pol, other in PAIRS:
        if unsettled(compare(summaries, pol, other, a.target)[3]):
            wanted |= {pol, other}
    return [pol for pol in POLICIES if pol in wanted and len(runs_of_scenario[pol]) < a.settle_to]


def run_all(a, scenarios, out_dir):
    """Every run: --repeats interleaved rounds (for each repeat and scenario,
    every policy), then, while some scenario has unsettled pairs, rounds of
    one more run of their policies (interleaved over the scenarios alike).
    A policy's k-th run of a scenario has seed k. Returns ({scenario:
    {policy: [run]}}, every run in the order run)."""
    runs = {sc: {pol: [] for pol in POLICIES} for sc in scenarios}
    in_order = []

    def one(sc, pol, label):
        seed = len(runs[sc][pol]) + 1
        name = f"{sc}_{pol}_seed{seed}".replace(":", "").replace(",", "_")
        run = run_one(a, pol, sc, seed, os.path.join(out_dir, name + ".jsonl"))
        runs[sc][pol].append(run)
        in_order.append(run)
        print(f"[{len(in_order)}{label}] {sc:14s} {pol:6s} seed {seed}: {describe(run, a.target)}", flush=True)

    base = a.repeats * len(POLICIES) * len(scenarios)
    for _ in range(a.repeats):
        for sc in scenarios:
            for pol in POLICIES:
                one(sc, pol, f"/{base}")
    while True:
        more = {sc: unsettled_policies(a, runs[sc]) for sc in scenarios}
        if not any(more.values()):
            break
        for sc in scenarios:
            for pol in more[sc]:
                one(sc, pol, " settling")
    return runs, in_order


def print_policy(s, a):
    print(f"\n  {s['policy']}")
    print(f"    time to target     {fmt_ttt(s, a.target)}")
    print(f"    crossed in epoch   " + ", ".join("-" if e is None else str(e) for e in s["target_epoch"]))
    if s.get("first_eval_s_median") is not None:
        print(f"    epoch 1 ended at   {s['first_eval_s_median']:.2f} s (median; the first evaluation)")
    if a.eval_every == 0 and s["reached_runs"] and all(e in (None, 1) for e in s["target_epoch"]):
        print(f"    note               past the target at the first evaluation: its time is when the slowest "
              f"worker finished epoch 1, an upper bound")
    if "samples_per_s_median" not in s:
        return
    print(f"    final test acc.    {s['final_test_accuracy_median']:.4f} "
          f"(min {s['final_test_accuracy_min']:.4f}, max {s['final_test_accuracy_max']:.4f})")
    print(f"    samples/s          {s['samples_per_s_median']:.0f}  (train_s {s['train_s_median']:.1f} s, medians)")
    print(f"    staleness          mean {s['staleness_mean_median']:.2f} (median of runs), "
          f"max {s['staleness_max']:.0f} (over runs), in clocks")
    print(f"    worker wait (s)    " + "  ".join(f"w{w} {v:.2f}" for w, v in enumerate(s["worker_wait_s_median"]))
          + "  (medians: seconds the policy held each worker's reads back)")


def main():
    p = argparse.ArgumentParser(
        description="Time to validation accuracy under bsp, ssp:1, ssp:3 and async, with and without stragglers "
                    "(MNIST mlp).")
    p.add_argument("--asgd", default=os.path.join(REPO_ROOT, "build", "bin", "asgd"),
                   help="the asgd binary (default <repo>/build/bin/asgd)")
    p.add_argument("--data-dir", default=None,
                   help="the MNIST folder (default $ASGD_DATA_DIR/mnist, else <repo>/../shared/data/mnist)")
    p.add_argument("--repeats", type=int, default=5, help="runs per policy and scenario, interleaved (default 5)")
    p.add_argument("--settle-to", type=int, default=None, metavar="N",
                   help=f"runs a side up to which a scenario's unsettled pairs ({SETTLED_BELOW} <= p < "
                        f"{SETTLED_FROM}) get more (default --repeats: none)")
    p.add_argument("--epochs", type=int, default=8,
                   help="epochs per run; long enough for bsp to reach the target (default 8)")
    p.add_argument("--workers", type=int, default=4, help="worker actors (default 4)")
    p.add_argument("--scenarios", default="none,0:4,random:0.1:4",
                   help="comma-separated asgd --straggler values, 'none' for none (default none,0:4,random:0.1:4; "
                        "a value with commas of its own goes in quotes: 'random:0.1:4+0:2' joins items with +)")
    p.add_argument("--footing", default="per-sample", choices=["per-sample", "defaults"],
                   help="per-sample: the same lr per sample for every policy (default); defaults: each policy's own")
    p.add_argument("--lr", type=float, default=0.01,
                   help="per-sample footing: the rate of each worker's gradient (bsp takes workers x this; "
                        "default 0.01)")
    p.add_argument("--momentum", type=float, default=0.9, help="per-sample footing: momentum of all (default 0.9)")
    p.add_argument("--target", type=float, default=0.97, help="validation accuracy to reach (default 0.97)")
    p.add_argument("--eval-every", type=float, default=0.1,
                   help="asgd's --eval-every: also evaluate every S training seconds (default 0.1; 0: per epoch)")
    p.add_argument("--lr-schedule", default="cosine", choices=["constant", "cosine"],
                   help="learning-rate schedule of every run (default cosine; see the module docstring)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="keep every run's metrics file in DIR (default: a temporary folder, removed)")
    p.add_argument("--measure", default="compute", choices=sorted(MEASURES),
                   help="what the times compared are: compute (the default: each run's seconds to target over "
                        "what one sample's forward and backward pass cost in that run, so that the machine's "
                        "speed drifting between runs cancels) or seconds")
    p.add_argument("--full-runs", action="store_true",
                   help="train every epoch of each run instead of stopping at the target (asgd --stop-at-target): "
                        "the time to target is the same, the runs about three times as long, and the final test "
                        "accuracy that of the whole schedule")
    p.add_argument("--json", action="store_true", help="end with one JSON line holding every run and figure")
    a = p.parse_args()

    if a.repeats < 1 or a.epochs < 1 or a.workers < 1:
        fail(2, "--repeats, --epochs and --workers must be >= 1")
    if a.settle_to is None:
        a.settle_to = a.repeats
    if a.settle_to < a.repeats:
        fail(2, f"--settle-to {a.settle_to}: must be at least --repeats ({a.repeats})")
    if not 0.0 < a.target <= 1.0:
        fail(2, f"--target {a.target}: must be in (0, 1]")
    if not a.lr > 0 or not 0 <= a.momentum < 1:
        fail(2, "--lr must be > 0 and --momentum in [0, 1)")
    scenarios = [x.strip().replace("+", ",") for x in a.scenarios.split(",") if x.strip()]
    if not scenarios:
        fail(2, "--scenarios: name at least one (none, or an asgd --straggler value)")
    a.asgd = os.path.abspath(a.asgd)
    if not (os.path.isfile(a.asgd) and os.access(a.asgd, os.X_OK)):
        fail(2, f"no asgd binary at {a.asgd} (build it with scripts/build, or pass --asgd)")
    a.data_dir = os.path.realpath(a.data_dir or default_data_dir())
    if not has_mnist(a.data_dir):
        fail(2, f"no MNIST training images in {a.data_dir} (pass --data-dir or set ASGD_DATA_DIR)")

    out_dir = a.out or tempfile.mkdtemp(prefix="policy_straggler.")
    os.makedirs(out_dir, exist_ok=True)
    try:
        refuse_bad_runs(a, scenarios, out_dir)
    except SystemExit:
        if a.out is None:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    footing = (f"per-sample footing: momentum {a.momentum:g}, lr {a.lr:g} per worker gradient "
               f"(bsp {a.lr * a.workers:g} on the average of {a.workers}), no staleness-aware steps, no warm-up"
               if a.footing == "per-sample" else "each policy's own defaults (not the same lr per sample)")
    print(f"MNIST mlp, {a.workers} workers, scenarios {', '.join(scenarios)}, {a.epochs} epochs, "
          f"lr schedule {a.lr_schedule}, target val accuracy {a.target}, {a.repeats} repeats "
          f"(seeds 1..{a.repeats}), {cores} cores; data {a.data_dir}", flush=True)
    print(f"footing: {footing}", flush=True)
    print(f"command: {a.asgd} train --data-dir DIR --policy P --workers {a.workers} [--straggler S] "
          f"--epochs {a.epochs} --lr-schedule {a.lr_schedule} --seed R --target-accuracy {a.target} "
          f"--eval-every {a.eval_every} --metrics-out FILE {' '.join(footing_flags(a, 'async'))}"
          f"{'' if a.full_runs else ' --stop-at-target true'}", flush=True)

    started = time.monotonic()
    try:
        runs, in_order = run_all(a, scenarios, out_dir)
    except KeyboardInterrupt:
        kept = f"; the finished runs' metrics files are in {out_dir}" if a.out else ""
        fail(130, f"interrupted: no verdicts (the runs above each printed their time){kept}")
    finally:
        if a.out is None:
            shutil.rmtree(out_dir, ignore_errors=True)
    elapsed = time.monotonic() - started

    cadence = f"every {a.eval_every:g} s and after each epoch" if a.eval_every > 0 else "once per epoch"
    results = {}
    for sc in scenarios:
        summaries = {pol: summarize(pol, runs[sc][pol], MEASURES[a.measure]) for pol in POLICIES}
        unit = "training seconds" if a.measure == "seconds" else "thousands of one sample's compute, then seconds"
        print(f"\n=== straggler {sc}: time to validation accuracy {a.target} ({unit}; validation "
              f"checked {cadence}; an epoch ends when the slowest worker finishes it)")
        for pol in POLICIES:
            print_policy(summaries[pol], a)
        print()
        verdicts = {}
        for pol, other in PAIRS:
            value, verdict, text, p, overlap = compare(summaries, pol, other, a.target)
            verdicts[f"{pol}/{other}"] = {"ratio": value, "verdict": verdict, "p": p, "spreads_overlap": overlap,
                                          "runs": [summaries[pol]["runs"], summaries[other]["runs"]],
                                          "settled": None if p is None else not unsettled(p)}
            print(f"  median({pol}) / median({other}) = {text}")
        results[sc] = {"summaries": summaries, "verdicts": verdicts}

    rule = (f"faster/slower at p < {SETTLED_BELOW}, not distinguishable at p >= {SETTLED_FROM}, in between more "
            f"runs up to {a.settle_to} a side, then p < {ALPHA}; ~ marks a verdict still unsettled there"
            if a.settle_to > a.repeats else
            f"faster/slower at p < {ALPHA}; ~ marks {SETTLED_BELOW} <= p < {SETTLED_FROM}, a verdict more "
            f"runs could move")
    print(f"\nverdicts ({a.footing} footing, {a.measure} measure; exact two-sided rank test on the times of each: "
          f"{rule}; * marks min-max spreads that do not overlap)")
    print("  " + "pair".ljust(14) + "".join(sc.ljust(27) for sc in scenarios))
    for pol, other in PAIRS:
        key = f"{pol}/{other}"
        cells = []
        for sc in scenarios:
            v = results[sc]["verdicts"][key]
            mark = ("*" if v["spreads_overlap"] is False else "") + ("~" if unsettled(v["p"]) else "")
            cells.append((v["verdict"] if v["ratio"] is None else f"{v['ratio']:.2f} {v['verdict']}{mark}").ljust(27))
        print("  " + key.ljust(14) + "".join(cells))
    print(f"\n{len(in_order)} runs ({a.repeats} a side, then {len(in_order) - a.repeats * len(POLICIES) * len(scenarios)} "
          f"settling) in {elapsed:.0f} s" + (f"; metrics files in {out_dir}" if a.out else ""), flush=True)

    failed = sum(s["failed_runs"] for sc in scenarios for s in results[sc]["summaries"].values())
    if failed:
        print(f"policy_straggler: {failed} run(s) failed; see above", file=sys.stderr)
    if a.json:
        print(json.dumps({
            "workers": a.workers, "scenarios": scenarios, "footing": a.footing, "lr": a.lr, "momentum": a.momentum,
            "epochs": a.epochs, "lr_schedule": a.lr_schedule, "eval_every_s": a.eval_every, "measure": a.measure,
            "target": a.target, "repeats": a.repeats, "settle_to": a.settle_to, "full_runs": a.full_runs,
            "elapsed_s": round(elapsed, 1),
            "results": results, "runs": in_order,
        }), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
