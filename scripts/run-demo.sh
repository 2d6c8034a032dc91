#!/usr/bin/env bash
# Runs the tessel demo under mpirun on NP ranks (default 4) from an existing build.
# On one machine this oversubscribes cores; as root it sets Open MPI's root permission.
set -euo pipefail
cd "$(dirname "$0")/.."
np=${NP:-4}
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export STARPU_SILENT=${STARPU_SILENT:-1}
export STARPU_NCPU=${STARPU_NCPU:-1}
export STARPU_HOME=${STARPU_HOME:-$PWD/build/starpu-home}
mkdir -p "$STARPU_HOME"
exec mpirun --oversubscribe --bind-to none -np "$np" build/tessel demo "$@"
