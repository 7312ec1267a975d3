#!/usr/bin/env bash
# Demo: serve vgpud's test device over vfio-user to a QEMU guest and watch
# the guest find and use it.
#
# Installs what is missing (Debian packages; QEMU with the vfio-user
# client; the guest kernel), all cached in ${VGPUD_CACHE:-/var/cache/vgpud}:
# the first run takes several minutes (building QEMU), later ones seconds.
# Needs root, like ci/test.sh. VGPUD_BIN=PATH runs that vgpud instead of
# building one.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$VGPUD_ROOT"

t_all=$SECONDS
log "1/4 host packages"
bash ci/setup-host.sh
log "2/4 QEMU with vfio-user-pci (first run: builds it, several minutes)"
qemu=$(bash ci/build-qemu.sh)
log "3/4 guest kernel"
bash ci/fetch-kernel.sh >/dev/null
log "4/4 vgpud"
if [[ -n ${VGPUD_BIN:-} ]]; then
    vgpud=$VGPUD_BIN
    log "using VGPUD_BIN=$vgpud"
else
    cargo build --release -p vgpud
    vgpud="${CARGO_TARGET_DIR:-$VGPUD_ROOT/target}/release/vgpud"
fi

logs=$(mktemp -d /tmp/vgpud-demo.XXXXXX)
log "starting vgpud testdev and booting the guest; its console follows"
echo >&2
rc=0
VM_LIVE=1 VM_LOG_DIR="$logs" VGPUD_BIN="$vgpud" bash ci/vm-test.sh >"$logs/verdict" || rc=$?
echo >&2

guest=$(tr -d '\r' <"$logs/guest.log")
cat <<SUMMARY
========================================================================
 vgpud demo: $([[ $rc -eq 0 ]] && echo "the guest used the device" || echo "FAILED")
------------------------------------------------------------------------
 host:  $vgpud testdev --socket <dir>/dev.sock
 VMM:   $qemu (TCG, q35)
        -device vfio-user-pci,socket=<dir>/dev.sock
 guest: Linux $KERNEL_RELEASE, busybox initramfs
        (/init: tests/vm/testdev-init.sh)

 guest checks:
$(grep -E '^VGPU-TEST (PASS|FAIL)' <<<"$guest" | sed 's/^VGPU-TEST /   /' || echo "   (none reported)")

 what vgpud logged about the guest's accesses:
$(grep -E 'testdev:' "$logs/vgpud.log" | sed 's/^/   /' | tail -n 12 || echo "   (nothing)")

 $(tail -n1 "$logs/verdict") (whole demo: $(elapsed "$t_all"))
 logs: $logs
========================================================================
SUMMARY
exit "$rc"
