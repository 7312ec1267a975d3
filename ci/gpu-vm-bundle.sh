#!/usr/bin/env bash
# Pack what tests/vm/gpu-vm.sh needs on a GPU machine where nothing can be
# built or installed: QEMU (this machine's build) with the shared
# libraries it loads and its firmware, the guest kernel, the guest suite's
# initramfs (the vgpu module, the guest tools, libcuda.so.1 and the CUDA
# programs of tests/cuda), vgpud, vgpuctl and vgpu-partition-host.
#
# usage: ci/gpu-vm-bundle.sh [OUT.tar.xz]     (default .devbin/gpu-vm.tar.xz)
#
# Then, on the GPU machine, from a checkout: bash tests/vm/gpu-vm.sh OUT.tar.xz
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cd "$VGPUD_ROOT"
out=${1:-.devbin/gpu-vm.tar.xz}
stage=$(mktemp -d /tmp/vgpud-gpu-vm-bundle.XXXXXX)
trap 'rm -rf "$stage"' EXIT
b=$stage/gpu-vm
mkdir -p "$b/bin" "$b/lib" "$b/firmware"

# The packages QEMU's build and the guest image need (a no-op when there).
bash ci/setup-host.sh >&2
qemu=$(bash ci/build-qemu.sh)
bash ci/fetch-kernel.sh >/dev/null
cp -L "$qemu" "$b/bin/qemu-system-x86_64"
# Every library QEMU loads but the C library itself, which the GPU
# machine's newer one replaces.
while read -r lib; do
    case $(basename "$lib") in
    libc.so.* | libm.so.* | ld-linux*) ;;
    *) cp -L "$lib" "$b/lib/" ;;
    esac
done < <(ldd "$qemu" | grep -oE '/[^ ]+' | sort -u)
for fw in /usr/share/seabios/bios-256k.bin /usr/share/qemu/kvmvapic.bin /usr/share/qemu/linuxboot_dma.bin; do
    cp -L "$fw" "$b/firmware/"
done
cp "$KERNEL_IMAGE" "$b/vmlinuz"

bash ci/check-guest-driver.sh >/dev/null
# The CUDA programs go into the image and beside it, to run natively too.
bash tests/cuda/build.sh "$b/cuda-tests"
VGPU_KO="$VGPUD_ROOT/guest-driver/vgpu.ko" VGPU_CUDA_TESTS="$b/cuda-tests" \
    bash tests/vm/guest-suite-initramfs.sh "$b/initrd.gz"
make -s -C "$KERNEL_HEADERS" M="$VGPUD_ROOT/guest-driver" clean >/dev/null 2>&1 || true

cargo build --release -p vgpud -p vgpuctl -p vgpu-partition-host
for p in vgpud vgpuctl vgpu-partition-host; do
    strip -o "$b/bin/$p" "${CARGO_TARGET_DIR:-$VGPUD_ROOT/target}/release/$p"
done
git rev-parse HEAD >"$b/commit" 2>/dev/null || true

mkdir -p "$(dirname "$out")"
tar -C "$stage" -cJf "$out" gpu-vm
log "wrote $out ($(du -h "$out" | cut -f1))"
