"""A small ONNX evaluator in numpy (float64), written for checking what
``python/tessel_torch.py export-onnx`` writes: it runs the operators torch's exporter emits for
tessel's networks (opset 13) as the ONNX specification defines them, independently of torch
and of tessel. An operator it does not know is an error that names it.

    outputs = onnx_eval.run("model.onnx", {"x": x})      # {"logits": array}
"""

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

try:  # onnx >= 1.13
    _NP_TYPE = helper.tensor_dtype_to_np_dtype
except AttributeError:  # Debian 12's onnx 1.12
    from onnx import mapping

    def _NP_TYPE(t):
        return mapping.TENSOR_TYPE_TO_NP_TYPE[t]


class UnsupportedOp(ValueError):
    pass


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _pad_spatial(x, begin, end, value):
    width = [(0, 0), (0, 0)] + list(zip(begin, end))
    return np.pad(x, width, constant_values=value)


def _windows(xp, extent, strides, dil):
    """(N, C, *out, *k) windows of the padded input: extent per axis (dilated kernel span),
    then every stride-th start and every dil-th element inside a window."""
    n = xp.ndim - 2
    win = np.lib.stride_tricks.sliding_window_view(xp, extent, axis=tuple(range(2, 2 + n)))
    sl = ((slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides) +
          tuple(slice(None, None, d) for d in dil))
    return win[sl]


def _conv(x, w, b, a):
    n = x.ndim - 2
    strides = a.get("strides", [1] * n)
    dil = a.get("dilations", [1] * n)
    pads = a.get("pads", [0] * 2 * n)
    group = a.get("group", 1)
    xp = _pad_spatial(x, pads[:n], pads[n:], 0.0)
    k = w.shape[2:]
    extent = [(k[i] - 1) * dil[i] + 1 for i in range(n)]
    win = _windows(xp, extent, strides, dil)
    cg, mg = x.shape[1] // group, w.shape[0] // group
    parts = []
    for g in range(group):
        xg = win[:, g * cg:(g + 1) * cg]
        wg = w[g * mg:(g + 1) * mg]
        r = np.tensordot(xg, wg, axes=([1] + list(range(2 + n, 2 + 2 * n)),
                                       [1] + list(range(2, 2 + n))))
        parts.append(np.moveaxis(r, -1, 1))
    y = np.concatenate(parts, axis=1)
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * n)
    return y


def _conv_transpose(x, w, b, a):
    n = x.ndim - 2
    strides = a.get("strides", [1] * n)
    dil = a.get("dilations", [1] * n)
    pads = a.get("pads", [0] * 2 * n)
    opad = a.get("output_padding", [0] * n)
    group = a.get("group", 1)
    k = w.shape[2:]
    cg, mg = x.shape[1] // group, w.shape[1]
    size = [(x.shape[2 + i] - 1) * strides[i] + (k[i] - 1) * dil[i] + 1 + opad[i]
            for i in range(n)]
    full = np.zeros((x.shape[0], mg * group) + tuple(size))
    for g in range(group):
        xg = x[:, g * cg:(g + 1) * cg]
        for kk in np.ndindex(*k):
            wk = w[(slice(g * cg, (g + 1) * cg), slice(None)) + kk]  # cg x mg
            contrib = np.moveaxis(np.tensordot(xg, wk, axes=([1], [0])), -1, 1)
            sl = (slice(None), slice(g * mg, (g + 1) * mg)) + tuple(
                slice(kk[i] * dil[i], kk[i] * dil[i] + (x.shape[2 + i] - 1) * strides[i] + 1,
                      strides[i]) for i in range(n))
            full[sl] += contrib
    out = [size[i] - pads[i] - pads[n + i] for i in range(n)]
    y = full[(slice(None), slice(None)) + tuple(slice(pads[i], pads[i] + out[i]) for i in range(n))]
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * n)
    return y


