#!/usr/bin/env python3
"""tessel train with layer-parallel MGRIT plans: the same V-cycle schedule gives the same bits
at 1, 2 and 4 ranks (layers=1, 2, 4: the parameters written after three steps are identical
byte for byte, and so are the per-step losses and residual norms in the metrics stream), and
space=1 (one rank with the same tiles, tiles=2) against space=2 at 2 ranks and
layers=2,space=2 at 4; a run stopped after two steps and resumed
from its checkpoint ends with the same bytes (a resume with another schedule is refused). The stream carries each step's forward and
backward residual norms (non-increasing here) and their convergence factor; --comm-stats
prints them; `tessel plan` describes the levels; a plan MGRIT cannot run is refused before
training.

usage: mgrit_check.py TESSEL WORKDIR MPIEXEC [MPIEXEC ARGS...]   (-np N appended)"""
import glob
import json
import os
import shutil
import subprocess
import sys

tessel, work = sys.argv[1], sys.argv[2]
mpiexec = sys.argv[3:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

data = "synthetic:dims=2,size=12,samples=24,classes=3,labels=sample"
common = ["train", "--model", "odetanh8", "--data", data, "--batch", "4", "--max-steps", "3",
          "--seed", "5", "--optimizer", "sgd", "--lr", "0.1", "--shuffle", "off", "--ncpu", "1"]
schedule = "levels=2,cf=2,iters=2,biters=2,relax=FCF"


def run(nranks, plan, extra=()):
    name = f"{nranks}-{plan}"
    out = os.path.join(work, name)
    metrics = os.path.join(work, name + ".json")
    cmd = mpiexec + ["-np", str(nranks), tessel] + common + [
        "--plan", plan, "--save-params", out, "--metrics-json", metrics] + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    params = {}
    for path in sorted(glob.glob(os.path.join(out, "*.npy"))):
        with open(path, "rb") as f:
            params[os.path.basename(path)] = f.read()
    with open(metrics + "l") as f:
        steps = [r for r in map(json.loads, f) if r["record"] == "step"]
    return params, steps, p.stdout


def same(a, b, what):
    pa, sa, _ = a
    pb, sb, _ = b
    assert pa.keys() == pb.keys() and len(pa) > 10, (what, sorted(pa), sorted(pb))
    for k in pa:
        assert pa[k] == pb[k], f"{what}: {k} differs"
    assert [s["loss"] for s in sa] == [s["loss"] for s in sb], (what, sa, sb)
    assert [s["mgrit"] for s in sa] == [s["mgrit"] for s in sb], (what, sa, sb)


one = run(1, schedule, ["--comm-stats"])
steps = one[1]
assert len(steps) == 3, steps
for s in steps:
    (seg,) = s["mgrit"]
    for d in ("forward", "backward"):
        norms = seg[d]
        assert len(norms) == 2 and norms[0] > 0, seg
        assert norms[1] <= norms[0], seg
        assert 0 <= seg[d + "_factor"] < 1, seg
assert "MGRIT segment 0 forward residuals (last step):" in one[2], one[2]
assert "convergence factor" in one[2], one[2]

same(one, run(2, "layers=2," + schedule), "layers=2 at 2 ranks")
same(one, run(4, "layers=4," + schedule), "layers=4 at 4 ranks")
# space=1 against space=2: one rank cutting every tensor as two ranks with space=2 do
# (tiles=2: the same spatial tiles, and as many sample tiles for the head), the same bits.
space2 = run(2, "space=2," + schedule)
same(run(1, "tiles=2," + schedule), space2, "space=1 (tiles=2) against space=2")
same(space2, run(4, "layers=2,space=2," + schedule), "space=2 against layers=2,space=2")

# Stopped after two steps and resumed from the checkpoint: the same bits as three at once.
ck = os.path.join(work, "ck")
first = mpiexec + ["-np", "2", tessel] + common[:common.index("--max-steps")] + [
    "--max-steps", "2"] + common[common.index("--max-steps") + 2:] + [
    "--plan", "layers=2," + schedule, "--checkpoint", ck]
p = subprocess.run(first, capture_output=True, text=True)
assert p.returncode == 0, p.stdout + p.stderr
resumed = os.path.join(work, "resumed")
p = subprocess.run(mpiexec + ["-np", "2", tessel, "train", "--resume", ck, "--max-steps", "3",
                              "--plan", "layers=2," + schedule, "--ncpu", "1",
                              "--save-params", resumed], capture_output=True, text=True)
assert p.returncode == 0, p.stdout + p.stderr
for path in sorted(glob.glob(os.path.join(resumed, "*.npy"))):
    with open(path, "rb") as f:
        assert f.read() == one[0][os.path.basename(path)], f"resumed: {path} differs"

# The schedule is part of the trajectory: resuming without it is refused.
p = subprocess.run(mpiexec + ["-np", "2", tessel, "train", "--resume", ck, "--max-steps", "3",
                              "--plan", "data=2"], capture_output=True, text=True)
assert p.returncode == 2, p.stdout + p.stderr
assert "trained with the MGRIT schedule 'levels=2,cf=2,iters=2,biters=2,relax=FCF,skip=0'" in \
    p.stderr, \
    p.stderr

# Against the serial executor the schedule is an approximation, close after three steps.
serial = run(1, "data=1")
for a, b in zip(steps, serial[1]):
    assert abs(a["loss"] - b["loss"]) < 1e-3 * abs(b["loss"]), (a, b)

plan = subprocess.run([tessel, "plan", "--model", "odetanh8", "--data", data, "--batch", "4",
                       "--plan", "layers=2,levels=3,cf=2", "--ranks", "2"],
                      capture_output=True, text=True)
assert plan.returncode == 0, plan.stdout + plan.stderr
assert "layer-parallel (MGRIT): 2 rank groups of 1 rank along the steps, 3 levels, cf 2" in \
    plan.stdout, plan.stdout
assert "segment of 8 steps: points per level 8, 4, 2" in plan.stdout, plan.stdout
assert "inference one sweep through the steps (infer=exact)" in plan.stdout, plan.stdout

bad = subprocess.run(mpiexec + ["-np", "1", tessel] + common + ["--plan", "levels=4,cf=2"],
                     capture_output=True, text=True)
assert bad.returncode != 0, bad.stdout
assert "coarsest level" in bad.stderr, bad.stderr
assert "epoch 1/1" not in bad.stdout, bad.stdout
print("mgrit check: bit-identical at 1, 2 and 4 ranks and with space=1 against space=2; "
      "residuals fall")
