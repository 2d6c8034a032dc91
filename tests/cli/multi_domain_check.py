#!/usr/bin/env python3
"""The multi-domain example (the zoo's dsn: each domain's encoders on its own ranks with
domains=2, the shared weights' gradients summed across them; only domain 0's labels train the
classifier) takes the one-rank run's steps at 2 and 4 ranks (per-step losses within 1e-5),
learns (the loss falls below half its start), classifies domain 0's test samples (at least
90 %) and domain 1's through the shared encoder (at least 60 %). A rank count that does not
split into the two domains is refused.

usage: multi_domain_check.py EXAMPLE MPIEXEC [MPIEXEC ARGS...]"""
import re
import subprocess
import sys

example, mpiexec = sys.argv[1], sys.argv[2:]
STEPS = 60


def run(nranks, expect=0):
    cmd = mpiexec + ["-np", str(nranks), example, str(STEPS), "3"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != expect:
        sys.exit(f"exit {p.returncode}, expected {expect}: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    losses = [float(v) for v in re.findall(r"^step \d+ loss (\S+)$", p.stdout, re.M)]
    acc = [float(v) for v in re.findall(r"^domain \d test accuracy (\S+)$", p.stdout, re.M)]
    return losses, acc, p.stdout + p.stderr


ref, ref_acc, _ = run(1)
assert len(ref) == STEPS and len(ref_acc) == 2, (ref, ref_acc)
assert ref[-1] < 0.5 * ref[0], f"the loss should fall: {ref[0]} -> {ref[-1]}"
assert ref_acc[0] >= 0.9 and ref_acc[1] >= 0.6, ref_acc
for nranks in (2, 4):
    got, acc, _ = run(nranks)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    assert len(got) == STEPS and worst < 1e-5, f"{nranks} ranks: {got} vs {ref}"
    assert acc[0] >= 0.9 and acc[1] >= 0.6, (nranks, acc)
    print(f"ok: {nranks} ranks, losses within {worst:.1e} of one rank, test accuracy {acc}")
_, _, out = run(3, expect=2)
assert "multiple of 2" in out, out
print(f"ok: one rank, loss {ref[0]:.3f} -> {ref[-1]:.3f}, test accuracy {ref_acc}; 3 ranks refused")
