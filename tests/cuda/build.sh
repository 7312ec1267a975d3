#!/usr/bin/env bash
# Build the CUDA programs of tests/cuda with nvcc as NVIDIA's toolkit
# builds them by default (the static CUDA runtime), PTX for compute_80 so
# any device from Ampere on (and the software backend's PTX executor)
# runs them; and vector_add_shared, on the shared runtime. The toolkit
# comes from ci/fetch-cuda.sh.
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
