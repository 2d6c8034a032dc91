#!/usr/bin/env python3
"""Plots of tessel's outputs, as PNG files (matplotlib, Debian's python3-matplotlib):

  tessel_plot.py metrics METRICS.json OUT.png   loss per step and per epoch, train and test
                                               accuracy per epoch (tessel train
                                               --metrics-json)
  tessel_plot.py trace TRACE.json OUT.png       a timeline of every worker of every rank, one
                                               row each, tasks coloured by pass (tessel train
                                               --trace)
  tessel_plot.py bench BENCH.json OUT.png       seconds per step of each scheduler (median,
                                               min-max bars) and the workers' busy share
                                               (tessel bench --json)
  tessel_plot.py tasks TRACE.json [TOP]         no plot: a table of where a trace's time went,
                                               per codelet and pass (tasks, total ms, mean us,
                                               share of all task time; TOP rows, default 15)
                                               and per worker (busy share of the trace's span)

Each prints what it drew. Standard library, numpy and matplotlib only."""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        return json.load(f)


def save(fig, title, out, said):
    """Titles, lays out and writes `fig` to `out`; prints `said`."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"{said} -> {out}")


def plot_metrics(src, out):
    m = load(src)
    losses = m.get("step_losses", [])
    first = m.get("first_step", 1)
    epochs = m.get("epochs", [])
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    ax_loss.plot(range(first, first + len(losses)), losses, lw=0.8, label="train loss per step")
    if epochs:
        steps_per_epoch = len(losses) / max(1, len(epochs))
        ends = [first - 1 + steps_per_epoch * (i + 1) for i in range(len(epochs))]
        ax_loss.plot(ends, [e["train_loss"] for e in epochs], "o-", label="train loss (epoch)")
        ax_loss.plot(ends, [e["test_loss"] for e in epochs], "s-", label="test loss (epoch)")
        if all(e.get("train_accuracy") is not None for e in epochs):  # (null: float targets)
            ax_acc.plot([e["epoch"] for e in epochs],
                        [100 * e["train_accuracy"] for e in epochs], "o-", label="train")
            ax_acc.plot([e["epoch"] for e in epochs],
                        [100 * e["test_accuracy"] for e in epochs], "s-", label="test")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.legend()
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("accuracy, %")
    ax_acc.legend()
    save(fig, f"{m.get('model', '?')} on {m.get('data', '?')}, batch {m.get('batch', '?')}", out,
         f"metrics: {len(losses)} steps, {len(epochs)} epochs")


def plot_trace(src, out):
    doc = load(src)
    events = doc["traceEvents"]
    tasks = [e for e in events if e.get("ph") == "X"]
    names = {(e["pid"], e.get("tid")): e["args"]["name"]
             for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    rows = sorted({(e["pid"], e["tid"]) for e in tasks})
    row_of = {r: i for i, r in enumerate(rows)}
    passes = sorted({e["cat"] for e in tasks})
    cmap = plt.get_cmap("tab10")
    colour = {p: cmap(i % 10) for i, p in enumerate(passes)}
    fig, ax = plt.subplots(figsize=(12, 1 + 0.5 * max(1, len(rows))))
    for p in passes:
        by_row = {}
        for e in tasks:
            if e["cat"] == p:
                by_row.setdefault(row_of[(e["pid"], e["tid"])], []).append(
                    (e["ts"] / 1000.0, max(e["dur"], 1e-3) / 1000.0))
        for i, (row, spans) in enumerate(sorted(by_row.items())):
            ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colour[p],
                           label=p if i == 0 else None)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {pid} {names.get((pid, tid), tid)}" for pid, tid in rows])
    ax.set_xlabel("ms")
    ax.invert_yaxis()
    ax.legend(loc="upper right", fontsize="small", ncol=min(4, len(passes)))
    ax.set_title(f"{len(tasks)} tasks on {len(rows)} workers")
    save(fig, None, out, f"trace: {len(tasks)} tasks, {len(rows)} workers, passes "
                         f"{', '.join(passes)}")


def plot_bench(src, out):
    b = load(src)
    res = b["results"]
    labels = [r["sched"] for r in res]
    med = [r["median"] * 1000 for r in res]
    lo = [(r["median"] - r["min"]) * 1000 for r in res]
    hi = [(r["max"] - r["median"]) * 1000 for r in res]
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4))
    ax_t.bar(labels, med, yerr=[lo, hi], capsize=4, color="tab:blue")
    ax_t.set_ylabel("ms per step (median, min-max)")
    ax_b.bar(labels, [100 * max(r["workers_busy"], 0) for r in res], color="tab:green")
    ax_b.set_ylabel("workers busy, %")
    ax_b.set_ylim(0, 100)
    save(fig, f"{b.get('model')} on {b.get('data')}, batch {b.get('batch')}, "
         f"{b.get('ranks')} rank(s), plan {b.get('plan') or 'default'}", out,
         f"bench: {len(res)} schedulers")


def task_table(src, top=15):
    """Where a trace's time went: per (codelet, pass) and per worker; returns the rows."""
    doc = load(src)
    events = doc["traceEvents"]
    tasks = [e for e in events if e.get("ph") == "X"]
    names = {(e["pid"], e.get("tid")): e["args"]["name"]
             for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    total = sum(e["dur"] for e in tasks) or 1.0
    groups = {}
    for e in tasks:
        g = groups.setdefault((e["name"], e["cat"]), [0, 0.0])
        g[0] += 1
        g[1] += e["dur"]
    rows = sorted(groups.items(), key=lambda kv: -kv[1][1])
    print(f"{len(tasks)} tasks, {total / 1000:.3f} ms of task time")
    print(f"{'codelet':28} {'pass':20} {'tasks':>7} {'total ms':>10} {'mean us':>9} {'share':>7}")
    for (name, cat), (n, dur) in rows[:top]:
        print(f"{name:28} {cat:20} {n:7d} {dur / 1000:10.3f} {dur / n:9.1f} {dur / total:7.1%}")
    if tasks:
        start = min(e["ts"] for e in tasks)
        span = max(e["ts"] + e["dur"] for e in tasks) - start or 1.0
        print(f"workers over the trace's {span / 1000:.3f} ms:")
        busy = {}
        for e in tasks:
            busy[(e["pid"], e["tid"])] = busy.get((e["pid"], e["tid"]), 0.0) + e["dur"]
        for (pid, tid), b in sorted(busy.items()):
            print(f"  rank {pid} {names.get((pid, tid), tid):12} busy {b / span:6.1%}")
    return rows


def main(argv):
    if len(argv) in (3, 4) and argv[1] == "tasks":
        task_table(argv[2], int(argv[3]) if len(argv) == 4 else 15)
        return
    kinds = {"metrics": plot_metrics, "trace": plot_trace, "bench": plot_bench}
    if len(argv) != 4 or argv[1] not in kinds:
        sys.exit(__doc__)
    kinds[argv[1]](argv[2], argv[3])


if __name__ == "__main__":
    main(sys.argv)
