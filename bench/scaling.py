#!/usr/bin/env python3
"""How cost grows with the job (issue 21): a scaling table.

Two parts, each run once in this order (quote it with the machine's load):

1. Across processes, the wire alone: `asgd bench load` (simulated workers,
   each a thread with a ZeroMQ connection per shard, pushing as fast as the
   real shard processes answer) while one thing grows at a time:
     model size  --keys 200K..64M floats (4 workers, 1 shard)
     workers     1..32 (1M floats, 2 shards)
     shards      1..8 (4M floats, 8 workers)
   For each: updates/s (whole-model updates: a push of its slice to every
   shard, answered within the run's window), the bytes moved per second
   (pushes and their replies), the shard processes' CPU time per update
   (summed over the shards, start-up included) and the largest shard RSS.

2. The real job (MNIST mlp, 1 epoch, every default) with 1..16 workers, in
   one process (`asgd train`) and as processes (`asgd cluster`, shared memory
   on): samples/s, the shards' optimizer time per update, and the largest
   resident set of any one process the run started.

Usage: bench/scaling.py [--asgd build/bin/asgd] [--data-dir DIR] [--seconds 6]
                        [--parts load,job] [--json FILE]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

LOAD_GRID = (
    [("model size", dict(keys=k, workers=4, shards=1, window=w)) for k, w in
     ((200_000, 4), (1 << 20, 4), (4 << 20, 2), (16 << 20, 1), (64 << 20, 1))]
    + [("workers", dict(keys=1 << 20, workers=n, shards=2, window=4)) for n in (1, 2, 4, 8, 16, 32)]
    + [("shards", dict(keys=4 << 20, workers=8, shards=s, window=2)) for s in (1, 2, 4, 8)]
)
JOB_WORKERS = (1, 2, 4, 8, 16)


def human(n):
    return f"{n / (1 << 20):g}M" if n >= 1 << 20 else f"{n / 1000:g}K"


def run_load(asgd, row, seconds):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "load.json")
        cmd = [asgd, "bench", "load", "--keys", str(row["keys"]), "--workers", str(row["workers"]),
               "--shards", str(row["shards"]), "--window", str(row["window"]), "--seconds", str(seconds),
               "--settle", str(max(1, seconds // 3)), "--rss-tolerance", "1000", "--json", out]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if not os.path.exists(out):
            sys.exit(f"scaling: {' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        with open(out) as f:
            j = json.load(f)
    shards = j["per_shard"]
    # An update is the whole model's: one push to each shard (its slice),
    # answered within the run's window (not those answered while it stopped).
    per_s = j["model_updates_per_s"]
    updates = sum(s["updates_applied"] for s in shards) / row["shards"]
    cpu_us = 1e6 * sum(s["cpu_s"] for s in shards) / max(1, updates)
    return {"updates_per_s": per_s,
            "mb_per_s": per_s * row["keys"] * 4 * 2 / 1e6,
            "shard_cpu_us_per_update": cpu_us,
            "shard_rss_mib": max(s["rss_max_mib"] for s in shards),
            "ok": j["counters_agree"]}


def run_job(asgd, command, workers, data_dir):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = [asgd, command, "--workers", str(workers), "--epochs", "1", "--data-dir", data_dir,
               "--metrics-out", metrics]
        # ru_maxrss of RUSAGE_CHILDREN is the largest of any child so far:
        # run each job from a fresh python so the figure is this job's own.
        probe = ("import resource,subprocess,sys;"
                 "r=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
                 "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
                 "sys.exit(r.returncode)")
        done = subprocess.run([sys.executable, "-c", probe] + cmd, capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not os.path.exists(metrics):
            sys.exit(f"scaling: {' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        with open(metrics) as f:
            summary = json.loads(f.read().strip().splitlines()[-1])
    optimizer = sum(summary.get("shard_optimizer_s") or [0.0])
    return {"samples_per_s": summary["samples_per_s"],
            "accuracy": summary["final_test_accuracy"],
            "optimizer_us_per_update": 1e6 * optimizer / max(1, summary["updates_applied"]),
            "largest_process_rss_mib": int(done.stdout.strip().splitlines()[-1]) / 1024.0}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--asgd", default="build/bin/asgd")
    p.add_argument("--data-dir", default=os.path.join(os.environ.get("ASGD_DATA_DIR", "data"), "mnist"))
    p.add_argument("--seconds", type=int, default=6, help="per bench load run (default 6)")
    p.add_argument("--parts", default="load,job")
    p.add_argument("--json")
    a = p.parse_args()
    parts = a.parts.split(",")
    results = {"load": [], "job": [], "load_average_start": open("/proc/loadavg").read().split()[:3]}
    if "load" in parts:
        print("across processes, the wire alone: asgd bench load (simulated workers; tcp loopback)")
        print(f"{'grows':<11} {'floats':>7} {'workers':>7} {'shards':>6} {'updates/s':>10} {'MB/s moved':>11} "
              f"{'shard CPU us/update':>20} {'shard RSS MiB':>14}")
        for axis, row in LOAD_GRID:
            r = run_load(a.asgd, row, a.seconds)
            results["load"].append({"axis": axis, **row, **r})
            print(f"{axis:<11} {human(row['keys']):>7} {row['workers']:>7} {row['shards']:>6} "
                  f"{r['updates_per_s']:>10.0f} {r['mb_per_s']:>11.0f} {r['shard_cpu_us_per_update']:>20.0f} "
                  f"{r['shard_rss_mib']:>14.0f}{'' if r['ok'] else '  counters disagree'}", flush=True)
    if "job" in parts:
        print("\nthe real job: MNIST mlp, 1 epoch, defaults; asgd train (one process) and asgd cluster (processes)")
        print(f"{'workers':>7} {'where':<10} {'samples/s':>10} {'accuracy':>8} {'optimizer us/update':>20} "
              f"{'largest RSS MiB':>16}")
        for n in JOB_WORKERS:
            for command, where in (("train", "one"), ("cluster", "processes")):
                r = run_job(a.asgd, command, n, a.data_dir)
                results["job"].append({"workers": n, "where": where, **r})
                print(f"{n:>7} {where:<10} {r['samples_per_s']:>10.0f} {r['accuracy']:>8.4f} "
                      f"{r['optimizer_us_per_update']:>20.1f} {r['largest_process_rss_mib']:>16.0f}", flush=True)
    results["load_average_end"] = open("/proc/loadavg").read().split()[:3]
    print(f"load average {' '.join(results['load_average_start'])} at the start, "
          f"{' '.join(results['load_average_end'])} at the end")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
