#!/usr/bin/env bash
# Fetch the guest kernel, its modules and its headers from
# bookworm-backports into the machine-wide cache, without installing them
# (no initramfs regeneration, nothing under /boot or /usr/src).
#
# Layout under $KERNEL_CACHE_DIR:
#   debs/   the four downloaded packages
#   root/   all four unpacked into one tree, so the headers' relative
#           symlinks (scripts, tools -> kbuild) resolve:
#     root/boot/vmlinuz-$KERNEL_RELEASE
#     root/lib/modules/$KERNEL_RELEASE/            (modules, for guests)
#     root/usr/src/linux-headers-$KERNEL_RELEASE/  (make -C here M=... modules)
#
# Prints the headers directory on stdout. Skips everything when cached.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DEB_DIR="${KERNEL_CACHE_DIR}/debs"
LOG_DIR="${KERNEL_CACHE_DIR}/logs"
COMMON="linux-headers-${KERNEL_ABI}-common"

# hello_module_ok: an out-of-tree module builds against the headers and
# carries the guest kernel's vermagic.
hello_module_ok() {
    local dir rc=0
    dir=$(mktemp -d /tmp/vgpud-hello.XXXXXX)
    cat >"$dir/hello.c" <<'C'
#include <linux/module.h>
#include <linux/init.h>

static int __init hello_init(void)
{
	pr_info("hello: loaded\n");
	return 0;
}

static void __exit hello_exit(void)
{
}

module_init(hello_init);
module_exit(hello_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("build check for the cached kernel headers");
C
    echo 'obj-m := hello.o' >"$dir/Makefile"
    if run_logged "$LOG_DIR/hello-module.log" make -C "$KERNEL_HEADERS" M="$dir" modules; then
        local vermagic
        vermagic=$(modinfo -F vermagic "$dir/hello.ko" 2>/dev/null || true)
        if [[ $vermagic != "$KERNEL_RELEASE "* ]]; then
            log "hello.ko has vermagic '$vermagic', expected '$KERNEL_RELEASE ...'"
            rc=1
        fi
    else
        rc=1
    fi
    rm -rf "$dir"
    return "$rc"
}

kernel_ok() {
    [[ -f $KERNEL_IMAGE && -d $KERNEL_MODULES/kernel && -f $KERNEL_HEADERS/Makefile ]]
}

if stamp_ok "$KERNEL_CACHE_DIR" ready && kernel_ok; then
    log "cached: $KERNEL_IMAGE"
    echo "$KERNEL_HEADERS"
    exit 0
fi

need_root
cache_lock kernel
if stamp_ok "$KERNEL_CACHE_DIR" ready && kernel_ok; then
    log "cached: $KERNEL_IMAGE"
    echo "$KERNEL_HEADERS"
    exit 0
fi
rm -f "$KERNEL_CACHE_DIR/.stamp-ready"
mkdir -p "$DEB_DIR" "$LOG_DIR"
t_all=$SECONDS

# --- 1. download --------------------------------------------------------------
pkgs=("$KERNEL_IMAGE_PKG" "${KERNEL_HEADER_PKGS[@]}")
if ! stamp_ok "$DEB_DIR" download; then
    t=$SECONDS
    log "downloading ${pkgs[*]} (version $KERNEL_PKG_VERSION)"
    rm -f "$DEB_DIR"/*.deb
    (cd "$DEB_DIR" && run_logged "$LOG_DIR/download.log" \
        apt-get download -q "${pkgs[@]/%/=$KERNEL_PKG_VERSION}") ||
        die "apt-get download failed (is bookworm-backports in the apt sources? run ci/setup-host.sh)"
    stamp_write "$DEB_DIR" download
    log "downloaded $(du -sh "$DEB_DIR" | cut -f1) in $(elapsed "$t")"
fi

# --- 2. unpack ------------------------------------------------------------------
t=$SECONDS
log "unpacking into $KERNEL_ROOT"
rm -rf "$KERNEL_ROOT"
mkdir -p "$KERNEL_ROOT"
for deb in "$DEB_DIR"/*.deb; do
    dpkg -x "$deb" "$KERNEL_ROOT"
done
kernel_ok || die "unpacked tree lacks the image, modules or headers"

# The flavour's Makefile includes the common one by absolute path under
# /usr/src; point it at the copy beside it instead.
cat >"$KERNEL_HEADERS/Makefile" <<MK
include ../${COMMON}/Makefile
MK
# lib/modules/*/build and source are absolute links into /usr/src.
ln -sfn "../../../usr/src/linux-headers-${KERNEL_RELEASE}" "$KERNEL_MODULES/build"
ln -sfn "../../../usr/src/${COMMON}" "$KERNEL_MODULES/source"

# Every symlink in the headers must resolve inside the private root.
broken=$(find -L "$KERNEL_ROOT/usr/src" "$KERNEL_MODULES/build" -type l 2>/dev/null | head -n5)
[[ -z $broken ]] || die "broken symlinks after unpacking: $broken"
log "unpacked in $(elapsed "$t")"

# --- 3. check an out-of-tree module build ----------------------------------------
t=$SECONDS
log "building a hello-world module against $KERNEL_HEADERS"
hello_module_ok || die "out-of-tree module build failed (log: $LOG_DIR/hello-module.log)"
log "module build works ($(elapsed "$t"))"

stamp_write "$KERNEL_CACHE_DIR" ready
log "kernel $KERNEL_RELEASE ready in $(elapsed "$t_all"): $KERNEL_IMAGE"
echo "$KERNEL_HEADERS"
