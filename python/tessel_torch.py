"""tessel model files as PyTorch modules.

A tessel model file (docs/model-format.md) becomes a ``torch.nn.Module`` whose parameters and
buffers carry the names tessel gives them (``NAME.weight``, ``NAME.bias``,
``NAME.running_mean``, ``NAME.running_var``), so a ``tessel train --save-params DIR`` directory
loads with ``load_state_dict(strict=True)`` and a module's ``state_dict()`` saves into a
directory ``tessel train/eval --load-params`` reads.

    module = tessel_torch.build("examples/models/unet2d.json", sample_shape=(1, 64, 64), classes=3)
    tessel_torch.load_params(module, "params/")      # strict
    logits = module.eval()(x)                        # N x classes (x spatial)

Command line (``python3 python/tessel_torch.py --help``):

    check  --model FILE --sample-shape C,S... --classes K --params DIR --data DIR --outputs FILE
           the module's outputs on DIR/x_test.npy against ``tessel eval --outputs FILE``
    save   --model FILE --sample-shape ... --classes K --seed S --out DIR
           a freshly initialised module's parameters, as tessel reads them
    export-onnx --model FILE --sample-shape ... --classes K --params DIR --out FILE.onnx
           the trained network as an ONNX file (inference: batch norm with its running
           statistics, dropout off), input "x" and output "logits" with a free batch size

Only the standard library, numpy and torch are used.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- the model file ----

# Attributes each op takes and their defaults (None: required), as docs/model-format.md lists
# them. "stage" and "inputs"/"name"/"op" are taken by every layer.
_OPS = {
    "input": {"shape": "none"},
    "conv": {"out": None, "kernel": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1,
             "bias": True, "padding_mode": "zeros", "share": "unset"},
    "conv_transpose": {"out": None, "kernel": None, "stride": 1, "padding": 0, "dilation": 1,
                       "groups": 1, "bias": True, "output_padding": 0, "share": "unset"},
    "batchnorm": {"eps": 1e-5, "momentum": 0.1},
    "group_norm": {"groups": None, "eps": 1e-5, "share": "unset"},
    "layer_norm": {"eps": 1e-5, "share": "unset"},
    "instance_norm": {"eps": 1e-5, "share": "unset"},
    "relu": {}, "sigmoid": {}, "tanh": {}, "gelu": {}, "silu": {},
    "leaky_relu": {"slope": 0.01},
    "maxpool": {"kernel": None, "stride": "kernel", "padding": 0, "ceil_mode": False},
    "avgpool": {"kernel": None, "stride": "kernel", "padding": 0, "count_include_pad": True,
                "ceil_mode": False},
    "global_avgpool": {},
    "upsample_nearest": {"scale": "unset", "size": "unset"},
    "upsample_linear": {"scale": "unset", "size": "unset"},
    "concat": {}, "add": {"h": 1.0}, "sub": {}, "mul": {}, "flatten": {},
    "slice": {"start": "unset", "stop": "unset", "channels": "unset"},
    "dropout": {"p": 0.5},
    "linear": {"out": None, "bias": True, "share": "unset"},
}
_COMMON_KEYS = {"name", "op", "inputs", "stage"}


class ModelFileError(ValueError):
    """A model file this bridge cannot turn into a module (the message says where and why)."""


def _per_dim(value, nsp, where, key):
    """A per-dimension attribute as a tuple of nsp integers."""
    if isinstance(value, bool):
        raise ModelFileError(f"{where}: '{key}' must be an integer or an array of integers")
    if isinstance(value, int):
        return (value,) * nsp
    if isinstance(value, list) and len(value) == nsp and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    raise ModelFileError(f"{where}: '{key}' must be an integer or {nsp} integers")


def _layer_attrs(layer, index):
    op = layer.get("op")
    name = layer.get("name")
    where = f"layers[{index}]" + (f" '{name}'" if name else "") + f" ({op})"
    if op not in _OPS:
        raise ModelFileError(f"{where}: unknown op (this bridge knows {', '.join(sorted(_OPS))})")
    known = _OPS[op]
    for key in layer:
        if key not in known and key not in _COMMON_KEYS:
            raise ModelFileError(f"{where}: unknown key '{key}'")
    attrs = {}
    for key, default in known.items():
        if key in layer:
            attrs[key] = layer[key]
        elif default is None:
            raise ModelFileError(f"{where}: '{key}' is required")
        else:
            attrs[key] = default
    return where, attrs


def _tessel_batchnorm(base):
    """``base`` (nn.BatchNormNd) without ``num_batches_tracked``: tessel's running statistics use
    the momentum only, and its parameter files hold weight, bias, running_mean, running_var."""

    class BatchNorm(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.register_buffer("num_batches_tracked", None)

        def _load_from_state_dict(self, state_dict, prefix, local_metadata, *rest):
            # PyTorch adds a num_batches_tracked entry to state dicts of an older format (no
            # version in the metadata, as a dict of tensors read from files has none).
            local_metadata = dict(local_metadata, version=self._version)
            super()._load_from_state_dict(state_dict, prefix, local_metadata, *rest)

    BatchNorm.__name__ = base.__name__
    return BatchNorm


_BATCHNORM = {1: _tessel_batchnorm(nn.BatchNorm1d), 2: _tessel_batchnorm(nn.BatchNorm2d),
              3: _tessel_batchnorm(nn.BatchNorm3d)}


class _Node:
    """One layer of the network: what it computes and from which values."""

    def __init__(self, op, inputs, fn, shape):
        self.op, self.inputs, self.fn, self.shape = op, inputs, fn, shape


class TesselNet(nn.Module):
    """The network of a tessel model file, for one sample shape and class count.

    The parameter-owning layers are submodules at their dotted names (``layer1.0.conv1``), so
    ``state_dict()`` has tessel's parameter names. Batch norm keeps no ``num_batches_tracked``
    (tessel's running statistics use the momentum only).
    """

    def __init__(self, spec, sample_shape, classes=None):
        super().__init__()
        if not isinstance(spec, dict) or spec.get("format") != "tessel-model":
            raise ModelFileError('not a tessel model file (no "format": "tessel-model")')
        if spec.get("version") != 1:
            raise ModelFileError(f"model file version {spec.get('version')!r}: this bridge reads 1")
        layers = spec.get("layers")
        if not isinstance(layers, list) or not layers or layers[0].get("op") != "input":
            raise ModelFileError("the layers must be a non-empty array starting with the input")
        self.sample_shape = tuple(int(s) for s in sample_shape)
        self.classes = classes
        nsp = len(self.sample_shape) - 1
        if not 0 <= nsp <= 3:
            raise ModelFileError(f"sample shape {self.sample_shape}: C and 0 to 3 spatial sizes")
        self._nodes = []
        self.further_inputs = []  # (name, sample shape) of the inputs after the first
        self._owners = {}  # name -> module of the layers with parameters
        names = {}
        for index, layer in enumerate(layers):
            where, attrs = _layer_attrs(layer, index)
            op = layer["op"]
            if op == "input" and index:  # a further input: its own shape, and a name
                given = attrs["shape"]
                if ("name" not in layer or not isinstance(given, list) or not given
                        or not all(isinstance(d, int) and d >= 1 for d in given)):
                    raise ModelFileError(f'{where}: an input after the first needs a "name" '
                                         f'and "shape", its sample shape')
            default_inputs = [] if op == "input" else [index - 1]
            if "inputs" in layer:
                inputs = []
                for n in layer["inputs"]:
                    if n not in names:
                        raise ModelFileError(f"{where}: input '{n}' names no earlier layer")
                    inputs.append(names[n])
            else:
                inputs = default_inputs
            in_shapes = [self._nodes[i].shape for i in inputs]
            # "share": this layer calls the module of an earlier one (its parameters)
            self._sharing = None
            if attrs.get("share", "unset") != "unset":
                self._sharing = attrs["share"]
                if self._sharing not in self._owners:
                    raise ModelFileError(f"{where}: the shared layer '{self._sharing}' is no "
                                         f"earlier layer with parameters")
            if op == "input" and index:
                fn, shape = (lambda v: v), tuple(attrs["shape"])
                self.further_inputs.append((layer["name"], shape))
            else:
                fn, shape = self._make(op, attrs, layer.get("name"), where, in_shapes, nsp)
            self._nodes.append(_Node(op, inputs, fn, shape))
            name = layer.get("name", "input" if op == "input" else None)
            if name is not None:
                if name in names:
                    raise ModelFileError(f"{where}: the name '{name}' is used twice")
                names[name] = index
        out = spec.get("output")
        if out is None:
            self._output = len(self._nodes) - 1
        elif out in names:
            self._output = names[out]
        else:
            raise ModelFileError(f"output '{out}' names no layer")
        self._names = names
        self._output_name = out if out is not None else "(output)"
        if out is None:
            self._names[self._output_name] = self._output
        self._losses = spec.get("losses", [])
        self.output_shape = self._nodes[self._output].shape

    def _register(self, name, module, where):
        """Register a layer's module at its dotted name; a layer that shares another's
        parameters gets that layer's module instead (after checking that it is the same
        function: class, attributes and parameter shapes)."""
        if not name:
            raise ModelFileError(f"{where}: a layer with parameters needs a name")
        if self._sharing is not None:
            source = self._owners[self._sharing]
            if type(source) is not type(module) or source.extra_repr() != module.extra_repr():
                raise ModelFileError(f"{where}: shares '{self._sharing}', a different layer "
                                     f"({source} vs {module})")
            self._owners[name] = source
            return source
        parent = self
        parts = name.split(".")
        for part in parts[:-1]:
            child = parent._modules.get(part)
            if child is None:
                child = nn.Module()
                parent.add_module(part, child)
            parent = child
        if parts[-1] in parent._modules:
            raise ModelFileError(f"{where}: the name '{name}' is used twice")
        parent.add_module(parts[-1], module)
        self._owners[name] = module
        return module

    def _make(self, op, a, name, where, in_shapes, nsp):
        """(function of the input values, output shape (C, spatial...)) of one layer."""
        x = in_shapes[0] if in_shapes else None
        nd = len(x) - 1 if x is not None else nsp
        conv_cls = {1: (nn.Conv1d, nn.ConvTranspose1d, nn.BatchNorm1d),
                    2: (nn.Conv2d, nn.ConvTranspose2d, nn.BatchNorm2d),
                    3: (nn.Conv3d, nn.ConvTranspose3d, nn.BatchNorm3d)}
        count = {"input": 0, "add": 2, "sub": 2, "mul": 2}.get(op, 1)
        if op == "concat":
            if not 1 <= len(in_shapes) <= 8:
                raise ModelFileError(f"{where}: concat takes one to eight inputs")
        elif op == "add":
            if not 2 <= len(in_shapes) <= 8:
                raise ModelFileError(f"{where}: add takes two to eight inputs")
        elif len(in_shapes) != count:
            raise ModelFileError(f"{where}: takes {count} input(s), has {len(in_shapes)}")

        def out_channels():
            if a["out"] == "classes":
                if self.classes is None:
                    raise ModelFileError(f'{where}: "out": "classes" needs a class count')
                return int(self.classes)
            return int(a["out"])

        if op == "input":
            return (lambda v: v), self.sample_shape
        if op in ("conv", "conv_transpose"):
            if nd < 1:
                raise ModelFileError(f"{where}: a convolution needs a spatial input")
            k = _per_dim(a["kernel"], nd, where, "kernel")
            s = _per_dim(a["stride"], nd, where, "stride")
            p = _per_dim(a["padding"], nd, where, "padding")
            d = _per_dim(a["dilation"], nd, where, "dilation")
            cin, cout = x[0], out_channels()
            if op == "conv":
                mode = a["padding_mode"]
                if mode not in ("zeros", "reflect", "replicate", "circular"):
                    raise ModelFileError(f"{where}: 'padding_mode' must be \"zeros\", "
                                         f"\"reflect\", \"replicate\" or \"circular\"")
                m = conv_cls[nd][0](cin, cout, k, s, p, d, a["groups"], a["bias"],
                                    padding_mode=mode)
                sp = tuple((x[i + 1] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1
                           for i in range(nd))
            else:
                op_ = _per_dim(a["output_padding"], nd, where, "output_padding")
                m = conv_cls[nd][1](cin, cout, k, s, p, op_, a["groups"], a["bias"], d)
                sp = tuple((x[i + 1] - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + op_[i] + 1
                           for i in range(nd))
            m = self._register(name, m, where)
            return m, (cout,) + sp
        if op == "batchnorm":
            m = _BATCHNORM[max(nd, 1)](x[0], eps=float(a["eps"]), momentum=float(a["momentum"]))
            m = self._register(name, m, where)
            return m, x
        if op == "instance_norm":
            if nd < 1:
                raise ModelFileError(f"{where}: instance_norm needs spatial dimensions, not {x}")
            cls = {1: nn.InstanceNorm1d, 2: nn.InstanceNorm2d, 3: nn.InstanceNorm3d}[nd]
            m = cls(x[0], eps=float(a["eps"]), affine=True)
            m = self._register(name, m, where)
            return m, x
        if op in ("group_norm", "layer_norm"):
            # layer norm: over features nn.LayerNorm(F); over (C, spatial...) one group
            if op == "layer_norm" and len(x) == 1:
                m = nn.LayerNorm(x[0], eps=float(a["eps"]))
            else:
                g_ = 1 if op == "layer_norm" else a["groups"]
                if not isinstance(g_, int) or isinstance(g_, bool) or g_ < 1 or x[0] % g_:
                    raise ModelFileError(f"{where}: groups {g_!r} must divide {x[0]} channels")
                m = nn.GroupNorm(g_, x[0], eps=float(a["eps"]))
            m = self._register(name, m, where)
            return m, x
        if op in ("relu", "sigmoid", "tanh"):
            return getattr(torch, op), x
        if op == "gelu":
            return (lambda v: F.gelu(v)), x
        if op == "silu":
            return (lambda v: F.silu(v)), x
        if op == "leaky_relu":
            slope = float(a["slope"])
            return (lambda v: F.leaky_relu(v, slope)), x
        if op in ("maxpool", "avgpool"):
            k = _per_dim(a["kernel"], nd, where, "kernel")
            s = k if a["stride"] == "kernel" else _per_dim(a["stride"], nd, where, "stride")
            p = _per_dim(a["padding"], nd, where, "padding")
            ceil = bool(a["ceil_mode"])

            def size(i):  # PyTorch's output size, floor or ceil mode
                span = x[i + 1] + 2 * p[i] - k[i]
                n = (-(-span // s[i]) if ceil else span // s[i]) + 1
                return n - 1 if ceil and (n - 1) * s[i] >= x[i + 1] + p[i] else n
            sp = tuple(size(i) for i in range(nd))
            pool = getattr(F, f"{op[:3]}_pool{nd}d")
            if op == "maxpool":
                return (lambda v: pool(v, k, s, p, ceil_mode=ceil)), (x[0],) + sp
            cip = bool(a["count_include_pad"])
            return (lambda v: pool(v, k, s, p, ceil_mode=ceil, count_include_pad=cip)), \
                (x[0],) + sp
        if op == "global_avgpool":
            dims = tuple(range(2, 2 + nd))
            return (lambda v: v.mean(dim=dims, keepdim=True)), (x[0],) + (1,) * nd
        if op in ("upsample_nearest", "upsample_linear"):
            if (a["scale"] == "unset") == (a["size"] == "unset"):
                raise ModelFileError(f"{where}: one of 'scale' and 'size' is required")
            if a["size"] != "unset":
                size = _per_dim(a["size"], nd, where, "size")
            else:
                sc = _per_dim(a["scale"], nd, where, "scale")
                size = tuple(x[i + 1] * sc[i] for i in range(nd))
            if op == "upsample_nearest":
                mode = "nearest"
                extra = {}
            else:
                mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[nd]
                extra = {"align_corners": False}
            return (lambda v: F.interpolate(v, size=size, mode=mode, **extra)), (x[0],) + size
        if op == "concat":
            for sh in in_shapes[1:]:
                if sh[1:] != x[1:]:
                    raise ModelFileError(f"{where}: inputs of shapes {in_shapes} differ in space")
            return (lambda *vs: torch.cat(vs, dim=1)), (sum(sh[0] for sh in in_shapes),) + x[1:]
        if op == "slice":
            if a["channels"] != "unset":  # those channels, all of every other axis
                c = a["channels"]
                if a["start"] != "unset" or a["stop"] != "unset" or not isinstance(c, list) \
                        or len(c) != 2:
                    raise ModelFileError(f"{where}: channels [first, end] or start and stop")
                a = dict(a, start=[c[0]] + [0] * (len(x) - 1), stop=[c[1]] + list(x[1:]))
            lo, hi = a["start"], a["stop"]
            if not (isinstance(lo, list) and isinstance(hi, list) and len(lo) == len(hi) == len(x)
                    and all(0 <= b < e <= n for b, e, n in zip(lo, hi, x))):
                raise ModelFileError(f"{where}: start {lo} and stop {hi} do not fit {x}")
            box = (slice(None),) + tuple(slice(b, e) for b, e in zip(lo, hi))
            return (lambda v: v[box]), tuple(e - b for b, e in zip(lo, hi))
        if op == "dropout":  # (its masks are tessel's own draws; the same distribution)
            p_ = a["p"]
            if not isinstance(p_, (int, float)) or isinstance(p_, bool) or not 0 <= p_ < 1:
                raise ModelFileError(f"{where}: p must be in [0, 1), not {p_!r}")
            return (lambda v: F.dropout(v, p_, self.training)), x
        if op in ("sub", "mul"):
            if in_shapes[1] != in_shapes[0]:
                raise ModelFileError(f"{where}: {op} of shapes {in_shapes}")
            return (torch.sub if op == "sub" else torch.mul), in_shapes[0]
        if op == "add":
            if any(sh != in_shapes[0] for sh in in_shapes[1:]):
                raise ModelFileError(f"{where}: adds shapes {in_shapes}")
            h = a["h"]
            if not isinstance(h, (int, float)) or isinstance(h, bool) or not math.isfinite(h) \
                    or h == 0:
                raise ModelFileError(f"{where}: h must be a finite nonzero number, not {h!r}")
            if h != 1 and len(in_shapes) > 2:
                raise ModelFileError(f"{where}: h takes an add of two inputs")

            def add(*vs):
                total = vs[0] + vs[1] if h == 1 else h * vs[0] + vs[1]
                for v in vs[2:]:  # in order, as tessel adds them
                    total = total + v
                return total
            return add, x
        if op == "flatten":
            return (lambda v: torch.flatten(v, 1)), (math.prod(x),)
        if op == "linear":
            if len(x) != 1:
                raise ModelFileError(f"{where}: a linear layer needs a flat input, not {x}")
            m = nn.Linear(x[0], out_channels(), a["bias"])
            m = self._register(name, m, where)
            return m, (out_channels(),)
        raise ModelFileError(f"{where}: unknown op")  # not reached: _layer_attrs checked it

    def values(self, *xs):
        """Every layer's value for the inputs xs (one per input layer, in order), by layer name
        (the named layers; the inputs too)."""
        inputs = sum(node.op == "input" for node in self._nodes)
        if len(xs) != inputs:
            raise TypeError(f"the model has {inputs} input(s), {len(xs)} given")
        values, fed = [], iter(xs)
        for node in self._nodes:
            if node.op == "input":
                values.append(next(fed))
            else:
                values.append(node.fn(*[values[i] for i in node.inputs]))
        return {name: values[i] for name, i in self._names.items()}, values[self._output]

    def forward(self, *xs):
        return self.values(*xs)[1]

    def loss_terms(self):
        """The model file's terms between layers, as PyTorch computes them: a list of
        (weight, fn(values) -> loss) with fn of the values() dict: F.mse_loss or F.l1_loss of
        the "on" layer (default the output) against the "against" layer, detached; the
        difference, ||A^T B||_F^2 of the two flattened per sample, into both; or the similarity,
        the biased MMD^2 of the two batches with tessel's Gaussian kernel mixture, into both."""
        import torch.nn.functional as F

        def difference(a, b):
            return ((a.flatten(1).T @ b.flatten(1)) ** 2).sum()

        def similarity(a, b):
            a, b = a.flatten(1), b.flatten(1)
            sigma = torch.tensor([1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1, 5, 10, 15, 20, 25, 30,
                                  35, 100, 1e3, 1e4, 1e5, 1e6], dtype=a.dtype)
            beta = (1.0 / (2.0 * sigma ** 2)).view(-1, 1, 1)

            def kernel(x, y):  # (differences, not cdist: its gradient at 0 is not 0)
                d = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
                return torch.exp(-beta * d[None]).sum(0)
            return kernel(a, a).mean() + kernel(b, b).mean() - 2 * kernel(a, b).mean()
        fns = {"mse": lambda a, b: F.mse_loss(a, b.detach()),
               "l1": lambda a, b: F.l1_loss(a, b.detach()), "difference": difference,
               "similarity": similarity}
        terms = []
        for k, t in enumerate(self._losses):
            if "against" not in t:
                continue
            if t["loss"] not in fns or t["against"] not in self._names or \
                    t.get("on", self._output_name) not in self._names:
                raise ModelFileError(f"losses[{k}]: mse, l1, difference or similarity between "
                                     f"two named layers")
            on, against, fn = t.get("on", self._output_name), t["against"], fns[t["loss"]]
            terms.append((float(t.get("weight", 1.0)),
                          lambda v, on=on, against=against, fn=fn: fn(v[on], v[against])))
        return terms


