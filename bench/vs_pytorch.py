"""tessel against PyTorch: training step time of the same network on the same batch.

Both run on the same cores (or GPU), through the PyTorch bridge (python/tessel_torch.py builds
PyTorch's network from the same model file).

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

On a GPU (`--device cuda`, its own rows: GPU_ROWS): tessel runs with one CUDA worker
(STARPU_NCUDA=1) and `--threads` CPU workers, with TSL_TASK_WHERE=cuda (every task whose codelet
has a CUDA function that accepts it runs on the GPU, the rest on the CPU workers; `--tessel-where
any` with `--sched dmdas` lets the scheduler spread tasks over both); PyTorch runs the module on
the GPU with torch.backends.cudnn.benchmark on and its default TF32 settings (convolutions may
use TF32, matrix products not; tessel's TESSEL_CUDA_TF32 default lets both), its step timed
between torch.cuda.synchronize() calls and including the batch's copy to the GPU, and
torch.cuda.max_memory_allocated() as its GPU peak. `--cli` names the tessel program, `--launcher`
a command put before it (e.g. "mpirun -n 1" or a wrapper that sets up its libraries), `--python`
the interpreter of the PyTorch runs, and `--timeout` the seconds one run may take (a row whose run
times out says so). For example, on the GPU machine:
    python3 bench/vs_pytorch.py --device cuda --cli KIT/bin/tessel --threads 4 --pairs 1

Data parallel (`--ranks N`, CPU): tessel runs `--plan data=N` on N ranks under `mpirun
--bind-to none` (tessel places each rank's workers on cores of their own), `--threads` workers a
rank; PyTorch runs N processes of `--threads` threads with DistributedDataParallel over gloo
(127.0.0.1), each on its own cores (sched_setaffinity, as tessel's ranks); both split the row's
global batch over the ranks. A step's time is rank 0's (tessel's metrics; PyTorch's after the
step, whose gradient all-reduce every rank waits for). Peak: the largest max-RSS of one process.
For the issue's comparison, 2 ranks x 1 worker against DDP on 2 processes x 1 thread:
    /usr/bin/python3 bench/vs_pytorch.py --ranks 2 --threads 1 --rows cnn-fashion,resnet-64
"""

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

# name: (model file under examples/models, or a path from the repository root, sample shape,
# classes, batch, tessel --plan or None)
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
    "wide-head-16": ("bench/models/wide_head.json", (1, 16, 16), 10, 16, None),
    "unet2d-gn-256": ("bench/models/unet2d_gn.json", (1, 256, 256), 3, 2, None),
    "unet3d-gn-64": ("bench/models/unet3d_gn.json", (1, 64, 64, 64), 3, 1, None),
}

# The same, on a GPU (--device cuda): the CUDA issue's rows (the default plan gives each CUDA
# worker one sample tile).
GPU_ROWS = {
    "cnn-fashion-b256": ("cnn.json", (1, 28, 28), 10, 256, None),
    "cnn3d-64-b4": ("cnn3d.json", (1, 64, 64, 64), 3, 4, None),
    "unet2d-512-b8": ("unet2d.json", (1, 512, 512), 3, 8, None),
    "unet3d-128-b1": ("unet3d.json", (1, 128, 128, 128), 3, 1, None),
    "unet2d-gn-512-b8": ("bench/models/unet2d_gn.json", (1, 512, 512), 3, 8, None),
}


class RunTimeout(Exception):
    """A run took longer than --timeout seconds."""


def make_data(directory, shape, classes, batch, segmentation, steps):
    import numpy as np
    rng = np.random.default_rng(0)
    n = batch * steps
    for split, count in (("", n), ("_test", batch)):
        np.save(os.path.join(directory, f"x{split}.npy"),
                rng.standard_normal((count,) + shape).astype(np.float32))
        yshape = (count,) + shape[1:] if segmentation else (count,)
        np.save(os.path.join(directory, f"y{split}.npy"), rng.integers(0, classes, yshape))


