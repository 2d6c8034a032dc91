#!/usr/bin/env bash
# The performance model against measurement: for each CASE (model, data, batch), calibrate on
# RANKS ranks of WORKERS CPU workers (`tessel train --plan auto`, one step: the ops' costs and
# the network, kept in the StarPU home), rank every candidate plan (`tessel plan --plan auto
# --json`, from that calibration and network), then measure every candidate with `tessel
# bench` (lws, WARMUP untimed steps, REPEATS repetitions of STEPS timed steps; median s/step),
# the candidates taken in turn and the whole
# sweep done twice in opposite orders (alternating runs), and compare (bench/auto_plan.py):
# Kendall tau of predicted against measured, the chosen plan's measured time against the best
# measured, one table row per candidate.
#
# usage: bench/auto_plan.sh [BUILD_DIR] [RANKS] [WORKERS] [CASE...]
#   CASE: MODEL:DATA:BATCH, data specs without ':' (default: cnn on fashion-mnist at 64, resnet
#   on synthetic 48^2 at 16 (per-sample labels), unet2d on synthetic 64^2 at 8)
set -euo pipefail
build=${1:-build}
ranks=${2:-2}
workers=${3:-1}
shift $(($# < 3 ? $# : 3))
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=("cnn:fashion-mnist:64"
                                 "resnet:synthetic@dims=2,size=48,samples=64,classes=4,labels=sample:16"
                                 "unet2d:synthetic@dims=2,size=64,samples=32,classes=3:8")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 STARPU_SILENT=1
export STARPU_NCPU=$workers STARPU_HOME=${STARPU_HOME:-$(mktemp -d)}
warmup=${WARMUP:-2} steps=${STEPS:-3} repeats=${REPEATS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
here=$(cd "$(dirname "$0")" && pwd)
mpi=(mpirun --oversubscribe --bind-to none -np "$ranks")

for c in "${cases[@]}"; do
    IFS=: read -r model data batch <<< "$c"
    data=${data//@/:}
    tag=$(printf '%s' "$model-$batch" | tr -c 'a-zA-Z0-9-' _)
    "${mpi[@]}" "$build/tessel" train --model "$model" --data "$data" --batch "$batch" \
        --max-steps 1 --epochs 1 --plan auto --optimizer sgd > "$work/$tag-calibrate.txt"
    "$build/tessel" plan --model "$model" --data "$data" --batch "$batch" --ranks "$ranks" \
        --ncpu "$workers" --optimizer sgd --plan auto --json "$work/$tag-ranking.json" \
        > "$work/$tag-plan.txt"
    mapfile -t plans < <(python3 -c 'import json,sys
for p in json.load(open(sys.argv[1]))["plans"]: print(p["plan"])' "$work/$tag-ranking.json")
    for pass in 1 2; do # the second sweep in reverse order
        order=("${plans[@]}")
        [ "$pass" = 2 ] && mapfile -t order < <(printf '%s\n' "${plans[@]}" | tac)
        for p in "${order[@]}"; do
            f="$work/$tag-$(printf '%s' "$p" | tr -c 'a-zA-Z0-9' _)-$pass.json"
            "${mpi[@]}" "$build/tessel" bench --model "$model" --data "$data" --batch "$batch" \
                --optimizer sgd --plan "$p" --sched lws --warmup "$warmup" --steps "$steps" \
                --repeat "$repeats" --json "$f" > /dev/null 2>> "$work/stderr.txt"
        done
    done
    echo "### $model, $data, batch $batch, $ranks ranks x $workers workers"
    python3 "$here/auto_plan.py" "$work/$tag-ranking.json" "$work/$tag"
done
