"""ONNX export (python/tessel_torch.py export-onnx) against tessel itself.

For every network of examples/models/ and the model file of every op the zoo leaves out, on
random data: tessel trains two SGD steps (weights and batch-norm statistics move from their
initial values) and saves the parameters, `tessel eval --outputs` writes the test outputs; the
bridge exports the trained network as ONNX, and an evaluator written for this test
(tests/bridge/onnx_eval.py: numpy, float64, the ONNX operators as the specification defines
them, neither torch nor tessel) runs the file on the test samples (7, not the batch of 2 the
export traced: the batch size must stay free). Its outputs must equal tessel's within 1e-5 of
max(1, |output|). A weight changed after tessel's outputs were written must fail the check.

usage: onnx_check.py TESSEL_CLI WORKDIR
Exit 77 (a skip for ctest) when torch or onnx cannot be imported.
"""

import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)

try:
    import numpy as np
    import onnx  # noqa: F401
    import torch  # noqa: F401
except ImportError as e:
    print(f"onnx_check: skipped: {e} (install with scripts/install-bridge-deps.sh)")
    sys.exit(77)

import bridge_check  # noqa: E402  (its model files, data and runner)
import onnx_eval  # noqa: E402
import tessel_torch  # noqa: E402

CASES = bridge_check.CASES + [("ceil.json", (3, 16, 16))]


def export(model, shape, params, path, env):
    bridge_check.run([sys.executable, os.path.join(ROOT, "python", "tessel_torch.py"),
                      "export-onnx", "--model", model, "--sample-shape", ",".join(map(str, shape)),
                      "--classes", str(bridge_check.CLASSES), "--params", params, "--out", path],
                     env)


def compare(path, data, outputs, what, further=()):
    feeds = {name: np.load(os.path.join(data, f"{name}_test.npy"))
             for name in ["x"] + [n for n, _ in further]}
    want = np.load(outputs)
    try:
        got = onnx_eval.run(path, feeds)["logits"]
    except onnx_eval.UnsupportedOp as e:
        print(f"{what}: FAILED: the evaluator lacks {e}")
        return False
    if got.shape != want.shape:
        print(f"{what}: FAILED: ONNX outputs {got.shape}, tessel's {want.shape}")
        return False
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max()) / scale
    ok = err <= 1e-5 and bool(np.isfinite(got).all())
    print(f"{what}: {'passed' if ok else 'FAILED'}: {got.shape[0]} samples, outputs "
          f"{got.shape[1:]}, largest difference {err:.3g} of max(1, |output|)")
    return ok


def main():
    cli, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = dict(os.environ, STARPU_SILENT="1", STARPU_NCPU=os.environ.get("STARPU_NCPU", "1"))
    env.setdefault("STARPU_HOME", os.path.join(work, "starpu-home"))
    written = {"ops.json": bridge_check.OPS_MODEL, "ceil.json": bridge_check.CEIL_MODEL,
               "inputs.json": bridge_check.INPUTS_MODEL}
    for name, content in written.items():
        with open(os.path.join(work, name), "w") as f:
            json.dump(content, f)
    failures = []
    for i, (name, shape) in enumerate(CASES):
        model = (os.path.join(work, name) if name in written
                 else os.path.join(ROOT, "examples", "models", name))
        module = tessel_torch.build(model, shape, bridge_check.CLASSES)
        case = os.path.join(work, name[:-5])
        data, params, outputs = case + "-data", case + "-params", case + "-out.npy"
        bridge_check.make_data(data, shape, len(module.output_shape) > 1, seed=40 + i,
                               further=module.further_inputs)
        bridge_check.run([cli, "train", "--data", "npy:" + data, "--model", model, "--batch", "4",
                          "--max-steps", "2", "--optimizer", "sgd", "--lr", "0.05",
                          "--momentum", "0.9", "--seed", str(i + 1), "--save-params", params],
                         env)
        bridge_check.run([cli, "eval", "--data", "npy:" + data, "--model", model,
                          "--load-params", params, "--batch", "3", "--outputs", outputs], env)
        path = case + ".onnx"
        export(model, shape, params, path, env)
        if not compare(path, data, outputs, name, module.further_inputs):
            failures.append(name)

    # A mutation the check must catch: one weight changed after tessel's outputs were written.
    model, shape = os.path.join(work, "ops.json"), (3, 16, 16)
    case = os.path.join(work, "ops")
    bad = case + "-params-mutated"
    shutil.copytree(case + "-params", bad)
    w = np.load(os.path.join(bad, "c1.weight.npy"))
    w.flat[0] += 0.5
    np.save(os.path.join(bad, "c1.weight.npy"), w)
    export(model, shape, bad, case + "-mutated.onnx", env)
    if compare(case + "-mutated.onnx", case + "-data", case + "-out.npy",
               "ops, one weight changed (must fail)"):
        failures.append("the check passed a changed weight")

    if failures:
        print(f"onnx_check: FAILED: {', '.join(failures)}")
        return 1
    print(f"onnx_check: passed ({len(CASES)} models exported and run, a changed weight caught)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
