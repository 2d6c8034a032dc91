#!/usr/bin/env python3
"""tessel train end to end on Fashion-MNIST, briefly: the metrics file is written and sane,
the accuracy after a few dozen steps is far above chance, a second run with the same seed
gives the same losses bit for bit, saved parameters are PyTorch-named .npy files that
tessel eval reads back, and a run from them with no steps reproduces the test accuracy.

usage: train_check.py TESSEL WORKDIR [MPIEXEC ARGS...]   (MPIEXEC prefix optional)"""
import json
import os
import shutil
import subprocess
import sys

tessel, work = sys.argv[1], sys.argv[2]
prefix = sys.argv[3:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def run(*args):
    cmd = prefix + [tessel] + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout


common = ["--data", "fashion-mnist", "--batch", "128", "--max-steps", "20", "--seed", "7"]
runs = []
for k in range(2):
    metrics = os.path.join(work, f"m{k}.json")
    out = run("train", *common, "--metrics-json", metrics,
              "--save-params", os.path.join(work, f"p{k}"))
    with open(metrics) as f:
        runs.append(json.load(f))
m = runs[0]
assert m["steps"] == 20, m
e = m["epochs"][0]
for key in ("train_loss", "test_loss", "test_accuracy", "samples_per_second"):
    assert e[key] == e[key] and e[key] > 0, (key, e)
assert m["final_test_accuracy"] > 0.5, f"20 steps should beat chance (0.1) by far: {m}"
def losses(r):
    return [(e["train_loss"], e["train_accuracy"], e["test_loss"], e["test_accuracy"])
            for e in r["epochs"]]


assert losses(runs[0]) == losses(runs[1]), f"same seed, different runs: {runs}"
names = sorted(os.listdir(os.path.join(work, "p0")))
assert "conv1.weight.npy" in names and "bn1.running_var.npy" in names and \
    "fc2.bias.npy" in names, names
out = run("eval", "--data", "fashion-mnist", "--batch", "128",
          "--load-params", os.path.join(work, "p0"))
acc = float(out.split("accuracy ")[1].split("%")[0]) / 100
assert abs(acc - m["final_test_accuracy"]) < 1e-4, (acc, m["final_test_accuracy"])
print(f"ok: test accuracy {acc:.4f} after 20 steps; runs identical; eval agrees")
