#!/usr/bin/env bash
# The GPU check kit's test runner: the commands tests/CMakeLists.txt gives ctest, run
# directly (no cmake or ctest needed), from an unpacked kit (scripts/gpu-check.sh pack puts
# this file in it as run-tests.sh).
#
# Usage: KIT/run-tests.sh LOGDIR [TEST...]
#   TEST  names as ctest names them (unit.graph, mpi.tensor.np1, cli.train.np1, ...);
#         none: every test below. `KIT/run-tests.sh --list` lists them.
# Each test runs under `timeout` (TEST_TIMEOUT seconds, default 300, and never past
# KIT_DEADLINE, a time in seconds since the epoch, when set), with the tests' environment
# (private STARPU_HOME, STARPU_SILENT=1, TSL_POISON_ALLOC=1, Open MPI allowed as root),
# through the kit's own mpirun. Variables the caller sets (STARPU_NCUDA, STARPU_SCHED, ...)
# pass through. Writes LOGDIR/NAME.log per test and LOGDIR/results.txt (one line per test:
# PASS|FAIL|TIMEOUT|SKIP NAME SECONDS [why]); exits 0 when no test failed or timed out.
set -uo pipefail

KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=/dev/null
. "$KIT/env.sh"

ALL_TESTS=(unit.graph unit.numpy_fixtures unit.gtest unit.numpy_reads_tessel mpi.tensor.np1
           mpi.tensor.np2 mpi.tensor.np1.cuda mpi.tensor.np2.cuda diag.scatter_again.cuda mpi.embed.np1 mpi.embed.np2 cli.info.np2 cli.demo.np1 cli.demo.np2
           cli.train.np1 cuda.np1 cuda.hetero cuda.np2)
if [ "${1:-}" = --list ]; then
    printf '%s\n' "${ALL_TESTS[@]}"
    exit 0
