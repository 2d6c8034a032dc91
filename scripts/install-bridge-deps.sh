#!/usr/bin/env bash
# What the PyTorch bridge (python/tessel_torch.py), its tests (bridge.torch, bridge.onnx) and the
# benchmarks against PyTorch (bench/vs_pytorch.py) need beyond scripts/install-deps.sh: Debian's
# PyTorch, numpy and onnx (ONNX export's check) for /usr/bin/python3; and matplotlib for the
# plots (python/tessel_plot.py, its test cli.bench_plots). Does nothing when they are installed.
set -euo pipefail
if /usr/bin/python3 -c 'import numpy, torch, matplotlib, onnx' 2>/dev/null; then
    echo "install-bridge-deps: python3-torch, python3-numpy, python3-matplotlib and python3-onnx" \
        "already installed"
    exit 0
fi
sudo_cmd=""
if [ "$(id -u)" -ne 0 ]; then
    sudo_cmd="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo_cmd apt-get update -qq
$sudo_cmd apt-get install -y -qq --no-install-recommends python3-torch python3-numpy \
    python3-matplotlib python3-onnx >/dev/null
/usr/bin/python3 -c 'import numpy, torch, matplotlib, onnx; print("install-bridge-deps: torch", torch.__version__, "matplotlib", matplotlib.__version__, "onnx", onnx.__version__)'
