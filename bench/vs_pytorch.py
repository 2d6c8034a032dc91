"""tessel against PyTorch on the same cores: one training step of the same network on the same
batch, through the PyTorch bridge (python/tessel_torch.py builds PyTorch's network from the same
model file).

For each row, `--pairs` pairs of runs alternate (tessel first in even pairs, PyTorch first in odd
ones), each run a fresh process doing `--warmup` steps then `--steps` timed steps with SGD
(momentum 0.9) and softmax cross-entropy on random data of the row's shape. Per run: the median
step time (and min/max); per pair: PyTorch's median / tessel's median (the speed ratio, > 1 when
tessel is faster); per row: the median and the range of the pair ratios, both sides' step-time
spread (min/median/max over all timed steps of all runs) and both sides' peak resident memory
(the largest max-RSS of a run; tessel's includes StarPU's and MPI's).

tessel's step times are its own per-step wall times (`--metrics-json` step_seconds: loading the
batch from the .npy files, forward, loss, backward, update); PyTorch's are wall times around
zero_grad/forward/loss/backward/step with the batch already a tensor.

usage (from the repository root, after building into build/ and scripts/install-bridge-deps.sh):
    /usr/bin/python3 bench/vs_pytorch.py [--threads 2] [--pairs 5] [--rows a,b,...] [--out FILE]
Prints a Markdown table (and writes it to --out).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

# name: (model file under examples/models, sample shape, classes, batch, tessel --plan or None)
ROWS = {
    "cnn-fashion": ("cnn.json", (1, 28, 28), 10, 64, None),
    "unet2d-256": ("unet2d.json", (1, 256, 256), 3, 2, None),
    "unet2d-256-tiles2": ("unet2d.json", (1, 256, 256), 3, 2, "tiles=2"),
    "unet3d-64": ("unet3d.json", (1, 64, 64, 64), 3, 1, None),
    "unet3d-64-tiles2": ("unet3d.json", (1, 64, 64, 64), 3, 1, "tiles=2"),
    "cnn3d-64": ("cnn3d.json", (1, 64, 64, 64), 3, 1, None),
    "resnet-64": ("resnet.json", (1, 64, 64), 10, 16, None),
    "unet3d-128": ("unet3d.json", (1, 128, 128, 128), 3, 1, None),
    "fcn2d-512": ("fcn2d.json", (1, 512, 512), 3, 2, None),
}


def make_data(directory, shape, classes, batch, segmentation, steps):
    import numpy as np
    rng = np.random.default_rng(0)
    n = batch * steps
    for split, count in (("", n), ("_test", batch)):
        np.save(os.path.join(directory, f"x{split}.npy"),
                rng.standard_normal((count,) + shape).astype(np.float32))
        yshape = (count,) + shape[1:] if segmentation else (count,)
        np.save(os.path.join(directory, f"y{split}.npy"), rng.integers(0, classes, yshape))


def run_measured(cmd, env):
    """Run cmd; (stdout, max RSS MiB of that process)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        print(out, file=sys.stderr)
        raise SystemExit(f"vs_pytorch: {' '.join(cmd)} exited {p.returncode}")
    return out, usage.ru_maxrss / 1024.0


def run_tessel(cli, model, data, batch, plan, steps, threads, work):
    metrics = os.path.join(work, "metrics.json")
    cmd = [cli, "train", "--data", "npy:" + data, "--model", model, "--batch", str(batch),
           "--max-steps", str(steps), "--optimizer", "sgd", "--lr", "0.01", "--momentum", "0.9",
           "--shuffle", "off", "--ncpu", str(threads), "--metrics-json", metrics]
    if plan:
        cmd += ["--plan", plan]
    env = dict(os.environ, STARPU_SILENT="1")
    _, rss = run_measured(cmd, env)
    with open(metrics) as f:
        return json.load(f)["step_seconds"], rss


def torch_worker(args):
    """One PyTorch run (in its own process): prints the step seconds as JSON."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    import tessel_torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = tuple(int(v) for v in args.shape.split(","))
    net = tessel_torch.build(args.model, shape, args.classes)
    x = torch.from_numpy(np.load(os.path.join(args.data, "x.npy")))
    y = torch.from_numpy(np.load(os.path.join(args.data, "y.npy")))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    net.train()
    times = []
    for step in range(args.steps):
        xb = x[step * args.batch:(step + 1) * args.batch]
        yb = y[step * args.batch:(step + 1) * args.batch]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    print(json.dumps(times))


def run_torch(model, shape, classes, data, batch, steps, threads):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", "--model", model,
           "--shape", ",".join(map(str, shape)), "--classes", str(classes), "--data", data,
           "--batch", str(batch), "--steps", str(steps), "--threads", str(threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out, rss = run_measured(cmd, env)
    return json.loads(out.strip().splitlines()[-1]), rss


def spread(values):
    return min(values), statistics.median(values), max(values)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "tessel"))
    ap.add_argument("--out")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model")
    ap.add_argument("--shape")
    ap.add_argument("--classes", type=int)
    ap.add_argument("--data")
    ap.add_argument("--batch", type=int)
    args = ap.parse_args()
    if args.torch_worker:
        return torch_worker(args)

    import tessel_torch
    lines = [f"| row | batch | tessel s/step (min/median/max) | PyTorch s/step (min/median/max) | "
             f"speed ratio, median (min-max of {args.pairs} pairs) | peak MiB tessel / PyTorch |",
             "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    total = args.warmup + args.steps
    for name in args.rows.split(","):
        model_file, shape, classes, batch, plan = ROWS[name]
        model = os.path.join(ROOT, "examples", "models", model_file)
        segmentation = len(tessel_torch.build(model, shape, classes).output_shape) > 1
        with tempfile.TemporaryDirectory(prefix="tessel-vs-pytorch-") as work:
            data = os.path.join(work, "data")
            os.makedirs(data)
            make_data(data, shape, classes, batch, segmentation, total)
            ratios, t_all, p_all, t_rss, p_rss = [], [], [], [], []
            for pair in range(args.pairs):
                order = ("tessel", "torch") if pair % 2 == 0 else ("torch", "tessel")
                med = {}
                for side in order:
                    if side == "tessel":
                        times, rss = run_tessel(args.cli, model, data, batch, plan, total,
                                                args.threads, work)
                        t_all += times[args.warmup:]
                        t_rss.append(rss)
                    else:
                        times, rss = run_torch(model, shape, classes, data, batch, total,
                                               args.threads)
                        p_all += times[args.warmup:]
                        p_rss.append(rss)
                    med[side] = statistics.median(times[args.warmup:])
                ratios.append(med["torch"] / med["tessel"])
            tmin, tmed, tmax = spread(t_all)
            pmin, pmed, pmax = spread(p_all)
            label = name + (f" (`--plan {plan}`)" if plan else "")
            line = (f"| {label} | {batch} | {tmin:.3f} / {tmed:.3f} / {tmax:.3f} | "
                    f"{pmin:.3f} / {pmed:.3f} / {pmax:.3f} | {statistics.median(ratios):.2f}x "
                    f"({min(ratios):.2f}-{max(ratios):.2f}) | {max(t_rss):.0f} / {max(p_rss):.0f} |")
            lines.append(line)
            print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
