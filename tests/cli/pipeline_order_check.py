#!/usr/bin/env python3
"""A pipeline's later stage sends the input gradient the stage before waits for before it makes
its first layer's weights' gradients: with `stages=2` (one and two micro-batches) on 2 ranks of
one CPU worker each, `tessel train --trace` of fcn2d, every step on rank 1 (stage 1) runs all the
data-gradient tasks of its first convolution (the first in the model file of the convolutions
whose forward rank 1 runs; it reads stage 0's output) before any of that layer's weight-gradient
tasks. Without the deferral the worker takes the weights' task first, as it was submitted, and
stage 0 waits for it. The run's losses equal those of the same plan without a trace, and of one
rank (the order of tasks changes no value).

usage: pipeline_order_check.py TESSEL WORKDIR MPIEXEC [ARGS...]   (the launcher; -np 2 added)"""
import json
import os
import re
import shutil
import subprocess
import sys

tessel, work = sys.argv[1], sys.argv[2]
prefix = sys.argv[3:] + ["-np", "2"]
if len(prefix) < 3:
    sys.exit(__doc__)
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "..", "..", "examples", "models", "fcn2d.json")) as f:
    convs = [layer["name"] for layer in json.load(f)["layers"] if layer["op"] == "conv"]
STEPS = 3


def run(plan, *args, mpi=True):
    p = subprocess.run((prefix if mpi else []) +
                       [tessel, "train", "--model", "fcn2d", "--data",
                        "synthetic:dims=2,size=16,samples=48,classes=3,seed=5", "--batch", "8",
                        "--max-steps", str(STEPS), "--epochs", "1", "--progress", "lines",
                        "--plan", plan] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    if p.returncode != 0:
        sys.exit(f"tessel train --plan {plan}: exit {p.returncode}\n{p.stdout}")
    return [float(x) for x in re.findall(r"step \d+/\d+ loss ([0-9.]+)", p.stdout)]


problems = []
reference = run("data=1", mpi=False)
if len(reference) != STEPS:
    sys.exit(f"expected {STEPS} losses from one rank, got {reference}")
for plan in ("stages=2", "stages=2,micro=2"):
    trace = os.path.join(work, plan.replace(",", "_").replace("=", "") + ".json")
    traced = run(plan, "--trace", trace)
    plain = run(plan)
    if traced != reference or plain != reference:
        problems.append(f"{plan}: losses {traced} (traced), {plain}, one rank {reference}")
    with open(trace) as f:
        tasks = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    mine = sorted((e for e in tasks if e["pid"] == 1 and e["cat"] != "inference"),
                  key=lambda e: e["ts"])
    stage1 = {e["args"].get("layer") for e in mine
              if e["cat"] == "forward" and e["name"] == "tsl_conv_fwd"}
    first = next((c for c in convs if c in stage1), None)
    if first is None or first == convs[0]:
        problems.append(f"{plan}: rank 1 runs the convolutions {sorted(stage1)}: no second stage")
        continue
    # the steps: a forward task after backward ones starts the next
    steps, backward = [[]], False
    for e in mine:
        if e["cat"] == "forward" and backward:
            steps.append([])
            backward = False
        backward |= e["cat"] == "backward"
        steps[-1].append(e)
    if len(steps) != STEPS:
        problems.append(f"{plan}: {len(steps)} steps on rank 1, not {STEPS}")
    micro = 2 if "micro=2" in plan else 1
    for k, step in enumerate(steps):
        data = [e for e in step if e["args"].get("layer") == first and
                e["name"] == "tsl_conv_bwd_data"]
        weights = [e for e in step if e["args"].get("layer") == first and
                   e["name"] == "tsl_conv_bwd_weights"]
        if len(data) != micro or len(weights) != micro:
            problems.append(f"{plan} step {k + 1}: {first} has {len(data)} data- and "
                            f"{len(weights)} weight-gradient tasks, not {micro} each")
            continue
        last_data = max(e["ts"] + e["dur"] for e in data)
        first_weights = min(e["ts"] for e in weights)
        if first_weights < last_data:
            problems.append(f"{plan} step {k + 1}: {first}'s weight gradient started at "
                            f"{first_weights:.1f} us, before its input gradient was done "
                            f"({last_data:.1f} us)")
if problems:
    sys.exit("pipeline order check failed:\n  " + "\n  ".join(problems))
print(f"pipeline order check passed: stage 1's first convolution makes its input gradient "
      f"first, {STEPS} steps, 1 and 2 micro-batches")