def build(model, sample_shape, classes=None):
    """The module of a model file (a path, or the parsed JSON as a dict)."""
    if isinstance(model, (str, os.PathLike)):
        with open(model, encoding="utf-8") as f:
            model = json.load(f)
    return TesselNet(model, sample_shape, classes)


# ---- parameter directories (tessel's --save-params / --load-params) ----

def read_params(directory):
    """Every DIR/NAME.npy as a state dict {NAME: tensor}."""
    state = {}
    for entry in sorted(os.listdir(directory)):
        if entry.endswith(".npy"):
            state[entry[:-4]] = torch.from_numpy(np.load(os.path.join(directory, entry)))
    if not state:
        raise FileNotFoundError(f"{directory}: no .npy parameter files")
    return state


def load_params(module, directory):
    """Load a tessel parameter directory into the module (strict: every name, no other)."""
    module.load_state_dict(read_params(directory), strict=True)
    return module


def save_params(module, directory):
    """Write the module's state dict as DIR/NAME.npy, as tessel --load-params reads it."""
    os.makedirs(directory, exist_ok=True)
    for name, value in module.state_dict().items():
        np.save(os.path.join(directory, name + ".npy"), value.detach().cpu().numpy())


# ---- command line ----

def _shape(text):
    return tuple(int(v) for v in text.split(","))


