#!/usr/bin/env python3
"""tessel train --trace FILE: the file is trace-event JSON (what Perfetto and chrome://tracing
open) with every rank's tasks, and the tasks of the training steps are all there, each under
its layer and pass: for STEPS steps of fcn2d with one sample tile per rank, each convolution
layer has exactly STEPS forward tasks and STEPS weight-gradient tasks on every rank (counted
from the model file, independently of tessel), every layer but the first STEPS data-gradient
tasks; events have a start, a non-negative duration, a rank and a named worker. With
--comm-stats on several ranks the bytes each rank sent are counter tracks, a sample per step.
Every rank has a "buffers" counter track, the MiB of StarPU buffers in use after each change,
whose highest sample is the buffer peak --rank-report gives that rank, and of those the MiB
StarPU-MPI received into ("received MiB": never more than all, none on one rank, some on
several, where batch norm's sums come from the other ranks). A path that cannot be written is
refused before training starts.

usage: trace_check.py TESSEL WORKDIR NRANKS [MPIEXEC ARGS...]   (MPIEXEC prefix optional)"""
import collections
import json
import os
import shutil
import subprocess
import sys

tessel, work, nranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
prefix = sys.argv[4:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
here = os.path.dirname(os.path.abspath(__file__))
model_file = os.path.join(here, "..", "..", "examples", "models", "fcn2d.json")
STEPS = 3
trace = os.path.join(work, "trace.json")


def run(*args):
    p = subprocess.run(prefix + [tessel, "train", "--model", "fcn2d", "--data",
                                 "synthetic:dims=2,size=10,samples=48,classes=3,seed=5",
                                 "--batch", "8", "--max-steps", str(STEPS), "--progress",
                                 "off"] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    return p.returncode, p.stdout


metrics = os.path.join(work, "metrics.json")
code, out = run("--trace", trace, "--rank-report", "--metrics-json", metrics)
if code != 0:
    sys.exit(f"tessel train --trace: exit {code}\n{out}")
with open(trace) as f:
    doc = json.load(f)
events = doc["traceEvents"]
tasks = [e for e in events if e.get("ph") == "X"]
meta = [e for e in events if e.get("ph") == "M"]
problems = []
if doc.get("otherData", {}).get("ranks") != nranks:
    problems.append(f"otherData.ranks is {doc.get('otherData')}, not {nranks}")
if doc["otherData"].get("dropped_events") != 0:
    problems.append("events were dropped")
ranks = {e["pid"] for e in tasks}
if ranks != set(range(nranks)):
    problems.append(f"tasks of ranks {sorted(ranks)}, expected 0..{nranks - 1}")
named = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
for e in tasks:
    for key in ("name", "cat", "ts", "dur", "pid", "tid", "args"):
        if key not in e:
            problems.append(f"event without {key}: {e}")
            break
    else:
        if e["dur"] < 0 or e["ts"] < 0:
            problems.append(f"negative time: {e}")
        if (e["pid"], e["tid"]) not in named:
            problems.append(f"worker {e['tid']} of rank {e['pid']} has no thread_name")
if {e["args"]["name"] for e in meta if e["name"] == "process_name"} != \
        {f"rank {r}" for r in range(nranks)}:
    problems.append("ranks not named")

# The model's convolutions, in order, from its file.
with open(model_file) as f:
    convs = [layer["name"] for layer in json.load(f)["layers"] if layer.get("op") == "conv"]
count = collections.Counter((e["pid"], e["name"], e["cat"], e["args"]["layer"]) for e in tasks)
for r in range(nranks):
    for i, layer in enumerate(convs):
        want = {("tsl_conv_fwd", "forward"): STEPS, ("tsl_conv_bwd_weights", "backward"): STEPS,
                ("tsl_conv_bwd_data", "backward"): STEPS if i > 0 else 0}
        for (name, cat), n in want.items():
            got = count[(r, name, cat, layer)]
            if got != n:
                problems.append(f"rank {r}, layer {layer}: {got} {name} ({cat}) tasks, "
                                f"expected {n}")
    # the losses of the steps (and no update outside the steps)
    if sum(n for (p, name, cat, _), n in count.items() if p == r and cat == "loss") < STEPS:
        problems.append(f"rank {r}: fewer than {STEPS} loss tasks")
# The buffers track: samples in time order, none negative, the highest the rank's buffer peak.
with open(metrics) as f:
    peaks = [r["buffer_peak_mib"] for r in json.load(f)["epochs"][-1]["ranks"]]  # rank order
for r in range(nranks):
    series = [(e["ts"], e["args"]["MiB"]) for e in events
              if e.get("ph") == "C" and e["name"] == "buffers" and e["pid"] == r]
    if len(series) < 2 * STEPS:
        problems.append(f"rank {r}: {len(series)} buffers samples")
        continue
    if [t for t, _ in series] != sorted(t for t, _ in series) or min(v for _, v in series) < 0:
        problems.append(f"rank {r}: buffers samples out of order or negative")
    if abs(max(v for _, v in series) - peaks[r]) > 0.002:
        problems.append(f"rank {r}: buffers track peaks at {max(v for _, v in series)} MiB, "
                        f"the rank report at {peaks[r]}")
    received = [(e["args"]["received MiB"], e["args"]["MiB"]) for e in events
                if e.get("ph") == "C" and e["name"] == "buffers" and e["pid"] == r]
    if any(not 0 <= got <= all_ + 1e-4 for got, all_ in received):
        problems.append(f"rank {r}: received MiB outside 0 .. MiB")
    most = max(got for got, _ in received)
    if (nranks == 1) != (most == 0):
        problems.append(f"rank {r} of {nranks}: received at most {most} MiB")
if problems:
    sys.exit("trace problems:\n  " + "\n  ".join(problems[:20]))

# With --comm-stats on several ranks: StarPU-MPI's bytes sent, sampled at every step's start
# and at the end, as counter tracks: per rank a sample a step and one more, each destination's
# count never going down, none to itself, some to every other rank by the end.
if nranks > 1:
    trace2 = os.path.join(work, "trace-comm.json")
    code, out = run("--trace", trace2, "--comm-stats")
    if code != 0:
        sys.exit(f"tessel train --trace --comm-stats: exit {code}\n{out}")
    with open(trace2) as f:
        counters = [e for e in json.load(f)["traceEvents"]
                    if e.get("ph") == "C" and e["name"] == "bytes sent"]
    for r in range(nranks):
        series = sorted((e["ts"], e["args"]) for e in counters if e["pid"] == r)
        if len(series) != STEPS + 1:
            sys.exit(f"rank {r}: {len(series)} bytes-sent samples, expected {STEPS + 1}")
        for dest in range(nranks):
            values = [args[f"to rank {dest}"] for _, args in series]
            if values != sorted(values) or (dest == r) != (values[-1] == 0):
                sys.exit(f"rank {r} to rank {dest}: bytes sent {values}")

# An unwritable path: refused at start, nothing trained.
code, out = run("--trace", os.path.join(work, "no-such-dir", "t.json"))
if code == 0 or "--trace" not in out or "epoch" in out:
    sys.exit(f"an unwritable --trace path: exit {code}, output:\n{out}")
print(f"trace: {len(tasks)} tasks of {nranks} rank(s), every convolution's tasks of "
      f"{STEPS} steps present under its layer; buffers tracks peak at the rank reports' "
      f"peaks; unwritable path refused")
