#!/usr/bin/env python3
"""Two asgd builds side by side: `asgd bench runtime` and `asgd bench comm`.

usage: bench/ab_compare.py BASE_ASGD NEW_ASGD [--rounds N] [--data DIR] [--sizes 1M,4M,16M]

Runs each binary's benchmarks in turn, N rounds, swapping which goes first
every round (the machines drift by up to 2.5x within seconds), and prints
the medians: runtime's (b)/(a) ratio and each comm size's ours/raw ratio
for both builds, and the small-message round trips. Ratios are measured
within one run of one binary, so they compare across builds where raw
samples/s would not."""
import argparse
import json
import statistics
import subprocess
import sys


def run(binary, args):
    out = subprocess.run([binary, "bench", *args, "--json"], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"{binary} bench {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("base")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--data", default="../shared/data/mnist")
    p.add_argument("--sizes", default="1M,4M,16M")
    a = p.parse_args()
    results = {"base": {"runtime": [], "comm": []}, "new": {"runtime": [], "comm": []}}
    for r in range(a.rounds):
        order = ["base", "new"] if r % 2 == 0 else ["new", "base"]
        for name in order:
            binary = a.base if name == "base" else a.new
            results[name]["runtime"].append(run(binary, ["runtime", "--data-dir", a.data, "--repeats", "3"]))
        for name in reversed(order):
            binary = a.base if name == "base" else a.new
            results[name]["comm"].append(run(binary, ["comm", "--repeats", "3", "--sizes", a.sizes]))
        print(f"round {r + 1}: runtime (b)/(a) base {results['base']['runtime'][-1]['ratio']:.3f}, "
              f"new {results['new']['runtime'][-1]['ratio']:.3f}", flush=True)

    med = statistics.median
    print("\n| measure | base | new | new / base |\n| --- | ---: | ---: | ---: |")
    def row(label, base, new):
        print(f"| {label} | {base:.3f} | {new:.3f} | {new / base:.3f} |")
    row("bench runtime (b)/(a)", med(x["ratio"] for x in results["base"]["runtime"]),
        med(x["ratio"] for x in results["new"]["runtime"]))
    row("bench runtime (b) samples/s (k)", med(x["runtime_samples_per_s"] for x in results["base"]["runtime"]) / 1e3,
        med(x["runtime_samples_per_s"] for x in results["new"]["runtime"]) / 1e3)
    sizes = [s["floats"] for s in results["base"]["comm"][0]["sizes"]]
    for i, floats in enumerate(sizes):
        row(f"bench comm ours/raw, {floats / 1048576:g}M floats",
            med(c["sizes"][i]["ratio"] for c in results["base"]["comm"]),
            med(c["sizes"][i]["ratio"] for c in results["new"]["comm"]))
    row("bench comm one-float round trip, ours (us)",
        med(c["small_round_trip_us"]["ours"] for c in results["base"]["comm"]),
        med(c["small_round_trip_us"]["ours"] for c in results["new"]["comm"]))
    row("bench comm one-float round trip, raw ZeroMQ (us)",
        med(c["small_round_trip_us"]["raw"] for c in results["base"]["comm"]),
        med(c["small_round_trip_us"]["raw"] for c in results["new"]["comm"]))


main()
