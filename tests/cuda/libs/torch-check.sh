#!/usr/bin/env bash
# PyTorch on the GPU it runs on (torch-suite.py beside this script): the
# device and its quota (VGPU_EXPECT_MEM bytes, when set), tensor ops,
# matmuls, cuDNN, autograd, training against the CPU, events, streams,
# CUDA graphs and out-of-memory at the quota; with TORCH_BENCH=1 the
# benchmarks too. Prints PASS/FAIL lines as the CUDA programs do.
#
# usage: torch-check.sh [CHECK...] [bench]   (TORCH_PYTHON: /opt/torch/.venv/bin/python3)
set -uo pipefail
py=${TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ -x $py ]] || { echo "FAIL torch: no $py"; exit 1; }
exec "$py" "$here/torch-suite.py" "$@"
