#!/usr/bin/env python3
"""Data parallelism on real data: the Fashion-MNIST CNN trained one epoch under data=NP on NP
ranks (sharded weights, gradient reduce-scatter and allgather as tasks) reaches the one-rank
run's test accuracy (same seed, same global batch) within 0.5 %.

usage: fashion_data_check.py TESSEL WORKDIR NP MPIEXEC [MPIEXEC ARGS...]"""
import json
import os
import shutil
import subprocess
import sys

tessel, work, nranks = sys.argv[1], sys.argv[2], sys.argv[3]
mpiexec = sys.argv[4:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
common = ["train", "--data", "fashion-mnist", "--batch", "128", "--epochs", "1", "--seed", "11"]


def accuracy(prefix, name, extra, env=None):
    path = os.path.join(work, name + ".json")
    cmd = prefix + [tessel] + common + ["--metrics-json", path] + extra
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    with open(path) as f:
        m = json.load(f)
    return m["final_test_accuracy"], m["epochs"][0]["seconds"]


one, t1 = accuracy([], "one-rank", [], dict(os.environ, STARPU_NCPU="2"))
par, tn = accuracy(mpiexec + ["-np", nranks], f"data{nranks}", ["--plan", f"data={nranks}"])
assert one > 0.8, f"one epoch should reach 80 % (got {one})"
assert abs(par - one) <= 0.005, f"data={nranks}: test accuracy {par} vs one rank {one}"
print(f"ok: test accuracy {par:.4f} on {nranks} ranks (data={nranks}, {tn:.0f} s) vs {one:.4f} "
      f"on one rank ({t1:.0f} s)")
