#!/usr/bin/env bash
# Regenerates the PTX corpus and the fatbinaries next to this script.
#
# The compiler comes from PyPI, CUDA 13.5 (nvcc 13.5.37):
#   pip download --no-deps nvidia-cuda-nvcc==13.5.37 nvidia-nvvm==13.5.37 \
#       nvidia-cuda-crt==13.5.37 nvidia-cuda-runtime==13.5.37
#   for w in *.whl; do unzip -qo "$w" -d cuda13; done
# (nvidia-cuda-nvcc-cu12 12.9.86 ships only ptxas and libnvvm, no nvcc
# driver, so the corpus is built with 13.5.) Host compiler: gcc-12.
#
# usage: CUDA13=/path/to/cuda13/nvidia/cu13 ./build.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
: "${CUDA13:?set CUDA13 to the unpacked nvidia/cu13 directory}"
export PATH="$CUDA13/bin:$PATH"
nv=(nvcc -ccbin gcc-12 -I"$CUDA13/include")
# cub.cu includes CCCL's headers: unpack nvidia-cuda-cccl of the same
# release beside the others (they land in include/cccl, where nvcc looks;
# cub.ptx was built with ci/fetch-cuda.sh's toolkit, nvcc 13.0.88 and
# nvidia-cuda-cccl 13.0.85).
for cu in *.cu; do
    "${nv[@]}" -ptx -arch=sm_90 "$cu" -o "${cu%.cu}.ptx"
done
# Other code generation of the same sources: debug (-G: no
# optimisation, debug sections) and fast math for sm_80 (.ftz, approximate
# division and square roots).
"${nv[@]}" -ptx -arch=sm_90 -G divergent.cu -o divergent.debug.ptx
"${nv[@]}" -ptx -arch=sm_90 -G reduce_shfl.cu -o reduce_shfl.debug.ptx
"${nv[@]}" -ptx -arch=sm_80 --use_fast_math matmul.cu -o matmul.fast.ptx
# Fatbinaries of the smallest kernel: PTX and cubin, uncompressed and
# compressed (nvcc's default compression of 13.x is Zstd-based).
"${nv[@]}" -fatbin -gencode arch=compute_90,code=[sm_90,compute_90] \
    --no-compress vector_add.cu -o vector_add.plain.fatbin
"${nv[@]}" -fatbin -gencode arch=compute_90,code=[sm_90,compute_90] \
    --compress-mode=speed vector_add.cu -o vector_add.lz4.fatbin
"${nv[@]}" -fatbin -gencode arch=compute_90,code=[sm_90,compute_90] \
    --compress-mode=size vector_add.cu -o vector_add.zstd.fatbin
"${nv[@]}" -fatbin -gencode arch=compute_90,code=sm_90 \
    vector_add.cu -o vector_add.cubin-only.fatbin
