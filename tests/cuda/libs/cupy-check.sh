#!/usr/bin/env bash
# CuPy on the GPU it runs on (cupy-suite.py beside this script): the
# device and its quota (VGPU_EXPECT_MEM bytes, when set), arithmetic,
# reductions, a matmul, kernels compiled by NVRTC (ElementwiseKernel,
# RawKernel) and out-of-memory at the quota, each checked against NumPy.
# Prints PASS/FAIL lines as the CUDA programs do.
#
# usage: cupy-check.sh [CHECK...]   (TORCH_PYTHON: /opt/torch/.venv/bin/python3)
set -uo pipefail
py=${TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ -x $py ]] || { echo "FAIL cupy: no $py"; exit 1; }
exec "$py" "$here/cupy-suite.py" "$@"
