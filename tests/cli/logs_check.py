#!/usr/bin/env python3
"""Quiet, honest logs: a 2-rank training run with redirected output has no carriage returns
(progress as lines, with elapsed time, total ETA and a line for the test evaluation);
--progress off leaves the epoch summaries only; --progress bar rewrites one line; a failure
every rank meets alike is printed once; and `tessel info` with neither STARPU_SILENT nor
STARPU_WORKERS_NOBIND in the environment, on a fresh StarPU home, prints exactly the lines
tessel itself prints (no StarPU warnings), while -v lets StarPU speak.

usage: logs_check.py TESSEL WORKDIR MPIEXEC [ARGS...]"""
import os
import shutil
import subprocess
import sys

tessel, work = sys.argv[1], sys.argv[2]
mpiexec = sys.argv[3:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def run(cmd, expect=0, env=None):
    # Bytes, decoded as they are: text mode would turn '\r' into '\n'.
    p = subprocess.run(cmd, capture_output=True, timeout=240, env=env)
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    if p.returncode != expect:
        sys.exit(f"exit {p.returncode}, expected {expect}: {' '.join(cmd)}\n{out}\n{err}")
    return out, err


train = [tessel, "train", "--model", "fcn2d", "--data",
         "synthetic:dims=2,size=8,samples=64,classes=3", "--batch", "8", "--epochs", "2"]

# Under a launcher, redirected: lines, never '\r'.
out, err = run(mpiexec + ["-n", "2"] + train)
assert "\r" not in out + err, f"carriage return in a redirected 2-rank log:\n{out!r}"
steps = [line for line in out.splitlines() if " step " in line]
assert steps and all("elapsed" in line and "ETA" in line for line in steps), out
assert out.count("evaluating on 64 test samples") == 2, out
assert out.count(": train loss") == 2, out
print(f"ok: 2 ranks, redirected: {len(steps)} progress lines, no carriage return")

# --comm-stats: the bytes in tessel's summaries, not StarPU-MPI's own statistics at shutdown
# (tessel turned its counts on; a user's STARPU_COMM_STATS=1 keeps them).
out, err = run(mpiexec + ["-n", "2"] + train + ["--comm-stats", "--max-steps", "3"])
assert "starpu_comm_stats" not in out + err, out + err
assert "sent" in out, out
out, err = run(mpiexec + ["-n", "2", "-x", "STARPU_COMM_STATS"] + train +
               ["--comm-stats", "--max-steps", "3"], env=dict(os.environ, STARPU_COMM_STATS="1"))
assert "starpu_comm_stats" in out + err, out + err
print("ok: --comm-stats without StarPU-MPI's shutdown statistics")

# --progress off: the summaries only.
out, _ = run(mpiexec + ["-n", "2"] + train + ["--progress", "off"])
assert " step " not in out and "evaluating" not in out and out.count(": train loss") == 2, out
# --progress bar (asked for): one line rewritten in place.
out, _ = run(train + ["--progress", "bar"])
assert "\r" in out and "elapsed" in out, out
print("ok: --progress off and --progress bar")

# A failure every rank meets alike: one line.
out, err = run(mpiexec + ["-n", "2"] + train + ["--load-params", os.path.join(work, "none")],
               expect=1)
lines = [line for line in (out + err).splitlines() if "loading parameters failed" in line]
assert len(lines) == 1, f"the failure is printed {len(lines)} times:\n{out}\n{err}"
print("ok: a failure of every rank is printed once")

# tessel info on a fresh StarPU home without STARPU_SILENT: tessel's own lines, nothing else.
env = {k: v for k, v in os.environ.items()
       if k not in ("STARPU_SILENT", "STARPU_WORKERS_NOBIND")}
env["STARPU_HOME"] = os.path.join(work, "starpu-home")
env.pop("STARPU_NCPU", None)
out, err = run([tessel, "info"], env=env)
quiet_env = dict(env, STARPU_SILENT="1", STARPU_HOME=os.path.join(work, "starpu-home-2"))
own_out, own_err = run([tessel, "info"], env=quiet_env)
assert (out + err).splitlines() == (own_out + own_err).splitlines(), \
    f"tessel info printed more than its own lines:\n{out}{err}\n-- its own --\n{own_out}{own_err}"
assert "[starpu]" not in out + err, out + err
print(f"ok: tessel info prints its {len(own_out.splitlines())} lines and no StarPU warning")
# -v: StarPU is not silenced (the user's STARPU_SILENT still wins when set).
out, err = run([tessel, "info", "-v"], env=dict(env, STARPU_HOME=os.path.join(work, "starpu-home-3")))
print(f"ok: tessel info -v: {len((out + err).splitlines())} lines")
