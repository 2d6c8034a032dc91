#!/usr/bin/env bash
# Peak memory per rank of a training step (batch 1) under given plans: for each sample size and
# RANKS:PLAN entry, `tessel train` runs two steps on a synthetic sample of DIMS spatial
# dimensions and reports the largest rank's peak resident memory and tile memory (metrics
# JSON), the most StarPU buffer memory a rank held at once (measured: tiles, halo slabs,
# received copies; tsl_context_buffer_bytes), next to `tessel plan`'s estimates for the same
# run: the largest rank's tiles (all), the most of them live at once, and that plus received
# copies (values crossing pipeline stages); and the most bytes of other ranks' data a rank
# kept in StarPU-MPI's cache at once (tsl_context_cached_bytes: halo slabs, tiles).
# Prints one table row per run: model, size, ranks, plan, peak MiB, tile MiB, buffers MiB,
# remote copies MiB, the three estimates in MiB, seconds per step.
#
# usage: bench/plan_memory.sh BUILD_DIR MODEL DIMS "SIZES" "RANKS:PLAN ..."
#   PLAN "-" for the default plan; for example
#   bench/plan_memory.sh build unet2d 2 "1024 1536" "1:- 4:stages=4 4:space=2x2"
# TRAIN_ARGS (environment): more `tessel train` options, e.g. "--host-cache-mib 0".
set -euo pipefail
build=$1 model=$2 dims=$3 sizes=$4 runs=$5
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 STARPU_SILENT=1
export STARPU_HOME=${STARPU_HOME:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
labels=""
case $model in cnn* | resnet*) labels=",labels=sample" ;; esac # classifiers
printf "| model | size | ranks | plan | peak MiB (largest rank) | tiles MiB (largest rank) |"
printf " buffers at most MiB (largest rank) | remote copies at most MiB (largest rank) |"
printf " estimate: tiles | estimate: live at once | estimate: live + received | s/step |\n"
printf "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
for size in $sizes; do
    for run in $runs; do
        ranks=${run%%:*} plan=${run#*:}
        planarg=()
        [ "$plan" != "-" ] && planarg=(--plan "$plan")
        data="synthetic:dims=$dims,size=$size,samples=2,classes=3$labels"
        "$build/tessel" plan --model "$model" --data "$data" --batch 1 --ranks "$ranks" \
            "${planarg[@]}" > "$work/plan.txt"
        estimate=$(sed -n 's/^largest rank \([0-9.]*\) MiB.*/\1/p' "$work/plan.txt")
        live=$(sed -n 's/^largest rank live at once \([0-9.]*\) MiB.*/\1/p' "$work/plan.txt")
        received=$(sed -n 's/^largest rank live at once with received copies \([0-9.]*\) MiB.*/\1/p' "$work/plan.txt")
        json=$work/m.json
        STARPU_NCPU=$((ranks == 1 ? 2 : 1)) mpirun --oversubscribe --bind-to none -np "$ranks" \
            "$build/tessel" train --model "$model" --data "$data" --batch 1 --epochs 1 --seed 1 \
            "${planarg[@]}" ${TRAIN_ARGS:-} --metrics-json "$json" > "$work/out.txt" 2>&1 ||
            { echo "failed: $model $size $ranks $plan"; tail -5 "$work/out.txt"; continue; }
        python3 - "$json" "$model" "$size" "$ranks" "$plan" "$dims" "$estimate" "$received" "$live" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
e = m["epochs"][0]
size = sys.argv[3] + ("^3" if sys.argv[6] == "3" else "^2" if sys.argv[6] == "2" else "")
print(f"| {sys.argv[2]} | {size} | {sys.argv[4]} | {sys.argv[5]} | {e['peak_memory_mib']:.0f} | "
      f"{e['tile_memory_mib']:.0f} | {e['buffer_peak_mib']:.0f} | {e['cached_peak_mib']:.1f} | "
      f"{float(sys.argv[7]):.0f} | {float(sys.argv[9]):.0f} | "
      f"{float(sys.argv[8]):.0f} | "
      f"{e['seconds'] / m['steps']:.1f} |")
PY
    done
done
