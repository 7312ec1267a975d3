#!/usr/bin/env bash
# JAX on the GPU it runs on (jax-suite.py beside this script): the
# devices it finds, a jitted matmul and a gradient against NumPy. Prints PASS/FAIL
# lines as the CUDA programs do.
#
# usage: jax-check.sh [CHECK...]   (TORCH_PYTHON: /opt/torch/.venv/bin/python3)
set -uo pipefail
py=${TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ -x $py ]] || { echo "FAIL jax: no $py"; exit 1; }
exec "$py" "$here/jax-suite.py" "$@"
