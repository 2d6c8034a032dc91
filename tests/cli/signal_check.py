#!/usr/bin/env python3
"""tessel train stopped by a signal: SIGTERM (and SIGUSR1) sent after some steps make every
rank finish its step, write the checkpoint, the parameters and the metrics, and exit with
128 + the signal's number; resumed from that checkpoint, the run's per-step losses equal an
uninterrupted run's bit for bit. Under an MPI launcher the signal goes to one rank only (as a
scheduler may send it): the other ranks stop at the same step.

usage: signal_check.py TESSEL WORKDIR [MPIEXEC ARGS...]   (MPIEXEC prefix optional)"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

tessel, work = sys.argv[1], sys.argv[2]
prefix = sys.argv[3:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

# 48 samples in batches of 8: 6 steps per epoch; enough epochs that the run is still going
# when the signal arrives.
EPOCHS, STEPS_PER_EPOCH = 40, 6
common = ["--model", "fcn2d", "--data", "synthetic:dims=2,size=10,samples=48,classes=3,seed=5",
          "--batch", "8", "--epochs", str(EPOCHS), "--seed", "3", "--progress", "lines"]


def start(*args):
    """tessel ARGS (under the launcher, if any), its stdout and stderr merged in one pipe."""
    return subprocess.Popen(prefix + [tessel] + list(args), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(p, what, expect, before=""):
    """The rest of p's output; exits unless p ends with code `expect`."""
    text = before + p.communicate(timeout=240)[0]
    if p.returncode != expect:
        sys.exit(f"{what}: exit {p.returncode}, expected {expect}: {' '.join(p.args)}\n{text}")
    return text


def step_losses(path):
    with open(path) as f:
        return json.load(f)["step_losses"]


def children(pid):
    """The processes whose parent is `pid` (the ranks mpirun started)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return sorted(found)


def interrupted(name, sig, code):
    """Start a run, wait for a step to be done, send `sig` to the tessel process (under a
    launcher, its last rank alone), check that it exits with `code`; returns its output and
    where it wrote its checkpoint, parameters and metrics."""
    ck, params = os.path.join(work, f"{name}-ck"), os.path.join(work, f"{name}-params")
    out = os.path.join(work, f"{name}.json")
    p = start("train", *common, "--checkpoint", ck, "--metrics-json", out, "--save-params",
              params)
    lines = []
    for line in p.stdout:  # a progress line says a step is done
        lines.append(line)
        if line.startswith("epoch 1/") and " step " in line:
            break
    else:
        sys.exit(f"{name}: no progress line\n{''.join(lines)}")
    pid = p.pid
    if prefix:
        deadline = time.time() + 30
        while not (ranks := children(p.pid)) and time.time() < deadline:
            time.sleep(0.05)
        assert ranks, f"{name}: no rank processes under {p.pid}"
        pid = ranks[-1]
    os.kill(pid, sig)
    return finish(p, name, code, "".join(lines)), ck, params, out


full_path = os.path.join(work, "full.json")
finish(start("train", *common, "--metrics-json", full_path), "uninterrupted", 0)
full = step_losses(full_path)
assert len(full) == EPOCHS * STEPS_PER_EPOCH, len(full)

cases = [("term", signal.SIGTERM, 143, "SIGTERM")]
if not prefix:
    cases.append(("usr1", signal.SIGUSR1, 138, "SIGUSR1"))
for name, sig, code, signame in cases:
    text, ck, params, out = interrupted(name, sig, code)
    assert f"stopped by {signame} after step" in text, text
    assert text.count("stopped by") == 1, f"{name}: one line, on rank 0\n{text}"
    with open(out) as f:
        m = json.load(f)
    stop = len(m["step_losses"])
    assert 0 < stop < len(full), f"{name}: stopped after {stop} of {len(full)} steps"
    assert m["stopped_by"] == signame, m.get("stopped_by")
    assert m["step_losses"] == full[:stop], f"{name}: losses before the signal differ"
    with open(os.path.join(ck, "latest")) as f:
        assert f.read().strip() == f"step-{stop:012d}", f"{name}: checkpoint not at step {stop}"
    assert os.path.exists(os.path.join(params, "conv1.weight.npy")), os.listdir(params)

    rest_path = os.path.join(work, f"{name}-rest.json")
    text = finish(start("train", "--resume", ck, "--metrics-json", rest_path), f"{name} resumed", 0)
    assert f"{stop} steps taken" in text, text
    assert m["step_losses"] + step_losses(rest_path) == full, \
        f"{name}: interrupted + resumed losses differ from the uninterrupted run's"
    print(f"ok: {signame} after step {stop} of {len(full)}: exit {code}, checkpoint, parameters "
          f"and metrics written; resumed, every loss identical")
