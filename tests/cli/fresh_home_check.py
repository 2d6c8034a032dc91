#!/usr/bin/env python3
"""Ranks of one node starting together with a fresh StarPU home: StarPU's first start measures
the memory bus and writes its files there, and ranks reading each other's half-written files
made StarPU abort (about half of the 8-rank starts on the 2-core CI machine). Every start
must succeed: RUNS times `tessel info` on RANKS ranks, each with a new, empty STARPU_HOME.

usage: fresh_home_check.py TESSEL WORKDIR RANKS RUNS MPIEXEC [MPIEXEC ARGS...]"""
import os
import shutil
import subprocess
import sys

tessel, work, ranks, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
mpiexec = sys.argv[5:]
shutil.rmtree(work, ignore_errors=True)
for run in range(runs):
    home = os.path.join(work, f"home-{run}")
    os.makedirs(home)
    env = dict(os.environ, STARPU_HOME=home)
    cmd = mpiexec + ["-np", str(ranks), tessel, "info"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0 or f"MPI ranks: {ranks}" not in p.stdout:
        sys.exit(f"start {run + 1} of {runs} failed ({p.returncode}): {' '.join(cmd)}\n"
                 f"{p.stdout}\n{p.stderr[-3000:]}")
    shutil.rmtree(home)
print(f"{runs} starts of {ranks} ranks with a fresh StarPU home: all succeeded")
