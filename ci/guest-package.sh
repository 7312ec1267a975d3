#!/usr/bin/env bash
# Build the guest package (vgpu-guest_*.deb): the vgpu kernel module as
# DKMS source, vgpu-smi, the CUDA driver and NVML of the vGPUs, and the
# files that set them up in a guest (resources/guest/). Prints the
# package's path on stdout. ci/vm-guest-package.sh installs it in a
# Debian guest and checks it there.
#
# usage: ci/guest-package.sh
# The package lands in target/debian/.
#
# It is put together with dpkg-deb rather than cargo-deb (which builds
# the host package): the DKMS tree's path and dkms.conf carry the
# package version (/usr/src/vgpu-<version>), and the libraries' dev
# links are symlinks, neither of which cargo-deb's fixed asset list
# expresses.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

case ${1:-} in
"") ;;
-h | --help) sed -n '2,9s/^# \{0,1\}//p' "$0"; exit 0 ;;
*) die "unknown argument: $1 (see --help)" ;;
esac

cd "$VGPUD_ROOT"
target="${CARGO_TARGET_DIR:-$VGPUD_ROOT/target}"
# The builds and flags of tests/vm/guest-suite-initramfs.sh, so that what
# the VM tests built already is reused: vgpu-smi static (it runs on any
# guest's C library), the two libraries in their own target folder (a
# shared library cannot be built with +crt-static).
TARGET=x86_64-unknown-linux-gnu
version=$(cargo pkgid -p vgpu-nvml | sed 's/.*[#@]//')
[[ $version =~ ^[0-9][0-9A-Za-z.+~-]*$ ]] || die "odd package version '$version'"

log "cargo build --release -p vgpu-guest-tools --bin vgpu-smi --target $TARGET (static)"
flags=${RUSTFLAGS:-}
[[ $flags == *+crt-static* ]] || flags="${flags:+$flags }-C target-feature=+crt-static"
RUSTFLAGS=$flags cargo build -q --release -p vgpu-guest-tools --target "$TARGET"
smi="$target/$TARGET/release/vgpu-smi"
log "cargo build --release -p vgpu-cuda -p vgpu-nvml --target $TARGET"
lib_target="$target/guest-cuda"
CARGO_TARGET_DIR=$lib_target cargo build -q --release -p vgpu-cuda -p vgpu-nvml --target "$TARGET"
libcuda="$lib_target/$TARGET/release/libcuda.so"
libnvml="$lib_target/$TARGET/release/libnvidia_ml.so"
for f in "$smi" "$libcuda" "$libnvml"; do
    [[ -f $f ]] || die "no $f"
done

# --- the tree ----------------------------------------------------------------------
stage="$target/guest-package"
rm -rf "$stage"
root="$stage/root"
src="$root/usr/src/vgpu-$version"
install -d "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/vgpu" "$src/include/uapi" \
    "$root/etc/ld.so.conf.d" "$root/usr/lib/udev/rules.d" "$root/usr/lib/sysusers.d" \
    "$root/usr/share/doc/vgpu-guest"
strip -o "$root/usr/bin/vgpu-smi" "$smi"
strip -o "$root/usr/lib/vgpu/libcuda.so.1" "$libcuda"
strip -o "$root/usr/lib/vgpu/libnvidia-ml.so.1" "$libnvml"
chmod 0755 "$root/usr/bin/vgpu-smi"
chmod 0644 "$root"/usr/lib/vgpu/*.so.1
ln -s libcuda.so.1 "$root/usr/lib/vgpu/libcuda.so"
ln -s libnvidia-ml.so.1 "$root/usr/lib/vgpu/libnvidia-ml.so"

# The module's sources as git tracks them (no build products).
mapfile -t sources < <(git ls-files -- guest-driver/Kbuild guest-driver/Makefile \
    guest-driver/LICENSE 'guest-driver/*.c' 'guest-driver/*.h')
[[ ${#sources[@]} -gt 0 ]] || die "no tracked guest-driver sources"
for f in "${sources[@]}"; do
    install -D -m 0644 "$f" "$src/${f#guest-driver/}"
done
sed "s/@VERSION@/$version/g" resources/guest/dkms.conf >"$src/dkms.conf"

install -m 0644 resources/guest/ld.so.conf.d/vgpu.conf "$root/etc/ld.so.conf.d/vgpu.conf"
install -m 0644 resources/guest/udev/70-vgpu.rules "$root/usr/lib/udev/rules.d/70-vgpu.rules"
install -m 0644 resources/guest/sysusers.d/vgpu.conf "$root/usr/lib/sysusers.d/vgpu.conf"
install -m 0644 docs/guest-package.md "$root/usr/share/doc/vgpu-guest/guest-package.md"
{
    echo "vgpu-guest: the kernel module (usr/src/vgpu-$version) is GPL-2.0,"
    echo "see usr/src/vgpu-$version/LICENSE; everything else is Apache-2.0:"
    echo
    cat LICENSE
} >"$root/usr/share/doc/vgpu-guest/copyright"

# --- control files ------------------------------------------------------------------
# The newest glibc symbol version the programs use is the C library they
# need.
glibc=$(objdump -T "$root/usr/bin/vgpu-smi" "$root"/usr/lib/vgpu/*.so.1 |
    grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' | sed 's/GLIBC_//' | sort -uV | tail -n1)
[[ -n $glibc ]] || die "cannot tell which glibc the libraries need"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/g" -e "s/@GLIBC@/$glibc/g" -e "s/@SIZE@/$size/g" \
    resources/guest/debian/control >"$root/DEBIAN/control"
install -m 0644 resources/guest/debian/conffiles "$root/DEBIAN/conffiles"
for s in postinst prerm postrm; do
    sed "s/@VERSION@/$version/g" "resources/guest/debian/$s" >"$root/DEBIAN/$s"
    chmod 0755 "$root/DEBIAN/$s"
done
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
    xargs -0 md5sum) >"$root/DEBIAN/md5sums"

mkdir -p "$target/debian"
deb="$target/debian/vgpu-guest_${version}_amd64.deb"
# CI throws the package away: compress it quickly there.
level=9
[[ ${CI:-} == true ]] && level=1
dpkg-deb --root-owner-group -Zxz -z"$level" --build "$root" "$deb" >/dev/null
log "built $deb ($(du -h "$deb" | cut -f1))"
echo "$deb"
