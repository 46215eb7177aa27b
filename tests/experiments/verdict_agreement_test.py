#!/usr/bin/python3
"""bench/verdict_agreement.py: its exact signed-rank test against the
enumeration of every sign choice, and its verdicts and agreement count on
two made-up runs of policy_straggler.py."""

import contextlib
import io
import itertools
import json
import os
import random
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import verdict_agreement as va  # noqa: E402


def enumerated(d):
    """Two-sided signed-rank p by listing every assignment of signs to the magnitudes."""
    d = [x for x in d if x != 0]
    mags = sorted(abs(x) for x in d)
    rank = {m: (2 * mags.index(m) + mags.count(m) + 1) / 2.0 for m in mags}  # mean rank, 1-based
    observed = sum(rank[abs(x)] for x in d if x > 0)
    below = above = 0
    for signs in itertools.product((1, -1), repeat=len(d)):
        w = sum(rank[abs(x)] for x, s in zip(d, signs) if s > 0)
        below += w <= observed + 1e-9
        above += w >= observed - 1e-9
    return min(1.0, 2.0 * min(below, above) / 2 ** len(d))


def run(policy, scenario, seed, units):
    return {"policy": policy, "scenario": scenario, "seed": seed, "time_to_target_units": units}


def straggler_output(times, verdicts):
    """A policy_straggler --json object with `times` {policy: [units by seed]} for
    scenario "none" and the script's own `verdicts` {pair: (verdict, p)}."""
    runs = [run(pol, "none", seed + 1, t) for pol, ts in times.items() for seed, t in enumerate(ts)]
    return {"measure": "compute", "footing": "per-sample", "scenarios": ["none"], "repeats": 6, "runs": runs,
            "results": {"none": {"verdicts": {k: {"verdict": v, "p": p} for k, (v, p) in verdicts.items()}}}}


class SignedRank(unittest.TestCase):
    def test_matches_the_enumeration_with_and_without_ties(self):
        rng = random.Random(5)
        for case in range(150):
            n = rng.randint(1, 9)
            pick = (lambda: rng.choice([-2, -1, 1, 1.5, 2, 3])) if case % 2 else (lambda: rng.random() - 0.3)
            d = [pick() for _ in range(n)]
            p, _ = va.signed_rank(d)
            self.assertAlmostEqual(p, enumerated(d), places=12, msg=str(d))

    def test_five_negative_differences_give_two_in_thirty_two_and_say_smaller(self):
        p, smaller = va.signed_rank([-0.1, -0.2, -0.3, -0.4, -0.5])
        self.assertAlmostEqual(p, 2 / 32)
        self.assertTrue(smaller)
        p, smaller = va.signed_rank([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
        self.assertAlmostEqual(p, 2 / 64)
        self.assertFalse(smaller)

    def test_no_difference_at_all_is_not_distinguishable(self):
        self.assertEqual(va.signed_rank([0, 0, 0])[0], 1.0)


class Agreement(unittest.TestCase):
    def write(self, obj):
        f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        f.write("a header line the script prints first\n" + json.dumps(obj) + "\n")
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    def agreement(self, *args):
        out = io.StringIO()
        sys.argv = ["verdict_agreement.py", *args]
        with contextlib.redirect_stdout(out):
            code = va.main()
        return code, out.getvalue()

    def test_counts_the_pairs_whose_verdicts_differ(self):
        every = {f"{p}/{o}": ("not distinguishable", 0.5) for p, o in va.ps.PAIRS}
        moved = dict(every, **{"async/bsp": ("faster", 0.01)})
        times = {pol: [100.0] * 6 for pol in va.ps.POLICIES}
        first, second = self.write(straggler_output(times, every)), self.write(straggler_output(times, moved))
        code, out = self.agreement(first, second)
        self.assertEqual(code, 0)
        self.assertIn(f"{len(va.ps.PAIRS) - 1} of {len(va.ps.PAIRS)} verdicts agree", out)
        self.assertEqual(out.count("DIFFER"), 1)

    def test_signed_rank_pairs_the_runs_by_seed(self):
        # async is 10% faster than bsp on every seed, though the seeds spread
        # far wider than that: paired, six of six is p = 2/64; unpaired, not.
        bsp = [100.0, 140.0, 180.0, 220.0, 260.0, 300.0]
        times = {pol: bsp for pol in va.ps.POLICIES}
        times["async"] = [0.9 * t for t in bsp]
        path = self.write(straggler_output(times, {f"{p}/{o}": ("x", 1.0) for p, o in va.ps.PAIRS}))
        code, out = self.agreement(path, path, "--test", "signed-rank")
        self.assertEqual(code, 0)
        line = next(line for line in out.splitlines() if line.strip().startswith("async/bsp"))
        self.assertIn(f"faster (p={2 / 64:.3f}, seeds r=+1.00)", line)
        self.assertAlmostEqual(va.paired_verdict(straggler_output(times, {}), "none", "async", "bsp")[1], 2 / 64)
        self.assertGreater(va.ps.rank_test(times["async"], bsp)[0], 0.05)

    def test_a_file_that_is_not_its_output_is_a_usage_error(self):
        path = self.write({"sizes": []})
        with self.assertRaises(SystemExit) as e, contextlib.redirect_stderr(io.StringIO()) as err:
            self.agreement(path, path)
        self.assertEqual(e.exception.code, 2)
        self.assertIn("not the output of policy_straggler.py --json", err.getvalue())


if __name__ == "__main__":
    unittest.main()
