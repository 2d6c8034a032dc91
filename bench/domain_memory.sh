#!/usr/bin/env bash
# Peak memory per rank of the zoo's multi-domain separation network (dsn) as the number of
# domains grows, one source and 1 to 7 target domains (the Multi-DSN memory figure): for each
# K in DOMAINS, `tessel train` runs two steps (batch 2, SIZE^2 images, one input channel per
# domain) on one rank holding every domain, and on K ranks with domains=K (each domain's
# encoders on its own rank; the shared weights' copies refreshed from, and their gradients
# summed into, domain 0's rank). Prints one table row per run: domains, ranks, plan, the largest
# rank's peak resident memory, tile memory and StarPU buffer memory at most, `tessel plan`'s
# estimate of the largest rank's live tiles with received copies, seconds per step.
#
# usage: bench/domain_memory.sh [BUILD_DIR] [SIZE] [DOMAINS]
#   defaults: build, 256, "2 3 5 8"
set -euo pipefail
build=${1:-build}
size=${2:-256}
domains=${3:-"2 3 5 8"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 STARPU_SILENT=1
export STARPU_HOME=${STARPU_HOME:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf "| domains | ranks | plan | peak MiB (largest rank) | tiles MiB (largest rank) |"
printf " buffers at most MiB (largest rank) | estimate: live + received MiB | s/step |\n"
printf "|---|---|---|---|---|---|---|---|\n"
for k in $domains; do
    data="synthetic:dims=2,size=$size,samples=4,classes=3,channels=$k,labels=sample"
    for run in "1:-" "$k:domains=$k"; do
        ranks=${run%%:*} plan=${run#*:}
        planarg=()
        [ "$plan" != "-" ] && planarg=(--plan "$plan")
        "$build/tessel" plan --model dsn --data "$data" --batch 2 --ranks "$ranks" \
            "${planarg[@]}" > "$work/plan.txt"
        received=$(sed -n 's/^largest rank live at once with received copies \([0-9.]*\) MiB.*/\1/p' "$work/plan.txt")
        json=$work/m.json
        STARPU_NCPU=1 mpirun --oversubscribe --bind-to none -np "$ranks" \
            "$build/tessel" train --model dsn --data "$data" --batch 2 --epochs 1 --seed 1 \
            --max-steps 2 "${planarg[@]}" --metrics-json "$json" > "$work/out.txt" 2>&1 ||
            { echo "failed: $k domains, $ranks ranks, $plan"; tail -5 "$work/out.txt"; continue; }
        python3 - "$json" "$k" "$ranks" "$plan" "$received" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
e = m["epochs"][0]
k = int(sys.argv[2])
print(f"| 1+{k - 1} | {sys.argv[3]} | {sys.argv[4]} | {e['peak_memory_mib']:.0f} | "
      f"{e['tile_memory_mib']:.1f} | {e['buffer_peak_mib']:.1f} | {float(sys.argv[5]):.1f} | "
      f"{e['seconds'] / m['steps']:.2f} |")
PY
    done
done
