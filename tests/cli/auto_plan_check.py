#!/usr/bin/env python3
"""--plan auto: tessel plan ranks the candidates from a calibration it measures once and keeps
in the StarPU home (the second run takes it from there), with clear errors for a missing
network description and a budget nothing fits; tessel train --plan auto on 2 ranks chooses a
plan on every rank alike (the run equals a run with that plan given, step for step), the
metrics file holds the predicted and the measured s/step, and tessel plan on one process then
predicts for 2 ranks from that run's calibration and network.

usage: auto_plan_check.py TESSEL WORKDIR MPIEXEC [MPIEXEC ARGS...]   (run with -np 2 appended)"""
import json
import os
import re
import shutil
import subprocess
import sys

tessel, work = sys.argv[1], sys.argv[2]
mpiexec = sys.argv[3:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
env = dict(os.environ, STARPU_HOME=os.path.join(work, "home"))
os.makedirs(env["STARPU_HOME"])
data = "synthetic:dims=2,size=24,samples=32,classes=3"


def run(cmd, expect=0):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != expect:
        sys.exit(f"exit {p.returncode}, expected {expect}: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


plan = [tessel, "plan", "--model", "fcn2d", "--data", data, "--batch", "8", "--ncpu", "1",
        "--plan", "auto", "--ranks", "2"]
out = run(plan + ["--link", "10,5"])
table = re.findall(r"^  (\S+=\S*)\s+([0-9.e+-]+)\s+([0-9.]+)\s+([0-9.]+)\s+(\w+)$", out, re.M)
assert 1 <= len(table) <= 5, out
assert [float(t[1]) for t in table] == sorted(float(t[1]) for t in table), out
chosen = re.search(r"plan auto: chose (\S+) \(predicted ([0-9.e+-]+) s/step", out)
assert chosen and chosen.group(1) == table[0][0], out
assert "calibration measured now" in out, out
assert f"plan {chosen.group(1)} on 2 ranks" in out, out  # then the chosen plan's detail
ranking = os.path.join(work, "ranking.json")
out = run(plan + ["--link", "10,5", "--json", ranking])
assert "calibration from the cache" in out, out
with open(ranking) as f:
    ranked = json.load(f)
fit = int(re.search(r"plan auto: (\d+) of (\d+) candidate plans ranked", out).group(1))
assert len(ranked["plans"]) == fit and ranked["candidates"] >= fit, ranked
assert ranked["plans"][0]["plan"] == table[0][0], ranked
secs = [p["seconds"] for p in ranked["plans"]]
assert secs == sorted(secs), secs
assert ranked["costs"]["bandwidth"] == 10e9, ranked["costs"]
assert all(ranked["costs"][k] >= 0 for k in ("task_seconds", "wait_seconds",
                                             "wait_seconds_windowed")), ranked
# another sample size is another calibration (the op costs per sample differ)
other = [a.replace("size=24", "size=16") for a in plan]
assert other != plan
out = run(other + ["--link", "10,5"])
assert "calibration measured now" in out, out
out = run(plan + ["--link", "10,5", "--objective", "memory"])
rows = re.findall(r"^  (\S+=\S*)\s+([0-9.e+-]+)\s+([0-9.]+)\s+([0-9.]+)\s+(\w+)$", out, re.M)
peaks = [float(t[2]) for t in rows]
assert peaks == sorted(peaks), out
# fcn2d's batch norm + ReLU outputs can be made again in the backward (recompute=1): the least
# memory; for time only where the plan without it does not fit (none here)
assert rows[0][0].endswith("recompute=1"), out
assert all("recompute" not in p["plan"] for p in ranked["plans"]), ranked
one = run(plan[:-1] + ["1", "--objective", "memory"])
peak = {t[0]: float(t[2]) for t in re.findall(
    r"^  (\S+=\S*)\s+([0-9.e+-]+)\s+([0-9.]+)\s+([0-9.]+)\s+(\w+)$", one, re.M)}
kept, remade = peak["data=1"], peak["recompute=1"]
budget = int(remade) + 1  # MiB beyond the overhead: the remade plan fits, the kept one not
assert remade < kept and budget < kept, one
one = run(plan[:-1] + ["1", "--mem-per-rank", str(48 + budget)])
assert "plan auto: chose recompute=1 " in one, one
# prediction beyond this machine: the scaling curves up to 8 ranks
curves = os.path.join(work, "scaling.json")
out = run(plan[:-1] + ["8", "--link", "10,5", "--scaling", curves])
assert "scaling (predicted" in out, out
with open(curves) as f:
    sc = json.load(f)
assert [p["ranks"] for p in sc["strong"]] == [1, 2, 4, 8], sc
assert all(p["batch"] == 8 for p in sc["strong"]), sc
assert [p["batch"] for p in sc["weak"]] == [8, 16, 32, 64], sc
assert all(p["seconds"] > 0 and p["plan"] for p in sc["strong"] + sc["weak"]), sc
assert sc["strong"][0]["plan"] == "data=1" or sc["strong"][0]["plan"].startswith("tiles="), sc
out = run(plan, expect=2)  # no network given, none measured yet
assert "needs the network" in out, out
out = run(plan + ["--link", "10,5", "--mem-per-rank", "49"], expect=1)
assert "fits in" in out, out

# tessel train --plan auto on 2 ranks, then with the chosen plan given
train = mpiexec + ["-np", "2", tessel, "train", "--model", "fcn2d", "--data", data, "--batch", "8",
                   "--epochs", "1", "--max-steps", "3", "--seed", "5", "--optimizer", "sgd"]
auto_json = os.path.join(work, "auto.json")
out = run(train + ["--plan", "auto", "--metrics-json", auto_json])
chosen = re.search(r"plan auto: chose (\S+) ", out)
assert chosen, out
with open(auto_json) as f:
    auto = json.load(f)
pa = auto["plan_auto"]
assert pa["plan"] == chosen.group(1), pa
assert pa["predicted_seconds_per_step"] > 0 and pa["measured_seconds_per_step"] > 0, pa
# the network and the calibration the 2-rank run measured serve tessel plan on one process
# predicting for several ranks (the ops on channel tiles, the waits between ranks); for one
# rank the one-rank calibration stays
out = run(plan)
assert "as the last run on several ranks measured it" in out, out
assert "calibration from a run on several ranks" in out, out
out = run(plan[:-1] + ["1"])
assert "calibration from the cache" in out, out
given_json = os.path.join(work, "given.json")
run(train + ["--plan", chosen.group(1), "--metrics-json", given_json])
with open(given_json) as f:
    given = json.load(f)
assert "plan_auto" not in given, given
assert auto["step_losses"] == given["step_losses"], (auto["step_losses"], given["step_losses"])
print(f"auto_plan_check: chose {chosen.group(1)}; predicted {pa['predicted_seconds_per_step']:.4g}"
      f" s/step, measured {pa['measured_seconds_per_step']:.4g}")
