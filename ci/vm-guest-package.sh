#!/usr/bin/env bash
# Install the guest package in a Debian guest and use it there: the
# package (ci/guest-package.sh) goes into a Debian root with dpkg, whose
# postinst has DKMS build vgpu.ko for the guest's kernel; that root then
# boots under QEMU (TCG) with a vGPU from vgpud, loads the DKMS module
# with modprobe, applies the udev rule (/dev/vgpuN, group vgpu, 0660),
# runs vgpu-smi, and runs tests/nvml/nvml-check.c against NVML as a
# member of the vgpu group. Last, dpkg --purge in the root must take the
# module, the DKMS tree and the package's files away.
#
# The Debian root (bookworm minbase with dkms, gcc and the guest kernel's
# headers and modules) is built once with debootstrap and cached in
# ${VGPUD_CACHE}/guest-root-<release>-<kernel package version>; each run
# installs the package into a fresh copy of it.
#
# Prints one line per check and `guest-package: N passed, M failed`.
#
# Environment:
#   VM_TIMEOUT=420   seconds before the guest is killed (TCG is slow)
#   VM_KEEP=1        keep the temporary folder (root, image, logs)
#   VM_LIVE=1        show the guest's console while it runs
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VM_TIMEOUT=${VM_TIMEOUT:-420}
VM_KEEP=${VM_KEEP:-0}
VM_LIVE=${VM_LIVE:-0}
VM_MEM_MB=1024
# The vGPU's memory quota; NVML must report it as the total.
VGPU_MEM=$((256 << 20))
RELEASE=bookworm
ROOT_CACHE="${VGPUD_CACHE}/guest-root-${RELEASE}-${KERNEL_PKG_VERSION}"
BASE_ROOT="$ROOT_CACHE/root"
# What the root needs besides minbase: DKMS and the compiler it builds
# with, udev, and what the checks use.
ROOT_PKGS=(dkms gcc-12 make libc6-dev kmod udev openssl xz-utils)
# A root made from another package list is made again.
ROOT_STAMP="ready-$(echo "${ROOT_PKGS[*]}" | md5sum | cut -c1-8)"

need_root
cd "$VGPUD_ROOT"
t_all=$SECONDS
TMP=$(mktemp -d /tmp/vgpud-guest-pkg.XXXXXX)
vgpud_pid=""
qemu_pids=()
mounted=()
result=1

# chroot_mounts ROOT / chroot_umounts: what dpkg and DKMS need in a chroot.
chroot_mounts() {
    local r=$1
    mount -t proc proc "$r/proc" && mounted+=("$r/proc")
    mount -t sysfs sysfs "$r/sys" && mounted+=("$r/sys")
    mount --bind /dev "$r/dev" && mounted+=("$r/dev")
    mount -t tmpfs tmpfs "$r/tmp" && mounted+=("$r/tmp")
}
chroot_umounts() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount "${mounted[i]}" || umount -l "${mounted[i]}" || true
    done
    mounted=()
}

