#!/usr/bin/env bash
# Installs every Debian 12 package tessel needs to build, test and run its main job.
# Idempotent: packages already present are left alone, and apt-get runs only when
# something is missing. Run as root, or with sudo available.
set -euo pipefail

packages=(
    build-essential cmake pkg-config git ca-certificates
    libstarpu-dev libstarpumpi-1.3-3 starpu-tools
    libopenmpi-dev openmpi-bin
    libhwloc-dev
    libdnnl-dev
    libopenblas-dev
    libgtest-dev
    zlib1g-dev
    libcjson-dev
    libhdf5-dev  # the hdf5: dataset (serial HDF5; tessel serialises its calls)
    dataset-fashion-mnist
    python3 python3-numpy
    clang-format
    doxygen  # the API reference (docs target): about 6 MB; its LLVM libraries come with clang-format
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#packages[@]} packages already installed"
    exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo_cmd=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
