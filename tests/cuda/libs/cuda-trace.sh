#!/usr/bin/env bash
# Runs PROGRAM through cuda-trace (trace/libcuda.so.1 beside this script,
# built by build.sh): one line per driver call on stderr, or with
# CUDA_TRACE=summary each function's calls and time at exit. The driver
# traced is CUDA_TRACE_REAL, else the guest's library where the guest
# suite puts it (/tmp/vgpu), else the machine's own libcuda.so.1.
#
# usage: cuda-trace.sh PROGRAM [ARGS...]   (PROGRAM beside this script unless a path)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ $# -ge 1 ]] || {
    sed -n '2,9s/^# \{0,1\}//p' "$0" >&2
    exit 2
}
real=${CUDA_TRACE_REAL:-}
if [[ -z $real ]]; then
    if [[ -e /tmp/vgpu/libcuda.so.1 ]]; then
        real=/tmp/vgpu/libcuda.so.1
    else
        real=$(ldconfig -p | awk '$1 == "libcuda.so.1" { print $NF; exit }')
    fi
fi
[[ -n $real ]] || { echo "FAIL cuda-trace: no libcuda.so.1 to trace" >&2; exit 1; }
export CUDA_TRACE_REAL=$real
export LD_LIBRARY_PATH=$here/trace${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
prog=$1
shift
[[ $prog == */* ]] || prog=$here/$prog
exec "$prog" "$@"