cleanup() {
    local pid
    chroot_umounts
    for pid in "${qemu_pids[@]}" $vgpud_pid; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${qemu_pids[@]}" $vgpud_pid; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ $VM_KEEP == 1 || $result -ne 0 ]]; then
        log "logs kept in $TMP"
    elif findmnt -rn -o TARGET | grep -q "^$TMP/"; then
        log "something is still mounted under $TMP: not removing it"
    else
        rm -rf --one-file-system "$TMP"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

passed=0
failed=0
check_pass() {
    echo "  PASS $*" >&2
    passed=$((passed + 1))
}
check_fail() {
    echo "  FAIL $*" >&2
    failed=$((failed + 1))
}

# --- inputs (cached after the first run) ---------------------------------------------
qemu=$(bash ci/build-qemu.sh)
bash ci/fetch-kernel.sh >/dev/null
deb=$(bash ci/guest-package.sh)
log "cargo build --release -p vgpud"
cargo build -q --release -p vgpud
vgpud="${CARGO_TARGET_DIR:-$VGPUD_ROOT/target}/release/vgpud"
gcc -O2 -Wall -Wextra -Werror -o "$TMP/nvml-check" tests/nvml/nvml-check.c ||
    die "tests/nvml/nvml-check.c does not build"

# debian_mirror: the Debian archive the host's apt uses (ci/setup-host.sh
# wrote it into vgpud.sources), else Debian's default.
debian_mirror() {
    local uri=""
    if [[ -f /etc/apt/sources.list.d/vgpud.sources ]]; then
        uri=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' \
            /etc/apt/sources.list.d/vgpud.sources | head -n1)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

# build_base_root: debootstrap, the packages, and the guest kernel's
# image (for its modules: the guest boots the image QEMU is given) and
# headers, installed as packages from the debs ci/fetch-kernel.sh
# downloaded.
build_base_root() {
    local mirror logs="$ROOT_CACHE/logs" t=$SECONDS
    mirror=$(debian_mirror)
    command -v debootstrap >/dev/null || {
        log "apt-get install debootstrap"
        run_logged "$VGPUD_CACHE/logs/debootstrap-install.log" \
            apt-get install -y -q --no-install-recommends debootstrap
    }
    rm -rf "$ROOT_CACHE"
    mkdir -p "$logs"
    log "debootstrap $RELEASE from $mirror (log: $logs/debootstrap.log)"
    run_logged "$logs/debootstrap.log" debootstrap --variant=minbase "$RELEASE" \
        "$BASE_ROOT" "$mirror" || die "debootstrap failed"
    cat >"$BASE_ROOT/etc/apt/sources.list" <<SRC
deb $mirror $RELEASE main
deb $mirror $RELEASE-backports main
SRC
    echo 'APT::Install-Recommends "false";' >"$BASE_ROOT/etc/apt/apt.conf.d/90vgpud-no-recommends"
    chroot_mounts "$BASE_ROOT"
    mkdir -p "$BASE_ROOT/tmp/kernel"
    local p
    for p in "$KERNEL_IMAGE_PKG" "${KERNEL_HEADER_PKGS[@]}"; do
        cp "$KERNEL_CACHE_DIR/debs/${p}_"*.deb "$BASE_ROOT/tmp/kernel/"
    done
    log "installing ${ROOT_PKGS[*]} and the kernel $KERNEL_RELEASE with its headers into the root"
    run_logged "$logs/apt.log" chroot "$BASE_ROOT" sh -c "
        apt-get update -q &&
        apt-get install -y -q ${ROOT_PKGS[*]} &&
        apt-get install -y -q -t $RELEASE-backports /tmp/kernel/*.deb &&
        apt-get clean" || die "installing packages into the root failed"
    chroot_umounts
    # (build is an absolute link: look from inside the root.)
    chroot "$BASE_ROOT" test -f "/lib/modules/$KERNEL_RELEASE/build/Makefile" ||
        die "the root has no headers for $KERNEL_RELEASE"
    # The guest boots with its own small initramfs: not the root's.
    rm -rf "$BASE_ROOT/var/lib/apt/lists"/* "$BASE_ROOT/tmp"/* "$BASE_ROOT"/boot/initrd.img-*
    stamp_write "$ROOT_CACHE" "$ROOT_STAMP"
    log "Debian root ready in $(elapsed "$t") ($(du -sh "$BASE_ROOT" | cut -f1))"
}

if ! stamp_ok "$ROOT_CACHE" "$ROOT_STAMP"; then
    cache_lock guest-root
    stamp_ok "$ROOT_CACHE" "$ROOT_STAMP" || build_base_root
fi

# --- install the package into a copy of the root ----------------------------------------
t=$SECONDS
root="$TMP/root"
cp -a "$BASE_ROOT" "$root"
log "copied the Debian root in $(elapsed "$t")"
chroot_mounts "$root"
cp "$deb" "$root/tmp/vgpu-guest.deb"
t=$SECONDS
if run_logged "$TMP/dpkg-install.log" chroot "$root" dpkg -i /tmp/vgpu-guest.deb; then
    check_pass "dpkg-install $(basename "$deb") ($(elapsed "$t"))"
else
    check_fail "dpkg-install: dpkg -i failed"
fi
# Built for the guest's kernel: the root's, not this machine's.
mapfile -t kos < <(find "$root/usr/lib/modules/$KERNEL_RELEASE/updates/dkms" \
    -name 'vgpu.ko*' 2>/dev/null)
if [[ ${#kos[@]} -eq 1 ]] &&
    [[ $(chroot "$root" modinfo -k "$KERNEL_RELEASE" -F vermagic vgpu) == "$KERNEL_RELEASE "* ]]; then
    check_pass "dkms-build vgpu.ko for $KERNEL_RELEASE: ${kos[0]#"$root"}"
else
    check_fail "dkms-build: no vgpu.ko for $KERNEL_RELEASE under /lib/modules/$KERNEL_RELEASE/updates/dkms"
    cat "$TMP/dpkg-install.log" >&2
fi
# Configuring again (dpkg-reconfigure, or after installing headers) keeps
# what is there.
if run_logged "$TMP/postinst-again.log" chroot "$root" \
    /var/lib/dpkg/info/vgpu-guest.postinst configure &&
    [[ $(chroot "$root" dkms status -m vgpu -k "$KERNEL_RELEASE") == *installed* ]]; then
    check_pass "postinst-again: configuring twice keeps the module installed"
else
    check_fail "postinst-again: a second configure failed or lost the module"
fi
# A member of the vgpu group runs the NVML checks.
chroot "$root" useradd --create-home --groups vgpu vgpuci
install -m 0755 "$TMP/nvml-check" "$root/usr/local/bin/nvml-check"
install -m 0755 tests/vm/guest-package-init.sh "$root/usr/local/sbin/vgpu-ci-init"
chroot_umounts

# --- boot it --------------------------------------------------------------------------------
# The root as an ext4 disk, and a small initramfs that mounts it: the
# kernel's virtio-blk and ext4 modules (with what they depend on), then
# switch_root to the checks.
t=$SECONDS
size_mb=$(($(du -sm "$root" | cut -f1) + 256))
run_logged "$TMP/mkfs.log" mkfs.ext4 -q -F -L vgpuroot -d "$root" "$TMP/root.img" "${size_mb}M" ||
    die "mkfs.ext4 failed"
mkdir -p "$TMP/initramfs/lib/modules"
: >"$TMP/initramfs/lib/modules/order"
while read -r kind path _; do
    [[ $kind == insmod ]] || continue
    name=$(basename "${path%.xz}")
    xz -dc "$root$path" >"$TMP/initramfs/lib/modules/$name"
    echo "$name" >>"$TMP/initramfs/lib/modules/order"
done < <(chroot "$root" modprobe -a -S "$KERNEL_RELEASE" --show-depends virtio_blk ext4 | awk '!seen[$2]++')
bash ci/mkinitramfs.sh --init tests/vm/guest-package-initramfs.sh "$TMP/initrd.gz" "$TMP/initramfs"
log "disk image (${size_mb} MiB) and initramfs in $(elapsed "$t")"

mkdir -p "$TMP/run"
cat >"$TMP/vgpud.toml" <<TOML
[daemon]
runtime_dir = "$TMP/run"
metrics_address = ""

[[gpu]]
name = "gpu0"
backend = "software"
memory = "1GiB"
compute_units = 2

[[vgpu]]
name = "a"
gpu = "gpu0"
socket = "a.sock"
memory = $VGPU_MEM
compute_units = 1
TOML
"$vgpud" run --allow-root --config "$TMP/vgpud.toml" </dev/null >"$TMP/vgpud.log" 2>&1 &
vgpud_pid=$!
for _ in $(seq 300); do
    [[ -S $TMP/run/a.sock ]] && break
    kill -0 "$vgpud_pid" 2>/dev/null || { cat "$TMP/vgpud.log" >&2; die "vgpud exited"; }
    sleep 0.1
done
[[ -S $TMP/run/a.sock ]] || { cat "$TMP/vgpud.log" >&2; die "vgpud did not create its socket"; }

# shellcheck disable=SC2054  # commas separate QEMU sub-options
args=(
    -machine q35,accel=tcg -cpu max -smp 2 -m "$VM_MEM_MB"
    -object "memory-backend-memfd,id=mem,size=${VM_MEM_MB}M,share=on" -numa node,memdev=mem
    -nographic -no-reboot -nodefaults -serial stdio -net none
    -L /usr/share/qemu -L /usr/share/seabios
    -kernel "$KERNEL_IMAGE" -initrd "$TMP/initrd.gz"
    -append "console=ttyS0 quiet panic=-1 vgpuci.mem=$VGPU_MEM vgpuci.count=1"
    -drive "file=$TMP/root.img,format=raw,if=virtio,cache=unsafe"
    -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$TMP/run/a.sock\",\"type\":\"unix\"}}"
)
t=$SECONDS
log "booting the Debian guest (TCG, timeout ${VM_TIMEOUT}s)"
timeout -k 10 "$VM_TIMEOUT" "$qemu" "${args[@]}" </dev/null >"$TMP/guest.log" 2>"$TMP/guest.qemu.log" &
qemu_pids=($!)
if [[ $VM_LIVE == 1 ]]; then
    tail -n +1 -f --pid="${qemu_pids[0]}" "$TMP/guest.log" | sed -u 's/\r$//' >&2 &
fi
wait "${qemu_pids[0]}" || true
qemu_pids=()
log "guest done in $(elapsed "$t")"
kill -TERM "$vgpud_pid" 2>/dev/null || true
wait "$vgpud_pid" 2>/dev/null || true
vgpud_pid=""

# verdict (ci/vm-guests.sh) counts the guest's VGPU-TEST lines into
# passed and failed, which sourcing it resets: keep the host's counts.
passed_host=$passed
failed_host=$failed
# shellcheck source=vm-guests.sh
. "$VGPUD_ROOT/ci/vm-guests.sh"
verdict guest || true
passed=$((passed + passed_host))
failed=$((failed + failed_host))
if grep -qE 'panicked|ERROR' "$TMP/vgpud.log"; then
    check_fail "vgpud logged errors or panics"
    cat "$TMP/vgpud.log" >&2
fi

# --- purge --------------------------------------------------------------------------------
chroot_mounts "$root"
if run_logged "$TMP/dpkg-purge.log" chroot "$root" dpkg --purge vgpu-guest; then
    left=()
    while read -r f; do
        left+=("${f#"$root"}")
    done < <(find "$root/usr/lib/modules" -path '*/updates/dkms/vgpu.ko*'
        find "$root/usr/src" "$root/var/lib/dkms" -maxdepth 1 -name 'vgpu*'
        find "$root/usr/lib/vgpu" "$root/etc/ld.so.conf.d/vgpu.conf" "$root/usr/bin/vgpu-smi" \
            "$root/usr/lib/udev/rules.d/70-vgpu.rules" "$root/usr/lib/sysusers.d/vgpu.conf" \
            -maxdepth 0 2>/dev/null)
    if chroot "$root" ldconfig -p | grep -qE 'libnvidia-ml|libcuda'; then
        left+=("the loader's cache still lists the libraries")
    fi
    if [[ ${#left[@]} -eq 0 ]]; then
        check_pass "dpkg-purge removes the module, the DKMS tree and the files"
    else
        check_fail "dpkg-purge left: ${left[*]}"
    fi
else
    check_fail "dpkg-purge: dpkg --purge failed"
fi
chroot_umounts

if [[ $failed -eq 0 && $passed -gt 0 ]]; then
    result=0
    log "PASS: $passed checks in $(elapsed "$t_all")"
else
    log "FAIL (logs in $TMP)"
fi
echo "guest-package: $passed passed, $failed failed"
exit "$result"
