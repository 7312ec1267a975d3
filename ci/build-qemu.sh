#!/usr/bin/env bash
# Build qemu-system-x86_64 with the vfio-user-pci client from Debian's
# source package and install it into the machine-wide cache.
#
# Prints the path of the binary on stdout. Skips everything when the cache
# already has a working binary. Takes about 2.5 minutes on 2 cores.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SRC_DIR="${QEMU_CACHE_DIR}/src"     # downloaded source files (kept)
WORK_DIR="${QEMU_CACHE_DIR}/work"   # unpacked tree and build (removed after)
LOG_DIR="${QEMU_CACHE_DIR}/logs"

# qemu_ok: the installed binary runs and has the vfio-user-pci device.
qemu_ok() {
    [[ -x $QEMU_BIN ]] &&
        "$QEMU_BIN" -nodefaults -device help 2>/dev/null | grep -q '"vfio-user-pci"'
}

if stamp_ok "$QEMU_CACHE_DIR" installed && qemu_ok; then
    log "cached: $QEMU_BIN"
    echo "$QEMU_BIN"
    exit 0
fi

need_root
cache_lock qemu
# Another run may have finished it while we waited for the lock.
if stamp_ok "$QEMU_CACHE_DIR" installed && qemu_ok; then
    log "cached: $QEMU_BIN"
    echo "$QEMU_BIN"
    exit 0
fi
rm -f "$QEMU_CACHE_DIR/.stamp-installed"
mkdir -p "$SRC_DIR" "$LOG_DIR"
t_all=$SECONDS

# --- 1. sources -------------------------------------------------------------
if ! stamp_ok "$SRC_DIR" download || ! sha256_ok "$SRC_DIR/$QEMU_ORIG_TARBALL" "$QEMU_ORIG_SHA256"; then
    t=$SECONDS
    log "downloading source package qemu=$QEMU_PKG_VERSION (sid, deb-src)"
    rm -f "$SRC_DIR"/qemu_* "$SRC_DIR/.stamp-download"
    if ! (cd "$SRC_DIR" && run_logged "$LOG_DIR/download.log" \
        apt-get source -q --download-only "qemu=$QEMU_PKG_VERSION"); then
        log "apt-get source failed; looking for a local copy"
        for f in "qemu_${QEMU_PKG_VERSION#*:}.dsc" "qemu_${QEMU_PKG_VERSION#*:}.debian.tar.xz" "$QEMU_ORIG_TARBALL"; do
            src=$(fallback_file "$f") || die "no copy of $f found either"
            log "using $src"
            cp "$src" "$SRC_DIR/$f"
        done
    fi
    sha256_ok "$SRC_DIR/$QEMU_ORIG_TARBALL" "$QEMU_ORIG_SHA256" ||
        die "$QEMU_ORIG_TARBALL: missing or wrong SHA-256"
    stamp_write "$SRC_DIR" download
    log "sources downloaded in $(elapsed "$t")"
fi

if ! sha256_ok "$SRC_DIR/$QEMU_PYCOTAP_WHEEL" "$QEMU_PYCOTAP_SHA256"; then
    log "downloading $QEMU_PYCOTAP_WHEEL (PyPI)"
    rm -f "$SRC_DIR/$QEMU_PYCOTAP_WHEEL"
    if ! run_logged "$LOG_DIR/pip.log" python3 -m pip download -q --no-deps \
        --only-binary=:all: -d "$SRC_DIR" "pycotap==$QEMU_PYCOTAP_VERSION"; then
        src=$(fallback_file "$QEMU_PYCOTAP_WHEEL") || die "no copy of $QEMU_PYCOTAP_WHEEL found"
        log "using $src"
        cp "$src" "$SRC_DIR/"
    fi
    sha256_ok "$SRC_DIR/$QEMU_PYCOTAP_WHEEL" "$QEMU_PYCOTAP_SHA256" ||
        die "$QEMU_PYCOTAP_WHEEL: wrong SHA-256"
fi

# --- 2. unpack and patch ------------------------------------------------------
t=$SECONDS
log "unpacking $QEMU_ORIG_TARBALL"
rm -rf "$WORK_DIR"
mkdir -p "$WORK_DIR"
tar -xJf "$SRC_DIR/$QEMU_ORIG_TARBALL" -C "$WORK_DIR"
tree=$(find "$WORK_DIR" -mindepth 1 -maxdepth 1 -type d -name 'qemu-*' | head -n1)
[[ -n $tree && -f $tree/configure ]] || die "unexpected tarball layout in $WORK_DIR"

# configure installs its Python dependencies offline from python/wheels.
mkdir -p "$tree/python/wheels"
cp "$SRC_DIR/$QEMU_PYCOTAP_WHEEL" "$tree/python/wheels/"

# The +ds tarball has no firmware blobs; don't try to unpack EDK2's.
sed -i 's/^\([[:space:]]*unpack_edk2_blobs = \)bzip2\.found()[[:space:]]*$/\1false/' "$tree/meson.build"
if grep -q 'unpack_edk2_blobs = bzip2' "$tree/meson.build"; then
    die "could not patch unpack_edk2_blobs in meson.build"
fi

# --- 3. configure and build ---------------------------------------------------
log "configuring (log: $LOG_DIR/configure.log)"
mkdir -p "$tree/build"
(cd "$tree/build" && run_logged "$LOG_DIR/configure.log" ../configure \
    --prefix="$QEMU_CACHE_DIR" \
    --target-list=x86_64-softmmu \
    --python=/usr/bin/python3 \
    --disable-download \
    --disable-install-blobs \
    --disable-docs \
    --disable-werror \
    --disable-tools \
    --disable-guest-agent \
    --disable-user \
    --disable-gtk \
    --disable-sdl \
    --disable-vnc \
    --disable-opengl \
    --disable-spice \
    --disable-libusb \
    --disable-usb-redir \
    --disable-xen) || die "configure failed"
grep -q '^CONFIG_VFIO_USER=y' "$tree/build/x86_64-softmmu-config-devices.mak" ||
    die "configure did not enable CONFIG_VFIO_USER"

jobs=$(nproc)
log "building qemu-system-x86_64 with ninja -j$jobs (log: $LOG_DIR/build.log)"
(cd "$tree/build" && run_logged "$LOG_DIR/build.log" ninja -j"$jobs" qemu-system-x86_64) ||
    die "build failed"
log "built in $(elapsed "$t")"

# --- 4. install -----------------------------------------------------------------
mkdir -p "$(dirname "$QEMU_BIN")"
install -m 0755 "$tree/build/qemu-system-x86_64" "$QEMU_BIN.tmp"
strip "$QEMU_BIN.tmp"
mv -f "$QEMU_BIN.tmp" "$QEMU_BIN"
qemu_ok || die "$QEMU_BIN has no vfio-user-pci device"
"$QEMU_BIN" --version | head -n1 | sed 's/^/    /' >&2
rm -rf "$WORK_DIR"
stamp_write "$QEMU_CACHE_DIR" installed
log "installed $QEMU_BIN in $(elapsed "$t_all")"
echo "$QEMU_BIN"
