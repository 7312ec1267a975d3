#!/usr/bin/env bash
# Install the Debian packages the build and the VM tests need.
#
# Idempotent: when every package is already there it touches nothing and
# takes well under a second. Adds two apt sources in deb822 style:
#   - bookworm-backports (binary): meson >= 1.5, guest kernel packages
#   - sid (deb-src only): the QEMU source package with the vfio-user client
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SOURCES_FILE=/etc/apt/sources.list.d/vgpud.sources
PIN_FILE=/etc/apt/preferences.d/vgpud-no-sid

# Packages from bookworm itself.
BASE_PKGS=(
    # QEMU build
    build-essential ninja-build pkg-config flex bison python3 python3-venv
    python3-pip libglib2.0-dev libpixman-1-dev libfdt-dev libslirp-dev
    device-tree-compiler dpkg-dev xz-utils
    # guest kernel module builds (the headers' compiler and kbuild tools)
    gcc-12 make libc6-dev libelf1 libssl3 zlib1g dwarves kmod
    sparse          # C=2: the kernel's static checks of the guest driver
    # guest initramfs and running guests
    busybox-static cpio gzip coreutils util-linux procps
    pciutils        # lspci, copied into guests (busybox has none)
    ca-certificates
    shellcheck      # lints these scripts
    # the host package's test (ci/package.sh): unit verification, setpriv
    systemd util-linux
)
# Packages taken from bookworm-backports (bookworm's are too old).
BACKPORTS_PKGS=(
    meson           # QEMU 10.2 needs meson >= 1.5; bookworm has 1.0
    seabios         # firmware matching QEMU 10.x
    qemu-system-data # option ROMs (linuxboot_dma.bin, kvmvapic.bin, ...)
)
MESON_MIN=1.5

need_root

# The URI and keyring of the machine's own Debian source, so the new
# entries are trusted the same way. Falls back to Debian's defaults.
debian_uri=""
debian_keyring=""
detect_debian_source() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f $f && $f != "$SOURCES_FILE" ]] || continue
        # First stanza whose URI ends in /debian (not -security, not others).
        local stanza
        stanza=$(awk -v RS= '/URIs:[^\n]*\/debian\/?(\n|$| )/ {print; exit}' "$f")
        [[ -n $stanza ]] || continue
        debian_uri=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' <<<"$stanza" | head -n1)
        debian_keyring=$(sed -n 's/^Signed-By:[[:space:]]*\([^[:space:]]*\).*/\1/p' <<<"$stanza" | head -n1)
        [[ -n $debian_uri ]] && return 0
    done
    if [[ -f /etc/apt/sources.list ]]; then
        local line
        line=$(grep -E '^deb[[:space:]].*/debian/?[[:space:]]+bookworm[[:space:]]' /etc/apt/sources.list | head -n1 || true)
        if [[ -n $line ]]; then
            debian_uri=$(grep -oE '(https?|mirror\+[a-z]+)://[^[:space:]]+' <<<"$line" | head -n1)
            debian_keyring=$(grep -oE 'signed-by=[^] ]+' <<<"$line" | head -n1 | cut -d= -f2 || true)
        fi
    fi
    if [[ -z $debian_uri ]]; then
        debian_uri=http://deb.debian.org/debian
    fi
}
detect_debian_source
if [[ -z $debian_keyring ]]; then
    debian_keyring=/usr/share/keyrings/debian-archive-keyring.gpg
fi

sources_content="# Added by ci/setup-host.sh (vgpud).
# bookworm-backports: meson, seabios, qemu-system-data, guest kernel.
Types: deb
URIs: ${debian_uri}
Suites: bookworm-backports
Components: main
Signed-By: ${debian_keyring}

# sid: source packages only (QEMU with the vfio-user client).
Types: deb-src
URIs: ${debian_uri}
Suites: sid
Components: main
Signed-By: ${debian_keyring}
"
# sid has no binary entry; this pin keeps it that way should one be added.
pin_content="# Added by ci/setup-host.sh (vgpud): never install binaries from sid.
Package: *
Pin: release n=sid
Pin-Priority: -1
"

sources_changed=0
if ! cmp -s "$SOURCES_FILE" <(printf '%s' "$sources_content"); then
    log "writing $SOURCES_FILE (URI $debian_uri, keyring $debian_keyring)"
    printf '%s' "$sources_content" >"$SOURCES_FILE"
    sources_changed=1
fi
if ! cmp -s "$PIN_FILE" <(printf '%s' "$pin_content"); then
    printf '%s' "$pin_content" >"$PIN_FILE"
fi

# is_installed PKG: dpkg says it is fully installed.
is_installed() {
    [[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true)" == installed ]]
}

missing_base=()
for p in "${BASE_PKGS[@]}"; do
    is_installed "$p" || missing_base+=("$p")
done
missing_bpo=()
for p in "${BACKPORTS_PKGS[@]}"; do
    if ! is_installed "$p"; then
        missing_bpo+=("$p")
        continue
    fi
    # An installed package may be bookworm's older one.
    v=$(dpkg-query -W -f='${Version}' "$p")
    if [[ $v != *bpo* ]]; then
        missing_bpo+=("$p")
    fi
done
if is_installed meson; then
    mv=$(dpkg-query -W -f='${Version}' meson)
    if ! dpkg --compare-versions "$mv" ge "$MESON_MIN"; then
        log "meson $mv is older than $MESON_MIN"
    fi
fi

# Lists for the added suites may be missing even when nothing else is.
lists_missing=0
if ! ls /var/lib/apt/lists/*_dists_bookworm-backports_* >/dev/null 2>&1 ||
    ! ls /var/lib/apt/lists/*_dists_sid_main_source_Sources* >/dev/null 2>&1; then
    lists_missing=1
fi

if [[ ${#missing_base[@]} -eq 0 && ${#missing_bpo[@]} -eq 0 &&
    $sources_changed -eq 0 && $lists_missing -eq 0 ]]; then
    log "all packages present, nothing to do"
    exit 0
fi

t0=$SECONDS
LOG_DIR="${VGPUD_CACHE}/logs"
mkdir -p "$LOG_DIR"
log "apt-get update (logs: $LOG_DIR)"
run_logged "$LOG_DIR/apt-update.log" apt-get update -q || die "apt-get update failed"

apt_install() {
    apt-get install -y -q --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@"
}

if [[ ${#missing_base[@]} -gt 0 ]]; then
    log "installing: ${missing_base[*]}"
    run_logged "$LOG_DIR/apt-install.log" apt_install "${missing_base[@]}" ||
        die "apt-get install failed"
fi
if [[ ${#missing_bpo[@]} -gt 0 ]]; then
    log "installing from bookworm-backports: ${missing_bpo[*]}"
    run_logged "$LOG_DIR/apt-install-backports.log" apt_install -t bookworm-backports "${missing_bpo[@]}" ||
        die "apt-get install -t bookworm-backports failed"
fi

mv=$(dpkg-query -W -f='${Version}' meson)
dpkg --compare-versions "$mv" ge "$MESON_MIN" || die "meson $mv < $MESON_MIN after install"
log "done in $(elapsed "$t0") (meson $mv)"
