#!/usr/bin/python3
"""Do two runs of bench/policy_straggler.py reach the same verdicts?

  bench/verdict_agreement.py RUN1.json RUN2.json [--test rank-sum|signed-rank]

Each file is what `policy_straggler.py --json` printed (its last line is the
JSON object). For every scenario the two runs share and every pair the
script compares, it prints each run's verdict and p, and at the end how many
verdicts agree.

--test rank-sum (the default) reads the verdicts the script itself gave
(exact Mann-Whitney on the two sets of times). --test signed-rank recomputes
them from the runs with a test that uses the experiment's pairing: repeat r
of every policy trains with seed r + 1 (the same initialisation, validation
split and data order), so each seed gives one ratio of the two policies'
times, and an exact two-sided Wilcoxon signed-rank test on the logarithms
of those ratios asks whether they centre on 1 (beside it, the correlation
of the two policies' times over the seeds: how much the pairing removes).
Same threshold (p < 0.05) and measure as the script's. Seeds that only one policy ran, or on which either
run missed the target, are left out of the pairing.
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import policy_straggler as ps  # noqa: E402  (PAIRS, ALPHA, MEASURES)


def fail(message):
    """A usage error: exit status 2, as the script's own."""
    print(f"verdict_agreement: {message}", file=sys.stderr)
    sys.exit(2)


def load(path):
    """The JSON object of a policy_straggler --json output (its last non-empty line)."""
    try:
        with open(path) as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
        result = json.loads(lines[-1])
    except (OSError, IndexError, json.JSONDecodeError) as e:
        fail(f"{path}: not the output of policy_straggler.py --json ({e})")
    missing = [k for k in ("measure", "footing", "scenarios", "repeats", "results", "runs")
               if not isinstance(result, dict) or k not in result]
    if missing:
        fail(f"{path}: not the output of policy_straggler.py --json (no {', '.join(missing)})")
    return result


def signed_rank(differences):
    """Exact two-sided Wilcoxon signed-rank p for `differences` centring on
    0, and whether they tend to be negative. Zeros are dropped; tied
    magnitudes take their mean rank (doubled, to stay integers); the null
    distribution of the positive ranks' sum is counted over every choice of
    signs by dynamic programming."""
    d = [x for x in differences if x != 0]
    if not d:
        return 1.0, False
    order = sorted(range(len(d)), key=lambda i: abs(d[i]))
    twice_rank = [0] * len(d)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and abs(d[order[j + 1]]) == abs(d[order[i]]):
            j += 1
        for k in range(i, j + 1):
            twice_rank[order[k]] = i + j + 2
        i = j + 1
    observed = sum(r for r, x in zip(twice_rank, d) if x > 0)
    ways = {0: 1}  # sum of the positive doubled ranks -> sign choices giving it
    for r in twice_rank:
        grown = dict(ways)
        for total, n in ways.items():
            grown[total + r] = grown.get(total + r, 0) + n
        ways = grown
    choices = 2 ** len(d)
    at_most = sum(n for total, n in ways.items() if total <= observed)
    at_least = sum(n for total, n in ways.items() if total >= observed)
    return min(1.0, 2.0 * min(at_most, at_least) / choices), 2 * observed < sum(twice_rank)


def times_by_seed(result, scenario, policy):
    key = ps.MEASURES[result["measure"]]
    return {r["seed"]: r[key] for r in result["runs"]
            if r["scenario"] == scenario and r["policy"] == policy and r.get(key) is not None}


def correlation(xs, ys):
    """Pearson's r of two equally long lists (None where either is constant)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy)


def paired_verdict(result, scenario, policy, other):
    """(verdict, p, r): the signed-rank verdict and the correlation of the
    two policies' times over the seeds both ran."""
    a, b = times_by_seed(result, scenario, policy), times_by_seed(result, scenario, other)
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return "not measurable", None, None
    p, smaller = signed_rank([math.log(a[s] / b[s]) for s in seeds])
    r = correlation([a[s] for s in seeds], [b[s] for s in seeds])
    return ("faster" if smaller else "slower") if p < ps.ALPHA else "not distinguishable", p, r


def verdict(result, scenario, policy, other, test):
    if test == "signed-rank":
        return paired_verdict(result, scenario, policy, other)
    v = result["results"][scenario]["verdicts"][f"{policy}/{other}"]
    return v["verdict"], v["p"], None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--test", choices=["rank-sum", "signed-rank"], default="rank-sum")
    a = parser.parse_args()
    one, two = load(a.first), load(a.second)
    if one["measure"] != two["measure"] or one["footing"] != two["footing"]:
        fail("the two runs used different --measure or --footing; their verdicts do not compare")
    scenarios = [sc for sc in one["scenarios"] if sc in two["scenarios"]]
    def fmt(v, p, r):
        seeds = "" if r is None else f", seeds r={r:+.2f}"
        return f"{v} ({'-' if p is None else f'p={p:.3f}'}{seeds})"
    agree = total = 0
    print(f"{a.test} test, {one['measure']} measure, {one['footing']} footing; "
          f"{one['repeats']} and {two['repeats']} repeats")
    for sc in scenarios:
        print(f"\n{sc}")
        for pol, other in ps.PAIRS:
            first, second = verdict(one, sc, pol, other, a.test), verdict(two, sc, pol, other, a.test)
            same = first[0] == second[0]
            agree += same
            total += 1
            print(f"  {pol + '/' + other:14}{fmt(*first):46}  {fmt(*second):46}  {'' if same else 'DIFFER'}".rstrip())
    print(f"\n{agree} of {total} verdicts agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
