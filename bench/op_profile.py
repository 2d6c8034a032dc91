"""Where a training step's time goes, tessel against PyTorch, by kind of operation.

For one row of bench/vs_pytorch.py (same network, batch, data, SGD with momentum, threads),
after `--warmup` steps:
- tessel: `tessel train --trace` over `--steps` more steps; each task's duration summed by
  kind (its codelet's family), divided by the steps: worker-milliseconds per step (the sum over
  the workers, so up to `--threads` x the step's wall time);
- PyTorch: torch.profiler over the same number of steps; each operator's self CPU time summed
  by kind and multiplied by the intra-op threads, divided by the steps: an upper bound of its
  core-milliseconds per step (oneDNN's convolutions keep both threads busy; element-wise
  operators on small tensors may use one).
The kinds: convolution, batch norm, activation, pooling, linear, add (residual and gradient
sums), loss, optimizer, data (tessel: reading the batch; PyTorch: none), copies (tessel's tile
copies and packs), other. Each side's wall time per step is printed too.

usage: /usr/bin/python3 bench/op_profile.py [--row resnet-64] [--threads 2] [--warmup 3]
                                             [--steps 10] [--cli build/tessel]
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
import vs_pytorch  # noqa: E402  (its rows and data)

TESSEL_KINDS = [("conv", "convolution"), ("bn", "batch norm"), ("act", "activation"),
                ("pool", "pooling"), ("upsample", "pooling"), ("linear", "linear"),
                ("add", "add"), ("axpy", "add"), ("sum", "add"), ("loss", "loss"),
                ("dice", "loss"), ("update", "optimizer"), ("read", "data"),
                ("copy", "copies"), ("pack", "copies"), ("unpack", "copies"),
                ("fill", "other")]
TORCH_KINDS = [("convolution", "convolution"), ("batch_norm", "batch norm"),
               ("relu", "activation"), ("threshold", "activation"), ("tanh", "activation"),
               ("sigmoid", "activation"), ("pool", "pooling"), ("upsample", "pooling"),
               ("addmm", "linear"), ("linear", "linear"), ("mm", "linear"),
               ("cross_entropy", "loss"), ("log_softmax", "loss"), ("nll_loss", "loss"),
               ("sgd", "optimizer"), ("add", "add"), ("sum", "add"), ("_foreach", "optimizer"),
               ("copy", "copies"), ("cat", "copies")]
ORDER = ["convolution", "batch norm", "activation", "pooling", "linear", "add", "loss",
         "optimizer", "data", "copies", "other"]


def kind_of(name, table):
    low = name.lower()
    for key, kind in table:
        if key in low:
            return kind
    return "other"


def tessel_profile(args, model, data, batch, plan, work):
    trace = os.path.join(work, "trace.json")
    metrics = os.path.join(work, "metrics.json")
    cmd = [args.cli, "train", "--data", "npy:" + data, "--model", model, "--batch", str(batch),
           "--max-steps", str(args.warmup + args.steps), "--optimizer", "sgd", "--lr", "0.01",
           "--momentum", "0.9", "--shuffle", "off", "--ncpu", str(args.threads),
           "--metrics-json", metrics, "--trace", trace, "--progress", "off"]
    if plan:
        cmd += ["--plan", plan]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, STARPU_SILENT="1", STARPU_NCUDA="0"))
    with open(trace) as f:
        tasks = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    with open(metrics) as f:
        secs = json.load(f)["step_seconds"][args.warmup:]
    # the timed steps: tasks after the warm-up steps' end (the first timed step's data read)
    reads = sorted(e["ts"] for e in tasks if e["cat"] == "data")
    per_step = max(1, len(reads) // (args.warmup + args.steps))
    start = reads[args.warmup * per_step] if len(reads) > args.warmup * per_step else 0
    totals = collections.Counter()
    for e in tasks:
        if e["ts"] >= start and e["cat"] not in ("inference", "other"):
            totals[kind_of(e["name"], TESSEL_KINDS)] += e["dur"] / 1000.0 / args.steps
    return totals, 1000 * sorted(secs)[len(secs) // 2]


def torch_profile(args, model_file, shape, classes, data, batch):
    import numpy as np
    import torch
    import torch.nn.functional as F
    import tessel_torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    net = tessel_torch.build(model_file, shape, classes)
    x = torch.from_numpy(np.load(os.path.join(data, "x.npy")))
    y = torch.from_numpy(np.load(os.path.join(data, "y.npy")))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    net.train()

    def step(k):
        xb, yb = x[k * batch:(k + 1) * batch], y[k * batch:(k + 1) * batch]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(xb), yb).backward()
        opt.step()

    for k in range(args.warmup):
        step(k)
    walls = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for k in range(args.warmup, args.warmup + args.steps):
            t0 = time.perf_counter()
            step(k)
            walls.append(time.perf_counter() - t0)
    totals = collections.Counter()
    for ev in prof.key_averages():
        if ev.self_cpu_time_total > 0:
            totals[kind_of(ev.key, TORCH_KINDS)] += \
                ev.self_cpu_time_total / 1000.0 * args.threads / args.steps
    return totals, 1000 * sorted(walls)[len(walls) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--row", default="resnet-64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "tessel"))
    args = ap.parse_args()
    model, shape, classes, batch, plan = vs_pytorch.ROWS[args.row]
    model_file = os.path.join(ROOT, "examples", "models", model)
    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "data")
        os.makedirs(data)
        vs_pytorch.make_data(data, shape, classes, batch,
                             vs_pytorch.output_is_spatial(model_file, shape, classes),
                             args.warmup + args.steps)
        t, t_wall = tessel_profile(args, model_file, data, batch, plan, work)
        p, p_wall = torch_profile(args, model_file, shape, classes, data, batch)
    print(f"{args.row}: batch {batch}, {args.threads} threads, {args.steps} steps after "
          f"{args.warmup}; step wall time (median): tessel {t_wall:.1f} ms, PyTorch "
          f"{p_wall:.1f} ms ({p_wall / t_wall:.2f}x)")
    print(f"| kind | tessel worker-ms/step | PyTorch core-ms/step (self CPU x {args.threads}) |")
    print("|---|---|---|")
    for kind in ORDER:
        if t[kind] or p[kind]:
            print(f"| {kind} | {t[kind]:.1f} | {p[kind]:.1f} |")
    print(f"| all | {sum(t.values()):.1f} | {sum(p.values()):.1f} |")


if __name__ == "__main__":
    main()