def _check(args):
    module = build(args.model, args.sample_shape, args.classes)
    load_params(module, args.params)
    # x, and each further input NAME from NAME_test.npy beside it
    xs = [torch.from_numpy(np.load(os.path.join(args.data, f"{name}_test.npy")))
          for name in ["x"] + [n for n, _ in module.further_inputs]]
    want = np.load(args.outputs)
    module.eval()
    with torch.no_grad():
        got = torch.cat([module(*[a[i:i + args.batch] for a in xs])
                         for i in range(0, len(xs[0]), args.batch)])
    got = got.numpy()
    if got.shape != want.shape:
        print(f"check: FAILED: module outputs {got.shape}, tessel's {want.shape}")
        return 1
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max()) / scale
    ok = err <= args.tolerance and np.isfinite(got).all() and np.isfinite(want).all()
    print(f"check: {'passed' if ok else 'FAILED'}: {got.shape[0]} samples, outputs {got.shape[1:]}, "
          f"largest difference {err:.3g} of max(1, |output|) (tolerance {args.tolerance:g})")
    return 0 if ok else 1


def _save(args):
    torch.manual_seed(args.seed)
    module = build(args.model, args.sample_shape, args.classes)
    # Batch-norm statistics away from (0, 1), so that loading them is checked too.
    with torch.no_grad():
        for name, buf in module.named_buffers():
            if name.endswith("running_mean"):
                buf.uniform_(-0.5, 0.5)
            elif name.endswith("running_var"):
                buf.uniform_(0.5, 2.0)
        for name, p in module.named_parameters():
            if name.endswith(".bias") or p.dim() == 1:
                p.uniform_(-0.5, 0.5)
    save_params(module, args.out)
    print(f"save: {len(module.state_dict())} tensors written to {args.out}")
    return 0


