#!/usr/bin/env python3
"""Compare `tessel plan --plan auto --json` predictions with `tessel bench` measurements
(bench/auto_plan.sh): a markdown row per candidate (predicted, measured median of both sweeps'
medians, binding term), Kendall tau-b of predicted against measured, and the chosen plan's
measured time against the best measured.

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
    runs = [json.load(open(f))["results"][0]["median"]
            for f in sorted(glob.glob(f"{prefix}-{name}-[12].json"))]
    if runs:
        rows.append((p["plan"], p["seconds"], statistics.median(runs), min(runs), max(runs),
                     p["binding"], p["peak_bytes"]))


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


print("| plan | predicted s/step | measured s/step (sweeps' min-max) | binding | predicted peak MiB |")
print("|---|---|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]:.4g} | {r[2]:.4g} ({r[3]:.4g}-{r[4]:.4g}) | {r[5]} | "
          f"{r[6] / 1048576:.1f} |")
if len(rows) >= 2:
    tau = kendall_tau_b([r[1] for r in rows], [r[2] for r in rows])
    best = min(rows, key=lambda r: r[2])
    chosen = rows[0]  # the ranking's first: the choice
    print(f"\nKendall tau-b {tau:.2f} over {len(rows)} plans; chosen {chosen[0]} measured "
          f"{chosen[2]:.4g} s/step, best measured {best[0]} {best[2]:.4g} "
          f"({100 * (chosen[2] / best[2] - 1):+.1f} %)")
