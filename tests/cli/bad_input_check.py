#!/usr/bin/env python3
"""tessel train on damaged or hostile input: each case ends with a clear message and an exit
code, never an abort, a hang or a silently wrong run.

- an optimizer step count of INT64_MAX in a checkpoint is refused when the checkpoint is read;
- state.json values are held to the command line's ranges (momentum, epochs, seed, ...);
- a `latest` file over 256 bytes is named as too large (not with a stale errno);
- a data spec and a model path longer than 1,023 characters are kept whole in a checkpoint
  (the run resumes), and ones longer than a checkpoint can keep are refused at start;
- labels asking for more than 2^24 classes are refused (as classes= is);
- a named pipe where a .npy file, a model file or a parameter file should be is refused at
  once.

usage: bad_input_check.py TESSEL WORKDIR [MPIEXEC ARGS...]   (MPIEXEC prefix optional)"""
import os
import resource
import shutil
import struct
import subprocess
import sys

tessel, work = sys.argv[1], sys.argv[2]
prefix = sys.argv[3:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def limit_memory():
    # A run that wrongly believes damaged input must not take the machine's memory with it.
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def run(*args, expect=0, match=None):
    cmd = prefix + [tessel] + list(args)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                           preexec_fn=limit_memory)
    except subprocess.TimeoutExpired:
        sys.exit(f"hung (killed after 120 s): {' '.join(cmd)}")
    out = p.stdout + p.stderr
    if p.returncode != expect:
        sys.exit(f"exit {p.returncode}, expected {expect}: {' '.join(cmd)}\n{out}")
    if match and match not in out:
        sys.exit(f"output lacks '{match}': {' '.join(cmd)}\n{out}")
    if "Assertion" in out or "signal 6" in out or "core dumped" in out:
        sys.exit(f"aborted: {' '.join(cmd)}\n{out}")
    return out


def write_npy(path, descr, shape, payload):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, "".join(f"{d}, " for d in shape))
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(payload)


data = "synthetic:dims=2,size=8,samples=16,classes=3,seed=5"
common = ["--model", "fcn2d", "--data", data, "--batch", "8", "--seed", "3"]

# ---- a checkpoint to damage: Adam (step counts and moments) after 2 steps ----
ck = os.path.join(work, "ck")
run("train", *common, "--epochs", "2", "--max-steps", "2", "--checkpoint", ck)
with open(os.path.join(ck, "latest")) as f:
    snapshot = os.path.join(ck, f.read().strip())


def damaged_copy(name):
    copy = os.path.join(work, name)
    shutil.copytree(ck, copy)
    with open(os.path.join(copy, "latest")) as f:
        return copy, os.path.join(copy, f.read().strip())


# An optimizer step count of INT64_MAX: the next step's count would overflow.
bad_step, snap = damaged_copy("ck-step")
step_files = sorted(f for f in os.listdir(os.path.join(snap, "optimizer")) if f.endswith(".step.npy"))
assert step_files, os.listdir(os.path.join(snap, "optimizer"))
write_npy(os.path.join(snap, "optimizer", step_files[0]), "<i8", (1,), struct.pack("<q", 2**63 - 1))
run("train", "--resume", bad_step, expect=1, match="holds the step count 9223372036854775807")
print("ok: an INT64_MAX optimizer step count is refused when the checkpoint is read")

# state.json values out of the command line's ranges.
with open(os.path.join(snapshot, "state.json")) as f:
    state = f.read()
for key, good, bad, message in [
        ('"momentum"', '"momentum": 0.90000000000000002', '"momentum": 2e6', "settings.momentum"),
        ('"epochs"', '"epochs": 2', '"epochs": 3e7', "settings.epochs"),
        ('"seed"', '"seed": "3"', '"seed": "-1"', "settings.seed"),
        ('"lr"', '"lr": 0.001', '"lr": -0.5', "settings.lr"),
        ('"batch"', '"batch": 8', '"batch": 1e300', "settings.batch"),
        ('"steps"', '"steps": 2', '"steps": 1e19', "progress.steps")]:
    assert good in state, (good, state)
    copy, snap = damaged_copy("ck-" + key.strip('"'))
    with open(os.path.join(snap, "state.json"), "w") as f:
        f.write(state.replace(good, bad))
    run("train", "--resume", copy, expect=1, match=message)
print("ok: state.json values outside the command line's ranges are refused, naming the value")

# A `latest` file longer than 256 bytes.
copy, snap = damaged_copy("ck-latest")
with open(os.path.join(copy, "latest"), "w") as f:
    f.write("step-" + "0" * 300 + "\n")
run("train", "--resume", copy, expect=1, match="larger than such a file can be")
print("ok: an oversized 'latest' is named as such")

# ---- long data specs and model paths ----
npy_dir = os.path.join(work, "npy")
os.makedirs(npy_dir)
n = 16
write_npy(os.path.join(npy_dir, "x.npy"), "<f4", (n, 1, 4, 4),
          struct.pack(f"<{n * 16}f", *[((i * 7) % 13) / 13.0 for i in range(n * 16)]))
