#!/usr/bin/env bash
# Checks that a libcuda.so.1 exports every function CUDA's cuda.h declares
# (legacy, versioned and per-thread-stream names, and the names its
# macros expand to): libraries such as cuFFT look the driver's functions
# up by name with dlsym and refuse to start if one is missing.
#
# usage: tests/cuda/check-exports.sh LIBCUDA.so CUDA_INCLUDE_DIR
set -euo pipefail
[[ $# -eq 2 && -f $1 && -f $2/cuda.h ]] || {
    sed -n '2,7s/^# \{0,1\}//p' "$0" >&2
    exit 2
}
lib=$1
inc=$2
declared=$(
    {
        gcc -E -D__CUDA_API_VERSION_INTERNAL -x c "$inc/cuda.h" -I "$inc" |
            grep -oE '\bCUresult\s+(CUDAAPI\s+)?cu[A-Za-z0-9_]+\s*\(' | grep -oE 'cu[A-Za-z0-9_]+'
        grep -E '^\s*#\s*define\s+cu[A-Za-z0-9]+\s+' "$inc/cuda.h" | awk '{print $3}' |
            grep -oE 'cu[A-Za-z0-9_]+'
    } | sort -u
)
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
if [[ -n $missing ]]; then
    echo "check-exports: $lib lacks $(wc -l <<<"$missing") of cuda.h's functions:" >&2
    head -n 20 <<<"$missing" | sed 's/^/  /' >&2
    exit 1
fi
echo "check-exports: $lib exports all $(wc -l <<<"$declared") functions of $inc/cuda.h"
