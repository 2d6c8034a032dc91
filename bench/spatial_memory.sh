#!/usr/bin/env bash
# Peak memory per rank of one U-Net 3D / CNN3D training step on spatial plans: for each model,
# cubic sample size and rank count, `tessel train` runs two steps (batch 1) and reports the
# largest rank's peak resident memory and tile memory (bench/plan_memory.sh, one table per
# model): the default plan on one rank, space=2 on 2, space=2x2 on 4, space=2x2x2 on 8.
#
# EXTRA: plan parts added to every run's plan, e.g. recompute=1.
#
# usage: bench/spatial_memory.sh [BUILD_DIR] [SIZES] [MODELS] [RANKS] [EXTRA]
#   defaults: build, "64 96 128", "unet3d cnn3d", "1 2 4", none
set -euo pipefail
build=${1:-build}
sizes=${2:-"64 96 128"}
models=${3:-"unet3d cnn3d"}
rank_counts=${4:-"1 2 4"}
extra=${5:-}
runs=""
for ranks in $rank_counts; do
    case $ranks in
        1) plan="" ;;
        2) plan="space=2" ;;
        4) plan="space=2x2" ;;
        8) plan="space=2x2x2" ;;
        *) echo "no plan for $ranks ranks" >&2; exit 2 ;;
    esac
    plan=$plan${plan:+${extra:+,}}$extra
    runs="$runs $ranks:${plan:--}"
done
for model in $models; do
    bash "$(dirname "$0")/plan_memory.sh" "$build" "$model" 3 "$sizes" "$runs"
done
