#!/usr/bin/env python3
"""tessel train --plan: a U-Net trained on 2 ranks with spatial plans (halo exchange) and a
data plan takes the same steps as the one-rank run (per-step losses equal within float
rounding), and the rank-0 summary names the plan.

usage: plan_check.py TESSEL WORKDIR MPIEXEC [MPIEXEC ARGS...]   (run with -np 2 appended)"""
import json
import os
import shutil
import subprocess
import sys

tessel, work = sys.argv[1], sys.argv[2]
mpiexec = sys.argv[3:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

common = ["train", "--model", "unet2d", "--data", "synthetic:dims=2,size=24,samples=24,classes=3",
          "--batch", "4", "--epochs", "1", "--seed", "3", "--optimizer", "sgd", "--lr", "0.05"]


def losses(prefix, plan):
    path = os.path.join(work, f"{plan or 'one-rank'}.json")
    cmd = prefix + [tessel] + common + ["--metrics-json", path] + (["--plan", plan] if plan else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    if plan:
        assert f"plan {plan}" in p.stdout, p.stdout
    with open(path) as f:
        return json.load(f)["step_losses"]


ref = losses([], None)
assert len(ref) == 6, ref
for plan in ["space=2", "space=1x2,tiles=2", "data=2"]:
    got = losses(mpiexec + ["-np", "2"], plan)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    assert len(got) == len(ref) and worst < 1e-5, f"{plan}: {got} vs {ref}"
    print(f"ok: plan {plan} on 2 ranks, per-step losses within {worst:.1e} of one rank")