def _explicit_circular(conv):
    """A forward for ``conv`` (circular padding) that wraps its input by concatenating the
    slices from the other end, then convolves unpadded: the same values, and an ONNX graph of
    Slice and Concat with the right ends (Debian's torch exports circular padding's slices
    one position short)."""
    nd = conv.weight.dim() - 2
    fn = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]

    def forward(x):
        for d in range(nd):
            p, axis = int(conv.padding[d]), 2 + d
            if p:
                n = x.shape[axis]
                x = torch.cat([x.narrow(axis, n - p, p), x, x.narrow(axis, 0, p)], dim=axis)
        return fn(x, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)
    return forward


def export_onnx(module, sample_shape, path, opset=13):
    """Write ``module`` (in eval mode) as an ONNX file: input "x" of shape (batch, *sample_shape)
    (and one input per further input layer, named as the layer, of its shape) and output
    "logits", the batch size free. Batch norms fold into the convolutions before them where
    torch's exporter can."""
    module.eval()
    names = ["x"] + [name for name, _ in module.further_inputs]
    x = tuple(torch.zeros((2,) + tuple(shape))
              for shape in [sample_shape] + [shape for _, shape in module.further_inputs])
    circular = [m for m in module.modules()
                if isinstance(m, torch.nn.modules.conv._ConvNd) and m.padding_mode == "circular"]
    for m in circular:
        m.forward = _explicit_circular(m)
    try:
        torch.onnx.export(module, x, path, input_names=names, output_names=["logits"],
                          dynamic_axes=dict({n: {0: "batch"} for n in names},
                                            logits={0: "batch"}),
                          opset_version=opset)
    finally:
        for m in circular:
            del m.forward


