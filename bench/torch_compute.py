#!/usr/bin/python3
"""Forward + backward samples/s of asgd's models against PyTorch, in one run.

For each model and batch size this measures, interleaved so that machine drift
falls on both sides alike:

  * ours: `asgd bench compute --json` for that one model and batch
    (Model::compute_gradients: forward, mean softmax cross-entropy, backward
    into the flat gradient; what a worker does per step);
  * PyTorch: the equivalent torch.nn module on the same device, timed the same
    way: zero the gradients (set_to_none), forward, F.cross_entropy (mean),
    backward; no optimizer step;

with the same shapes ((B, 1, 28, 28) pixel-like inputs, 10 classes), thread
count, warm-up (--warmup seconds and at least 5 steps), timed windows and
median. It prints a table with ours/PyTorch ratios and PASS/FAIL against a
threshold (1.0 on cpu, 0.9 on cuda), and exits 1 if any row fails.

PyTorch runs in long-lived worker processes started by this script (the
script itself never imports torch), one per OpenMP wait policy. Debian's torch
runs its own ops on libgomp threads and its matrix products on OpenBLAS's
separate pthread pool; with the default wait policy idle OpenMP threads spin
and take cores from OpenBLAS, which made PyTorch 3-4x slower with 2 threads
than with 1 on the 2-core development VM (see bench/pytorch_mlp.py). So on the
CPU with more than one thread PyTorch is timed both with the default policy
and with OMP_WAIT_POLICY=PASSIVE, and the ratio is taken against the faster
("best PyTorch"). Both sides get the same OPENBLAS_CORETYPE (the kernels the
asgd CLI picks for itself) and OpenBLAS pool size.

On a GPU (--device cuda[:K]) PyTorch runs with cudnn.benchmark on and TF32
off for matmuls and convolutions (ours computes in full fp32). Its inputs sit
in pinned host memory and are copied to the GPU each step (non_blocking), as
a training loop fed from host memory does; it synchronises only at the window
boundaries. Ours returns every step's gradient in host memory, as a worker
needs it.

Model definitions (NCHW; must match compute/model.cpp, so that state_dict
names match our layout, e.g. "3.main.0.weight"; initialised as ours: mlp
He-uniform with zero biases, lenet and resnet-mini torch.nn's defaults):
  mlp:   Linear(784,256) ReLU Linear(256,128) ReLU Linear(128,10), on the
         input viewed as (B, 784) (ours has no Flatten layer either)
  lenet: Conv2d(1,16,5) ReLU MaxPool2d(2) Conv2d(16,32,5) ReLU MaxPool2d(2)
         Flatten Linear(512,128) ReLU Linear(128,10)
  resnet-mini: Conv2d(1,16,3,1,1,bias=False) BatchNorm2d(16) ReLU
         Residual(16->32, stride 2) ReLU Residual(32->64, stride 2) ReLU
         (AdaptiveAvgPool2d(1) Flatten) Linear(64,10), where Residual(x) =
         main(x) + shortcut(x), main = Conv3x3(stride) BN ReLU Conv3x3 BN and
         shortcut = Conv1x1(stride) BN.
  resnet18: the CIFAR ResNet-18 (a 3x3 stem, four stages of two basic
         blocks, identity shortcuts where the shape stays), here on the same
         (B, 1, 28, 28) inputs as the others.
The script checks that each PyTorch model has as many parameters as ours.

Usage: /usr/bin/python3 bench/torch_compute.py [--models mlp,lenet,resnet-mini,resnet18]
           [--batches 64,128] [--device cpu|cuda|cuda:K] [--threads 2]
           [--seconds 2] [--windows 5] [--warmup 0.5] [--rounds 1] [--statistic median]
           [--threshold R] [--asgd build/bin/asgd] [--json]
Exit status: 0 every row passes, 1 a row fails or a run failed, 2 usage, the
binary missing, or PyTorch cannot use the requested device.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import pytorch_mlp  # noqa: E402  (BLAS inspection and kernel choice shared with the MLP baseline)

MODELS = ("mlp", "lenet", "resnet-mini", "resnet18")
MIN_WARMUP_STEPS = 5  # as bench/compute_bench.cpp
BATCH_POOL = 4        # distinct batches cycled through, as ours
MNIST_MEAN, MNIST_STD, INK = 0.1307, 0.3081, 0.2


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def fail(code, message):
    log(f"torch_compute: {message}")
    sys.exit(code)


# --------------------------------------------------------------------------
# The PyTorch side (runs in a worker process).


def build_model(torch, name, channels=1):
    nn = torch.nn

    class Residual(nn.Module):
        def __init__(self, main, shortcut):
            super().__init__()
            self.main = nn.Sequential(*main)
            self.shortcut = nn.Sequential(*shortcut)

        def forward(self, x):
            return self.main(x) + self.shortcut(x)

    def block(cin, cout, stride):
        return Residual(
            [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
             nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)],
            [nn.Conv2d(cin, cout, 1, stride, 0, bias=False), nn.BatchNorm2d(cout)])

    def basic_block(cin, cout, stride):
        # ResNet's basic block: the identity shortcut where the shape stays.
        shortcut = [nn.Conv2d(cin, cout, 1, stride, 0, bias=False), nn.BatchNorm2d(cout)] \
            if stride != 1 or cin != cout else []
        return Residual(
            [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
             nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)], shortcut)

    if name == "resnet18":
        # The CIFAR variant, as asgd's (compute/model.cpp): a 3x3 stem, four
        # stages of two basic blocks, each followed by its own ReLU module.
        layers = [nn.Conv2d(channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
        width = 64
        for stage in (64, 128, 256, 512):
            for b in range(2):
                layers += [basic_block(width, stage, 2 if b == 0 and stage != 64 else 1), nn.ReLU()]
                width = stage
        layers += [nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()), nn.Linear(512, 10)]
        return nn.Sequential(*layers)
    if name == "mlp":
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    elif name == "lenet":
        model = nn.Sequential(
            nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(512, 128), nn.ReLU(), nn.Linear(128, 10))
    elif name == "resnet-mini":
        model = nn.Sequential(
            nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            block(16, 32, 2), nn.ReLU(),
            block(32, 64, 2), nn.ReLU(),
            # ours is one layer (global average pool), so one module here
            # keeps the parameter names equal ("8.weight").
            nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()), nn.Linear(64, 10))
    else:
        raise ValueError(f"unknown model '{name}' (known: {', '.join(MODELS)})")
    if name == "mlp":  # ours: He-uniform weights and zero biases for mlp; torch's defaults for the others
        for m in model.modules():
            if isinstance(m, nn.Linear):
                nn.init.kaiming_uniform_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)
    return model


def measure_torch(torch, device, req):
    """One (model, batch) measurement; the dict the main process reads."""
    F = torch.nn.functional
    name, batch = req["model"], req["batch"]
    torch.manual_seed(req["seed"])
    model = build_model(torch, name).to(device)
    model.train()
    gen = torch.Generator().manual_seed(req["seed"])
    cuda = device.type == "cuda"
    pool = []
    for _ in range(BATCH_POOL):
        # Pixel-like: most pixels background, the rest uniform; normalised.
        x = torch.rand(batch, 1, 28, 28, generator=gen)
        x = torch.where(torch.rand(batch, 1, 28, 28, generator=gen) < INK, x, torch.zeros(()))
        x = (x - MNIST_MEAN) / MNIST_STD
        if name == "mlp":
            x = x.view(batch, 784)
        y = torch.randint(0, 10, (batch,), generator=gen)
        if cuda:
            x, y = x.pin_memory(), y.pin_memory()
        pool.append((x, y))

    state = {"next": 0, "loss": None}

    def step():
        x, y = pool[state["next"]]
        state["next"] = (state["next"] + 1) % len(pool)
        if cuda:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        state["loss"] = loss

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    i = 0
    while i < MIN_WARMUP_STEPS or time.perf_counter() - t0 < req["warmup"]:
        step()
        i += 1
        if cuda and i % 5 == 0:
            sync()  # keep the warm-up clock honest on an asynchronous device
    sync()

    window_s = req["seconds"] / req["windows"]
    windows, steps_total, timed = [], 0, 0.0
    for _ in range(req["windows"]):
        steps = 0
        t0 = time.perf_counter()
        while True:
            step()
            steps += 1
            if time.perf_counter() - t0 >= window_s:
                break
        sync()
        elapsed = time.perf_counter() - t0
        windows.append(steps * batch / elapsed)
        steps_total += steps
        timed += elapsed
    ordered = sorted(windows)
    med = ordered[len(ordered) // 2]
    return {"model": name, "batch": batch, "samples_per_s": med, "min_samples_per_s": ordered[0],
            "max_samples_per_s": ordered[-1], "spread": (ordered[-1] - ordered[0]) / med, "windows": windows,
            "steps": steps_total, "timed_s": timed, "loss": float(state["loss"].item()),
            "params": sum(p.numel() for p in model.parameters())}


def worker_main(a):
    """Serves measurement requests (JSON lines on stdin) until stdin closes.
    The first line out is a greeting with what this torch is and uses."""
    try:
        import torch
    except ImportError as e:
        print(json.dumps({"error": f"cannot import torch ({e}); install python3-torch (Debian) "
                                   f"and run with /usr/bin/python3"}), flush=True)
        return 1
    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    hello = {"torch": torch.__version__, "threads": torch.get_num_threads(),
             "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
             "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE"),
             "mkldnn": bool(torch.backends.mkldnn.is_available()), "cuda_available": torch.cuda.is_available()}
    hello["blas"] = pytorch_mlp.inspect_blas(torch, a.threads)  # also sizes OpenBLAS's pool
    device = torch.device(a.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch was built without CUDA" if not torch.backends.cuda.is_built()
                   else "torch finds no usable GPU (driver or device missing)")
            hello["error"] = f"PyTorch {torch.__version__} cannot run on {a.device}: {why}"
            print(json.dumps(hello), flush=True)
            return 2
        index = device.index or 0
        if index >= torch.cuda.device_count():
            hello["error"] = f"PyTorch sees {torch.cuda.device_count()} GPU(s); there is no {a.device}"
            print(json.dumps(hello), flush=True)
            return 2
        device = torch.device("cuda", index)
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        hello["gpu"] = torch.cuda.get_device_name(index)
        hello["cudnn"] = torch.backends.cudnn.version()
    print(json.dumps(hello), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            print(json.dumps(measure_torch(torch, device, req)), flush=True)
        except Exception as e:  # reported to the main process, which stops
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
    return 0


# --------------------------------------------------------------------------
# The main process: starts the workers, runs ours, interleaves, reports.


class TorchWorker:
    def __init__(self, a, policy, env):
        self.policy = policy
        env = dict(env)
        if policy == "passive":
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        else:
            env.pop("OMP_WAIT_POLICY", None)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--device", a.device,
               "--threads", str(a.threads)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.hello = self._read("start-up")

    def _read(self, what):
        line = self.proc.stdout.readline()
        if not line:
            fail(1, f"PyTorch worker ({self.policy}) exited during {what} with status {self.proc.wait()}")
        return json.loads(line)

    def measure(self, req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        r = self._read(f"{req['model']} batch {req['batch']}")
        if "error" in r:
            fail(1, f"PyTorch ({self.policy}) {req['model']} batch {req['batch']}: {r['error']}")
        return r

    def close(self):
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait()


def run_ours(a, model, batch, env):
    cmd = [a.asgd, "bench", "compute", "--json", "--models", model, "--batches", str(batch), "--device", a.device,
           "--threads", str(a.threads), "--seconds", str(a.seconds), "--windows", str(a.windows),
           "--warmup", str(a.warmup), "--seed", str(a.seed)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        fail(2 if r.returncode == 2 else 1,
             f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    fail(1, f"{' '.join(cmd)} printed no JSON line: {r.stdout.strip()!r}")


def cpu_snapshot(live_pids=()):
    """(wall s, busy CPU s of the whole machine, CPU s of this process, its
    finished children and the running processes `live_pids`), or None where
    /proc cannot be read."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        ours = 0.0
        for pid in live_pids:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()
            ours += (int(stat[11]) + int(stat[12])) / tick  # utime, stime
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    busy = (sum(fields[:8]) - idle) / tick
    t = os.times()
    return time.monotonic(), busy, ours + t.user + t.system + t.children_user + t.children_system