write_npy(os.path.join(npy_dir, "y.npy"), "<i8", (n,), struct.pack(f"<{n}q", *[i % 3 for i in range(n)]))
write_npy(os.path.join(npy_dir, "x_test.npy"), "<f4", (8, 1, 4, 4), struct.pack("<128f", *[0.5] * 128))
write_npy(os.path.join(npy_dir, "y_test.npy"), "<i8", (8,), struct.pack("<8q", *[1] * 8))
model_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                          "models", "cnn.json")
if not os.path.exists(model_file):
    model_file = None
longer = "/." * 700  # 1,400 characters that name the same directory, ahead of the path
long_data = "npy:" + longer + npy_dir
long_ck = os.path.join(work, "ck-long")
args = ["--data", long_data, "--batch", "8", "--epochs", "2", "--max-steps", "1"]
if model_file:
    args += ["--model", longer + os.path.abspath(model_file)]
else:
    args += ["--model", "cnn"]
run("train", *args, "--checkpoint", long_ck)
run("train", "--resume", long_ck, match="1 steps taken")
too_long = "npy:" + "/." * 2100 + npy_dir
run("train", "--data", too_long, "--checkpoint", os.path.join(work, "ck-too-long"), expect=2,
    match="--data is longer than a checkpoint keeps")
print("ok: long data specs and model paths are kept whole; too long ones are refused at start")

# ---- labels that ask for more classes than tessel takes ----
huge = os.path.join(work, "npy-huge-label")
shutil.copytree(npy_dir, huge)
write_npy(os.path.join(huge, "y.npy"), "<i8", (n,),
          struct.pack(f"<{n}q", *[2**26 if i == 5 else i % 3 for i in range(n)]))
run("train", "--data", "npy:" + huge, "--model", "cnn", "--batch", "8", expect=1,
    match="would make 67108865 classes")
print("ok: a label of 2^26 is refused (at most 2^24 classes)")

# ---- named pipes where files should be ----
fifo_data = os.path.join(work, "npy-fifo")
shutil.copytree(npy_dir, fifo_data)
os.remove(os.path.join(fifo_data, "x.npy"))
os.mkfifo(os.path.join(fifo_data, "x.npy"))
run("train", "--data", "npy:" + fifo_data, "--model", "cnn", "--batch", "8", expect=1,
    match="not a regular file")
fifo_model = os.path.join(work, "model-fifo.json")
os.mkfifo(fifo_model)
run("train", "--data", data, "--model", fifo_model, expect=1, match="not a regular file")
params = os.path.join(work, "params")
run("train", *common, "--max-steps", "1", "--save-params", params)
victim = sorted(f for f in os.listdir(params) if f.endswith(".npy"))[0]
os.remove(os.path.join(params, victim))
os.mkfifo(os.path.join(params, victim))
run("train", *common, "--max-steps", "1", "--load-params", params, expect=1,
    match="not a regular file")
print("ok: named pipes for data, model and parameter files are refused at once")

# ---- a model of several inputs: the data feeds one ----
two_inputs = os.path.join(work, "two-inputs.json")
with open(two_inputs, "w") as f:
    f.write('{"format": "tessel-model", "version": 1, "layers": ['
            '{"op": "input"}, {"name": "c", "op": "conv", "out": 4, "kernel": 3, "padding": 1}, '
            '{"op": "flatten"}, {"name": "f", "op": "linear", "out": "classes"}, '
            '{"name": "v", "op": "input", "shape": [5]}, '
            '{"name": "g", "op": "linear", "out": "classes"}, '
            '{"name": "s", "op": "add", "inputs": ["f", "g"]}]}')
run("train", "--data", data, "--model", two_inputs, "--max-steps", "1", expect=1,
    match="input 'v': only npy directories (NAME.npy beside x.npy) and HDF5 files")
two_data = os.path.join(work, "two-inputs-data")
os.makedirs(two_data)
for split, n in (("", 16), ("_test", 8)):
    write_npy(os.path.join(two_data, f"x{split}.npy"), "<f4", (n, 1, 8, 8), bytes(4 * n * 64))
    write_npy(os.path.join(two_data, f"y{split}.npy"), "<i8", (n,),
              struct.pack(f"<{n}q", *[i % 2 for i in range(n)]))
    write_npy(os.path.join(two_data, f"v{split}.npy"), "<f4", (n, 4 if split else 5),
              bytes(4 * n * (4 if split else 5)))
run("train", "--data", "npy:" + two_data, "--model", two_inputs, "--max-steps", "1", expect=2,
    match="the data's input 'v' has 1-axis samples of 4 channels, and model")
os.remove(os.path.join(two_data, "v_test.npy"))
run("train", "--data", "npy:" + two_data, "--model", two_inputs, "--max-steps", "1", expect=1,
    match="v_test.npy")
print("ok: a model's further inputs the data lacks or shapes otherwise are refused at start")
