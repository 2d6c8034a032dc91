"""The PyTorch bridge (python/tessel_torch.py) against tessel itself.

For every network of examples/models/ and a model file that uses the ops the zoo leaves out,
on random data: tessel trains two SGD steps (so weights and batch-norm statistics are no
longer their initial values) and saves the parameters; `tessel eval --outputs` writes the
test outputs; the bridge builds the module, loads the parameters with strict=True and must
give the same outputs. Also: the outputs of a 2-rank spatial plan, the other direction
(parameters saved from the module, loaded by tessel eval), and one SGD step of tessel against
PyTorch's from the same parameters (an ODE network with h != 1, the ResNet).

usage: bridge_check.py TESSEL_CLI WORKDIR MPIEXEC
Exit 77 (a skip for ctest) when torch cannot be imported.
"""

import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

try:
    import numpy as np
    import torch  # noqa: F401
except ImportError as e:
    print(f"bridge_check: skipped: {e} (install with scripts/install-bridge-deps.sh)")
    sys.exit(77)

import tessel_torch  # noqa: E402

# Every op the zoo does not use, with non-default attributes.
OPS_MODEL = {
    "format": "tessel-model", "version": 1,
    "description": "every op and attribute the zoo leaves out",
    "layers": [
        {"name": "input", "op": "input"},
        {"name": "c1", "op": "conv", "out": 6, "kernel": [3, 5], "stride": [1, 2],
         "padding": [2, 2], "dilation": [2, 1]},
        {"name": "b1", "op": "batchnorm", "eps": 1e-3, "momentum": 0.3},
        {"name": "a1", "op": "leaky_relu", "slope": 0.2},
        {"name": "r1", "op": "conv", "out": 6, "kernel": [5, 3], "padding": [2, 1],
         "padding_mode": "reflect"},
        {"name": "gn", "op": "group_norm", "groups": 3, "eps": 1e-4},
        {"name": "gn_relu", "op": "relu"},
        {"name": "inorm", "op": "instance_norm", "eps": 1e-3},
        {"name": "g1", "op": "conv", "out": 6, "kernel": 3, "padding": 1, "groups": 3,
         "bias": False, "padding_mode": "replicate"},
        {"name": "g1_again", "op": "conv", "out": 6, "kernel": 3, "padding": 1, "groups": 3,
         "bias": False, "padding_mode": "replicate", "share": "g1"},
        {"name": "inorm_again", "op": "instance_norm", "eps": 1e-3, "share": "inorm"},
        {"name": "w1", "op": "conv", "out": 6, "kernel": [3, 5], "padding": [1, 2],
         "padding_mode": "circular"},
        {"name": "gelu", "op": "gelu"},
        {"op": "silu"},
        {"name": "ap", "op": "avgpool", "kernel": 3, "stride": 2, "padding": 1,
         "count_include_pad": False},
        {"name": "t1", "op": "conv_transpose", "out": 4, "kernel": 3, "stride": 2,
         "padding": 1, "output_padding": 1},
        {"name": "sig", "op": "sigmoid"},
        {"name": "mp", "op": "maxpool", "kernel": 2, "inputs": ["a1"]},
        {"name": "un", "op": "upsample_nearest", "scale": 2},
        {"name": "tanh", "op": "tanh", "inputs": ["gelu"]},
        {"name": "cat", "op": "concat", "inputs": ["sig", "un", "tanh"]},
        {"name": "p2", "op": "maxpool", "kernel": 2, "stride": 2},
        {"name": "down", "op": "upsample_nearest", "size": [5, 3]},
        {"name": "odd", "op": "upsample_linear", "size": [8, 4]},
        {"name": "ul", "op": "upsample_linear", "scale": [2, 2]},
        {"name": "sum", "op": "add", "inputs": ["ul", "cat", "ul"]},
        {"name": "gate", "op": "mul", "inputs": ["sum", "cat"]},
        {"name": "diff", "op": "sub", "inputs": ["gate", "ul"]},
        {"name": "b2", "op": "batchnorm"},
        {"op": "relu"},
        {"op": "global_avgpool"},
        {"op": "flatten"},
        {"name": "h", "op": "linear", "out": 10, "bias": False},
        {"name": "ln", "op": "layer_norm"},
        {"name": "fc", "op": "linear", "out": "classes"},
    ],
}