def others_share(start, end):
    """The share of all cores that processes other than ours kept busy between
    two snapshots: what disturbed the measurement."""
    if not start or not end:
        return None
    wall = end[0] - start[0]
    others = (end[1] - start[1]) - (end[2] - start[2])
    return max(0.0, others) / (wall * pytorch_mlp.available_cores())


def parse_list(text, what, convert):
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"{what}: empty list")
    try:
        return [convert(t) for t in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: bad value in '{text}'")


def main():
    p = argparse.ArgumentParser(description="asgd vs PyTorch forward+backward samples/s per model and batch")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated (default mlp,lenet,resnet-mini)")
    p.add_argument("--batches", default="64,128", help="comma-separated batch sizes (default 64,128)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:K (default cpu)")
    p.add_argument("--threads", type=int, default=2, help="threads for both sides (default 2)")
    p.add_argument("--seconds", type=float, default=2.0, help="timed seconds per measurement (default 2)")
    p.add_argument("--windows", type=int, default=5, help="timed windows per measurement; median (default 5)")
    p.add_argument("--warmup", type=float, default=0.5, help="untimed seconds first, at least 5 steps (default 0.5)")
    p.add_argument("--rounds", type=int, default=1,
                   help="alternations of ours and PyTorch per model and batch; medians over rounds (default 1)")
    p.add_argument("--statistic", choices=("median", "best"), default="median",
                   help="per side: the median window, medians over rounds (default); or the fastest window of "
                        "any round, which other processes on a busy machine disturb less")
    p.add_argument("--threshold", type=float, default=None,
                   help="minimum ours/PyTorch ratio to pass (default 1.0 on cpu, 0.9 on cuda)")
    p.add_argument("--omp-wait-policy", choices=("both", "default", "passive"), default=None,
                   help="PyTorch's OpenMP wait policies to time (default: both on the cpu with > 1 thread)")
    p.add_argument("--asgd", default=os.path.join(REPO_ROOT, "build", "bin", "asgd"),
                   help="the asgd binary (default <repo>/build/bin/asgd)")
    p.add_argument("--seed", type=int, default=1, help="seed for parameters and inputs (default 1)")
    p.add_argument("--json", action="store_true",
                   help="stdout: one JSON object per row, then a summary object; the table goes to stderr")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.threads <= 0 or a.windows <= 0 or a.rounds <= 0 or a.seconds <= 0 or a.warmup < 0:
        p.error("--threads, --windows, --rounds and --seconds must be positive, --warmup not negative")
    if a.worker:
        return worker_main(a)
    try:
        models = parse_list(a.models, "--models", str)
        batches = parse_list(a.batches, "--batches", int)
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    for m in models:
        if m not in MODELS:
            p.error(f"--models: unknown model '{m}' (known: {', '.join(MODELS)})")
    if any(b <= 0 for b in batches):
        p.error("--batches must be positive")
    cuda = a.device.startswith("cuda")
    if not (a.device == "cpu" or a.device == "cuda" or (a.device.startswith("cuda:") and a.device[5:].isdigit())):
        p.error(f"--device: unknown device '{a.device}' (expected cpu, cuda or cuda:K)")
    threshold = a.threshold if a.threshold is not None else (0.9 if cuda else 1.0)
    policy = a.omp_wait_policy or ("both" if not cuda and a.threads > 1 else "default")
    policies = ["default", "passive"] if policy == "both" else [policy]
    a.asgd = os.path.abspath(a.asgd)
    if not (os.path.isfile(a.asgd) and os.access(a.asgd, os.X_OK)):
        fail(2, f"asgd binary not found or not executable: {a.asgd} (build it, or pass --asgd)")

    # Both sides get the kernels the asgd CLI picks for itself where OpenBLAS
    # does not know the CPU, and the same pool sizes (read at load time).
    env = dict(os.environ)
    if "OPENBLAS_CORETYPE" not in env:
        core = pytorch_mlp.coretype_asgd_would_pick()
        if core:
            env["OPENBLAS_CORETYPE"] = core
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(a.threads)

    out = sys.stderr if a.json else sys.stdout

    def say(text=""):
        print(text, file=out, flush=True)

    load_at_start = os.getloadavg()[0]  # before our own processes add to it
    snapshot_at_start = cpu_snapshot()
    workers = [TorchWorker(a, pol, env) for pol in policies]
    for w in workers:
        if "error" in w.hello:
            fail(2 if cuda else 1, w.hello["error"])
    hello = workers[0].hello
    blas = hello["blas"]
    say(f"PyTorch {hello['torch']}, {hello['threads']} threads, mkldnn {'on' if hello['mkldnn'] else 'off'}; "
        f"BLAS {blas['provider']} (sgemm_ from {blas['sgemm_from']}), OpenBLAS core {blas.get('openblas_core')}, "
        f"pool {blas.get('openblas_threads')} threads, 512x512 sgemm {blas['sgemm_512_gflops']} GFLOP/s")
    if cuda:
        say(f"GPU: {hello.get('gpu')} (cuDNN {hello.get('cudnn')}); cudnn.benchmark on, TF32 off")
    say(f"CPU: {pytorch_mlp.cpu_model()}, {pytorch_mlp.available_cores()} cores; OPENBLAS_CORETYPE="
        f"{env.get('OPENBLAS_CORETYPE', '(OpenBLAS picks)')}; load average {load_at_start:.2f}")
    if not blas["optimised"]:
        pytorch_mlp.warn_blas(blas)
    say(f"device {a.device}, {a.threads} threads, per measurement {a.warmup} s warm-up then {a.windows} windows "
        f"of {a.seconds / a.windows:.2f} s, {a.rounds} round(s), statistic {a.statistic}; PyTorch OpenMP wait policy: "
        f"{', '.join(policies)}")
    say()

    field, combine = (("samples_per_s", statistics.median) if a.statistic == "median"
                      else ("max_samples_per_s", max))
    rows = []
    failed = False
    for model in models:
        for batch in batches:
            live = [w.proc.pid for w in workers]
            row_start = cpu_snapshot(live)
            ours_runs, torch_runs = [], {pol: [] for pol in policies}
            ours_last, torch_last = None, {}
            for r in range(a.rounds):
                order = ["ours"] + policies
                if r % 2:
                    order.reverse()
                for side in order:
                    if side == "ours":
                        ours_last = run_ours(a, model, batch, env)
                        ours_runs.append(ours_last[field])
                    else:
                        w = workers[policies.index(side)]
                        torch_last[side] = w.measure({"model": model, "batch": batch, "seconds": a.seconds,
                                                      "windows": a.windows, "warmup": a.warmup, "seed": a.seed})
                        torch_runs[side].append(torch_last[side][field])
            row_disturbed = others_share(row_start, cpu_snapshot(live))
            ours = combine(ours_runs)
            per_policy = {pol: combine(v) for pol, v in torch_runs.items()}
            best_policy = max(per_policy, key=per_policy.get)
            best = per_policy[best_policy]
            ratio = ours / best
            shapes_match = ours_last["params"] == torch_last[best_policy]["params"]
            ok = ratio >= threshold and shapes_match
            failed |= not ok
            row = {"model": model, "batch": batch, "device": a.device, "threads": a.threads, "statistic": a.statistic,
                   "ours_samples_per_s": round(ours, 1), "torch_samples_per_s": round(best, 1),
                   "torch_policy": best_policy, "ratio": round(ratio, 4), "threshold": threshold,
                   "pass": ok, "params": ours_last["params"], "torch_params": torch_last[best_policy]["params"],
                   "ours_spread": round(ours_last["spread"], 4),
                   "torch_spread": round(torch_last[best_policy]["spread"], 4),
                   "ours_runs": ours_runs,
                   "torch_runs": {pol: [round(v, 1) for v in runs] for pol, runs in torch_runs.items()},
                   "others_cpu_share": round(row_disturbed, 4) if row_disturbed is not None else None}
            rows.append(row)
            if not shapes_match:
                log(f"!! {model}: ours has {ours_last['params']} parameters, the PyTorch module "
                    f"{torch_last[best_policy]['params']}: the definitions differ, the row fails")
            if a.json:
                print(json.dumps(row), flush=True)
            extra = ", ".join(f"PyTorch[{pol}] {v:,.0f} (spread {torch_last[pol]['spread']:.0%})"
                              for pol, v in per_policy.items())
            say(f"  {model} batch {batch}: ours {ours:,.0f} samples/s (spread {ours_last['spread']:.0%}), {extra}, "
                f"ratio {ratio:.2f}"
                + (f"; other processes used {row_disturbed:.0%} of the cores" if row_disturbed is not None else ""))
    for w in workers:
        w.close()
    disturbed = others_share(snapshot_at_start, cpu_snapshot())

    say()
    torch_head = "PyTorch" if len(policies) == 1 else "best PyTorch"
    say(f"{'model':<12} {'batch':>5} {'device':<7} {'ours samples/s':>15} {torch_head + ' samples/s':>22} "
        f"{'ratio':>6}  result (threshold {threshold})")
    for row in rows:
        note = f"  (PyTorch with {row['torch_policy']} OpenMP wait policy)" if len(policies) > 1 else ""
        verdict = "PASS" if row["pass"] else ("FAIL (model shapes differ)" if row["params"] != row["torch_params"]
                                              else "FAIL")
        say(f"{row['model']:<12} {row['batch']:>5} {row['device']:<7} {row['ours_samples_per_s']:>15,.0f} "
            f"{row['torch_samples_per_s']:>22,.0f} {row['ratio']:>6.2f}  {verdict}{note}")
    if disturbed is not None:
        say(f"other processes kept {disturbed:.0%} of the {pytorch_mlp.available_cores()} cores busy during the run"
            + (" (a noisy machine: rerun when it is quiet)" if not cuda and disturbed > 0.05 else ""))
    if not blas["optimised"]:
        say(f"NOT MEANINGFUL: PyTorch used {blas['provider']} for its matrix products")
    if a.json:
        print(json.dumps({"summary": True, "device": a.device, "threads": a.threads, "threshold": threshold,
                          "all_pass": not failed, "torch": hello["torch"], "torch_blas": blas["provider"],
                          "openblas_core": blas.get("openblas_core"), "gpu": hello.get("gpu"),
                          "load_average_at_start": load_at_start,
                          "others_cpu_share": round(disturbed, 4) if disturbed is not None else None}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
