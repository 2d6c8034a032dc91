#!/usr/bin/env bash
# Peak memory per rank of one U-Net 3D / CNN3D training step on spatial plans: for each model,
# cubic sample size and rank count, `tessel train` runs two steps (batch 1) and reports the
# largest rank's peak resident memory and tile memory (metrics JSON). Prints one table row per
# run: model, size, ranks, plan, peak MiB, tile MiB, step seconds.
#
# usage: bench/spatial_memory.sh [BUILD_DIR] [SIZES] [MODELS] [RANKS]
#   defaults: build, "64 96 128", "unet3d cnn3d", "1 2 4" (8 ranks: space=2x2x2)
set -euo pipefail
build=${1:-build}
sizes=${2:-"64 96 128"}
models=${3:-"unet3d cnn3d"}
rank_counts=${4:-"1 2 4"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 STARPU_SILENT=1
export STARPU_HOME=${STARPU_HOME:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf "| model | size | ranks | plan | peak MiB (largest rank) | tiles MiB (largest rank) | s/step |\n"
printf "|---|---|---|---|---|---|---|\n"
for model in $models; do
    for size in $sizes; do
        for ranks in $rank_counts; do
            case $ranks in
                1) plan="" ;;
                2) plan="--plan space=2" ;;
                4) plan="--plan space=2x2" ;;
                8) plan="--plan space=2x2x2" ;;
                *) echo "no plan for $ranks ranks" >&2; exit 2 ;;
            esac
            json=$work/m.json
            labels=""
            case $model in cnn*) labels=",labels=sample" ;; esac # classifiers
            STARPU_NCPU=$((ranks == 1 ? 2 : 1)) mpirun --oversubscribe --bind-to none -np $ranks \
                "$build/tessel" train --model "$model" \
                --data "synthetic:dims=3,size=$size,samples=2,classes=3$labels" --batch 1 --epochs 1 \
                --seed 1 $plan --metrics-json "$json" > "$work/out.txt" 2>&1 ||
                { echo "failed: $model $size $ranks"; tail -5 "$work/out.txt"; continue; }
            python3 - "$json" "$model" "$size" "$ranks" "${plan#--plan }" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
e = m["epochs"][0]
plan = sys.argv[5] or "-"
print(f"| {sys.argv[2]} | {sys.argv[3]}^3 | {sys.argv[4]} | {plan} | {e['peak_memory_mib']:.0f} | "
      f"{e['tile_memory_mib']:.0f} | {e['seconds'] / m['steps']:.1f} |")
PY
        done
    done
done