fi
[ $# -ge 1 ] || { echo "usage: $0 LOGDIR [TEST...] | --list" >&2; exit 2; }
LOGDIR="$1"
shift
mkdir -p "$LOGDIR"
LOGDIR="$(cd "$LOGDIR" && pwd)"
TESTS=("$@")
[ ${#TESTS[@]} -gt 0 ] || TESTS=("${ALL_TESTS[@]}")

WORK="$(mktemp -d "${TMPDIR:-/tmp}/tessel-kit-tests.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export STARPU_HOME="$WORK/starpu-home" STARPU_SILENT=1 STARPU_WORKERS_NOBIND=1
export TSL_POISON_ALLOC=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$STARPU_HOME"
MPIEXEC=(mpirun --oversubscribe --bind-to none)
SHARE="$KIT/share/tests"
# A python3 with numpy where there is one (the unit fixtures need it), else any python3.
PY="$(command -v python3 || true)"
for p in /usr/bin/python3 "$PY"; do
    if [ -x "$p" ] && "$p" -c 'import numpy' >/dev/null 2>&1; then PY="$p"; break; fi
done
failed=0

# limit: TEST_TIMEOUT, cut to what is left before KIT_DEADLINE.
limit() {
    local t="${TEST_TIMEOUT:-300}"
    if [ -n "${KIT_DEADLINE:-}" ]; then
        local left=$((KIT_DEADLINE - $(date +%s)))
        [ "$left" -lt "$t" ] && t="$left"
    fi
    echo "$t"
}

result() { # status name seconds [why]
    echo "$*" >>"$LOGDIR/results.txt"
    printf '%-8s %-28s %s\n' "$1" "$2" "${*:3}"
    case "$1" in FAIL | TIMEOUT) failed=1 ;; esac
}

# run NAME NCPU MATCH NOMATCH CMD...: MATCH (egrep, may be empty) must occur in the output and
# NOMATCH must not.
run() {
    local name="$1" ncpu="$2" match="$3" nomatch="$4"
    shift 4
    local t log="$LOGDIR/$name.log" start rc
    t="$(limit)"
    if [ "$t" -le 5 ]; then
        result SKIP "$name" 0 "no time left"
        return
    fi
    start=$(date +%s)
    echo "+ STARPU_NCPU=$ncpu STARPU_NCUDA=${STARPU_NCUDA-} STARPU_SCHED=${STARPU_SCHED-}" \
        "GTEST_FILTER=${GTEST_FILTER-} timeout $t $*" >"$log"
    STARPU_NCPU="$ncpu" timeout -k 10 "$t" "$@" >>"$log" 2>&1
    rc=$?
    local secs=$(($(date +%s) - start))
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        result TIMEOUT "$name" "${secs}s" "after ${t}s"
    elif [ $rc -ne 0 ]; then
        result FAIL "$name" "${secs}s" "exit $rc"
    elif [ -n "$match" ] && ! grep -Eq "$match" "$log"; then
        result FAIL "$name" "${secs}s" "output lacks '$match'"
    elif [ -n "$nomatch" ] && grep -Eq "$nomatch" "$log"; then
        result FAIL "$name" "${secs}s" "output has '$nomatch'"
    else
        result PASS "$name" "${secs}s"
    fi
}

# With CUDA workers asked for (STARPU_NCUDA >= 1), a CUDA test that skips for want of one is a
# failure: the pattern of its skip message, else none.
cuda_noskip() {
    [ "${STARPU_NCUDA:-0}" -ge 1 ] 2>/dev/null && echo "no CUDA worker in this process|built without CUDA"
}

# cuda_suites NAME RANKS: every CUDA test suite of the test binary (Cuda*) in a process of its
# own (NAME.SUITE), so that a codelet failure, which aborts its process, hides no other suite's
# results.
cuda_suites() {
    local s suites
    suites="$("$KIT/bin/tessel_mpi_tests" --gtest_list_tests 2>/dev/null | sed -n 's/^\(Cuda[A-Za-z0-9_]*\)\.$/\1/p')"
    if [ -z "$suites" ]; then
        result FAIL "$1" 0 "no Cuda* suite listed by tessel_mpi_tests --gtest_list_tests"
        return
    fi
    for s in $suites; do
        GTEST_FILTER="$s.*" run "$1.$s" 2 "PASSED" "$(cuda_noskip)" \
            "${MPIEXEC[@]}" -n "$2" "$KIT/bin/tessel_mpi_tests"
    done
}

have_numpy() { [ -n "$PY" ] && "$PY" -c 'import numpy' >/dev/null 2>&1; }

one() {
    local b="$KIT/bin"
    case "$1" in
    unit.graph) run "$1" 1 "" "" "$b/tessel_graph_tests" ;;
    unit.numpy_fixtures)
        if have_numpy; then
            run "$1" 1 "" "" "$PY" "$SHARE/make_numpy_fixtures.py" "$WORK/numpy-fixtures"
        else result SKIP "$1" 0 "no python3 with numpy"; fi ;;
    unit.gtest)
        if [ ! -x "$b/tessel_unit_tests" ]; then
            result SKIP "$1" 0 "the build has no tessel_unit_tests"
        elif [ ! -d "$WORK/numpy-fixtures" ]; then
            result SKIP "$1" 0 "needs unit.numpy_fixtures"
        else
            # (the kit carries a subset of Fashion-MNIST, uncompressed: the tests that compare
            # the whole .gz files are left out)
            TESSEL_NUMPY_FIXTURES="$WORK/numpy-fixtures" GTEST_FILTER='-DatasetFashionMnist.*' \
                run "$1" 1 "" "" "$b/tessel_unit_tests"
        fi ;;
    unit.numpy_reads_tessel)
        if have_numpy && [ -x "$b/tessel_unit_tests" ] && [ -d "$WORK/numpy-fixtures" ]; then
            run "$1" 1 "" "" "$PY" "$SHARE/make_numpy_fixtures.py" "$WORK/numpy-fixtures" --check
        else result SKIP "$1" 0 "needs python3 with numpy and unit.gtest"; fi ;;
    # With the scheduler's placement (TSL_TASK_WHERE=any: CPU and CUDA workers side by side);
    # the default (auto) places tasks as cuda does where there is a CUDA worker.
    mpi.tensor.np1)
        TSL_TASK_WHERE=any run "$1" 2 "" "" "${MPIEXEC[@]}" -n 1 "$b/tessel_mpi_tests" ;;
    mpi.tensor.np2)
        TSL_TASK_WHERE=any run "$1" 1 "" "" "${MPIEXEC[@]}" -n 2 "$b/tessel_mpi_tests" ;;
    # The same with every task that has a CUDA function on the CUDA worker (TSL_TASK_WHERE=cuda):
    # a fixed placement, so runs compared bit for bit place their tasks alike (with `any`,
    # an exp or log computed on the GPU may differ from the CPU's in the last place).
    # (ScatterGather.ScatterAgain... did not finish in 95 s there on the first H100 run, where
    # it takes 1.5 s with the default placement: diag.scatter_again.cuda runs it alone)
    mpi.tensor.np1.cuda)
        TSL_TASK_WHERE=cuda GTEST_FILTER='-ScatterGather.ScatterAgain*' run "$1" 2 "" "" \
            "${MPIEXEC[@]}" -n 1 "$b/tessel_mpi_tests" ;;
    mpi.tensor.np2.cuda)
        TSL_TASK_WHERE=cuda GTEST_FILTER='-ScatterGather.ScatterAgain*' run "$1" 1 "" "" \
            "${MPIEXEC[@]}" -n 2 "$b/tessel_mpi_tests" ;;
    # That test alone with TSL_TASK_WHERE=cuda, StarPU's watchdog reporting every 5 s without a
    # finished task (a hang says so; a slow run shows progress), limited to 40 s.
    diag.scatter_again.cuda)
        TSL_TASK_WHERE=cuda GTEST_FILTER='ScatterGather.ScatterAgain*' \
            STARPU_WATCHDOG_TIMEOUT=5000000 STARPU_WATCHDOG_CRASH=0 TEST_TIMEOUT=40 \
            run "$1" 2 "PASSED" "" "${MPIEXEC[@]}" -n 1 "$b/tessel_mpi_tests" ;;
    mpi.embed.np1) run "$1" 2 "" "" "${MPIEXEC[@]}" -n 1 "$b/tessel_embed_test" ;;
    mpi.embed.np2) run "$1" 1 "" "" "${MPIEXEC[@]}" -n 2 "$b/tessel_embed_test" ;;
    cli.info.np2) run "$1" 1 "MPI ranks: 2" "" "${MPIEXEC[@]}" -n 2 "$b/tessel" info ;;
    cli.demo.np1)
        run "$1" 2 "sums identical" "DIFFER" "${MPIEXEC[@]}" -n 1 "$b/tessel" demo \
            --shape 4x3x9x10 --grid 2x1x3x2 ;;
    cli.demo.np2)
        run "$1" 1 "sums identical" "DIFFER" "${MPIEXEC[@]}" -n 2 "$b/tessel" demo --owners cyclic ;;
    cli.train.np1)
        if [ -n "$PY" ]; then
            run "$1" 2 "" "" "$PY" "$SHARE/train_check.py" "$b/tessel" "$WORK/train-np1"
        else result SKIP "$1" 0 "no python3"; fi ;;
    # The CUDA tests alone (tests/mpi/test_cuda*.cpp; they skip without a CUDA worker, which
    # NOSKIP makes a failure where STARPU_NCUDA asks for one): every Cuda* test at one rank; the
    # heterogeneous model test under dmdas with 4 CPU workers beside the CUDA one; and at two
    # ranks sharing the GPU, the space=2 model test with the codelet tests on each rank.
    cuda.np1)
        cuda_suites "$1" 1 ;;
    cuda.hetero)
        STARPU_SCHED=dmdas GTEST_FILTER='CudaModel.Heterogeneous*' run "$1" 4 "PASSED" \
            "$(cuda_noskip)" "${MPIEXEC[@]}" -n 1 "$b/tessel_mpi_tests" ;;
    cuda.np2)
        cuda_suites "$1" 2 ;;
    *) result FAIL "$1" 0 "no such test (see --list)" ;;
    esac
}

for t in "${TESTS[@]}"; do
    one "$t"
done
exit $failed
