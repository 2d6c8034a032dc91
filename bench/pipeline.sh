#!/usr/bin/env bash
# Pipeline efficiency: seconds per training step (SGD) of a network on one rank and on 2
# pipeline stages (stages=2,balance=time, one rank per stage) with M micro-batches, for each M.
# Every rank has one CPU worker. Reported per 2-stage run: the efficiency T1 / (2 T), T1 the
# one-rank step and T the 2-stage step (1 = two balanced stages that never wait), against
# GPipe's ideal for 2 stages, M / (M + 1); and the gain over the same 2 stages with one
# micro-batch (where the stages cannot overlap) against its ideal 2M / (M + 1).
#
# usage: bench/pipeline.sh [BUILD_DIR] [MODEL] [MICROS] [REPEATS] [BATCH] [SIZE] [SCHED]
#   defaults: build, bench/models/plain_cnn.json, "1 2 4 8", 3, 16, 64, lws
set -euo pipefail
build=${1:-build}
model=${2:-$(dirname "$0")/models/plain_cnn.json}
micros=${3:-"1 2 4 8"}
repeats=${4:-3}
batch=${5:-16}
size=${6:-64}
sched=${7:-lws}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 STARPU_SILENT=1 STARPU_NCPU=1
export STARPU_HOME=${STARPU_HOME:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# 32 input channels: every convolution of plain_cnn.json costs the same, the stages balance.
data="synthetic:dims=2,size=$size,samples=$((batch * 6)),classes=4,channels=32,labels=sample"
# Mean seconds per step of one run over steps 2 to 6 (the first builds oneDNN's primitives).
step_seconds() { # RANKS PLAN
    local planarg=()
    [ "$2" != "-" ] && planarg=(--plan "$2")
    mpirun --oversubscribe --bind-to none -np "$1" "$build/tessel" train --model "$model" \
        --data "$data" --batch "$batch" --epochs 1 --max-steps 6 --seed 1 --optimizer sgd \
        --sched "$sched" "${planarg[@]}" --metrics-json "$work/m.json" > "$work/out.txt" 2>&1 ||
        { echo "failed: $1 ranks, plan $2" >&2; tail -5 "$work/out.txt" >&2; exit 1; }
    python3 -c "
import json
t = json.load(open('$work/m.json'))['step_seconds'][1:]
print(f'{sum(t) / len(t):.3f}')"
}
best_of() { printf "%s\n" "$@" | sort -g | head -1; }
printf "| plan | ranks | s/step (runs) | efficiency T1/(2T) | ideal M/(M+1) | gain over micro=1 | ideal 2M/(M+1) |\n"
printf "|---|---|---|---|---|---|---|\n"
runs=""
for r in $(seq "$repeats"); do runs="$runs $(step_seconds 1 -)"; done
base=$(best_of $runs)
printf "| default | 1 | %s | - | - | - | - |\n" "$runs"
one=""
for m in $micros; do
    plan="stages=2,micro=$m,balance=time"
    runs=""
    for r in $(seq "$repeats"); do runs="$runs $(step_seconds 2 "$plan")"; done
    best=$(best_of $runs)
    [ -z "$one" ] && one=$best # the first M given is the no-overlap reference (1 by default)
    python3 -c "
print(f'| $plan | 2 | $runs | {$base / (2 * $best):.2f} | {$m / ($m + 1):.2f} | {$one / $best:.2f} | {2 * $m / ($m + 1):.2f} |')"
done
