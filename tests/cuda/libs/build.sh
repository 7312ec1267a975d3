#!/usr/bin/env bash
# Build the programs of tests/cuda/libs (cuBLAS, cuFFT, and memfd_copy,
# a native copy-rate check) with a CUDA toolkit that has those libraries
# (NVIDIA's /usr/local/cuda on a GPU machine; the toolkit wheels CI uses
# have no cuBLAS headers). They link the libraries dynamically, as
# applications do, and take them from that toolkit's lib64 at run time.
#
# With the machine's own libcuda.so.1 it also builds cuda-trace
# (trace/libcuda.so.1, run with cuda-trace.sh), which traces a program's
# driver calls natively or in a guest, and nvml-trace
# (nvml-trace/libnvidia-ml.so.1), which traces NVML's the same way.
#
# usage: tests/cuda/libs/build.sh OUTDIR [CUDA_HOME]   (/usr/local/cuda)
set -euo pipefail

[[ $# -ge 1 && $# -le 2 ]] || {
    sed -n '2,13s/^# \{0,1\}//p' "$0" >&2
    exit 2
}
out=$1
cuda=${2:-/usr/local/cuda}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out"
[[ -x $cuda/bin/nvcc ]] || { echo "no nvcc in $cuda/bin" >&2; exit 1; }
build() {
    local name=$1
    shift
    "$cuda/bin/nvcc" -O2 -std=c++17 -gencode arch=compute_90,code=sm_90 \
        -gencode arch=compute_80,code=compute_80 -o "$out/$name" "$here/$name.cu" "$@"
}
build cublas_gemm -lcublas
build cufft -lcufft
build memfd_copy
install -m 0755 "$here/nvidia-smi-check.sh" "$here/cuda-trace.sh" \
    "$here/torch-check.sh" "$here/cupy-check.sh" "$here/jax-check.sh" "$out/"
install -m 0644 "$here/torch-suite.py" "$here/cupy-suite.py" "$here/jax-suite.py" "$here/suite.py" "$out/"
# cuda-trace: a libcuda.so.1 with the machine's driver's exported names.
real=$(ldconfig -p | awk '$1 == "libcuda.so.1" { print $NF; exit }')
if [[ -n $real ]]; then
    mkdir -p "$out/trace"
    bash "$here/gen-trace-stubs.sh" "$real" >"$out/trace/stubs.c"
    gcc -O2 -shared -fPIC -Wall -o "$out/trace/libcuda.so.1" "$here/cuda-trace.c" \
        "$out/trace/stubs.c" -ldl -lpthread
fi
# nvml-trace: the same for NVIDIA's NVML (nvml-trace/libnvidia-ml.so.1).
real=$(ldconfig -p | awk '$1 == "libnvidia-ml.so.1" { print $NF; exit }')
if [[ -n $real ]]; then
    mkdir -p "$out/nvml-trace"
    bash "$here/gen-trace-stubs.sh" "$real" nvml >"$out/nvml-trace/stubs.c"
    gcc -O2 -shared -fPIC -Wall -o "$out/nvml-trace/libnvidia-ml.so.1" "$here/cuda-trace.c" \
        "$out/nvml-trace/stubs.c" -ldl -lpthread
fi