def _export(args):
    module = build(args.model, args.sample_shape, args.classes)
    load_params(module, args.params)
    export_onnx(module, args.sample_shape, args.out, args.opset)
    print(f"export-onnx: {args.model} with {args.params} written to {args.out} (opset {args.opset})")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tessel_torch", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("check", "save", "export-onnx"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True, help="a tessel model file (.json)")
        p.add_argument("--sample-shape", type=_shape, required=True, help="C,S1,S2,... of one sample")
        p.add_argument("--classes", type=int, help='the class count ("out": "classes")')
    c = sub.choices["check"]
    c.add_argument("--params", required=True, help="a tessel --save-params directory")
    c.add_argument("--data", required=True, help="an npy: data directory (x_test.npy is read)")
    c.add_argument("--outputs", required=True, help="tessel eval --outputs FILE")
    c.add_argument("--batch", type=int, default=16)
    c.add_argument("--tolerance", type=float, default=1e-5)
    s = sub.choices["save"]
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", required=True)
    e = sub.choices["export-onnx"]
    e.add_argument("--params", required=True, help="a tessel --save-params directory")
    e.add_argument("--out", required=True, help="the .onnx file to write")
    e.add_argument("--opset", type=int, default=13)
    args = parser.parse_args(argv)
    commands = {"check": _check, "save": _save, "export-onnx": _export}
    try:
        return commands[args.command](args)
    except (ModelFileError, OSError, RuntimeError) as e:
        print(f"tessel_torch: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
