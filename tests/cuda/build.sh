#!/usr/bin/env bash
# Build the CUDA programs of tests/cuda with nvcc as NVIDIA's toolkit
# builds them by default (the static CUDA runtime), PTX for compute_80 so
# any device from Ampere on (and the software backend's PTX executor)
# runs them; and vector add again on the shared runtime and on the CUDA
# 12.9 runtime, static and shared. The toolkit comes from ci/fetch-cuda.sh.
#
# usage: tests/cuda/build.sh OUTDIR
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../ci/lib.sh"

[[ $# -eq 1 ]] || {
    sed -n '3,8s/^# \{0,1\}//p' "$0" >&2
    exit 2
}
out=$1
mkdir -p "$out"
nvcc_root=$(bash "$VGPUD_ROOT/ci/fetch-cuda.sh")
for src in "$VGPUD_ROOT"/tests/cuda/*.cu; do
    name=$(basename "$src" .cu)
    run_logged "$out/.nvcc-$name.log" "$nvcc_root/bin/nvcc" -O2 \
        -arch=compute_80 -code=compute_80 -L "$nvcc_root/lib" \
        -o "$out/$name" "$src" || die "nvcc did not build $src"
    rm -f "$out/.nvcc-$name.log"
done
# What module_load loads through the driver API, beside it: PTX, a
# fatbinary of PTX, relocatable PTX to link, and machine code for
# Ampere (sm_80), which a Hopper-class device cannot run.
ml=$out/module_load.d
mkdir -p "$ml"
src=$VGPUD_ROOT/tests/cuda/module_load
for step in "-ptx -o $ml/scale.ptx $src/scale.cu" \
    "-fatbin -o $ml/scale.fatbin $src/scale.cu" \
    "-ptx -rdc=true -o $ml/link_main.ptx $src/link_main.cu" \
    "-ptx -rdc=true -o $ml/link_lib.ptx $src/link_lib.cu"; do
    # shellcheck disable=SC2086  # one step's words
    run_logged "$out/.nvcc-module-load.log" "$nvcc_root/bin/nvcc" \
        -arch=compute_80 -code=compute_80 $step || die "nvcc: $step"
done
run_logged "$out/.nvcc-module-load.log" "$nvcc_root/bin/nvcc" -cubin -arch=sm_80 \
    -o "$ml/scale_sm80.cubin" "$src/scale.cu" || die "nvcc did not build scale_sm80.cubin"
rm -f "$out/.nvcc-module-load.log"
# The same vector add on the shared runtime, which finds the driver the
# same way; libcudart.so.13 goes beside it, found through its RUNPATH.
cp -L "$nvcc_root/lib/libcudart.so.13" "$out/"
# The wheel has no unversioned name for the linker to find.
ln -sf libcudart.so.13 "$out/libcudart.so"
run_logged "$out/.nvcc-shared.log" "$nvcc_root/bin/nvcc" -O2 -cudart shared \
    -arch=compute_80 -code=compute_80 -L "$out" -L "$nvcc_root/lib" \
    -Xlinker -rpath -Xlinker "\$ORIGIN" \
    -o "$out/vector_add_shared" "$VGPUD_ROOT/tests/cuda/vector_add.cu" ||
    die "nvcc did not build vector_add_shared"
rm -f "$out/.nvcc-shared.log"
# And on the CUDA 12.9 runtime, static and shared: the driver serves both
# generations of the runtime.
cp -L "$CUDA12_RUNTIME/lib/libcudart.so.12" "$out/"
mkdir -p "$out/.cuda12"
cp -L "$CUDA12_RUNTIME/lib/libcudart_static.a" "$CUDA12_RUNTIME/lib/libculibos.a" "$out/.cuda12/"
ln -sf ../libcudart.so.12 "$out/.cuda12/libcudart.so"
for kind in static shared; do
    name=vector_add_cuda12
    [[ $kind == shared ]] && name+=_shared
    run_logged "$out/.nvcc-$name.log" "$nvcc_root/bin/nvcc" -O2 -cudart "$kind" \
        -arch=compute_80 -code=compute_80 -I "$CUDA12_RUNTIME/include" \
        -L "$out/.cuda12" -L "$nvcc_root/lib" -Xlinker -rpath -Xlinker "\$ORIGIN" \
        -o "$out/$name" "$VGPUD_ROOT/tests/cuda/vector_add.cu" ||
        die "nvcc did not build $name"
    rm -f "$out/.nvcc-$name.log"
done
rm -rf "$out/.cuda12"
