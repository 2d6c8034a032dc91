#!/usr/bin/env bash
# The CUDA build of tessel, for CI: builds StarPU with CUDA (scripts/build-starpu-cuda.sh,
# which does nothing when its stamp is current), configures tessel against it with
# TESSEL_CUDA=ON, builds it, and runs the unit tests with it.
#
# Usage: bash scripts/ci-cuda-build.sh   (from the repository root)
#   CUDA_DIR            the CUDA toolkit (default /usr/local/cuda); without its nvcc the script
#                       says "skipped" and exits 0
#   STARPU_CUDA_PREFIX  where StarPU with CUDA goes (default $PWD/build-starpu-cuda/prefix)
#   BUILD_DIR           tessel's build folder (default $PWD/build-cuda)
#   CTEST_ARGS          what ctest runs (default: -L unit); e.g. "-R ^mpi\.tensor\.np1$" or ""
#                       for the whole suite
# On a machine without a GPU, StarPU finds no CUDA device and runs on CPU workers only; the
# CUDA codelet tests (tests/mpi/test_cuda.cpp) then skip.
set -euo pipefail

say() { echo "ci-cuda-build: $*"; }

CUDA_DIR="${CUDA_DIR:-/usr/local/cuda}"
if [ ! -x "$CUDA_DIR/bin/nvcc" ]; then
    say "skipped: no $CUDA_DIR/bin/nvcc"
    exit 0
fi
PREFIX="${STARPU_CUDA_PREFIX:-$PWD/build-starpu-cuda/prefix}"
BUILD_DIR="${BUILD_DIR:-$PWD/build-cuda}"
read -r -a ctest_args <<<"${CTEST_ARGS--L unit}"
jobs="$(nproc)"

say "StarPU with CUDA in $PREFIX"
CUDA_DIR="$CUDA_DIR" bash scripts/build-starpu-cuda.sh "$PREFIX"

say "configure $BUILD_DIR (TESSEL_CUDA=ON)"
mkdir -p "$BUILD_DIR"
if ! PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" \
    CUDACXX="$CUDA_DIR/bin/nvcc" \
    cmake -S . -B "$BUILD_DIR" -DTESSEL_CUDA=ON >"$BUILD_DIR/configure.log" 2>&1; then
    cat "$BUILD_DIR/configure.log"
    say "error: configure failed (log above)"
    exit 1
fi
grep -E '^-- tessel:' "$BUILD_DIR/configure.log"

say "build ($jobs jobs)"
cmake --build "$BUILD_DIR" -j"$jobs"

say "ctest ${ctest_args[*]}"
ctest --test-dir "$BUILD_DIR" -j"$jobs" --output-on-failure "${ctest_args[@]}"
say "passed"
