#!/usr/bin/env bash
# Fetch the CUDA toolkit that builds the CUDA test programs (nvcc with the
# static runtime, and CCCL's headers: Thrust, CUB, libcu++) from NVIDIA's
# wheels on PyPI into the machine-wide cache.
# No GPU and no driver are needed to compile; the programs run against the
# guest's libcuda.so.1 (crates/vgpu-cuda).
#
# Prints the toolkit root (bin/nvcc, include/, lib/) on stdout; the CUDA
# 12.9 runtime is in $CUDA12_RUNTIME (ci/lib.sh). Skips everything when
# cached.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if stamp_ok "$CUDA_CACHE_DIR" ready && [[ -x $CUDA_ROOT/bin/nvcc ]]; then
    printf '%s\n' "$CUDA_ROOT"
    exit 0
fi
cache_lock cuda
if ! { stamp_ok "$CUDA_CACHE_DIR" ready && [[ -x $CUDA_ROOT/bin/nvcc ]]; }; then
    command -v python3 >/dev/null || die "python3 is needed to fetch the CUDA wheels"
    rm -rf "$CUDA_CACHE_DIR/root" "$CUDA_CACHE_DIR/wheels"
    mkdir -p "$CUDA_CACHE_DIR/wheels" "$CUDA_CACHE_DIR/root"
    log "downloading ${CUDA_WHEELS[*]}"
    run_logged "$CUDA_CACHE_DIR/pip.log" python3 -m pip download --no-deps --quiet \
        --dest "$CUDA_CACHE_DIR/wheels" "${CUDA_WHEELS[@]}" ||
        die "could not download the CUDA wheels"
    for w in "$CUDA_CACHE_DIR"/wheels/*.whl; do
        python3 -m zipfile -e "$w" "$CUDA_CACHE_DIR/root" || die "could not unpack $w"
    done
    # Wheels do not keep file modes.
    chmod +x "$CUDA_ROOT"/bin/* "$CUDA_ROOT"/nvvm/bin/*
    probe=$(mktemp -d /tmp/vgpud-nvcc.XXXXXX)
    # CCCL's headers are where nvcc looks for them (include/cccl).
    printf '#include <thrust/sort.h>\n#include <cub/cub.cuh>\n#include <cooperative_groups.h>\n__global__ void k(int *p) { *p = 1; }\nint main() { return 0; }\n' >"$probe/k.cu"
    run_logged "$CUDA_CACHE_DIR/probe.log" "$CUDA_ROOT/bin/nvcc" -L "$CUDA_ROOT/lib" \
        -o "$probe/k" "$probe/k.cu" || die "nvcc from the wheels does not build a program"
    rm -rf "$probe"
    stamp_write "$CUDA_CACHE_DIR" ready
    log "CUDA toolkit ready in $CUDA_ROOT"
fi
printf '%s\n' "$CUDA_ROOT"
