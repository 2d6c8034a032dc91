#!/usr/bin/env bash
# Layer-parallel training by MGRIT against the serial executor and pipeline stages, on
# Fashion-MNIST (28^2 samples) with the zoo's odetanhN (stem, N residual tanh steps of 8
# channels, head). Each row trains STEPS steps of batch BATCH; s/step is the median of the
# steps' wall seconds after the first two (the metrics stream), over REPEATS runs. For MGRIT
# rows also the last step's forward and backward residual norms (first and last cycle) and
# the forward convergence factor, and the cycles that factor needs to bring the residual down
# by 1e-6. One CPU worker per rank; ranks beyond the cores share them (on this 2-core machine
# the rows show the work each plan does, not the speed-up of a cluster).
#
# usage: bench/mgrit.sh [BUILD_DIR] [REPEATS] [STEPS] [BATCH] [N...]
set -euo pipefail
build=${1:-build}
repeats=${2:-3}
steps=${3:-6}
batch=${4:-16}
shift $(($# < 4 ? $# : 4))
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(64 256)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 STARPU_SILENT=1 STARPU_NCPU=1
export STARPU_HOME=${STARPU_HOME:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

summary() { # metrics streams...
    python3 - "$@" <<'EOF'
import json, math, statistics, sys
per_run, res = [], None
for path in sys.argv[1:]:
    steps = [r for r in map(json.loads, open(path)) if r["record"] == "step"]
    per_run.append(statistics.median(s["seconds"] for s in steps[2:] or steps))
    if "mgrit" in steps[-1]:
        res = steps[-1]["mgrit"][0]
med = statistics.median(per_run)
out = f"{med:.3f} ({min(per_run):.3f}-{max(per_run):.3f})"
if res:
    f, b = res["forward"], res["backward"]
    factor = res["forward_factor"]
    need = math.ceil(math.log(1e-6) / math.log(factor)) if 0 < factor < 1 else "-"
    out += f" | {f[0]:.2e} -> {f[-1]:.2e} | {b[0]:.2e} -> {b[-1]:.2e} | {factor:.3g} | {need}"
else:
    out += " | | | |"
print(out)
EOF
}

printf "| N | ranks | plan | s/step median (min-max) | forward residual | backward residual | factor | cycles to 1e-6 |\n"
printf "|---|---|---|---|---|---|---|---|\n"
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
    for row in "${rows[@]}"; do
        set -- $row
        files=()
        for r in $(seq "$repeats"); do
            f="$work/$n-$1-$2-$r.json"
            mpirun --oversubscribe --bind-to none -np "$1" "$build/tessel" train \
                --model "odetanh$n" --data fashion-mnist --batch "$batch" --max-steps "$steps" \
                --optimizer sgd --lr 0.05 --seed 1 --plan "$2" --metrics-json "$f" -q > /dev/null
            files+=("${f}l")
        done
        printf "| %s | %s | %s | %s |\n" "$n" "$1" "$2" "$(summary "${files[@]}")"
    done
done
