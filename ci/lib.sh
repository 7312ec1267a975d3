# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this file
# Shared settings and helpers for the scripts under ci/.
#
# Source it from a script that has `set -euo pipefail`:
#     . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# --- pinned versions -------------------------------------------------------

# Debian source package of QEMU that has the vfio-user-pci client (>= 10.1).
QEMU_PKG_VERSION="1:10.2.2+ds-1"
QEMU_UPSTREAM_VERSION="10.2.2+ds"
QEMU_ORIG_TARBALL="qemu_${QEMU_UPSTREAM_VERSION}.orig.tar.xz"
QEMU_ORIG_SHA256="be05230fe47a6937cd29f28f562932c8125f9c93c2a82c625198f7a4aa601dfb"
# QEMU's configure wants this wheel in python/wheels (the +ds tarball has none).
QEMU_PYCOTAP_VERSION="1.3.1"
QEMU_PYCOTAP_WHEEL="pycotap-${QEMU_PYCOTAP_VERSION}-py3-none-any.whl"
QEMU_PYCOTAP_SHA256="1c3a25b3ff89e48f4e00f1f71dbbc1642b4f65c65d416524d07e73492fff25ea"

# Guest kernel from bookworm-backports.
KERNEL_ABI="6.12.95+deb12"
KERNEL_RELEASE="${KERNEL_ABI}-amd64"
KERNEL_PKG_VERSION="6.12.95-1~bpo12+1"
KERNEL_IMAGE_PKG="linux-image-${KERNEL_RELEASE}-unsigned"
KERNEL_HEADER_PKGS=(
    "linux-headers-${KERNEL_RELEASE}"
    "linux-headers-${KERNEL_ABI}-common"
    "linux-kbuild-${KERNEL_ABI}"
)
# The kernel's source, at the same version, for scripts/checkpatch.pl
# (the headers packages ship kernel-doc but not checkpatch).
KERNEL_SOURCE_PKG="linux-source-6.12"

# --- paths -----------------------------------------------------------------

VGPUD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VGPUD_CACHE="${VGPUD_CACHE:-/var/cache/vgpud}"

# Cache folders are keyed by version (epoch dropped, it has a colon).
QEMU_CACHE_DIR="${VGPUD_CACHE}/qemu-${QEMU_PKG_VERSION#*:}"
QEMU_BIN="${QEMU_CACHE_DIR}/bin/qemu-system-x86_64"
# Firmware for the guest comes from Debian's seabios and qemu-system-data.
QEMU_FIRMWARE_DIRS=(/usr/share/qemu /usr/share/seabios)

KERNEL_CACHE_DIR="${VGPUD_CACHE}/linux-${KERNEL_ABI}"
KERNEL_ROOT="${KERNEL_CACHE_DIR}/root"
KERNEL_IMAGE="${KERNEL_ROOT}/boot/vmlinuz-${KERNEL_RELEASE}"
KERNEL_HEADERS="${KERNEL_ROOT}/usr/src/linux-headers-${KERNEL_RELEASE}"
KERNEL_MODULES="${KERNEL_ROOT}/lib/modules/${KERNEL_RELEASE}"
# checkpatch.pl with the files it reads beside it (ci/fetch-checkpatch.sh).
KERNEL_CHECKPATCH_DIR="${KERNEL_CACHE_DIR}/checkpatch"
KERNEL_CHECKPATCH="${KERNEL_CHECKPATCH_DIR}/checkpatch.pl"

BUSYBOX="/bin/busybox"

# Read-only copies of source files, used only when the registry fails:
# a clone has shared/ beside it.
# The CUDA toolkit that builds the CUDA test programs: NVIDIA's wheels on
# PyPI (nvcc, its front end and back end, the runtime and headers, and
# CCCL's headers: Thrust, CUB, libcu++, which <cooperative_groups.h> needs
# too; the release of nvcc's), the version of the GPU machine's driver
# (CUDA 13.0); and the CUDA 12.9 runtime, static and shared, which
# programs may also be linked with.
CUDA_WHEELS=(
    "nvidia-cuda-nvcc==13.0.88"
    "nvidia-nvvm==13.0.88"
    "nvidia-cuda-crt==13.0.88"
    "nvidia-cuda-runtime==13.0.96"
    "nvidia-cuda-cccl==13.0.85"
    "nvidia-cuda-runtime-cu12==12.9.79"
)
CUDA_CACHE_DIR="${VGPUD_CACHE}/cuda-13.0.88+cccl-13.0.85+12.9.79"
CUDA_ROOT="${CUDA_CACHE_DIR}/root/nvidia/cu13"
CUDA12_RUNTIME="${CUDA_CACHE_DIR}/root/nvidia/cuda_runtime"