def _pool(x, a, kind, count_include_pad=0):
    n = x.ndim - 2
    k = a["kernel_shape"]
    strides = a.get("strides", [1] * n)
    dil = a.get("dilations", [1] * n)
    pads = list(a.get("pads", [0] * 2 * n))
    ceil = a.get("ceil_mode", 0)
    extent = [(k[i] - 1) * dil[i] + 1 for i in range(n)]
    out, extra = [], []
    for i in range(n):
        span = x.shape[2 + i] + pads[i] + pads[n + i] - extent[i]
        o = (-(-span // strides[i]) if ceil else span // strides[i]) + 1
        if ceil and (o - 1) * strides[i] >= x.shape[2 + i] + pads[i]:
            o -= 1  # the last window must start inside the input or its left padding
        out.append(o)
        extra.append(max(0, (o - 1) * strides[i] + extent[i] - (x.shape[2 + i] + pads[i] +
                                                                 pads[n + i])))
    if kind == "max":
        xp = _pad_spatial(x, pads[:n], [pads[n + i] + extra[i] for i in range(n)], -np.inf)
        win = _windows(xp, extent, strides, dil)
        return win.max(axis=tuple(range(2 + n, 2 + 2 * n)))[(slice(None), slice(None)) +
                                                              tuple(slice(0, o) for o in out)]
    xp = _pad_spatial(x, pads[:n], [pads[n + i] + extra[i] for i in range(n)], 0.0)
    mask = np.ones((1, 1) + x.shape[2:])
    if count_include_pad:  # the padding counts, the ceil-mode extension past it does not
        mask = _pad_spatial(mask, pads[:n], pads[n:], 1.0)
        mask = _pad_spatial(mask, [0] * n, extra, 0.0)
    else:
        mask = _pad_spatial(mask, pads[:n], [pads[n + i] + extra[i] for i in range(n)], 0.0)
    axes = tuple(range(2 + n, 2 + 2 * n))
    cut = (slice(None), slice(None)) + tuple(slice(0, o) for o in out)
    total = _windows(xp, extent, strides, dil).sum(axis=axes)[cut]
    count = _windows(mask, extent, strides, dil).sum(axis=axes)[cut]
    return total / count


def _resize(x, a, scales, sizes):
    n = x.ndim - 2
    if sizes is not None and len(sizes):
        out = [int(v) for v in sizes[2:]]
    else:
        out = [int(math.floor(x.shape[2 + i] * scales[2 + i])) for i in range(n)]
    mode = a.get("mode", b"nearest").decode()
    ctm = a.get("coordinate_transformation_mode", b"half_pixel").decode()
    y = x
    for i in range(n):
        axis, size_in, size_out = 2 + i, x.shape[2 + i], out[i]
        scale = size_out / size_in
        dst = np.arange(size_out, dtype=np.float64)
        if ctm == "asymmetric":
            src = dst / scale
        elif ctm == "half_pixel":
            src = (dst + 0.5) / scale - 0.5
        else:
            raise UnsupportedOp(f"Resize: coordinate_transformation_mode {ctm}")
        if mode == "nearest":
            nm = a.get("nearest_mode", b"round_prefer_floor").decode()
            if nm != "floor":
                raise UnsupportedOp(f"Resize: nearest_mode {nm}")
            idx = np.clip(np.floor(src).astype(np.int64), 0, size_in - 1)
            y = np.take(y, idx, axis=axis)
        elif mode == "linear":
            lo = np.floor(src)
            frac = src - lo
            i0 = np.clip(lo.astype(np.int64), 0, size_in - 1)
            i1 = np.clip(lo.astype(np.int64) + 1, 0, size_in - 1)
            shape = [1] * y.ndim
            shape[axis] = size_out
            frac = frac.reshape(shape)
            y = np.take(y, i0, axis=axis) * (1 - frac) + np.take(y, i1, axis=axis) * frac
        else:
            raise UnsupportedOp(f"Resize: mode {mode}")
    return y


def _slice(x, starts, ends, axes, steps):
    axes = list(range(len(starts))) if axes is None else [int(v) for v in axes]
    steps = [1] * len(starts) if steps is None else [int(v) for v in steps]
    sl = [slice(None)] * x.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        sl[ax % x.ndim] = slice(int(s), int(e), st)
    return x[tuple(sl)]


def _pad(x, pads, value, mode):
    r = x.ndim
    widths = [(int(pads[i]), int(pads[r + i])) for i in range(r)]
    if mode in ("reflect", "edge"):  # numpy's modes of the same names: x[-i] = x[i], x[0]
        return np.pad(x, widths, mode=mode)
    if mode != "constant":
        raise UnsupportedOp(f"Pad: mode {mode}")
    return np.pad(x, widths, constant_values=0.0 if value is None else float(value))


_ERF = np.vectorize(math.erf)


def _node(node, ins):
    a = _attrs(node)
    op = node.op_type
    x = ins[0] if ins else None
    if op == "Conv":
        return _conv(x, ins[1], ins[2] if len(ins) > 2 else None, a)
    if op == "ConvTranspose":
        return _conv_transpose(x, ins[1], ins[2] if len(ins) > 2 else None, a)
    if op == "BatchNormalization":
        scale, bias, mean, var = ins[1:5]
        shape = (1, -1) + (1,) * (x.ndim - 2)
        return ((x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + a.get("epsilon", 1e-5)) *
                scale.reshape(shape) + bias.reshape(shape))
    if op == "InstanceNormalization":  # per (sample, channel) over the remaining axes
        scale, bias = ins[1:3]
        axes = tuple(range(2, x.ndim))
        mean = x.mean(axis=axes, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        return ((x - mean) / np.sqrt(var + a.get("epsilon", 1e-5)) * scale.reshape(shape) +
                bias.reshape(shape))
    if op == "Pow":
        return np.power(ins[0], ins[1])
    if op == "Sqrt":
        return np.sqrt(x)
    if op == "Relu":
        return np.maximum(x, 0.0)
    if op == "LeakyRelu":
        return np.where(x >= 0, x, a.get("alpha", 0.01) * x)
    if op == "Sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if op == "Tanh":
        return np.tanh(x)
    if op == "Erf":
        return _ERF(x)
    if op in ("Add", "Sub", "Mul", "Div"):
        f = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op]
        return f(ins[0], ins[1])
    if op == "MaxPool":
        return _pool(x, a, "max")
    if op == "AveragePool":
        return _pool(x, a, "avg", a.get("count_include_pad", 0))
    if op == "GlobalAveragePool":
        return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True)
    if op == "ReduceMean":
        axes = a.get("axes")
        return x.mean(axis=None if axes is None else tuple(axes), keepdims=bool(a.get("keepdims", 1)))
    if op == "Flatten":
        axis = a.get("axis", 1)
        return x.reshape((int(np.prod(x.shape[:axis])), -1))
    if op == "Gemm":
        A = ins[0].T if a.get("transA", 0) else ins[0]
        B = ins[1].T if a.get("transB", 0) else ins[1]
        y = a.get("alpha", 1.0) * (A @ B)
        return y + a.get("beta", 1.0) * ins[2] if len(ins) > 2 and ins[2] is not None else y
    if op == "MatMul":
        return ins[0] @ ins[1]
    if op == "Concat":
        return np.concatenate(ins, axis=a["axis"])
    if op == "Identity":
        return x
    if op == "Constant":
        return numpy_helper.to_array(a["value"]) if "value" in a else None
    if op == "Shape":
        return np.array(x.shape, dtype=np.int64)
    if op == "ConstantOfShape":
        value = numpy_helper.to_array(a["value"]) if "value" in a else np.zeros(1, np.float32)
        return np.full([int(v) for v in x], value.reshape(-1)[0], dtype=value.dtype)
    if op == "Gather":
        return np.take(x, ins[1].astype(np.int64), axis=a.get("axis", 0))
    if op == "Unsqueeze":  # opset 13: the axes are an input
        axes = [int(v) % (x.ndim + len(ins[1])) for v in ins[1]]
        return np.expand_dims(x, tuple(sorted(axes)))
    if op == "Transpose":
        return np.transpose(x, a.get("perm"))
    if op == "Cast":
        return x.astype(_NP_TYPE(a["to"]))
    if op == "Slice":
        return _slice(x, ins[1], ins[2], ins[3] if len(ins) > 3 else None,
                      ins[4] if len(ins) > 4 else None)
    if op == "Resize":
        return _resize(x, a, ins[2] if len(ins) > 2 else None, ins[3] if len(ins) > 3 else None)
    if op == "Pad":
        return _pad(x, ins[1], ins[2] if len(ins) > 2 else None, a.get("mode", b"constant").decode())
    if op == "Reshape":
        return x.reshape([x.shape[i] if v == 0 else int(v) for i, v in enumerate(ins[1])])
    raise UnsupportedOp(f"operator {op} (node {node.name})")


def run(path, feeds):
    """The graph's outputs, by name, for the inputs `feeds` (name -> array), in float64."""
    model = onnx.load(path)
    onnx.checker.check_model(model)
    values = {}
    for t in model.graph.initializer:
        v = numpy_helper.to_array(t)
        values[t.name] = v.astype(np.float64) if v.dtype.kind == "f" else v
    for name, v in feeds.items():
        values[name] = np.asarray(v, dtype=np.float64)
    for node in model.graph.node:
        ins = [values[i] if i else None for i in node.input]
        ins = [v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v
               for v in ins]
        values[node.output[0]] = _node(node, ins)
    return {o.name: values[o.name] for o in model.graph.output}
