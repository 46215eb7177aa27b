#!/usr/bin/env python3
"""report.html of a real `asgd compare` run, opened in headless Chromium.

    report_in_browser.py ASGD_BINARY ARTIFACT_DIR

Runs a small comparison on MNIST (three policies, one and two workers, two
repeats), opens its report.html with the network cut off, and checks from the
DOM Chromium dumps that every chart on the page drew data and that no script
error happened. Saves a screenshot as ARTIFACT_DIR/report.png and prints its
path. Exits 77 (skipped) only when Chromium is not installed; a missing
ASGD_DATA_DIR is a failure, like every test that needs data.
"""

import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def chromium_binary():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(binary, profile, *args):
    # --host-resolver-rules and a dead proxy: any request the page made
    # would fail, so a page that renders here renders offline.
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
           "--user-data-dir=" + profile, "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
           "--virtual-time-budget=15000", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if result.returncode != 0:
        fail("chromium exited with %d: %s" % (result.returncode, result.stderr[-2000:]))
    return result.stdout


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    asgd, artifacts = sys.argv[1], os.path.abspath(sys.argv[2])
    binary = chromium_binary()
    if not binary:
        print("SKIP: chromium is not installed (apt-get install chromium)")
        return SKIP
    data_root = os.environ.get("ASGD_DATA_DIR")
    if not data_root or not os.path.isdir(os.path.join(data_root, "mnist")):
        fail("ASGD_DATA_DIR is not set or has no mnist/ (point it at ../shared/data)")

    # scripts/sanitize sets it: the 12 runs take far longer under a sanitizer.
    slowdown = int(os.environ.get("ASGD_SANITIZER_SLOWDOWN", "1"))
    os.makedirs(artifacts, exist_ok=True)
    out = os.path.join(artifacts, "compare")
    shutil.rmtree(out, ignore_errors=True)
    run = subprocess.run([asgd, "compare", "--policies", "bsp,ssp:2,async", "--repeats", "2", "--dataset", "mnist",
                          "--model", "mlp", "--workers", "1,2", "--epochs", "2", "--out", out],
                         capture_output=True, text=True, timeout=600 * slowdown)
    print(run.stdout)
    if run.returncode != 0:
        fail("asgd compare exited with %d: %s" % (run.returncode, run.stderr[-2000:]))
    report = os.path.join(out, "report.html")
    page = open(report, encoding="utf-8").read()
    if re.search(r"<(script|link|img|iframe|object|embed)\b[^>]*\b(src|href|data)\s*=", page, re.I):
        fail("report.html refers to an outside resource")
    expected = re.findall(r'<canvas id="([^"]+)"', page)
    if len(expected) < 9 or "phases" not in expected:
        fail("expected 9 charts (speedup and phases included), found canvases %s" % expected)

    shot = os.path.join(artifacts, "report.png")
    dom, drawn = render(binary, report, shot)
    for chart_id in expected:
        c = drawn.get(chart_id)
        if c is None:
            fail("chart %s was not drawn" % chart_id)
        if c["datasets"] < 1 or c["points"] < 1 or not c["painted"]:
            fail("chart %s has no data: %s" % (chart_id, json.dumps(c)))
        print("chart %-22s %2d datasets, %4d points" % (chart_id, c["datasets"], c["points"]))
    # The loss chart draws the loss since the previous evaluation: an epoch's
    # mean (over the whole epoch) is left out of a run with evaluations.
    if not drawn["loss"]["points"] < drawn["acc-vs-time"]["points"]:
        fail("the loss chart has the epochs' means among its %d points" % drawn["loss"]["points"])
    # The energy column: a number where a meter measured the runs, else
    # "not measured" with the reason in the notes.
    if ">Energy</th>" not in dom or not re.search(r"(not measured|[0-9] J)", dom):
        fail("the time-to-target table has no energy column with values")
    if not os.path.exists(shot) or os.path.getsize(shot) < 20000:
        fail("no screenshot at " + shot)
    print("screenshot: " + shot)

    # bsp alone: every update of staleness 0, a 100% bar the staleness
    # chart's log scale once drew from 100 to 100, i.e. not at all.
    out = os.path.join(artifacts, "compare-bsp")
    shutil.rmtree(out, ignore_errors=True)
    run = subprocess.run([asgd, "compare", "--policies", "bsp", "--dataset", "mnist", "--model", "mlp", "--epochs", "1",
                          "--validation-size", "1000", "--out", out],
                         capture_output=True, text=True, timeout=600 * slowdown)
    if run.returncode != 0:
        fail("asgd compare --policies bsp exited with %d: %s" % (run.returncode, run.stderr[-2000:]))
    _, drawn = render(binary, os.path.join(out, "report.html"), os.path.join(artifacts, "report-bsp.png"))
    c = drawn.get("staleness")
    if c is None or c["points"] < 1 or not c["painted"]:
        fail("bsp's staleness chart has no data: %s" % json.dumps(c))
    print("bsp alone: staleness chart drawn from %s%% to %s%%" % (c["y_min"], c["y_max"]))
    return 0


def render(binary, report, shot):
    """Opens report in Chromium: its DOM and its charts' render status by id
    (a chart whose value axis spans nothing drew nothing: a failure). Saves a
    screenshot at shot."""
    url = "file://" + report
    with tempfile.TemporaryDirectory() as profile:
        dom = chromium(binary, profile, "--dump-dom", url)
        if os.path.exists(shot):
            os.remove(shot)
        chromium(binary, profile, "--window-size=1400,3000", "--screenshot=" + shot, url)
    m = re.search(r'<pre id="asgd-render-status"[^>]*>([^<]*)</pre>', dom)
    if not m or not m.group(1).strip():
        fail("the page wrote no render status; its scripts did not run to the end")
    status = json.loads(html.unescape(m.group(1)))
    if status["errors"]:
        fail("script errors: %s" % json.dumps(status["errors"], indent=2))
    drawn = {c["id"]: c for c in status["charts"]}
    for c in drawn.values():
        if c.get("y_min") is not None and c.get("y_max") is not None and not c["y_min"] < c["y_max"]:
            fail("chart %s: its value axis spans nothing (%s to %s)" % (c["id"], c["y_min"], c["y_max"]))
    return dom, drawn


if __name__ == "__main__":
    sys.exit(main())
