#!/usr/bin/env python3
"""tessel plan's traffic estimate against what StarPU-MPI counts: for plans of every kind (data,
spatial, mixed, pipeline stages with micro-batches, buckets off, a default plan that leaves a rank
idle, filters, channels, spatial tiles of circular convolutions, domains of the multi-domain
network: views of the input crossing to their groups, shared weights' copies and gradients,
codes gathered by the loss terms, global pooling over spatial tiles), the bytes `tessel plan` says each rank sends per training step equal, within 5 % (and
8 KiB), the bytes `tessel train --comm-stats` measures on the same model, data, batch and plan
(the metrics file's per-rank sent_bytes_per_step). At 1 rank the estimate is 0 and so is the
measurement.

usage: traffic_check.py TESSEL WORKDIR NRANKS [LAUNCHER...]"""
import json
import os
import re
import shutil
import subprocess
import sys

tessel, work, nranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
launcher = sys.argv[4:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

# A segmentation network of circular (periodic) convolutions: at an edge of the input a tile's
# window takes halo slabs from the tiles at the other end too.
PERIODIC = os.path.join(work, "periodic.json")
with open(PERIODIC, "w") as f:
    json.dump({"format": "tessel-model", "version": 1, "layers": [
        {"op": "input"},
        {"name": "c1", "op": "conv", "out": 8, "kernel": 3, "padding": 1,
         "padding_mode": "circular"},
        {"op": "relu"},
        {"name": "c2", "op": "conv", "out": 8, "kernel": 5, "padding": 2,
         "padding_mode": "circular"},
        {"op": "relu"},
        {"name": "head", "op": "conv", "out": "classes", "kernel": 1}]}, f)

# Group and layer norm: per-sample statistics summed within each sample slab.
NORM = os.path.join(work, "norm.json")
with open(NORM, "w") as f:
    json.dump({"format": "tessel-model", "version": 1, "layers": [
        {"op": "input"},
        {"name": "c1", "op": "conv", "out": 8, "kernel": 3, "padding": 1},
        {"name": "gn1", "op": "group_norm", "groups": 4},
        {"op": "relu"},
        {"name": "c2", "op": "conv", "out": 8, "kernel": 3, "padding": 1},
        {"name": "ln2", "op": "layer_norm"},
        {"op": "relu"},
        {"name": "head", "op": "conv", "out": "classes", "kernel": 1}]}, f)

# Global average pooling over spatial tiles under filters=: each channel group's spatial tiles
# gather onto the group's pooled tile (channel-whole, they went to one rank: 2.5 times the
# estimate on rank 0).
POOLED = os.path.join(work, "pooled.json")
with open(POOLED, "w") as f:
    json.dump({"format": "tessel-model", "version": 1, "layers": [
        {"op": "input"},
        {"name": "c1", "op": "conv", "out": 8, "kernel": 3, "padding": 1},
        {"op": "relu"},
        {"op": "global_avgpool"},
        {"op": "flatten"},
        {"name": "fc", "op": "linear", "out": "classes"}]}, f)

# (model, data, batch, plan or None); each a few seconds at its rank count
CASES = {
    1: [("unet2d", "synthetic:dims=2,size=32,samples=8", 2, None)],
    2: [("cnn2d", "synthetic:dims=2,size=32,samples=16,labels=sample", 8, "data=2"),
        ("unet2d", "synthetic:dims=2,size=64,samples=8", 2, "space=2"),
        ("unet3d", "synthetic:dims=3,size=16,samples=4", 2, "stages=2,micro=2"),
        ("resnet", "synthetic:dims=2,size=16,samples=32,labels=sample", 8, "data=2,bucket=0"),
        ("fcn2d", "synthetic:dims=2,size=64,samples=8", 1, None),
        ("cnn2d", "synthetic:dims=2,size=32,samples=16,labels=sample", 8, "filters=2"),
        ("unet2d", "synthetic:dims=2,size=64,samples=8", 4, "filters=2"),
        (PERIODIC, "synthetic:dims=2,size=256,samples=8", 4, "space=2"),
        ("cnn2d", "synthetic:dims=2,size=32,samples=16,labels=sample", 8, "channels=2"),
        ("unet2d", "synthetic:dims=2,size=64,samples=8", 4, "channels=2"),
        (NORM, "synthetic:dims=2,size=64,samples=8", 4, "space=2"),
        (NORM, "synthetic:dims=2,size=64,samples=8", 4, "channels=2"),
        ("dsn", "synthetic:dims=2,size=64,samples=16,channels=2,labels=sample", 8, "domains=2"),
        ("dsn", "synthetic:dims=2,size=64,samples=16,channels=4,labels=sample", 8, "domains=2"),
        # global average pooling over spatial tiles: each pooled tile reads the whole map
        ("dsn", "synthetic:dims=2,size=64,samples=16,channels=2,labels=sample", 4, "space=2")],
    4: [("resnet", "synthetic:dims=2,size=16,samples=32,labels=sample", 8, "data=4"),
        ("cnn2d", "synthetic:dims=2,size=32,samples=16,labels=sample", 8, "data=2,filters=2"),
        ("cnn2d", "synthetic:dims=2,size=32,samples=16,labels=sample", 8, "filters=2,space=2"),
        (POOLED, "synthetic:dims=2,size=32,samples=16,labels=sample", 8, "filters=2,space=2"),
        ("unet2d", "synthetic:dims=2,size=64,samples=8", 2, "data=2,space=2"),
        ("unet2d", "synthetic:dims=2,size=64,samples=8", 4, "stages=4,micro=2"),
        ("cnn3d", "synthetic:dims=3,size=16,samples=8,labels=sample", 2, "space=2x2"),
        (PERIODIC, "synthetic:dims=2,size=192,samples=8", 4, "space=2x2"),
        ("cnn2d", "synthetic:dims=2,size=32,samples=16,labels=sample", 8, "channels=2,space=2"),
        ("unet2d", "synthetic:dims=2,size=64,samples=8", 4, "channels=4"),
        (NORM, "synthetic:dims=2,size=64,samples=8", 4, "data=2,space=2"),
        (NORM, "synthetic:dims=2,size=64,samples=8", 4, "channels=2,space=2"),
        ("dsn", "synthetic:dims=2,size=64,samples=16,channels=4,labels=sample", 8, "domains=4"),
        ("dsn", "synthetic:dims=2,size=64,samples=16,channels=2,labels=sample", 8,
         "domains=2,data=2"),
        ("dsn", "synthetic:dims=2,size=64,samples=16,channels=2,labels=sample", 4,
         "domains=2,space=2")],
}


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def estimate(args):
    """Per-rank MiB sent per step from tessel plan's rank table, and its summary line."""
    out = run([tessel, "plan", "--ranks", str(nranks), "--ncpu", "1"] + args)
    per = {}
    header = False
    for line in out.splitlines():
        if line.startswith("rank  tiles"):
            header = "sends per step" in line
            continue
        m = re.match(r"^(\d+)\s.*\s([0-9.]+) MiB$", line)
        if header and m:
            per[int(m.group(1))] = float(m.group(2))
    summary = [l for l in out.splitlines() if l.startswith("traffic per training step")]
    assert header and len(per) == nranks and len(summary) == 1, out
    most = re.search(r"rank (\d+) sends the most, ([0-9.]+) MiB", summary[0])
    assert most and float(most.group(2)) == max(per.values()) == per[int(most.group(1))], out
    return per


for i, (model, data, batch, plan) in enumerate(CASES[nranks]):
    args = ["--model", model, "--data", data, "--batch", str(batch), "--optimizer", "sgd"]
    if plan:
        args += ["--plan", plan]
    predicted = estimate(args)
    metrics = os.path.join(work, f"m{i}.json")
    run(launcher + [tessel, "train", "--max-steps", "3", "--seed", "1", "--comm-stats",
                    "--metrics-json", metrics] + args)
    with open(metrics) as f:
        epoch = json.load(f)["epochs"][0]
    ranks = epoch.get("ranks") or [epoch]
    measured = {r: v["sent_bytes_per_step"] / 1048576.0 for r, v in enumerate(ranks)}
    assert len(measured) == nranks, (plan, epoch)
    for r in range(nranks):
        want, got = measured[r], predicted[r]
        assert abs(got - want) <= max(0.05 * want, 8 / 1024.0), (
            f"{model} {plan or 'default plan'} on {nranks} ranks, rank {r}: estimated "
            f"{got:.3f} MiB a step, StarPU-MPI sent {want:.3f}")
    if nranks > 1:  # the check compares real traffic (a domain plan's: codes, shared weights)
        assert max(measured.values()) > (0.004 if "domains" in (plan or "") else 0.05), measured
    print(f"{model} {plan or 'default plan'}: estimated "
          f"{', '.join(f'{predicted[r]:.3f}' for r in range(nranks))} MiB, sent "
          f"{', '.join(f'{measured[r]:.3f}' for r in range(nranks))} MiB per step")
