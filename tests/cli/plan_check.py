#!/usr/bin/env python3
"""tessel train --plan: a U-Net trained on 2 ranks with spatial plans (halo exchange) and a
data plan takes the same steps as the one-rank run (per-step losses equal within float
rounding), and the rank-0 summary names the plan. With --rank-report --comm-stats, every rank
gets a line and an entry in the metrics file, the summary's figures are the largest rank's, and
the bytes the ranks sent add up to the bytes they received.

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


def losses(prefix, plan, extra=()):
    path = os.path.join(work, f"{plan or 'one-rank'}.json")
    cmd = prefix + [tessel] + common + ["--metrics-json", path] + (["--plan", plan] if plan else [])
    p = subprocess.run(cmd + list(extra), capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    if plan:
        assert f"plan {plan}" in p.stdout, p.stdout
    with open(path) as f:
        metrics = json.load(f)
    if extra:
        check_rank_report(p.stdout, metrics)
    return metrics["step_losses"]


def check_rank_report(out, metrics):
    epoch = metrics["epochs"][-1]
    ranks = epoch["ranks"]
    assert len(ranks) == 2, ranks
    for r in range(2):
        assert f"  rank {r}: peak memory " in out, out
        assert ranks[r]["buffer_peak_mib"] > 0 and ranks[r]["tile_memory_mib"] > 0, ranks
    for key in ("peak_memory_mib", "tile_memory_mib", "buffer_peak_mib"):
        assert abs(epoch[key] - max(v[key] for v in ranks)) < 1e-3, (key, epoch, ranks)
    sent = sum(v["sent_bytes_per_step"] for v in ranks)
    received = sum(v["received_bytes_per_step"] for v in ranks)
    assert sent > 0 and abs(sent - received) <= len(ranks), ranks  # per-step means, rounded
    assert epoch["sent_bytes_per_step"] == max(v["sent_bytes_per_step"] for v in ranks), epoch


ref = losses([], None)
assert len(ref) == 6, ref
for plan in ["space=2", "space=1x2,tiles=2", "data=2"]:
    extra = ["--rank-report", "--comm-stats"] if plan == "space=2" else []
    got = losses(mpiexec + ["-np", "2"], plan, extra)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    assert len(got) == len(ref) and worst < 1e-5, f"{plan}: {got} vs {ref}"
    print(f"ok: plan {plan} on 2 ranks, per-step losses within {worst:.1e} of one rank")
