#!/usr/bin/env python3
"""tessel train --checkpoint / --resume: a run interrupted mid-epoch (and one interrupted at
an epoch boundary) and resumed from its checkpoint gives the same per-step losses and epoch
metrics, bit for bit, as the uninterrupted run; with Adam, AdamW and SGD (momentum, Nesterov,
dampening, weight decay: every optimizer setting is in the checkpoint, and the loss), on a network
with batch norm (running statistics are part of the state). Leftovers of a crashed save do
not disturb a resume; bad checkpoints and conflicting options get clear errors.

usage: checkpoint_check.py TESSEL WORKDIR [MPIEXEC ARGS...]   (MPIEXEC prefix optional)"""
import json
import os
import shutil
import subprocess
import sys

tessel, work = sys.argv[1], sys.argv[2]
prefix = sys.argv[3:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def run(*args, expect=0):
    cmd = prefix + [tessel] + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != expect:
        sys.exit(f"exit {p.returncode}, expected {expect}: {' '.join(cmd)}\n"
                 f"{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


def metrics(path):
    with open(path) as f:
        return json.load(f)


def epochs(m):
    return [(e["train_loss"], e["train_accuracy"], e["test_loss"], e["test_accuracy"])
            for e in m["epochs"]]


# 48 samples in batches of 8: 6 steps per epoch, 18 in all.
data = "synthetic:dims=2,size=10,samples=48,classes=3,seed=5"
cases = [("adam", ["--optimizer", "adam", "--lr", "0.003"], 8),  # stops mid-epoch 2
         ("sgd", ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"], 12),  # at a boundary
         # every other optimizer setting, kept in the checkpoint and resumed
         ("adamw", ["--optimizer", "adamw", "--lr", "0.003", "--betas", "0.8,0.99", "--eps",
                    "1e-7", "--weight-decay", "0.05"], 9),
         ("nesterov", ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.8", "--nesterov",
                       "--weight-decay", "0.001"], 7),
         ("dampening", ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.8", "--dampening",
                        "0.25"], 10),
         # a learning-rate schedule is a function of the steps taken: resumed exactly too
         ("schedule", ["--optimizer", "adam", "--lr", "0.003", "--lr-schedule", "cosine:15:0.0005",
                       "--warmup-steps", "4"], 3),
         ("step-schedule", ["--optimizer", "sgd", "--lr", "0.05", "--lr-schedule", "step:5:0.5"],
          11),
         # the loss is a setting of the run too
         ("loss", ["--optimizer", "sgd", "--lr", "0.05", "--loss", "cross_entropy:0.5,dice"], 5)]
for name, opt, stop in cases:
    common = ["--model", "fcn2d", "--data", data, "--batch", "8", "--epochs", "3",
              "--seed", "11"] + opt
    full = os.path.join(work, f"{name}-full.json")
    run("train", *common, "--metrics-json", full)
    whole = metrics(full)
    assert len(whole["step_losses"]) == 18 and whole["first_step"] == 1, whole

    ck = os.path.join(work, f"{name}-ck")
    first = os.path.join(work, f"{name}-first.json")
    run("train", *common, "--max-steps", str(stop), "--checkpoint", ck,
        "--checkpoint-every", "5", "--metrics-json", first)
    snaps = sorted(d for d in os.listdir(ck) if d.startswith("step-"))
    assert snaps == [f"step-{stop:012d}"], f"only the last snapshot stays: {snaps}"
    with open(os.path.join(ck, "latest")) as f:
        assert f.read().strip() == snaps[0]
    assert os.path.exists(os.path.join(ck, snaps[0], "optimizer", "conv1.weight.step.npy"))
    assert metrics(first)["step_losses"] == whole["step_losses"][:stop]

    # What a save that crashed half-way leaves behind must not matter.
    os.makedirs(os.path.join(ck, "step-000000000099.partial", "optimizer"))
    with open(os.path.join(ck, "latest.tmp.123"), "w") as f:
        f.write("step-000000000099\n")

    # Settings come from the checkpoint; given ones must match.
    second = os.path.join(work, f"{name}-second.json")
    out = run("train", "--resume", ck, "--checkpoint", ck, "--metrics-json", second,
              "--seed", "11")
    assert f"{stop} steps taken" in out, out
    rest = metrics(second)
    assert rest["first_step"] == stop + 1, rest["first_step"]
    assert rest["step_losses"] == whole["step_losses"][stop:], \
        f"{name}: resumed losses differ\n{rest['step_losses']}\n{whole['step_losses'][stop:]}"
    assert epochs(rest) == epochs(whole), f"{name}: epoch metrics differ\n{rest}\n{whole}"
    assert sorted(d for d in os.listdir(ck) if d.startswith("step-")) == ["step-000000000018"]
    print(f"ok: {name} resumed after step {stop} of 18, identical losses and metrics")

# The optimizer's settings are in the checkpoint: a different one given at resume is refused.
ck = os.path.join(work, "adamw-ck")
with open(os.path.join(ck, "step-000000000018", "state.json")) as f:
    settings = json.load(f)["settings"]
assert settings["optimizer"] == "adamw" and settings["betas"] == [0.8, 0.99], settings
assert settings["eps"] == 1e-7 and settings["weight_decay"] == 0.05, settings
for given, flag in ((["--weight-decay", "0.01"], "--weight-decay"), (["--betas", "0.9,0.99"], "--betas"),
                    (["--eps", "1e-8"], "--eps"), (["--lr-schedule", "step:3:0.5"], "--lr-schedule"),
                    (["--warmup-steps", "2"], "--warmup-steps"), (["--loss", "dice"], "--loss")):
    out = run("train", "--resume", ck, "--epochs", "4", *given, expect=2)
    assert f"{flag} differs from the checkpoint" in out, out
with open(os.path.join(work, "loss-ck", "step-000000000018", "state.json")) as f:
    assert json.load(f)["settings"]["loss"] == "cross_entropy:0.5,dice"
# Options of another optimizer, and impossible combinations, are clear usage errors.
for bad, says in ((["--optimizer", "adam", "--nesterov"], "--nesterov is not an option"),
                  (["--optimizer", "sgd", "--betas", "0.9,0.9"], "--betas is not an option"),
                  (["--optimizer", "sgd", "--momentum", "0", "--nesterov"], "--nesterov needs"),
                  (["--optimizer", "adamw", "--betas", "0.9"], "--betas"),
                  (["--optimizer", "adamw", "--eps", "0"], "--eps"),
                  (["--optimizer", "adagrad"], "--optimizer"),
                  (["--lr-schedule", "cosine:0"], "--lr-schedule"),
                  (["--lr-schedule", "step:5:2"], "--lr-schedule"),
                  (["--lr-schedule", "linear"], "--lr-schedule"),
                  (["--lr", "0.01", "--lr-schedule", "cosine:5:0.1"], "MIN 0.1 is above --lr")):
    out = run("train", "--data", data, *bad, expect=2)
    assert says in out, (bad, out)
# A checkpoint of version 1 (before these settings were kept) resumes with their defaults.
ck = os.path.join(work, "sgd-ck")
state = os.path.join(ck, "step-000000000018", "state.json")
with open(state) as f:
    old = json.load(f)
old["version"] = 1
for key in ("weight_decay", "dampening", "nesterov", "betas", "eps"):
    del old["settings"][key]
with open(state, "w") as f:
    json.dump(old, f)
out = run("train", "--resume", ck, "--epochs", "4", "--max-steps", "19")
assert "18 steps taken" in out, out
print("ok: optimizer settings kept, conflicts and bad combinations refused, version 1 resumes")

# Errors: clear messages, non-zero exit, nothing half-done.
ck = os.path.join(work, "adam-ck")
out = run("train", "--resume", ck, "--batch", "4", expect=2)
assert "--batch differs from the checkpoint" in out, out
out = run("train", "--resume", ck, "--load-params", ck, expect=2)
assert "--resume and --load-params" in out, out
out = run("train", "--resume", os.path.join(work, "nothing-here"), expect=1)
assert "not a checkpoint directory" in out, out
snap = os.path.join(ck, "step-000000000018")
os.remove(os.path.join(snap, "optimizer", "conv2.weight.exp_avg_sq.npy"))
out = run("train", "--resume", ck, "--epochs", "4", expect=1)
assert "conv2.weight.exp_avg_sq.npy" in out, out
with open(os.path.join(snap, "state.json"), "w") as f:
    f.write('{"format": "tessel-checkpoint", "version": 1, "settings": {')
out = run("train", "--resume", ck, expect=1)
assert "not a valid checkpoint state" in out, out
print("ok: bad checkpoints and conflicting options are refused")