# Runs argv[2:] and writes its max RSS (KiB) into argv[1]. A child's max RSS starts from what
# its parent had when it forked (Linux keeps the high-water mark across fork and exec): timed
# from this script, which has imported numpy, every run would report at least this process's
# size. This small interpreter (-S: no site packages) forks the measured program instead.
RSS_LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def output_is_spatial(model, shape, classes):
    """Whether the network's output has spatial dimensions (per-voxel labels), asked of the bridge
    in a process of its own (this one stays free of torch: see RSS_LAUNCHER)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import tessel_torch; "
            "print(len(tessel_torch.build(sys.argv[2], tuple(map(int, sys.argv[3].split(','))), "
            "int(sys.argv[4])).output_shape))")
    out = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "python"), model,
                          ",".join(map(str, shape)), str(classes)],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    return int(out.strip()) > 1


def run_measured(cmd, env, timeout=None):
    """Run cmd; (stdout, max RSS MiB of that process). RunTimeout when it takes more than
    `timeout` seconds: it runs in a session of its own, killed whole then (a launcher's children
    too)."""
    rss_file = tempfile.NamedTemporaryFile(prefix="tessel-vs-pytorch-rss-", delete=False)
    rss_file.close()
    cmd = [sys.executable, "-S", "-c", RSS_LAUNCHER, rss_file.name] + list(cmd)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=bool(timeout))
    fired = []

    def kill():
        fired.append(True)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill) if timeout else None
    if timer:
        timer.start()
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    if timer:
        timer.cancel()
    if fired:
        print(out[-4000:], file=sys.stderr)
        raise RunTimeout(f"over {timeout:g} s")
    p.returncode = os.waitstatus_to_exitcode(status)
    with open(rss_file.name) as f:
        text = f.read().strip()
    os.unlink(rss_file.name)
    if p.returncode:
        print(out, file=sys.stderr)
        raise SystemExit(f"vs_pytorch: {' '.join(cmd[4:])} exited {p.returncode}")
    return out, int(text) / 1024.0


def run_tessel(args, model, data, batch, plan, steps, work):
    metrics = os.path.join(work, "metrics.json")
    launcher = shlex.split(args.launcher)
    if args.ranks > 1:
        launcher = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np",
                    str(args.ranks)] + launcher
        plan = f"data={args.ranks}" + (f",{plan}" if plan else "")
    cmd = launcher + [
        args.cli, "train", "--data", "npy:" + data, "--model", model, "--batch", str(batch),
        "--max-steps", str(steps), "--optimizer", "sgd", "--lr", "0.01", "--momentum", "0.9",
        "--shuffle", "off", "--ncpu", str(args.threads), "--metrics-json", metrics]
    if plan:
        cmd += ["--plan", plan]
    if args.sched:
        cmd += ["--sched", args.sched]
    env = dict(os.environ, STARPU_SILENT="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if args.device == "cuda":
        env.update(STARPU_NCUDA="1", TSL_TASK_WHERE=args.tessel_where)
    else:
        env.update(STARPU_NCUDA="0")
    _, rss = run_measured(cmd, env, args.timeout)
    with open(metrics) as f:
        return json.load(f)["step_seconds"], rss, None


def torch_worker(args):
    """One PyTorch run (in its own process): prints the step seconds as JSON, and on a GPU the
    peak GPU memory (MiB) after them. With --ranks N > 1, N processes (this one rank 0) train
    with DistributedDataParallel over gloo."""
    if args.ranks > 1:
        import socket
        import torch.multiprocessing as mp
        with socket.socket() as sock:  # a free port for the rendezvous
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        queue = mp.get_context("spawn").SimpleQueue()
        ctx = mp.spawn(torch_rank, args=(args, port, queue), nprocs=args.ranks, join=False)
        result = queue.get()
        while not ctx.join():
            pass
        print(json.dumps(result))
        return 0
    torch_rank(0, args, None, None)
    return 0


def torch_rank(rank, args, port, queue):
    """The training loop of one PyTorch process (of --ranks with DDP when port is given)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    import tessel_torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if port is not None:  # its own cores, as tessel's ranks; its part of the global batch
        cores = sorted(os.sched_getaffinity(0))
        per = max(1, len(cores) // args.ranks)
        os.sched_setaffinity(0, cores[rank * per:(rank + 1) * per] or cores)
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                             rank=rank, world_size=args.ranks)
    cuda = args.device == "cuda"
    dev = torch.device("cuda" if cuda else "cpu")
    if cuda:
        # PyTorch's defaults stay: TF32 allowed for convolutions (cudnn.allow_tf32), not for
        # matrix products (cuda.matmul.allow_tf32); the fastest measured cuDNN algorithms.
        torch.backends.cudnn.benchmark = True
    shape = tuple(int(v) for v in args.shape.split(","))
    net = tessel_torch.build(args.model, shape, args.classes).to(dev)
    x = torch.from_numpy(np.load(os.path.join(args.data, "x.npy")))
    y = torch.from_numpy(np.load(os.path.join(args.data, "y.npy")))
    local, first = args.batch, 0
    if port is not None:
        net = torch.nn.parallel.DistributedDataParallel(net)
        local = args.batch // args.ranks
        first = rank * local
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    net.train()
    times = []
    for step in range(args.steps):
        xb = x[step * args.batch + first:step * args.batch + first + local]
        yb = y[step * args.batch + first:step * args.batch + first + local]
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        xb, yb = xb.to(dev), yb.to(dev)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 1048576.0 if cuda else None
    result = {"times": times, "gpu_peak_mib": peak}
    if port is None:
        print(json.dumps(result))
        return
    torch.distributed.barrier()
    if rank == 0:
        queue.put(result)
    torch.distributed.destroy_process_group()