VGPUD_FALLBACK_DIRS=(
    "${VGPUD_ROOT}/../shared/cache"
)

# --- helpers ---------------------------------------------------------------

LOG_TAG="${LOG_TAG:-$(basename "$0" .sh)}"

# log MESSAGE...: a progress line on stderr.
log() {
    printf '[%s] %s: %s\n' "$(date +%H:%M:%S)" "$LOG_TAG" "$*" >&2
}

# die MESSAGE...: log and exit 1.
die() {
    log "ERROR: $*"
    exit 1
}

# need_root: most steps install packages or write the machine-wide cache.
need_root() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (apt-get, ${VGPUD_CACHE})"
}

# stamp_ok DIR NAME: true when step NAME finished in DIR.
# A stamp is written only after a step succeeded, so an interrupted step
# has no stamp and is redone from scratch.
stamp_ok() {
    [[ -f "$1/.stamp-$2" ]]
}

# stamp_write DIR NAME
stamp_write() {
    date -u +%Y-%m-%dT%H:%M:%SZ >"$1/.stamp-$2"
}

# cache_lock NAME: hold an exclusive lock on the cache until the script
# exits, so two concurrent runs don't build into the same folder.
cache_lock() {
    mkdir -p "$VGPUD_CACHE"
    exec {VGPUD_LOCK_FD}>"${VGPUD_CACHE}/.lock-$1"
    if ! flock -n "$VGPUD_LOCK_FD"; then
        log "waiting for another run holding ${VGPUD_CACHE}/.lock-$1"
        flock "$VGPUD_LOCK_FD"
    fi
}

# run_logged LOGFILE CMD...: run CMD with its output in LOGFILE; on failure
# show the end of the log and return the command's status.
run_logged() {
    local logfile=$1
    shift
    local rc=0
    "$@" >"$logfile" 2>&1 || rc=$?
    if [[ $rc -ne 0 ]]; then
        log "command failed (exit $rc): $*"
        log "last lines of $logfile:"
        tail -n 60 "$logfile" >&2 || true
    fi
    return "$rc"
}

# fallback_file NAME: print the path of a fallback copy of NAME, if any.
fallback_file() {
    local dir f
    for dir in "${VGPUD_FALLBACK_DIRS[@]}"; do
        for f in "$dir/$1" "$dir"/*/"$1"; do
            if [[ -f "$f" ]]; then
                printf '%s\n' "$f"
                return 0
            fi
        done
    done
    return 1
}

# elapsed SINCE_SECONDS: "12s" or "3m04s" since SINCE_SECONDS ($SECONDS).
elapsed() {
    local s=$((SECONDS - $1))
    if ((s >= 60)); then
        printf '%dm%02ds' $((s / 60)) $((s % 60))
    else
        printf '%ds' "$s"
    fi
}

# pinned_toolchain: make the Rust release rust-toolchain.toml names
# usable without a download (these machines reach no toolchain server):
# where rustup lacks it but its stable toolchain is that very release,
# stable is entered under the pinned name too. Any other mismatch stops.
pinned_toolchain() {
    command -v rustup >/dev/null || return 0
    local pin home triple stable
    pin=$(sed -n 's/^channel *= *"\(.*\)"$/\1/p' "${VGPUD_ROOT}/rust-toolchain.toml")
    [[ -n $pin ]] || die "rust-toolchain.toml names no channel"
    triple=$(rustup run stable rustc -vV 2>/dev/null | sed -n 's/^host: //p')
    home=$(rustup show home)
    [[ -e "${home}/toolchains/${pin}-${triple}" ]] && return 0
    stable=$(rustup run stable rustc --version 2>/dev/null | cut -d' ' -f2)
    [[ $stable == "$pin" ]] ||
        die "rust-toolchain.toml pins Rust ${pin}; this machine has ${stable:-no stable toolchain}"
    log "entering the stable toolchain (${stable}) as ${pin}-${triple}"
    ln -s "stable-${triple}" "${home}/toolchains/${pin}-${triple}"
}

# sha256_ok FILE SUM: the file exists and has that SHA-256.
sha256_ok() {
    [[ -f $1 ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$2" ]]
}

export DEBIAN_FRONTEND=noninteractive

# Every script here may run cargo: the pinned toolchain must be there first.
pinned_toolchain
