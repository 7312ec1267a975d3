#!/usr/bin/env bash
# Build the guest kernel module against the cached guest kernel headers
# and check its C the way the kernel checks it; any finding fails:
#   - the build at W=1 with C=2, so sparse checks every file: no compiler
#     or sparse warning;
#   - checkpatch.pl --strict on the tracked *.c and *.h of guest-driver/,
#     include/uapi/vgpu.h among them, and on include/vgpu_abi.h (generated
#     from crates/vgpu-abi; CAMELCASE ignored for C11's _Static_assert):
#     no error, warning or check;
#   - scripts/kernel-doc -none on include/uapi/vgpu.h: every documented
#     structure fully described, warnings fatal.
#
# Leaves guest-driver/vgpu.ko built; the caller cleans the folder.
# Paths given to checkpatch are relative to guest-driver/, the module's
# own tree, so include/uapi/ is seen as a UAPI folder.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cd "$VGPUD_ROOT/guest-driver"
bash "$VGPUD_ROOT/ci/fetch-kernel.sh" >/dev/null
checkpatch=$(bash "$VGPUD_ROOT/ci/fetch-checkpatch.sh")
command -v sparse >/dev/null || die "sparse not found (run ci/setup-host.sh)"
TMP=$(mktemp -d /tmp/vgpud-driver-check.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

log "guest kernel module against $KERNEL_HEADERS (W=1, sparse)"
make -s -C "$KERNEL_HEADERS" M="$PWD" clean >/dev/null 2>&1 || true
if ! make -C "$KERNEL_HEADERS" M="$PWD" W=1 C=2 modules >"$TMP/build.log" 2>&1; then
    cat "$TMP/build.log" >&2
    die "the kernel module does not build"
fi
if grep -qE '(warning|error):' "$TMP/build.log"; then
    cat "$TMP/build.log" >&2
    die "the kernel module builds with compiler or sparse warnings"
fi
grep -q '^ *CHECK ' "$TMP/build.log" || die "sparse did not run (no CHECK lines in the build log)"

log "checkpatch.pl --strict"
# The tracked sources: not what the build generates (vgpu.mod.c).
mapfile -t sources < <(git ls-files -- '*.c' '*.h' ':(exclude)include/vgpu_abi.h')
[[ ${#sources[@]} -gt 0 ]] || die "no tracked C sources in guest-driver/"
if ! perl "$checkpatch" --no-tree --strict --terse --show-types --color=never \
    -f "${sources[@]}" >"$TMP/checkpatch.log" 2>&1; then
    cat "$TMP/checkpatch.log" >&2
    die "checkpatch.pl --strict reports problems"
fi
# The generated ABI header too; C11's _Static_assert is its one mixed-case
# word.
if ! perl "$checkpatch" --no-tree --strict --terse --show-types --color=never \
    --ignore CAMELCASE -f include/vgpu_abi.h >"$TMP/checkpatch-abi.log" 2>&1; then
    cat "$TMP/checkpatch-abi.log" >&2
    die "checkpatch.pl --strict reports problems in the generated include/vgpu_abi.h"
fi

log "kernel-doc include/uapi/vgpu.h"
if ! perl "$KERNEL_HEADERS/scripts/kernel-doc" -none -Wall -Werror \
    include/uapi/vgpu.h >"$TMP/kernel-doc.log" 2>&1 || [[ -s $TMP/kernel-doc.log ]]; then
    cat "$TMP/kernel-doc.log" >&2
    die "kernel-doc reports problems in include/uapi/vgpu.h"
fi
log "the guest driver is clean: W=1, sparse, checkpatch --strict, kernel-doc"
