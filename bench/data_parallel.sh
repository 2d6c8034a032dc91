#!/usr/bin/env bash
# Exposed communication of data-parallel training on Fashion-MNIST: the step time of
# `--plan data=2` on 2 ranks (global batch B, B/2 per rank, sharded weights, gradients
# reduced as tasks) against the compute-only step: two independent one-rank runs of batch
# B/2 at the same time (the same per-rank work and the same sharing of the machine, and no
# communication). One CPU worker per rank; each run takes STEPS steps; s/step is the
# training time of the epoch divided by its steps. Exposed = (dp - compute) / dp.
# The compute-only runs are bound to cores 0 and 1 by hand (each alone would take core 0): the
# baseline is the work done on both cores. The data-parallel ranks keep tessel's binding (on 2
# cores, each rank's worker and StarPU-MPI thread on a core of their own; tsl_node_share).
#
# usage: bench/data_parallel.sh [BUILD_DIR] [REPEATS] [STEPS] [BATCH]
# environment: DP_PLAN, the data-parallel run's plan (default data=2; say data=2,bucket=0 to
# send every small parameter on its own)
set -euo pipefail
build=${1:-build}
repeats=${2:-3}
steps=${3:-60}
batch=${4:-128}
half=$((batch / 2))
plan=${DP_PLAN:-data=2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 STARPU_SILENT=1 STARPU_NCPU=1
export STARPU_HOME=${STARPU_HOME:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step_time() { # metrics file, batch
    python3 -c "import json; m=json.load(open('$1')); print(f\"{$2 / m['epochs'][0]['samples_per_second']:.4f}\")"
}
printf "| model | $plan on 2 ranks (s/step) | compute only, 2 x 1 rank (s/step) | exposed |\n"
printf "|---|---|---|---|\n"
for model in cnn resnet; do
    common=(train --model "$model" --data fashion-mnist --max-steps "$steps" --seed 1)
    for r in $(seq "$repeats"); do
        mpirun --oversubscribe --bind-to none -np 2 "$build/tessel" "${common[@]}" \
            --batch "$batch" --plan "$plan" --metrics-json "$work/dp.json" > /dev/null
        STARPU_WORKERS_CPUID=0 STARPU_MPI_NOBIND=1 "$build/tessel" "${common[@]}" \
            --batch "$half" --metrics-json "$work/c0.json" > /dev/null &
        STARPU_WORKERS_CPUID=1 STARPU_MPI_NOBIND=1 "$build/tessel" "${common[@]}" \
            --batch "$half" --metrics-json "$work/c1.json" > /dev/null
        wait
        dp=$(step_time "$work/dp.json" "$batch")
        c0=$(step_time "$work/c0.json" "$half")
        c1=$(step_time "$work/c1.json" "$half")
        python3 -c "dp, c = $dp, max($c0, $c1); print(f'| $model | {dp:.3f} | {c:.3f} | {(dp - c) / dp:.0%} |')"
    done
done
