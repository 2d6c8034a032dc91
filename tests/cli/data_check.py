#!/usr/bin/env python3
"""Parallel plans take the one-rank run's steps: a network (by default a residual network:
batch norm, residual adds, a linear head) trained 3 steps with SGD (momentum) and with Adam
under each plan (data=D with weights sharded over the ranks, pipeline stages with
micro-batches, mixes with space=), ends with the parameters and batch-norm buffers of the
one-rank run, and each step's loss is the one-rank loss.

usage: data_check.py TESSEL WORKDIR NP PLANS MPIEXEC [MPIEXEC ARGS...]
       (PLANS: space-separated; each run with -np NP appended to the MPIEXEC command)
environment: CHECK_MODEL (default resnet), CHECK_DATA (a --data spec), CHECK_OPTIMIZERS
       (space-separated, default "sgd adam"), CHECK_TARGETS=C (instead of CHECK_DATA: an npy
       directory of 40 random 1 x 12 x 12 samples with f32 targets of C x 12 x 12, trained
       with --loss mse,l1:0.3)"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

tessel, work, nranks, plans = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
mpiexec = sys.argv[5:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

model = os.environ.get("CHECK_MODEL", "resnet")
data = os.environ.get("CHECK_DATA", "synthetic:dims=2,size=12,samples=40,classes=4,labels=sample")
optimizers = os.environ.get("CHECK_OPTIMIZERS", "sgd adam").split()
targets = int(os.environ.get("CHECK_TARGETS", "0"))
loss = []
if targets:  # float targets: regression losses
    data_dir = os.path.join(work, "targets-data")
    os.makedirs(data_dir)
    rng = np.random.default_rng(7)
    for split, n in (("", 40), ("_test", 8)):
        np.save(os.path.join(data_dir, f"x{split}.npy"),
                rng.standard_normal((n, 1, 12, 12)).astype(np.float32))
        np.save(os.path.join(data_dir, f"y{split}.npy"),
                rng.standard_normal((n, targets, 12, 12)).astype(np.float32))
    data, loss = "npy:" + data_dir, ["--loss", "mse,l1:0.3"]
common = ["train", "--model", model, "--batch", "8", "--max-steps", "3", "--seed", "5",
          "--data", data] + loss


def train(prefix, optimizer, plan):
    name = f"{optimizer}-{plan or 'one-rank'}"
    out = os.path.join(work, name)
    cmd = prefix + [tessel] + common + ["--optimizer", optimizer, "--save-params", out,
                                        "--metrics-json", out + ".json"]
    if plan:
        cmd += ["--plan", plan]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    params = {f: np.load(os.path.join(out, f)) for f in sorted(os.listdir(out))}
    with open(out + ".json") as f:
        metrics = json.load(f)
    # float targets have no accuracy: null, not a number that reads as 0 %
    acc = [metrics["final_test_accuracy"]] + [e[k] for e in metrics["epochs"]
                                              for k in ("train_accuracy", "test_accuracy")]
    assert all((a is None) == bool(targets) for a in acc), (name, acc)
    return params, metrics["step_losses"]


for optimizer in optimizers:
    ref, ref_losses = train([], optimizer, None)
    assert len(ref) > 10 and len(ref_losses) == 3, (sorted(ref), ref_losses)
    for plan in plans:
        got, losses = train(mpiexec + ["-np", nranks], optimizer, plan)
        assert sorted(got) == sorted(ref), (plan, sorted(got))
        worst, where = 0.0, ""
        for name, r in ref.items():
            if name.endswith("num_batches_tracked.npy"):
                assert np.array_equal(got[name], r), (plan, name)
                continue
            # Whole tensors, relative to their largest value: sums over samples and positions
            # are added in another order on other tiles (a lost or doubled contribution is
            # off by far more).
            d = float(np.max(np.abs(got[name].astype(np.float64) - r)) /
                      max(1.0, float(np.max(np.abs(r)))))
            if d > worst:
                worst, where = d, name
        assert worst < 1e-4, f"{optimizer}, plan {plan}: {where} differs by {worst:.2e}"
        lw = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        assert len(losses) == 3 and lw < 1e-5, (plan, losses, ref_losses)
        print(f"ok: {model}, {optimizer}, plan {plan} on {nranks} ranks: {len(ref)} parameters and buffers "
              f"within {worst:.1e} ({where}), losses within {lw:.1e} of one rank")