# (model file, sample shape) of each case.
CASES = [
    ("cnn.json", (1, 28, 28)),
    ("cnn1d.json", (2, 40)),
    ("cnn2d.json", (1, 16, 16)),
    ("cnn3d.json", (1, 8, 8, 8)),
    ("fcn2d.json", (2, 12, 12)),
    ("resnet.json", (3, 16, 16)),
    ("unet2d.json", (1, 16, 16)),
    ("unet3d.json", (1, 8, 8, 8)),
    ("ops.json", (3, 16, 16)),
    ("odetanh8.json", (2, 12, 12)),
    ("dsn.json", (2, 12, 12)),
    ("inputs.json", (2, 12, 12)),
]

# Training steps against PyTorch's (the backward and the update, not only the forward): an ODE
# network whose residual steps u + h F(u) have h != 1 and the ResNet, under every optimizer
# setting of tessel train: (model, sample shape, steps, tessel's optimizer options, the
# torch.optim class and its arguments). Adam's steps divide by the root of the squared gradients'
# average: on the ResNet, whose deepest weights get gradients near 0, rounding differences of
# 1e-7 in a gradient move such a weight by up to 1e-4 after 3 steps, so Adam is checked on the
# ODE network.
STEP_CASES = [
    ("odetanh8.json", (2, 12, 12), 1, ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0"],
     "SGD", {"lr": 0.1}),
    ("resnet.json", (3, 16, 16), 1, ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0"],
     "SGD", {"lr": 0.1}),
    ("odetanh8.json", (2, 12, 12), 3,
     ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--nesterov", "--weight-decay",
      "0.01"],
     "SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("resnet.json", (3, 16, 16), 3,
     ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.5", "--dampening", "0.3",
      "--weight-decay", "0.001"],
     "SGD", {"lr": 0.05, "momentum": 0.5, "dampening": 0.3, "weight_decay": 0.001}),
    ("odetanh8.json", (2, 12, 12), 3,
     ["--optimizer", "adam", "--lr", "0.01", "--betas", "0.8,0.99", "--eps", "1e-6",
      "--weight-decay", "0.01"],
     "Adam", {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.01}),
    ("odetanh8.json", (2, 12, 12), 3, ["--optimizer", "adamw", "--lr", "0.01", "--weight-decay",
     "0.2"],
     "AdamW", {"lr": 0.01, "weight_decay": 0.2}),
    ("odetanh8.json", (2, 12, 12), 3, ["--optimizer", "adamw", "--lr", "0.01"],
     "AdamW", {"lr": 0.01}),
    # learning-rate schedules against torch.optim.lr_scheduler's, stepped after every step
    ("resnet.json", (3, 16, 16), 3, ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9",
     "--lr-schedule", "step:2:0.3"],
     "SGD", {"lr": 0.1, "momentum": 0.9}, "StepLR", {"step_size": 2, "gamma": 0.3}),
    ("odetanh8.json", (2, 12, 12), 3, ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0",
     "--lr-schedule", "cosine:3:0.01"],
     "SGD", {"lr": 0.1}, "CosineAnnealingLR", {"T_max": 3, "eta_min": 0.01}),
    ("odetanh8.json", (2, 12, 12), 3, ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0",
     "--warmup-steps", "3"],
     "SGD", {"lr": 0.1}, "LinearLR", {"start_factor": 1 / 3, "total_iters": 2}),
    # every op the zoo leaves out (the model above, written into the work directory)
    ("ops.json", (3, 16, 16), 3, ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"],
     "SGD", {"lr": 0.05, "momentum": 0.9}),
    # --loss: soft Dice, and a weighted sum with the cross-entropy (segmentation networks)
    ("fcn2d.json", (2, 12, 12), 3, ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9",
     "--loss", "dice"],
     "SGD", {"lr": 0.1, "momentum": 0.9}),
    ("unet2d.json", (1, 16, 16), 2, ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0",
     "--loss", "cross_entropy:0.7,dice:0.5"],
     "SGD", {"lr": 0.05}),
    # the loss named in the model file ("losses"; fcn2d's layers, written into the work directory)
    ("fcn2d-losses.json", (2, 12, 12), 2, ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0"],
     "SGD", {"lr": 0.1}),
    # losses on float targets (an npy y of f32, the output's shape): MSE and L1 summed, against
    # F.mse_loss and F.l1_loss, from --loss and from the model file
    ("fcn2d.json", (2, 12, 12), 3, ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9",
     "--loss", "mse,l1:0.3"],
     "SGD", {"lr": 0.1, "momentum": 0.9}),
    ("fcn2d-l1.json", (2, 12, 12), 2, ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0"],
     "SGD", {"lr": 0.1}),
]
# a model file naming a loss on float targets
L1_SECTION = [{"loss": "l1", "weight": 2.0}]
TARGET_LOSSES = ("mse", "l1")
# the model file of the last case: fcn2d with a "losses" section
LOSSES_SECTION = [{"loss": "dice", "weight": 0.8}, {"loss": "cross_entropy"}]
# a slice of channels and rows, then pooling in ceil mode: windows past the input's end, clipped
# (max) and divided as PyTorch divides them (average, with and without the padding in the
# divisor)
CEIL_MODEL = {
    "format": "tessel-model", "version": 1,
    "layers": [
        {"op": "input"},
        {"name": "c1", "op": "conv", "out": 4, "kernel": 3, "padding": 1},
        {"op": "slice", "start": [1, 1, 0], "stop": [4, 11, 13]},  # x[:, 1:4, 1:11, 0:13]
        {"op": "maxpool", "kernel": 3, "stride": 2, "ceil_mode": True},
        {"name": "c2", "op": "conv", "out": 4, "kernel": 1},
        {"name": "ap", "op": "avgpool", "kernel": 3, "stride": 2, "padding": 1,
         "ceil_mode": True},
        {"op": "avgpool", "kernel": 3, "stride": 2, "ceil_mode": True, "count_include_pad": False},
        {"op": "flatten"},
        {"name": "fc", "op": "linear", "out": "classes"},
    ],
}
STEP_CASES.append(("ceil.json", (2, 12, 13), 3, ["--optimizer", "sgd", "--lr", "0.05",
                   "--momentum", "0.9"], "SGD", {"lr": 0.05, "momentum": 0.9}))

