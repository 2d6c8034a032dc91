#!/usr/bin/env bash
# The main job: train the small CNN of the model zoo on Fashion-MNIST (from the Debian
# package) for 3 epochs on one rank with every core as a StarPU worker, printing progress,
# a summary per epoch (test accuracy reaches about 91 %), and writing build/train-metrics.json
# and the trained parameters to build/cnn-params/ (PyTorch state_dict names, .npy).
# NP=2 runs it on 2 MPI ranks instead; extra arguments go to `tessel train`.
set -euo pipefail
cd "$(dirname "$0")/.."
np=${NP:-1}
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export STARPU_SILENT=${STARPU_SILENT:-1}
export STARPU_HOME=${STARPU_HOME:-$PWD/build/starpu-home}
mkdir -p "$STARPU_HOME"
args=(train --model cnn --data fashion-mnist --epochs 3 --batch 64 --optimizer adam --lr 0.001
      --seed 1 --metrics-json build/train-metrics.json --save-params build/cnn-params "$@")
if [ "$np" -eq 1 ]; then
    exec build/tessel "${args[@]}"
fi
export STARPU_NCPU=${STARPU_NCPU:-1}
exec mpirun --oversubscribe --bind-to none -np "$np" build/tessel "${args[@]}"
