#!/usr/bin/env bash
# Seconds per training step, bytes sent per step and StarPU buffer peak of several plans (and
# builds) of one model, measured in alternating rounds: round r runs every LABEL=BUILD:PLAN
# entry once, in the order given, so the entries share the machine's state alike. Each run is
# `tessel bench` (one scheduler, W warm-up steps, N timed steps, one repetition) on RANKS ranks
# of one CPU worker each. Prints one table row per entry: median s/step over the rounds with
# its min-max, and the bytes sent per step and the buffer peak the last run reported.
#
# usage: bench/plan_rounds.sh MODEL DATA BATCH RANKS ROUNDS "LABEL=BUILD:PLAN ..."
#   for example (this session's and the previous session's build of the same model):
#   bench/plan_rounds.sh bench/models/wide_head.json \
#       synthetic:dims=2,size=16,samples=64,classes=10,labels=sample 16 2 7 \
#       "data=build:data=2 filters=build:filters=2 filters-before=/tmp/old/build:filters=2"
# STEPS (10), WARMUP (3), SCHED (lws), OPTIMIZER (sgd) in the environment change the runs.
set -euo pipefail
model=$1 data=$2 batch=$3 ranks=$4 rounds=$5 entries=$6
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 STARPU_SILENT=1
export STARPU_HOME=${STARPU_HOME:-$(mktemp -d)} STARPU_NCPU=${STARPU_NCPU:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for r in $(seq 1 "$rounds"); do
    for e in $entries; do
        label=${e%%=*} rest=${e#*=}
        build=${rest%%:*} plan=${rest#*:}
        mpirun --oversubscribe --bind-to none -np "$ranks" "$build/tessel" bench --model "$model" \
            --data "$data" --batch "$batch" --plan "$plan" --sched "${SCHED:-lws}" \
            --steps "${STEPS:-10}" --warmup "${WARMUP:-3}" --repeat 1 \
            --optimizer "${OPTIMIZER:-sgd}" --json "$work/$label.$r.json" > /dev/null
    done
done
/usr/bin/python3 - "$work" "$rounds" "$entries" <<'EOF'
import json, statistics, sys
work, rounds, entries = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
print("| entry | plan | s/step median (min-max) | MB sent/step | buffer peak MiB |")
print("|---|---|---|---|---|")
for e in entries:
    label = e.split("=", 1)[0]
    runs = [json.load(open(f"{work}/{label}.{r}.json")) for r in range(1, rounds + 1)]
    t = [run["results"][0]["median"] for run in runs]
    last = runs[-1]["results"][0]
    print(f"| {label} | {runs[0]['plan']} | {statistics.median(t):.4f} ({min(t):.4f}-{max(t):.4f})"
          f" | {last['bytes_per_step'] / 1e6:.2f} | {last['buffer_peak_mib']:.1f} |")
EOF
