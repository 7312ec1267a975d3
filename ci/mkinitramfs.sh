#!/usr/bin/env bash
# Build a busybox initramfs for the test guests.
#
# usage: ci/mkinitramfs.sh [--init SCRIPT] [--bin PROGRAM]... OUT.cpio.gz [DIR...]
#
#   --init SCRIPT   becomes /init (default: mount /proc, /sys, /dev, run a shell)
#   --bin PROGRAM   copy a host program and the shared libraries it needs
#                   (e.g. --bin /usr/bin/lspci; busybox has no lspci)
#   DIR...          copied into the root as they are laid out (DIR/x -> /x)
#
# The image has busybox at /bin/busybox with a symlink for every applet
# (what `busybox --install -s` makes), and empty /proc /sys /dev /tmp.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
    sed -n '3,10s/^# \{0,1\}//p' "$0" >&2
    exit 2
}

init_script=""
bins=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --init) init_script=${2:?--init needs a file}; shift 2 ;;
    --bin) bins+=("${2:?--bin needs a program}"); shift 2 ;;
    -h | --help) usage ;;
    --) shift; break ;;
    -*) log "unknown option $1"; usage ;;
    *) break ;;
    esac
done
[[ $# -ge 1 ]] || usage
out=$1
shift

[[ -x $BUSYBOX ]] || die "$BUSYBOX missing (apt-get install busybox-static, or run ci/setup-host.sh)"
if ldd "$BUSYBOX" >/dev/null 2>&1; then
    die "$BUSYBOX is dynamically linked; the busybox-static package is needed"
fi

root=$(mktemp -d /tmp/vgpud-initramfs.XXXXXX)
trap 'rm -rf "$root"' EXIT

mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,etc,root,lib,run}
cp "$BUSYBOX" "$root/bin/busybox"
# Same result as `busybox --install -s`, done here so /init can use any applet.
while read -r applet; do
    [[ $applet == /bin/busybox || $applet == bin/busybox ]] && continue
    applet=${applet#/}
    mkdir -p "$root/$(dirname "$applet")"
    [[ -e $root/$applet ]] || ln -s /bin/busybox "$root/$applet"
done < <("$BUSYBOX" --list-full)

# copy_with_libs PROGRAM: the program and what ldd says it loads, at the
# same paths (the dynamic loader included).
copy_with_libs() {
    local prog=$1 lib
    [[ -x $prog ]] || die "--bin $prog: not an executable"
    mkdir -p "$root/$(dirname "$prog")"
    rm -f "$root/$prog"
    cp -L "$prog" "$root/$prog"
    while read -r lib; do
        [[ -n $lib ]] || continue
        mkdir -p "$root/$(dirname "$lib")"
        cp -L "$lib" "$root/$lib"
    done < <(ldd "$prog" 2>/dev/null | grep -oE '/[^ ]+' | sort -u)
}
for b in "${bins[@]}"; do
    copy_with_libs "$b"
done

if [[ -n $init_script ]]; then
    [[ -f $init_script ]] || die "--init $init_script: no such file"
    install -m 0755 "$init_script" "$root/init"
else
    cat >"$root/init" <<'SH'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "initramfs shell; 'poweroff -f' to stop"
exec setsid cttyhack sh
SH
    chmod 0755 "$root/init"
fi

for d in "$@"; do
    [[ -d $d ]] || die "$d: not a directory"
    cp -a "$d/." "$root/"
done

mkdir -p "$(dirname "$out")"
(cd "$root" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
    cpio --null -o -H newc -R 0:0 --quiet | gzip -6) >"$out.tmp"
mv -f "$out.tmp" "$out"
log "wrote $out ($(du -h "$out" | cut -f1))"
