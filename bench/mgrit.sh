#!/usr/bin/env bash
# Layer-parallel training by MGRIT against the serial executor and pipeline stages, on
# Fashion-MNIST (28^2 samples) with the zoo's odetanhN (stem, N residual tanh steps of 8
# channels, h = 1/N, head): `tessel bench` (lws scheduler, WARMUP untimed steps, then REPEATS
# repetitions of STEPS timed steps of batch BATCH; median, min and max s/step), the workers'
# busy share (all task time over all workers' time: the parallelism the plan exposes, as a
# fraction of the workers), one more step traced for its total task time and critical path
# (with a worker per task and free messages; their ratio is the parallelism the plan exposes
# whatever the core count), and for MGRIT rows the last step's residual norms per V-cycle,
# forward and backward, with the cycles the forward's convergence factor needs for 1e-6. One
# CPU worker per rank; ranks beyond the cores share them (on a 2-core machine the rows show the
# work each plan does, not a cluster's speed-up).
#
# usage: bench/mgrit.sh [BUILD_DIR] [REPEATS] [STEPS] [BATCH] [N...]
# environment: MGRIT_ROWS=short for the serial, layers=2 and layers=4 rows only
set -euo pipefail
build=${1:-build}
repeats=${2:-3}
steps=${3:-3}
batch=${4:-16}
shift $(($# < 4 ? $# : 4))
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(64)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 STARPU_SILENT=1 STARPU_NCPU=1
export STARPU_HOME=${STARPU_HOME:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

row() { # bench JSON
    python3 - "$1" <<'EOF'
import json, math, sys
r = json.load(open(sys.argv[1]))["results"][0]
out = f"{r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f}) | {100 * r['workers_busy']:.0f}%"
t, c = r["task_seconds"], r["critical_path_seconds"]
out += f" | {t:.3f} | {c:.3f} | {t / c:.2f}" if c > 0 else " | | |"
f, b = r.get("mgrit_forward"), r.get("mgrit_backward")
if f:
    norms = " ".join(f"{x:.1e}" for x in f)
    bnorms = " ".join(f"{x:.1e}" for x in b)
    rates = [f[i + 1] / f[i] for i in range(len(f) - 1) if f[i] > 0 and f[i + 1] > 0]
    factor = math.exp(sum(map(math.log, rates)) / len(rates)) if rates else None
    need = math.ceil(math.log(1e-6) / math.log(factor)) if factor and factor < 1 else "-"
    out += f" | {norms} | {bnorms} | {factor:.3g} | {need}" if factor else f" | {norms} | {bnorms} | - | -"
else:
    out += " | | | |"
print(out)
EOF
}

printf "| N | ranks | plan | s/step median (min-max) | workers busy | task s | critical path s | parallelism | forward residuals | backward residuals | factor | cycles to 1e-6 |\n"
printf "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
for n in "${sizes[@]}"; do
    rows=(
        "1 data=1"
        "1 levels=2,cf=4,iters=1,biters=1"
        "1 levels=2,cf=4,iters=2,biters=1"
        "2 stages=2"
        "2 stages=2,micro=4"
        "2 layers=2"
        "2 layers=2,levels=2,cf=4,iters=1,biters=1"
        "2 layers=2,levels=2,cf=4,iters=2,biters=1"
        "2 layers=2,levels=2,cf=4,iters=4,biters=2"
        "2 layers=2,levels=3,cf=4,iters=2,biters=1"
        "4 layers=4,levels=2,cf=4,iters=2,biters=1"
        "4 layers=2,space=2,levels=2,cf=4,iters=2,biters=1"
        "4 space=4"
        "4 stages=4"
    )
    [ "${MGRIT_ROWS:-}" = short ] && rows=("1 data=1" "2 layers=2,levels=2,cf=4,iters=2,biters=1"
                                          "4 layers=4,levels=2,cf=4,iters=2,biters=1")
    for r in "${rows[@]}"; do
        set -- $r
        f="$work/$n-$1-$2.json"
        mpirun --oversubscribe --bind-to none -np "$1" "$build/tessel" bench \
            --model "odetanh$n" --data fashion-mnist --batch "$batch" --optimizer sgd \
            --plan "$2" --sched lws --warmup 1 --steps "$steps" --repeat "$repeats" \
            --critical-path --json "$f" > /dev/null
        printf "| %s | %s | %s | %s |\n" "$n" "$1" "$2" "$(row "$f")"
    done
done