# loss terms between layers: a reconstruction branch against the input, a feature against
# another layer's output (taken as constant), beside the cross-entropy on the head
AUX_MODEL = {
    "format": "tessel-model", "version": 1,
    "layers": [
        {"op": "input"},
        {"name": "c1", "op": "conv", "out": 6, "kernel": 3, "padding": 1},
        {"name": "h", "op": "relu"},
        {"name": "recon", "op": "conv", "out": 2, "kernel": 3, "padding": 1},
        {"name": "feat", "op": "conv", "inputs": ["h"], "out": 6, "kernel": 3, "padding": 1},
        {"name": "bn", "op": "batchnorm"},
        {"op": "relu"},
        {"op": "maxpool", "kernel": 2, "stride": 2},
        {"op": "flatten"},
        {"name": "fc", "op": "linear", "out": "classes"},
    ],
    "losses": [{"loss": "cross_entropy"},
               {"loss": "mse", "weight": 0.5, "on": "recon", "against": "input"},
               {"loss": "l1", "weight": 0.3, "on": "feat", "against": "h"}],
}
STEP_CASES.append(("aux.json", (2, 12, 12), 3, ["--optimizer", "sgd", "--lr", "0.05",
                   "--momentum", "0.9"], "SGD", {"lr": 0.05, "momentum": 0.9}))
# the difference and the similarity of two codes (domain separation networks): shared and
# private encoders
DSN_MODEL = {
    "format": "tessel-model", "version": 1,
    "layers": [
        {"op": "input"},
        {"name": "shared_conv", "op": "conv", "out": 4, "kernel": 3, "padding": 1},
        {"op": "relu"},
        {"op": "maxpool", "kernel": 2, "stride": 2},
        {"op": "flatten"},
        {"name": "shared", "op": "linear", "out": 8},
        {"name": "private_conv", "op": "conv", "inputs": ["input"], "out": 4, "kernel": 3,
         "padding": 1},
        {"op": "relu"},
        {"op": "maxpool", "kernel": 2, "stride": 2},
        {"op": "flatten"},
        {"name": "private", "op": "linear", "out": 8},
        {"name": "sum", "op": "add", "inputs": ["shared", "private"]},
        {"name": "fc", "op": "linear", "out": "classes"},
    ],
    "losses": [{"loss": "cross_entropy"},
               {"loss": "difference", "weight": 0.02, "on": "shared", "against": "private"},
               {"loss": "similarity", "weight": 0.5, "on": "shared", "against": "private"}],
}
STEP_CASES.append(("dsn-codes.json", (2, 12, 12), 3, ["--optimizer", "sgd", "--lr", "0.05",
                   "--momentum", "0.9"], "SGD", {"lr": 0.05, "momentum": 0.9}))
