#!/usr/bin/env python3
"""Compare `tessel plan --plan auto --json` predictions with `tessel bench` measurements
(bench/auto_plan.sh): a markdown row per candidate (predicted, measured median of both sweeps'
medians, binding term, predicted and measured peak of a rank's buffers), Kendall tau-b of
predicted against measured, the chosen plan's measured time against the best measured, and the
peak's prediction error.

usage: auto_plan.py RANKING.json PREFIX   (PREFIX-<plan>-<pass>.json: tessel bench --json)"""
import glob
import json
import re
import statistics
import sys

ranking = json.load(open(sys.argv[1]))
prefix = sys.argv[2]
rows = []
for p in ranking["plans"]:
    name = re.sub(r"[^a-zA-Z0-9]", "_", p["plan"])
    results = [json.load(open(f))["results"][0]
               for f in sorted(glob.glob(f"{prefix}-{name}-[12].json"))]
    runs = [r["median"] for r in results]
    peaks = [r["buffer_peak_mib"] for r in results if "buffer_peak_mib" in r]
    if runs:
        rows.append((p["plan"], p["seconds"], statistics.median(runs), min(runs), max(runs),
                     p["binding"], p["peak_bytes"], max(peaks) if peaks else None))


def kendall_tau_b(x, y):
    conc = disc = tx = ty = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif (dx > 0) == (dy > 0):
                conc += 1
            else:
                disc += 1
    denom = ((conc + disc + tx) * (conc + disc + ty)) ** 0.5
    return (conc - disc) / denom if denom else float("nan")


print("| plan | predicted s/step | measured s/step (sweeps' min-max) | binding | "
      "peak MiB predicted / measured | error |")
print("|---|---|---|---|---|---|")
errors = []
for r in rows:
    predicted = r[6] / 1048576
    if r[7]:
        errors.append(predicted / r[7] - 1)
        peak = f"{predicted:.1f} / {r[7]:.1f} | {100 * errors[-1]:+.0f} %"
    else:
        peak = f"{predicted:.1f} / - | -"
    print(f"| {r[0]} | {r[1]:.4g} | {r[2]:.4g} ({r[3]:.4g}-{r[4]:.4g}) | {r[5]} | {peak} |")
if len(rows) >= 2:
    tau = kendall_tau_b([r[1] for r in rows], [r[2] for r in rows])
    best = min(rows, key=lambda r: r[2])
    chosen = rows[0]  # the ranking's first: the choice
    print(f"\nKendall tau-b {tau:.2f} over {len(rows)} plans; chosen {chosen[0]} measured "
          f"{chosen[2]:.4g} s/step, best measured {best[0]} {best[2]:.4g} "
          f"({100 * (chosen[2] / best[2] - 1):+.1f} %)")
if errors:
    within = sum(1 for e in errors if abs(e) <= 0.15)
    print(f"Peak of a rank's buffers: predicted within 15 % of measured for {within} of "
          f"{len(errors)} plans (errors {100 * min(errors):+.0f} % to {100 * max(errors):+.0f} %)")
