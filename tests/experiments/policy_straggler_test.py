#!/usr/bin/python3
"""bench/policy_straggler.py's verdicts, without training anything: its exact
rank test against the enumeration it replaced, and --settle-to's extra runs
(which pairs get them, their seeds, the cap), with run_one replaced by
made-up times."""

import contextlib
import io
import itertools
import os
import random
import sys
import types
import unittest
import unittest.mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import policy_straggler as ps  # noqa: E402


def enumerated(a, b):
    """The exact two-sided Mann-Whitney p-value by listing every split."""
    def wins(xs, ys):
        return sum(1.0 if x < y else 0.5 if x == y else 0.0 for x in xs for y in ys)
    observed = wins(a, b)
    pooled = list(a) + list(b)
    below = above = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(a)):
        picked = set(chosen)
        w = wins([pooled[i] for i in chosen], [pooled[i] for i in range(len(pooled)) if i not in picked])
        total += 1
        below += w <= observed
        above += w >= observed
    return min(1.0, 2.0 * min(below, above) / total), observed > len(a) * len(b) / 2.0


class RankTest(unittest.TestCase):
    def test_matches_the_enumeration_with_and_without_ties(self):
        rng = random.Random(3)
        for case in range(200):
            m, n = rng.randint(1, 6), rng.randint(1, 6)
            pick = (lambda: rng.choice([1, 2, 2.5, 3, 4, 5])) if case % 2 else rng.random
            a = [pick() for _ in range(m)]
            b = [pick() + (0 if case % 2 else 0.2) for _ in range(n)]
            p, smaller = ps.rank_test(a, b)
            p_ref, smaller_ref = enumerated(a, b)
            self.assertAlmostEqual(p, p_ref, places=12, msg=f"{a} against {b}")
            if p < 1.0:
                self.assertEqual(smaller, smaller_ref, f"{a} against {b}")

    def test_spreads_apart_at_five_a_side_give_two_in_252(self):
        p, smaller = ps.rank_test([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
        self.assertAlmostEqual(p, 2 / 252)
        self.assertTrue(smaller)
        self.assertFalse(ps.rank_test([6, 7, 8, 9, 10], [1, 2, 3, 4, 5])[1])


def fake_run(times):
    """A run_one that gives policy P's k-th run (seed k) the time times[P](k)."""
    def run_one(a, policy, scenario, seed, metrics_path):
        t = times[policy](seed)
        return {"policy": policy, "scenario": scenario, "seed": seed, "time_to_target_s": t,
                "time_to_target_units": t, "target_epoch": 2, "final_test_accuracy": 0.98, "samples_per_s": 1.0,
                "train_s": 1.0, "epoch_end_s": [0.5], "staleness_mean": 0.0, "staleness_max": 0.0,
                "worker_wait_s": [0.0]}
    return run_one


class Settling(unittest.TestCase):
    def setUp(self):
        self.saved = ps.run_one
        self.args = types.SimpleNamespace(repeats=5, settle_to=5, measure="compute", target=0.97)

    def tearDown(self):
        ps.run_one = self.saved

    def run_all(self, times):
        ps.run_one = fake_run(times)
        with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
            return ps.run_all(self.args, ["none"], "/nonexistent")

    # bsp clearly slowest; ssp:3 and async interleaved with each other
    # (not distinguishable); ssp:1 between, overlapping bsp by two runs.
    TIMES = {"bsp": lambda s: 10.0 + s, "ssp:1": lambda s: 8.0 + s, "ssp:3": lambda s: 1.0 + 0.5 * s,
             "async": lambda s: 1.25 + 0.5 * s}

    def test_without_settle_to_every_policy_runs_repeats_times(self):
        runs, in_order = self.run_all(self.TIMES)
        self.assertEqual(len(in_order), 20)
        self.assertEqual({p: len(r) for p, r in runs["none"].items()}, {p: 5 for p in ps.POLICIES})

    def test_only_the_policies_of_unsettled_pairs_get_more_runs_with_the_next_seeds_up_to_the_cap(self):
        runs, _ = self.run_all(self.TIMES)
        summaries = {p: ps.summarize(p, runs["none"][p], "time_to_target_units") for p in ps.POLICIES}
        p = ps.compare(summaries, "ssp:1", "bsp", 0.97)[3]
        self.assertTrue(ps.unsettled(p), f"ssp:1 against bsp at 5 a side: p = {p}, not the case under test")
        self.args.settle_to = 9
        runs, in_order = self.run_all(self.TIMES)
        counts = {pol: len(r) for pol, r in runs["none"].items()}
        self.assertEqual(counts["ssp:3"], 5)  # in no unsettled pair: never more
        self.assertEqual(counts["async"], 5)
        self.assertGreater(counts["ssp:1"], 5)
        self.assertLessEqual(max(counts.values()), 9)
        self.assertEqual([r["seed"] for r in runs["none"]["ssp:1"]], list(range(1, counts["ssp:1"] + 1)))
        self.assertEqual(len(in_order), sum(counts.values()))
        # It stopped because the pair settled or the cap was reached.
        summaries = {pol: ps.summarize(pol, runs["none"][pol], "time_to_target_units") for pol in ps.POLICIES}
        p = ps.compare(summaries, "ssp:1", "bsp", 0.97)[3]
        self.assertTrue(not ps.unsettled(p) or counts["ssp:1"] == 9, f"p = {p} with {counts['ssp:1']} runs")


class BadFlags(unittest.TestCase):
    """A run's flags asgd would refuse end the script with exit 2 before any
    run, with asgd's message (every run started and failed, then exit 1).
    The asgd binary is a stand-in that refuses --straggler bogus as asgd
    does, and trains nothing."""

    def test_a_bad_scenario_is_refused_before_any_run(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "asgd")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\n"
                        "case \"$*\" in *train*) echo trained >> %s/trained;; esac\n"
                        "case \"$*\" in *'--straggler bogus'*) echo \"asgd: error: --straggler bogus: no\" >&2; "
                        "exit 2;; esac\n" % d)
            os.chmod(fake, 0o755)
            os.makedirs(os.path.join(d, "mnist"))
            open(os.path.join(d, "mnist", "train-images-idx3-ubyte"), "w").close()
            argv = ["policy_straggler.py", "--asgd", fake, "--data-dir", os.path.join(d, "mnist"),
                    "--scenarios", "none,bogus", "--repeats", "1"]
            err = io.StringIO()
            with unittest.mock.patch.object(sys, "argv", argv), contextlib.redirect_stderr(err), \
                    contextlib.redirect_stdout(io.StringIO()):
                with self.assertRaises(SystemExit) as ended:
                    ps.main()
            self.assertEqual(ended.exception.code, 2)
            self.assertIn("--straggler bogus: no (scenario bogus)", err.getvalue())
            self.assertFalse(os.path.exists(os.path.join(d, "trained")), "a run started")


if __name__ == "__main__":
    unittest.main()
