#!/usr/bin/env bash
# Build the initramfs of the vgpu guest test suite.
#
# usage: tests/vm/guest-suite-initramfs.sh OUT.cpio.gz
#
# The image is ci/mkinitramfs.sh's busybox image with
#   /init                  tests/vm/guest-suite-init.sh
#   /vgpu.ko               the guest driver, built against the cached guest
#                          kernel's headers (ci/fetch-kernel.sh)
#   /usr/bin/vgpu-smi, /usr/bin/vgpu-guest-test, /usr/bin/vgpu-saxpy,
#   /usr/bin/vgpu-sgemm    crates/vgpu-guest-tools, statically linked (glibc,
#                          +crt-static), stripped
#   /usr/bin/vgpu-saxpy-c  crates/vgpu-guest-tools/examples/c/saxpy.c linked
#                          statically with libvgpu_guest.a (the C interface)
#   /usr/lib/vgpu/libcuda.so.1, /usr/lib/vgpu/libnvidia-ml.so.1
#                          crates/vgpu-cuda and crates/vgpu-nvml, the
#                          guest's CUDA driver and NVML
#   /usr/libexec/vgpu-cuda-tests/*
#                          tests/cuda/*.cu built by tests/cuda/build.sh
#                          (nvcc, the static CUDA runtime), with the glibc
#                          libraries they load
#   /lib/modules-9p/*.ko   the guest kernel's 9p modules, so that mode
#                          host-cuda can use the host's userland
#
# Environment:
#   VGPU_KO=PATH           use this vgpu.ko instead of building one
#   VGPU_GUEST_BIN_DIR=DIR use the binaries and libvgpu_guest.a in DIR
#                          instead of building them (they must be static)
#   VGPU_CUDA_LIB=PATH     use this libcuda.so.1 instead of building it
#   VGPU_CUDA_TESTS=DIR    use the CUDA programs in DIR instead of building
#                          them
#
# The module is built in a temporary copy of guest-driver/, so the source
# folder gets no build outputs.
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../ci/lib.sh"