# a network of three inputs: an image (the data's x), a second image b (b.npy) and a feature
# vector v (v.npy), each through its own layers, then joined
INPUTS_MODEL = {
    "format": "tessel-model", "version": 1,
    "layers": [
        {"op": "input"},
        {"name": "ca", "op": "conv", "out": 4, "kernel": 3, "padding": 1},
        {"name": "b", "op": "input", "shape": [3, 12, 12]},
        {"name": "cb", "op": "conv", "out": 4, "kernel": 3, "padding": 1, "bias": False},
        {"name": "ab", "op": "add", "inputs": ["ca", "cb"]},
        {"op": "relu"},
        {"name": "c2", "op": "conv", "out": 6, "kernel": 3, "padding": 1},
        {"op": "relu"},
        {"op": "global_avgpool"},
        {"name": "pooled", "op": "flatten"},
        {"name": "v", "op": "input", "shape": [5]},
        {"name": "lv", "op": "linear", "out": 6},
        {"name": "joined", "op": "add", "inputs": ["pooled", "lv"]},
        {"op": "relu"},
        {"name": "fc", "op": "linear", "out": "classes"},
    ],
}
STEP_CASES.append(("inputs.json", (2, 12, 12), 3, ["--optimizer", "sgd", "--lr", "0.05",
                   "--momentum", "0.9"], "SGD", {"lr": 0.05, "momentum": 0.9}))
# the zoo's multi-domain separation network of two domains (examples/models/dsn.json): slices of
# the input, shared encoders, decoder and codes, reconstruction, difference and similarity terms
STEP_CASES.append(("dsn.json", (2, 12, 12), 3, ["--optimizer", "sgd", "--lr", "0.05",
                   "--momentum", "0.9"], "SGD", {"lr": 0.05, "momentum": 0.9}))
# --loss replaces the file's terms on the batch; its terms between layers stay
STEP_CASES.append(("aux.json", (2, 12, 12), 2, ["--optimizer", "sgd", "--lr", "0.05",
                   "--momentum", "0", "--loss", "cross_entropy:0.7"], "SGD", {"lr": 0.05}))


def torch_loss(options, logits, labels, model):
    """The loss tessel train's --loss (in `options`) or else the model file's "losses" names,
    in PyTorch: the weighted sum of
    F.cross_entropy and tessel's soft Dice (1 - the mean over classes of (2 I + 1) / (sum p +
    sum g + 1), p the softmax over classes, g the one-hot labels, sums over the whole batch)."""
    import torch.nn.functional as F
    if "--loss" in options:
        spec = options[options.index("--loss") + 1]
    else:
        with open(model) as f:
            terms = json.load(f).get("losses", [{"loss": "cross_entropy"}])
        spec = ",".join(f"{t['loss']}:{t.get('weight', 1.0)}" for t in terms if "against" not in t)
    total = 0
    for term in spec.split(","):
        name, _, weight = term.partition(":")
        weight = float(weight) if weight else 1.0
        if name == "cross_entropy":
            total = total + weight * F.cross_entropy(logits, labels)
        elif name == "mse":
            total = total + weight * F.mse_loss(logits, labels)
        elif name == "l1":
            total = total + weight * F.l1_loss(logits, labels)
        else:
            p = torch.softmax(logits, dim=1)
            g = F.one_hot(labels, logits.shape[1]).movedim(-1, 1).to(p.dtype)
            axes = [0] + list(range(2, logits.dim()))
            inter, size = (p * g).sum(axes), p.sum(axes) + g.sum(axes) + 1.0
            total = total + weight * (1 - ((2 * inter + 1.0) / size).mean())
    return total
CLASSES = 3


def run(cmd, env):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode:
        print(p.stdout)
        raise SystemExit(f"bridge_check: FAILED: {' '.join(cmd)} exited {p.returncode}")
    return p.stdout


