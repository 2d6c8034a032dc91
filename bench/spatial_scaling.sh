#!/usr/bin/env bash
# Step time of U-Net 3D training (batch 1) on spatial plans, one worker per rank: strong
# scaling (the same 64^3 sample on 1 rank and on 2 ranks, space=2; and on 1 rank with 2
# workers, tiles=2) and weak scaling (64^3 on 1 rank against 80^3, 1.95x the voxels, on 2
# ranks). Each configuration runs REPEATS times (default 3) for 4 steps; prints s/step per run.
#
# usage: bench/spatial_scaling.sh [BUILD_DIR] [REPEATS]
set -euo pipefail
build=${1:-build}
repeats=${2:-3}
part=${3:-all}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 STARPU_SILENT=1
export STARPU_HOME=${STARPU_HOME:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { # label ranks ncpu size plan...
    local label=$1 ranks=$2 ncpu=$3 size=$4
    shift 4
    local times=()
    for r in $(seq "$repeats"); do
        STARPU_NCPU=$ncpu mpirun --oversubscribe --bind-to none -np "$ranks" "$build/tessel" \
            train --model unet3d --data "synthetic:dims=3,size=$size,samples=4,classes=3" \
            --batch 1 --epochs 1 --seed 1 --metrics-json "$work/m.json" "$@" > /dev/null
        times+=("$(python3 -c "import json; m=json.load(open('$work/m.json')); \
print(f\"{m['epochs'][0]['seconds'] / m['steps']:.2f}\")")")
    done
    printf "| %s | %s | %s | %s^3 | %s | %s |\n" "$label" "$ranks" "$ncpu" "$size" "${*:-default}" \
        "${times[*]}"
}
if [ "$part" != wait ]; then
    printf "| case | ranks | workers/rank | sample | plan | s/step (runs) |\n|---|---|---|---|---|---|\n"
    run "strong, base" 1 1 64
    run "strong" 2 1 64 --plan space=2
    run "strong, one rank" 1 2 64 --plan tiles=2
    run "weak, base" 1 1 64
    run "weak" 2 1 80 --plan space=2
fi
[ "$part" = time ] && exit 0
printf "\n| plan (2 ranks, batch 2, 64^3) | s/step | workers busy | MiB sent per step (busiest rank) |\n"
printf "|---|---|---|---|\n"
for plan in data=2 space=2; do
    for r in $(seq "$repeats"); do
        STARPU_NCPU=1 mpirun --oversubscribe --bind-to none -np 2 "$build/tessel" train \
            --model unet3d --data "synthetic:dims=3,size=64,samples=4,classes=3" --batch 2 \
            --epochs 1 --seed 1 --plan "$plan" --comm-stats --metrics-json "$work/m.json" \
            > /dev/null 2>&1
        python3 -c "import json; m=json.load(open('$work/m.json')); e=m['epochs'][0]; \
print(f\"| $plan | {e['seconds'] / m['steps']:.2f} | {100 * e['workers_busy']:.1f} % | \
{e['sent_bytes_per_step'] / 1048576:.2f} |\")"
    done
done