[[ $# -eq 1 && $1 != -* ]] || {
    sed -n '3,22s/^# \{0,1\}//p' "$0" >&2
    exit 2
}
out=$1
cd "$VGPUD_ROOT"

BINS=(vgpu-smi vgpu-guest-test vgpu-saxpy vgpu-sgemm)
TARGET=x86_64-unknown-linux-gnu

stage=$(mktemp -d /tmp/vgpu-guest-suite.XXXXXX)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/root/usr/bin"

# --- the module ---------------------------------------------------------------------
if [[ -n ${VGPU_KO:-} ]]; then
    [[ -f $VGPU_KO ]] || die "VGPU_KO=$VGPU_KO: no such file"
    ko=$VGPU_KO
else
    bash ci/fetch-kernel.sh >/dev/null
    [[ -d $KERNEL_HEADERS ]] || die "no kernel headers at $KERNEL_HEADERS"
    log "building vgpu.ko against $KERNEL_HEADERS"
    mkdir -p "$stage/driver"
    cp -a guest-driver/Kbuild guest-driver/Makefile guest-driver/*.c guest-driver/*.h \
        guest-driver/include "$stage/driver/"
    run_logged "$stage/driver.log" make -C "$KERNEL_HEADERS" M="$stage/driver" modules ||
        die "vgpu.ko did not build"
    ko=$stage/driver/vgpu.ko
fi
modinfo_vermagic=$(modinfo -F vermagic "$ko" 2>/dev/null || true)
if [[ -n $modinfo_vermagic && $modinfo_vermagic != "$KERNEL_RELEASE "* ]]; then
    log "warning: $ko is built for '$modinfo_vermagic', the guest runs $KERNEL_RELEASE"
fi
install -m 0644 "$ko" "$stage/root/vgpu.ko"

# --- the programs -------------------------------------------------------------------
if [[ -n ${VGPU_GUEST_BIN_DIR:-} ]]; then
    bindir=$VGPU_GUEST_BIN_DIR
else
    log "cargo build --release -p vgpu-guest -p vgpu-guest-tools --target $TARGET (static)"
    flags=${RUSTFLAGS:-}
    # Same flags every time, or cargo rebuilds everything.
    [[ $flags == *+crt-static* ]] || flags="${flags:+$flags }-C target-feature=+crt-static"
    RUSTFLAGS=$flags cargo build --release -p vgpu-guest -p vgpu-guest-tools --target "$TARGET"
    bindir="${CARGO_TARGET_DIR:-$VGPUD_ROOT/target}/$TARGET/release"
fi
for b in "${BINS[@]}"; do
    [[ -x $bindir/$b ]] || die "no $bindir/$b"
    if ldd "$bindir/$b" 2>/dev/null | grep -q '=>'; then
        die "$bindir/$b is dynamically linked; build with RUSTFLAGS='-C target-feature=+crt-static'"
    fi
    strip -o "$stage/root/usr/bin/$b" "$bindir/$b"
done
[[ -f $bindir/libvgpu_guest.a ]] || die "no $bindir/libvgpu_guest.a"
run_logged "$stage/cc.log" gcc -static -O2 -Wall -Werror \
    -I crates/vgpu-guest/include -I guest-driver/include \
    crates/vgpu-guest-tools/examples/c/saxpy.c "$bindir/libvgpu_guest.a" \
    -lpthread -ldl -lm -o "$stage/vgpu-saxpy-c" ||
    die "the C sample did not build"
strip -o "$stage/root/usr/bin/vgpu-saxpy-c" "$stage/vgpu-saxpy-c"

# --- the CUDA driver and unmodified CUDA programs -------------------------------------
if [[ -n ${VGPU_CUDA_LIB:-} ]]; then
    cudalib=$VGPU_CUDA_LIB
else
    # A shared library cannot be built with +crt-static: its own target
    # folder keeps the static build above from being rebuilt.
    log "cargo build --release -p vgpu-cuda -p vgpu-nvml (libcuda.so.1, libnvidia-ml.so.1)"
    cuda_target="${CARGO_TARGET_DIR:-$VGPUD_ROOT/target}/guest-cuda"
    CARGO_TARGET_DIR=$cuda_target cargo build --release -p vgpu-cuda -p vgpu-nvml --target "$TARGET"
    cudalib=$cuda_target/$TARGET/release/libcuda.so
    nvmllib=$cuda_target/$TARGET/release/libnvidia_ml.so
    bash tests/cuda/check-exports.sh "$cudalib" "$(bash ci/fetch-cuda.sh)/include" >&2 ||
        die "libcuda.so.1 does not export what NVIDIA's does"
fi
[[ -f $cudalib ]] || die "no $cudalib"
mkdir -p "$stage/root/usr/lib/vgpu" "$stage/root/usr/libexec/vgpu-cuda-tests"
strip -o "$stage/root/usr/lib/vgpu/libcuda.so.1" "$cudalib"
if [[ -f ${nvmllib:-} ]]; then
    strip -o "$stage/root/usr/lib/vgpu/libnvidia-ml.so.1" "$nvmllib"
fi
if [[ -n ${VGPU_CUDA_TESTS:-} ]]; then
    cp -a "$VGPU_CUDA_TESTS/." "$stage/root/usr/libexec/vgpu-cuda-tests/"
else
    bash tests/cuda/build.sh "$stage/root/usr/libexec/vgpu-cuda-tests"
fi
# The glibc libraries the programs and the driver load, at their paths.
for f in "$stage"/root/usr/libexec/vgpu-cuda-tests/* "$stage/root/usr/lib/vgpu/libcuda.so.1"; do
    while read -r lib; do
        [[ -e $stage/root/$lib ]] && continue
        mkdir -p "$stage/root/$(dirname "$lib")"
        cp -L "$lib" "$stage/root/$lib"
    done < <(ldd "$f" 2>/dev/null | grep -oE '/[^ ]+' | sort -u)
done

# The 9p client (virtio-pci is built in), uncompressed for busybox insmod.
mods=$KERNEL_CACHE_DIR/root/lib/modules/$KERNEL_RELEASE/kernel
mkdir -p "$stage/root/lib/modules-9p"
for m in fs/netfs/netfs net/9p/9pnet net/9p/9pnet_virtio fs/9p/9p; do
    xz -dc "$mods/$m.ko.xz" >"$stage/root/lib/modules-9p/$(basename "$m").ko" ||
        die "no $mods/$m.ko.xz"
done

bash ci/mkinitramfs.sh --init tests/vm/guest-suite-init.sh "$out" "$stage/root"
