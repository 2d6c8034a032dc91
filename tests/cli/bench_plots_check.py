#!/usr/bin/env python3
"""tessel bench compares schedulers, and python/tessel_plot.py draws what tessel writes:

- `tessel bench` under four schedulers (eager, lws, dmda, dmdas) at the given rank count: the
  table has a row per scheduler, the JSON a result per scheduler with every repetition's time,
  min <= median <= max, positive times, a busy share in (0, 1], tasks and busy shares by kind
  of worker (CPU, CUDA: a CUDA share only with CUDA tasks), and bytes between ranks
  exactly when there is more than one rank; a scheduler StarPU does not have is refused with
  its list; with --critical-path, a traced step whose critical path is positive and shorter
  than its tasks' summed time;
- a metrics file and a trace of a short training run, and the bench JSON, each plotted to a
  PNG: a real PNG (signature, IHDR size) with something drawn (more than one colour); the
  trace's task table (tessel_plot.py tasks) counts every task once.
Skips (exit 77) where matplotlib is missing (scripts/install-bridge-deps.sh installs it).

usage: bench_plots_check.py TESSEL WORKDIR NRANKS [MPIEXEC ARGS...]"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

tessel, work, nranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
prefix = sys.argv[4:]
here = os.path.dirname(os.path.abspath(__file__))
plot = os.path.join(here, "..", "..", "python", "tessel_plot.py")
try:
    import matplotlib  # noqa: F401
except ImportError:
    print("SKIPPED: no matplotlib for /usr/bin/python3 (bash scripts/install-bridge-deps.sh)")
    sys.exit(77)
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
DATA = "synthetic:dims=2,size=12,samples=48,classes=3,seed=5"
SCHEDS = ["eager", "lws", "dmda", "dmdas"]


def run(args, expect=0):
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=400)
    if (p.returncode == 0) != (expect == 0):
        sys.exit(f"{' '.join(args)}: exit {p.returncode}\n{p.stdout}")
    return p.stdout


bench_json = os.path.join(work, "bench.json")
out = run(prefix + [tessel, "bench", "--model", "fcn2d", "--data", DATA, "--batch", "8",
                    "--steps", "2", "--warmup", "1", "--repeat", "3", "--sched",
                    ",".join(SCHEDS), "--critical-path", "--json", bench_json])
rows = [line.split()[0] for line in out.splitlines() if line.split()[:1] and
        line.split()[0] in SCHEDS]
if rows != SCHEDS:
    sys.exit(f"table rows {rows}, expected {SCHEDS}:\n{out}")
with open(bench_json) as f:
    b = json.load(f)
problems = []
if [r["sched"] for r in b["results"]] != SCHEDS or b["ranks"] != nranks:
    problems.append(f"results for {[r['sched'] for r in b['results']]}, ranks {b['ranks']}")
for r in b["results"]:
    t = r["seconds_per_step"]
    if len(t) != 3 or min(t) <= 0 or not (r["min"] <= r["median"] <= r["max"]) or \
            r["min"] != min(t) or r["max"] != max(t) or sorted(t)[1] != r["median"]:
        problems.append(f"{r['sched']}: times {t}, median {r['median']}")
    if not 0 < r["workers_busy"] <= 1:
        problems.append(f"{r['sched']}: busy {r['workers_busy']}")
    # where the work went, by kind of worker: every timed task on a CPU worker or a CUDA one
    if r["tasks_cpu"] + r["tasks_cuda"] < 1 or not 0 < r["busy_cpu"] <= 1 or \
            (r["tasks_cuda"] > 0) != (r["busy_cuda"] >= 0):
        problems.append(f"{r['sched']}: tasks {r['tasks_cpu']} on CPU, {r['tasks_cuda']} on "
                        f"CUDA, busy {r['busy_cpu']} / {r['busy_cuda']}")
    # --critical-path: a traced step's task time and critical path (the optimizer's updates
    # of the parameters alone run side by side: shorter than the sum)
    if not 0 < r["critical_path_seconds"] < r["task_seconds"]:
        problems.append(f"{r['sched']}: critical path {r['critical_path_seconds']} s of "
                        f"{r['task_seconds']} s of tasks")
    if (r["bytes_per_step"] > 0) != (nranks > 1):
        problems.append(f"{r['sched']}: {r['bytes_per_step']} bytes per step at {nranks} ranks")
if out.count("traced step: task time") != len(SCHEDS):
    problems.append("no 'traced step' line per scheduler")
if problems:
    sys.exit("bench problems:\n  " + "\n  ".join(problems))
bad = subprocess.run([tessel, "bench", "--data", DATA, "--sched", "eager,no-such"],
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
if bad.returncode == 0 or "no scheduler 'no-such'" not in bad.stdout or "dmdas" not in bad.stdout:
    sys.exit(f"an unknown scheduler: exit {bad.returncode}\n{bad.stdout}")

metrics, trace = os.path.join(work, "m.json"), os.path.join(work, "t.json")
run(prefix + [tessel, "train", "--model", "fcn2d", "--data", DATA, "--batch", "8", "--epochs",
              "2", "--progress", "off", "--metrics-json", metrics, "--trace", trace])


def png_check(path):
    """(width, height) of a PNG with more than one colour in its first rows; exits otherwise."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        sys.exit(f"{path}: not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    # the image data: every IDAT chunk, inflated
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    pixels = zlib.decompress(idat)
    if width < 100 or height < 100 or len(set(pixels[:len(pixels) // 2])) < 3:
        sys.exit(f"{path}: {width}x{height}, nothing drawn")
    return width, height


for kind, src in (("metrics", metrics), ("trace", trace), ("bench", bench_json)):
    png = os.path.join(work, f"{kind}.png")
    print(run(["/usr/bin/python3", plot, kind, src, png]).strip())
    w, h = png_check(png)
    print(f"  {png}: {w}x{h}")
# The trace's table: every task counted once, the convolutions' forward among the rows.
table = run(["/usr/bin/python3", plot, "tasks", trace, "100"])
with open(trace) as f:
    ntasks = sum(1 for e in json.load(f)["traceEvents"] if e.get("ph") == "X")
row = re.compile(r"^\S+\s+.+?\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+%$")
counted = sum(int(m.group(1)) for m in map(row.match, table.splitlines()) if m)
if not table.startswith(f"{ntasks} tasks,") or "tsl_conv_fwd" not in table or counted != ntasks:
    sys.exit(f"the trace's table does not count its {ntasks} tasks:\n{table}")
print(f"bench: {len(SCHEDS)} schedulers at {nranks} rank(s); three plots drawn; the trace's "
      f"table counts its {ntasks} tasks")