def run_torch(args, model, shape, classes, data, batch, steps):
    cmd = [args.python, os.path.abspath(__file__), "--torch-worker", "--model", model,
           "--shape", ",".join(map(str, shape)), "--classes", str(classes), "--data", data,
           "--batch", str(batch), "--steps", str(steps), "--threads", str(args.threads),
           "--device", args.device, "--ranks", str(args.ranks)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if args.torch_ld_library_path is not None:
        env["LD_LIBRARY_PATH"] = args.torch_ld_library_path
    out, rss = run_measured(cmd, env, args.timeout)
    result = json.loads(out.strip().splitlines()[-1])
    return result["times"], rss, result["gpu_peak_mib"]


def spread(values):
    return min(values), statistics.median(values), max(values)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--ranks", type=int, default=1,
                    help="data parallel on N ranks: tessel data=N, PyTorch DDP (gloo), CPU only")
    ap.add_argument("--threads", type=int, default=2,
                    help="tessel's CPU workers and PyTorch's threads (default 2)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rows", help="comma-separated row names (default: every row of the device)")
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "tessel"))
    ap.add_argument("--launcher", default="", help="command put before the tessel program")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the PyTorch runs")
    ap.add_argument("--torch-ld-library-path", default=None,
                    help="LD_LIBRARY_PATH of the PyTorch runs (default: this one's)")
    ap.add_argument("--tessel-where", choices=("cuda", "any"), default="cuda",
                    help="TSL_TASK_WHERE of tessel's runs on a GPU (default cuda)")
    ap.add_argument("--sched", default=None, help="tessel's StarPU scheduler (--sched)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds one run may take")
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

    if args.ranks < 1 or (args.ranks > 1 and args.device == "cuda"):
        raise SystemExit("vs_pytorch: --ranks takes N >= 1, on the CPU only")
    table = GPU_ROWS if args.device == "cuda" else ROWS
    names = args.rows.split(",") if args.rows else list(table)
    uneven = [n for n in names if n in table and table[n][3] % args.ranks]
    if uneven:
        raise SystemExit(f"vs_pytorch: the batch of {', '.join(uneven)} does not split over "
                         f"{args.ranks} ranks")
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"vs_pytorch: no {args.device} row {', '.join(unknown)} "
                         f"(rows: {', '.join(table)})")
    lines = []
    if args.device == "cuda":
        lines.append(f"GPU: tessel with 1 CUDA worker and {args.threads} CPU workers, "
                     f"TSL_TASK_WHERE={args.tessel_where}"
                     f"{', scheduler ' + args.sched if args.sched else ''}, TESSEL_CUDA_TF32="
                     f"{os.environ.get('TESSEL_CUDA_TF32', '1 (default)')}; PyTorch eager, "
                     f"cudnn.benchmark on, default TF32 (convolutions yes, matmul no). "
                     f"Peak: tessel's process RSS; PyTorch's RSS and GPU peak "
                     f"(max_memory_allocated).")
        lines.append("")
    if args.ranks > 1:
        lines.append(f"Data parallel: tessel `--plan data={args.ranks}` on {args.ranks} ranks x "
                     f"{args.threads} workers; PyTorch DistributedDataParallel (gloo) on "
                     f"{args.ranks} processes x {args.threads} threads; global batch as the row's.")
        lines.append("")
    lines += [f"| row | batch | tessel s/step (min/median/max) | PyTorch s/step (min/median/max) | "
              f"speed ratio, median (min-max of {args.pairs} pairs) | peak MiB tessel / PyTorch"
              f"{' (GPU)' if args.device == 'cuda' else ''} |",
              "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    total = args.warmup + args.steps
    failed = False
    for name in names:
        model_file, shape, classes, batch, plan = table[name]
        model = os.path.join(ROOT, *(model_file.split("/") if "/" in model_file
                                     else ("examples", "models", model_file)))
        segmentation = output_is_spatial(model, shape, classes)
        label = name + (f" (`--plan {plan}`)" if plan else "")
        with tempfile.TemporaryDirectory(prefix="tessel-vs-pytorch-") as work:
            data = os.path.join(work, "data")
            os.makedirs(data)
            make_data(data, shape, classes, batch, segmentation, total)
            ratios, t_all, p_all, t_rss, p_rss, p_gpu = [], [], [], [], [], []
            try:
                for pair in range(args.pairs):
                    order = ("tessel", "torch") if pair % 2 == 0 else ("torch", "tessel")
                    med = {}
                    for side in order:
                        if side == "tessel":
                            times, rss, _ = run_tessel(args, model, data, batch, plan, total,
                                                       work)
                            t_all += times[args.warmup:]
                            t_rss.append(rss)
                        else:
                            times, rss, gpu = run_torch(args, model, shape, classes, data, batch,
                                                        total)
                            p_all += times[args.warmup:]
                            p_rss.append(rss)
                            if gpu is not None:
                                p_gpu.append(gpu)
                        med[side] = statistics.median(times[args.warmup:])
                    ratios.append(med["torch"] / med["tessel"])
            except RunTimeout as e:
                failed = True
                line = f"| {label} | {batch} | {side} run timed out ({e}) | | | |"
                lines.append(line)
                print(line, flush=True)
                continue
            tmin, tmed, tmax = spread(t_all)
            pmin, pmed, pmax = spread(p_all)
            peak = f"{max(t_rss):.0f} / {max(p_rss):.0f}"
            if p_gpu:
                peak += f" ({max(p_gpu):.0f})"
            line = (f"| {label} | {batch} | {tmin:.3f} / {tmed:.3f} / {tmax:.3f} | "
                    f"{pmin:.3f} / {pmed:.3f} / {pmax:.3f} | {statistics.median(ratios):.2f}x "
                    f"({min(ratios):.2f}-{max(ratios):.2f}) | {peak} |")
            lines.append(line)
            print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
