#!/usr/bin/env python3
"""tessel train stopped by a signal: SIGTERM (and SIGUSR1) sent once the metrics stream shows
a step make every rank finish its step, write the checkpoint, the parameters and the metrics,
and exit with 128 + the signal's number; resumed from that checkpoint, the run's per-step
losses equal an uninterrupted run's bit for bit, and the metrics stream (FILE.jsonl) goes on
where the checkpoint stands, dropping records written after it. Under an MPI launcher the
signal goes to one rank only (as a scheduler may send it): the other ranks stop at the same
step.

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


def start(*args, log=None):
    """tessel ARGS (under the launcher, if any), its stdout and stderr merged in one pipe, or
    written to the open file `log`."""
    return subprocess.Popen(prefix + [tessel] + list(args), stdout=log or subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(p, what, expect, log=None):
    """p's output (from `log` if given); exits unless p ends with code `expect`."""
    text = p.communicate(timeout=240)[0]
    if log:
        log.seek(0)
        text = log.read()
    if p.returncode != expect:
        sys.exit(f"{what}: exit {p.returncode}, expected {expect}: {' '.join(p.args)}\n{text}")
    return text


def step_losses(path):
    with open(path) as f:
        return json.load(f)["step_losses"]


def records(path):
    """The metrics stream's records (the JSON lines of the .jsonl next to `path`)."""
    with open(path[:-len(".json")] + ".jsonl") as f:
        return [json.loads(line) for line in f]


def of_kind(recs, kind):
    return [r for r in recs if r["record"] == kind]


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
    log = open(os.path.join(work, f"{name}.log"), "w+")
    p = start("train", *common, "--checkpoint", ck, "--metrics-json", out, "--save-params",
              params, log=log)
    stream, deadline = out[:-len(".json")] + ".jsonl", time.time() + 120
    while time.time() < deadline and p.poll() is None:  # until the stream shows a step
        if os.path.exists(stream) and '"record": "step"' in open(stream).read():
            break
        time.sleep(0.02)
    else:
        sys.exit(f"{name}: no step record in {stream}\n{finish(p, name, p.poll(), log)}")
    pid = p.pid
    if prefix:
        deadline = time.time() + 30
        while not (ranks := children(p.pid)) and time.time() < deadline:
            time.sleep(0.05)
        assert ranks, f"{name}: no rank processes under {p.pid}"
        pid = ranks[-1]
    os.kill(pid, sig)
    return finish(p, name, code, log), ck, params, out


full_path = os.path.join(work, "full.json")
finish(start("train", *common, "--metrics-json", full_path), "uninterrupted", 0)
full = step_losses(full_path)
assert len(full) == EPOCHS * STEPS_PER_EPOCH, len(full)
full_records = records(full_path)
assert [r["loss"] for r in of_kind(full_records, "step")] == full, "stream and summary differ"
assert [r["epoch"] for r in of_kind(full_records, "epoch")] == list(range(1, EPOCHS + 1))

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
    recs = records(out)
    assert [r["step"] for r in of_kind(recs, "step")] == list(range(1, stop + 1)), recs
    assert [r["loss"] for r in of_kind(recs, "step")] == full[:stop]
    assert recs[-1] == {"record": "stop", "step": stop, "signal": signame}, recs[-1]
    # What a run killed after its checkpoint leaves in the stream: a record past the
    # checkpoint's step and a line cut short. The resume drops both.
    with open(out[:-len(".json")] + ".jsonl", "a") as f:
        f.write(json.dumps({"record": "step", "step": stop + 1, "loss": 0.5}) + "\n")
        f.write('{"record": "step", "st')

    # Resumed with the same --metrics-json: the summary holds the resumed steps, the stream
    # goes on.
    text = finish(start("train", "--resume", ck, "--metrics-json", out), f"{name} resumed", 0)
    assert f"{stop} steps taken" in text, text
    assert m["step_losses"] + step_losses(out) == full, \
        f"{name}: interrupted + resumed losses differ from the uninterrupted run's"
    recs = records(out)
    assert [r["step"] for r in of_kind(recs, "step")] == list(range(1, len(full) + 1))
    assert [r["loss"] for r in of_kind(recs, "step")] == full, f"{name}: stream losses differ"
    assert [(r["epoch"], r["complete"]) for r in of_kind(recs, "epoch")] == \
        [(e, True) for e in range(1, EPOCHS + 1)], f"{name}: epoch records"
    assert len(of_kind(recs, "stop")) == 1
    print(f"ok: {signame} after step {stop} of {len(full)}: exit {code}, checkpoint, parameters "
          f"and metrics written; resumed, every loss identical, the stream continued")
