#!/usr/bin/env bash
# Fetch the guest kernel's scripts/checkpatch.pl into the machine-wide
# cache. The headers packages ship scripts/kernel-doc but not checkpatch,
# so it comes from Debian's kernel source package of the same version
# (about 150 MB, downloaded once per kernel version and then deleted):
# only checkpatch.pl and the files it reads beside it are kept.
#
# Layout: $KERNEL_CHECKPATCH_DIR/{checkpatch.pl,spelling.txt,const_structs.checkpatch}
#
# Prints the path of checkpatch.pl on stdout. Skips everything when cached.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FILES=(checkpatch.pl spelling.txt const_structs.checkpatch)

checkpatch_ok() {
    local f
    for f in "${FILES[@]}"; do
        [[ -f $KERNEL_CHECKPATCH_DIR/$f ]] || return 1
    done
}

if stamp_ok "$KERNEL_CHECKPATCH_DIR" ready && checkpatch_ok; then
    log "cached: $KERNEL_CHECKPATCH"
    echo "$KERNEL_CHECKPATCH"
    exit 0
fi

need_root
cache_lock checkpatch
if stamp_ok "$KERNEL_CHECKPATCH_DIR" ready && checkpatch_ok; then
    log "cached: $KERNEL_CHECKPATCH"
    echo "$KERNEL_CHECKPATCH"
    exit 0
fi
t=$SECONDS
LOG_DIR="${KERNEL_CACHE_DIR}/logs"
mkdir -p "$LOG_DIR"
rm -rf "$KERNEL_CHECKPATCH_DIR"
work=$(mktemp -d "${KERNEL_CACHE_DIR}/.checkpatch.XXXXXX")
trap 'rm -rf "$work"' EXIT

log "downloading $KERNEL_SOURCE_PKG (version $KERNEL_PKG_VERSION) for checkpatch.pl"
(cd "$work" && run_logged "$LOG_DIR/download-source.log" \
    apt-get download -q "${KERNEL_SOURCE_PKG}=${KERNEL_PKG_VERSION}") ||
    die "apt-get download failed (is bookworm-backports in the apt sources? run ci/setup-host.sh)"

# The package holds one tarball, /usr/src/$KERNEL_SOURCE_PKG.tar.xz.
top=$KERNEL_SOURCE_PKG
members=("${FILES[@]/#/$top/scripts/}")
dpkg-deb --fsys-tarfile "$work"/*.deb |
    tar -xO "./usr/src/${top}.tar.xz" |
    xz -dc |
    tar -x -C "$work" "${members[@]}" ||
    die "cannot extract ${members[*]} from $KERNEL_SOURCE_PKG"

mkdir -p "$KERNEL_CHECKPATCH_DIR"
for f in "${FILES[@]}"; do
    install -m 0644 "$work/$top/scripts/$f" "$KERNEL_CHECKPATCH_DIR/$f"
done
chmod 0755 "$KERNEL_CHECKPATCH"
checkpatch_ok || die "checkpatch files missing after extraction"
stamp_write "$KERNEL_CHECKPATCH_DIR" ready
log "checkpatch ready in $(elapsed "$t"): $KERNEL_CHECKPATCH"
echo "$KERNEL_CHECKPATCH"
