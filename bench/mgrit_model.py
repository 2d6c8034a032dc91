#!/usr/bin/env python3
"""A model of MGRIT's time per training step on P rank groups, from one measured number: the
serial executor's seconds per step of an N-step ODE network on one worker (bench/mgrit.sh's
first row), which gives t, the forward and backward of one step (a forward is taken as 1/3 of
it, the backward 2/3, as in the executor's flop counts).

The step as tessel runs it (src/executor/mgrit.c): F forward and B backward V-cycles of L
levels, coarsening factor M, FCF-relaxation, then one fine sweep each way. Level l has
N_l = N / M^l points spread over the P groups; a group relaxes its own points one after the
other (one worker a group), so a level's relaxation costs ceil(N_l / P) steps times
(2 (M - 1) + 1) / M, its restriction two steps per C-point (a and b); the coarsest level is a
serial sweep of N_{L-1} steps that crosses every group holding its points. Each level also
passes the C-point states between neighbouring groups: a message of latency A and S bytes at
G GB/s per relaxation. Serial: N steps forward and backward on one group; pipeline stages
(stages=P, one micro-batch) are no faster than serial.

usage: bench/mgrit_model.py SECONDS_PER_STEP N BYTES_PER_STATE [L M F B] [A_US G_GBPS]"""
import math
import sys

t_step, n, state = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
levels, cf, fwd, bwd = (int(x) for x in (sys.argv[4:8] if len(sys.argv) >= 8 else (3, 4, 2, 1)))
alpha = float(sys.argv[8]) * 1e-6 if len(sys.argv) >= 9 else 5e-6
gbps = float(sys.argv[9]) if len(sys.argv) >= 10 else 10.0
t = t_step / n  # one step's forward and backward
msg = alpha + state / (gbps * 1e9)


def cycle(p, t_one):
    """One V-cycle of one direction, each step costing t_one."""
    total = 0.0
    for l in range(levels - 1):
        points = n // cf ** l
        per_group = math.ceil(points / p)
        relax = per_group * (2 * (cf - 1) + 1) / cf
        restrict = 2 * math.ceil(points / cf / p)
        total += (relax + restrict) * t_one + 2 * msg  # neighbours exchange at once
    coarsest = n // cf ** (levels - 1)
    total += coarsest * t_one + min(p, coarsest) * msg
    return total


print(f"model: N {n}, serial {t_step:.4g} s/step (t = {t * 1e3:.3g} ms a step), L {levels}, "
      f"cf {cf}, {fwd} forward / {bwd} backward cycles, FCF; messages {alpha * 1e6:.0f} us + "
      f"{state / 1e6:.3g} MB at {gbps:g} GB/s")
print("| P | MGRIT s/step | serial s/step | speed-up |")
print("|---|---|---|---|")
for p in (1, 2, 16, 64, 256, 1024):
    if p > n:
        continue
    f = fwd * cycle(p, t / 3) + math.ceil(n / p) * t / 3
    b = bwd * cycle(p, 2 * t / 3) + math.ceil(n / p) * 2 * t / 3
    print(f"| {p} | {f + b:.4g} | {t_step:.4g} | {t_step / (f + b):.2f} |")
