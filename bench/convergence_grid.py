#!/usr/bin/python3
"""Does every policy converge with the default settings as workers grow?

Runs MNIST mlp with every default (nothing but the policy, the worker count,
the seed and the epochs is given) for each combination of

  * mode: `asgd train` (one process) and `asgd cluster` (a process per
    shard and worker; hogwild is one-process only and is skipped there),
  * policy: bsp, ssp:3, async, averaging, hogwild,
  * workers: 2, 4, 8, 16,
  * seed: 1, 2, 3,

and prints one row per (mode, policy, workers) with the final test accuracy
of each seed, the lowest, the median training time, and PASS when every
seed reached --target (default 0.97). A run that fails (diverged, timed
out) counts as 0 and its error is printed under the table. The runs go one
after the other: on a 2-core machine a 16-worker cluster already takes both
cores.

Usage: /usr/bin/python3 bench/convergence_grid.py [--modes train,cluster]
           [--policies bsp,ssp:3,async,averaging,hogwild] [--workers 2,4,8,16]
           [--seeds 1,2,3] [--epochs 5] [--target 0.97] [--data-dir DIR]
           [--asgd build/bin/asgd] [--json FILE] [--timeout 600] [-- EXTRA ASGD FLAGS...]
Exit status: 0 every row passes, 1 a row fails, 2 usage or a missing binary.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)


def csv(text, kind=str):
    return [kind(x) for x in text.split(",") if x]


def default_data_dir():
    root = os.environ.get("ASGD_DATA_DIR") or os.path.join(REPO_ROOT, "..", "shared", "data")
    return os.path.join(root, "mnist")


def run_one(a, mode, policy, workers, seed, extra):
    """One job; (accuracy, train_s, adjustments line, error)."""
    with tempfile.TemporaryDirectory(prefix="asgd-grid-") as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = [a.asgd, mode, "--policy", policy, "--workers", str(workers), "--seed", str(seed), "--epochs",
               str(a.epochs), "--data-dir", a.data_dir, "--metrics-out", metrics, "--log-level", "warn"] + extra
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            return 0.0, time.monotonic() - start, "", f"timed out after {a.timeout} s"
        adjust = next((l.strip() for l in proc.stdout.splitlines() if "adjust" in l), "")
        if proc.returncode != 0:
            err = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["?"])[-1]
            return 0.0, time.monotonic() - start, adjust, f"exit {proc.returncode}: {err}"
        summary = None
        with open(metrics) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("event") == "summary":
                    summary = rec
        if summary is None:
            return 0.0, time.monotonic() - start, adjust, "no summary in the metrics file"
        return summary["final_test_accuracy"], summary["train_s"], adjust, ""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="train,cluster")
    p.add_argument("--policies", default="bsp,ssp:3,async,averaging,hogwild")
    p.add_argument("--workers", default="2,4,8,16")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--target", type=float, default=0.97)
    p.add_argument("--data-dir", default=default_data_dir())
    p.add_argument("--asgd", default=os.path.join(REPO_ROOT, "build", "bin", "asgd"))
    p.add_argument("--json", help="also write every run as JSON Lines here")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run (default 600)")
    p.add_argument("extra", nargs="*", help="more asgd flags for every run (after --)")
    a = p.parse_args()
    if not os.access(a.asgd, os.X_OK):
        print(f"convergence_grid: {a.asgd} is not an executable (build first: scripts/build)", file=sys.stderr)
        return 2
    if not os.path.isdir(a.data_dir):
        print(f"convergence_grid: no data folder {a.data_dir} (give --data-dir or set ASGD_DATA_DIR)", file=sys.stderr)
        return 2
    modes, policies = csv(a.modes), csv(a.policies)
    worker_counts, seeds = csv(a.workers, int), csv(a.seeds, int)
    for m in modes:
        if m not in ("train", "cluster"):
            print(f"convergence_grid: unknown mode {m} (train, cluster)", file=sys.stderr)
            return 2

    out = open(a.json, "w") if a.json else None
    rows, errors = [], []
    for mode in modes:
        for policy in policies:
            if mode == "cluster" and policy == "hogwild":
                continue  # one parameter buffer shared in one process
            for workers in worker_counts:
                accs, times, adjust = [], [], ""
                for seed in seeds:
                    acc, train_s, adj, err = run_one(a, mode, policy, workers, seed, a.extra)
                    adjust = adjust or adj
                    accs.append(acc)
                    if not err:  # (a failed run's figure is its wall time, not a training time)
                        times.append(train_s)
                    if err:
                        errors.append(f"{mode} {policy} {workers} workers seed {seed}: {err}")
                    rec = {"mode": mode, "policy": policy, "workers": workers, "seed": seed, "epochs": a.epochs,
                           "final_test_accuracy": acc, "train_s": train_s, "error": err, "adjustments": adj,
                           "extra": a.extra}
                    if out:
                        out.write(json.dumps(rec) + "\n")
                        out.flush()
                    print(json.dumps(rec), file=sys.stderr, flush=True)
                ok = min(accs) >= a.target
                rows.append((mode, policy, workers, accs, statistics.median(times) if times else None, ok, adjust))

    print(f"MNIST mlp, every default{(' plus ' + ' '.join(a.extra)) if a.extra else ''}, {a.epochs} epochs, "
          f"seeds {','.join(map(str, seeds))}; PASS when every seed reaches {a.target}")
    head = f"{'mode':<8} {'policy':<10} {'workers':>7}  " + " ".join(f"{'seed ' + str(s):>8}" for s in seeds)
    print(head + f" {'lowest':>8} {'train s':>8}  result")
    for mode, policy, workers, accs, med_t, ok, adjust in rows:
        print(f"{mode:<8} {policy:<10} {workers:>7}  " + " ".join(f"{x:>8.4f}" for x in accs) +
              f" {min(accs):>8.4f} {(f'{med_t:.1f}' if med_t is not None else '-'):>8}  {'PASS' if ok else 'FAIL'}")
    for e in errors:
        print("  " + e)
    return 0 if all(r[5] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