def make_data(directory, sample_shape, segmentation, seed, targets=None, further=()):
    """x and y (class labels, or f32 targets of shape `targets` per sample) of 12 and 7 samples;
    NAME.npy for each (NAME, shape) of `further` (a model's inputs after the first)."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    for split, n in (("", 12), ("_test", 7)):
        np.save(os.path.join(directory, f"x{split}.npy"),
                rng.standard_normal((n,) + sample_shape).astype(np.float32))
        for name, shape in further:
            np.save(os.path.join(directory, f"{name}{split}.npy"),
                    rng.standard_normal((n,) + tuple(shape)).astype(np.float32))
        if targets:
            y = rng.standard_normal((n,) + tuple(targets)).astype(np.float32)
        else:
            yshape = (n,) + sample_shape[1:] if segmentation else (n,)
            y = rng.integers(0, CLASSES, yshape)
        np.save(os.path.join(directory, f"y{split}.npy"), y)


def takes_targets(options, model):
    """Whether the case's loss (--loss, else the model file's) is one on float targets."""
    if "--loss" in options:
        names = [t.partition(":")[0] for t in options[options.index("--loss") + 1].split(",")]
    else:
        with open(model) as f:
            names = [t["loss"] for t in json.load(f).get("losses", [])]
    return bool(names) and names[0] in TARGET_LOSSES


def check(model, shape, params, data, outputs, what):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "python", "tessel_torch.py"), "check",
                          "--model", model, "--sample-shape", ",".join(map(str, shape)),
                          "--classes", str(CLASSES), "--params", params, "--data", data,
                          "--outputs", outputs, "--batch", "3"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(f"{what}: {out.stdout.strip()}")
    return out.returncode == 0


def step_check(cli, work, env, case_index, seed):
    """Parameters saved by the bridge; `steps` training steps (batches of 4 in order) in tessel
    and in PyTorch from them, with the case's optimizer settings: every parameter and
    batch-norm statistic after them must agree within 1e-5 of max(1, |value|)."""
    name, shape, steps, options, optim, optim_args = STEP_CASES[case_index][:6]
    schedule = STEP_CASES[case_index][6:]
    here = name in ("ops.json", "fcn2d-losses.json", "ceil.json", "fcn2d-l1.json",
                    "aux.json", "dsn-codes.json", "inputs.json")  # (work dir)
    model = os.path.join(work if here else os.path.join(ROOT, "examples", "models"), name)
    case = os.path.join(work, f"step{case_index}-" + name[:-5])
    init, after, data = case + "-init", case + "-after", case + "-data"
    run([sys.executable, os.path.join(ROOT, "python", "tessel_torch.py"), "save", "--model", model,
         "--sample-shape", ",".join(map(str, shape)), "--classes", str(CLASSES), "--seed",
         str(seed), "--out", init], env)
    module = tessel_torch.build(model, shape, CLASSES)
    make_data(data, shape, len(module.output_shape) > 1, seed=seed,
              targets=module.output_shape if takes_targets(options, model) else None,
              further=module.further_inputs)
    run([cli, "train", "--data", "npy:" + data, "--model", model, "--batch", "4", "--max-steps",
         str(steps), "--shuffle", "off", "--load-params", init, "--save-params", after] + options,
        env)
    tessel_torch.load_params(module, init)
    module.train()
    xs = torch.from_numpy(np.load(os.path.join(data, "x.npy")))
    ys = torch.from_numpy(np.load(os.path.join(data, "y.npy")))
    more = [torch.from_numpy(np.load(os.path.join(data, f"{name}.npy")))
            for name, _ in module.further_inputs]
    opt = getattr(torch.optim, optim)(module.parameters(), **optim_args)
    sched = getattr(torch.optim.lr_scheduler, schedule[0])(opt, **schedule[1]) if schedule else None
    for step in range(steps):
        opt.zero_grad()
        values, out = module.values(*[a[4 * step:4 * step + 4] for a in [xs] + more])
        loss = torch_loss(options, out, ys[4 * step:4 * step + 4], model)
        for weight, term in module.loss_terms():  # the model file's terms between layers
            loss = loss + weight * term(values)
        loss.backward()
        opt.step()
        if sched:
            sched.step()
    want = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    got = tessel_torch.read_params(after)
    worst, where = 0.0, None
    for key, value in want.items():
        err = float(np.abs(got[key].numpy() - value).max()) / max(1.0, float(np.abs(value).max()))
        if err > worst:
            worst, where = err, key
    moved = max(float(np.abs(want[k] - tessel_torch.read_params(init)[k].numpy()).max())
                for k in want)
    ok = set(got) == set(want) and worst <= 1e-5 and moved > 1e-3
    print(f"{name}, {steps} step(s) of {' '.join(options)}: {'passed' if ok else 'FAILED'}: "
          f"largest difference {worst:.3g} ({where}), parameters moved up to {moved:.3g}")
    return ok


def main():
    cli, work, mpiexec = sys.argv[1], sys.argv[2], sys.argv[3]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = dict(os.environ, STARPU_SILENT="1", STARPU_NCPU=os.environ.get("STARPU_NCPU", "1"))
    env.setdefault("STARPU_HOME", os.path.join(work, "starpu-home"))
    ops_path = os.path.join(work, "ops.json")
    with open(ops_path, "w") as f:
        json.dump(OPS_MODEL, f)
    with open(os.path.join(ROOT, "examples", "models", "fcn2d.json")) as f:
        with_losses = dict(json.load(f), losses=LOSSES_SECTION)
    with open(os.path.join(work, "fcn2d-losses.json"), "w") as f:
        json.dump(with_losses, f)
    with open(os.path.join(work, "ceil.json"), "w") as f:
        json.dump(CEIL_MODEL, f)
    with open(os.path.join(work, "aux.json"), "w") as f:
        json.dump(AUX_MODEL, f)
    with open(os.path.join(work, "dsn-codes.json"), "w") as f:
        json.dump(DSN_MODEL, f)
    with open(os.path.join(work, "inputs.json"), "w") as f:
        json.dump(INPUTS_MODEL, f)
    with open(os.path.join(work, "fcn2d-l1.json"), "w") as f:
        json.dump(dict(with_losses, losses=L1_SECTION), f)
    failures = []
    for i, (name, shape) in enumerate(CASES):
        model = (os.path.join(work, name) if name in ("ops.json", "inputs.json")
                 else os.path.join(ROOT, "examples", "models", name))
        module = tessel_torch.build(model, shape, CLASSES)
        segmentation = len(module.output_shape) > 1
        case = os.path.join(work, name[:-5])
        data, params, outputs = case + "-data", case + "-params", case + "-out.npy"
        make_data(data, shape, segmentation, seed=i, further=module.further_inputs)
        run([cli, "train", "--data", "npy:" + data, "--model", model, "--batch", "4",
             "--max-steps", "2", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9",
             "--seed", str(i + 1), "--save-params", params], env)
        run([cli, "eval", "--data", "npy:" + data, "--model", model, "--load-params", params,
             "--batch", "3", "--outputs", outputs], env)
        if not check(model, shape, params, data, outputs, name):
            failures.append(name)

    # The outputs of a spatial plan on 2 ranks are gathered whole.
    model = os.path.join(ROOT, "examples", "models", "unet2d.json")
    case = os.path.join(work, "unet2d")
    out2 = case + "-out-np2.npy"
    run(mpiexec.split() + ["2", cli, "eval", "--data", "npy:" + case + "-data", "--model", model,
                           "--load-params", case + "-params", "--batch", "3", "--plan", "space=2",
                           "--outputs", out2], env)
    if not check(model, (1, 16, 16), case + "-params", case + "-data", out2, "unet2d space=2, 2 ranks"):
        failures.append("unet2d space=2")

    # The other direction: the module's parameters, saved by the bridge, loaded by tessel.
    model, shape = ops_path, (3, 16, 16)
    case = os.path.join(work, "ops")
    saved = case + "-from-torch"
    run([sys.executable, os.path.join(ROOT, "python", "tessel_torch.py"), "save", "--model", model,
         "--sample-shape", "3,16,16", "--classes", str(CLASSES), "--seed", "5", "--out", saved], env)
    run([cli, "eval", "--data", "npy:" + case + "-data", "--model", model, "--load-params", saved,
         "--batch", "3", "--outputs", case + "-out-torch.npy"], env)
    if not check(model, shape, saved, case + "-data", case + "-out-torch.npy", "ops, from torch"):
        failures.append("ops from torch")

    # A mutation the check must catch: one weight changed after tessel's outputs were written.
    bad = case + "-params-mutated"
    shutil.copytree(case + "-params", bad)
    w = np.load(os.path.join(bad, "c1.weight.npy"))
    w.flat[0] += 0.5
    np.save(os.path.join(bad, "c1.weight.npy"), w)
    if check(model, shape, bad, case + "-data", case + "-out.npy", "ops, one weight changed (must fail)"):
        failures.append("the check passed a changed weight")

    for i, case in enumerate(STEP_CASES):
        if not step_check(cli, work, env, i, seed=21 + i):
            failures.append(f"{case[0]} training steps with {' '.join(case[3])}")

    if failures:
        print(f"bridge_check: FAILED: {', '.join(failures)}")
        return 1
    print(f"bridge_check: passed ({len(CASES)} models, a 2-rank plan, torch to tessel, "
          f"{len(STEP_CASES)} training steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
