#!/usr/bin/env bash
# Build the host package (vgpud_*.deb, with cargo-deb) and, with --test,
# prove it on this machine: install it, start the daemon from the
# installed files the way its systemd unit does, verify the unit, and
# purge it again leaving nothing behind.
#
# usage: ci/package.sh [--test]
# The package lands in target/debian/. cargo-deb is installed once into
# ${VGPUD_CACHE:-/var/cache/vgpud}/cargo-deb-<version>.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CARGO_DEB_VERSION="3.8.0"

with_test=0
for arg in "$@"; do
    case $arg in
    --test) with_test=1 ;;
    -h | --help) sed -n '2,9s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown argument: $arg (see --help)" ;;
    esac
done

cd "$VGPUD_ROOT"
target="${CARGO_TARGET_DIR:-$VGPUD_ROOT/target}"

# --- build -------------------------------------------------------------------------
deb_root="${VGPUD_CACHE}/cargo-deb-${CARGO_DEB_VERSION}"
if [[ ! -x $deb_root/bin/cargo-deb ]]; then
    need_root
    cache_lock cargo-deb
    log "installing cargo-deb ${CARGO_DEB_VERSION} into ${deb_root}"
    mkdir -p "${VGPUD_CACHE}/logs"
    run_logged "${VGPUD_CACHE}/logs/cargo-deb.log" \
        cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked --root "$deb_root"
fi

log "building the release binaries, manual pages and completions"
cargo build --release -p vgpud -p vgpuctl -p vgpu-partition-host
rm -rf "$target/dist"
cargo run --release -q -p vgpu-dist -- "$target/dist"
# CI throws the package away: compress it quickly there.
fast=()
[[ ${CI:-} == true ]] && fast=(--fast)
"$deb_root/bin/cargo-deb" --no-build -p vgpud -q "${fast[@]}"
deb=$(find "$target/debian" -maxdepth 1 -name 'vgpud_*.deb' -newer "$target/release/vgpud" | sort | tail -n 1)
[[ -f $deb ]] || die "cargo-deb made no package"
log "built $deb ($(du -h "$deb" | cut -f1))"
[[ $with_test == 1 ]] || exit 0

# --- test: install, run as the unit does, verify, purge -------------------------------
need_root
passed=0
check() {
    log "PASS $*"
    passed=$((passed + 1))
}

if dpkg -s vgpud >/dev/null 2>&1; then
    die "a vgpud package is already installed here; remove it first"
fi
dpkg -i "$deb" >/dev/null
mapfile -t files < <(dpkg -L vgpud | while read -r f; do [[ -f $f ]] && echo "$f"; done)
for f in /usr/bin/vgpud /usr/bin/vgpuctl /usr/bin/vgpu-partition-host \
    /etc/vgpud/vgpud.toml /usr/lib/systemd/system/vgpud.service \
    /usr/lib/sysusers.d/vgpud.conf /usr/share/man/man1/vgpud-run.1.gz \
    /usr/share/bash-completion/completions/vgpuctl \
    /usr/share/doc/vgpud/examples/cuda-isolated.toml; do
    [[ -e $f ]] || die "the package did not install $f"
done
check "installed ${#files[@]} files"
[[ $(dpkg-query -W -f='${Conffiles}' vgpud) == *"/etc/vgpud/vgpud.toml"* ]] ||
    die "/etc/vgpud/vgpud.toml is not a conffile"
getent passwd vgpud >/dev/null || die "the vgpud user was not created"
check "conffile and vgpud user"

unit=/usr/lib/systemd/system/vgpud.service
verify_out=$(systemd-analyze verify "$unit" 2>&1) || die "systemd-analyze verify: $verify_out"
check "systemd-analyze verify $unit"
/usr/bin/vgpud check-config /etc/vgpud/vgpud.toml >/dev/null
for ex in /usr/share/doc/vgpud/examples/*.toml; do
    /usr/bin/vgpud check-config "$ex" >/dev/null || die "example $ex does not parse"
done
check "check-config of the conffile and the examples"

# What systemd does: RuntimeDirectory= as the unit's User=, then
# ExecStart= as that user with no new privileges.
unit_value() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }
user=$(unit_value User)
group=$(unit_value Group)
read -r -a exec_start <<<"$(unit_value ExecStart)"
run_dir="/run/$(unit_value RuntimeDirectory)"
[[ ! -e $run_dir ]] || die "$run_dir exists already"
install -d -m "$(unit_value RuntimeDirectoryMode)" -o "$user" -g "$group" "$run_dir"
log_file=$(mktemp)
setpriv --reuid="$user" --regid="$group" --init-groups --no-new-privs -- \
    "${exec_start[@]}" >"$log_file" 2>&1 &
pid=$!
cleanup() {
    kill "$pid" 2>/dev/null || true
    rm -rf "$run_dir" "$log_file"
}
trap cleanup EXIT
for _ in $(seq 100); do
    [[ -S $run_dir/api.sock && -S $run_dir/vgpu0.sock ]] && break
    kill -0 "$pid" 2>/dev/null || { cat "$log_file" >&2; die "the installed daemon exited"; }
    sleep 0.1
done
[[ -S $run_dir/vgpu0.sock ]] || { cat "$log_file" >&2; die "no vGPU socket in $run_dir"; }
[[ $(stat -c %U "$run_dir/vgpu0.sock") == "$user" ]] || die "the socket is not the unit user's"
list=$(/usr/bin/vgpuctl --api "$run_dir/api.sock" list)
grep -q vgpu0 <<<"$list" || die "vgpuctl list: $list"
check "the installed daemon runs as $user from $unit's command line and serves vgpu0"
kill -TERM "$pid"
wait "$pid" || die "the daemon exited with $? on SIGTERM"
[[ ! -e $run_dir/vgpu0.sock ]] || die "sockets left in $run_dir after SIGTERM"
check "SIGTERM stops it cleanly"
trap - EXIT
cleanup

dpkg --purge vgpud >/dev/null
left=()
for f in "${files[@]}"; do
    [[ -e $f ]] && left+=("$f")
done
[[ -e /etc/vgpud ]] && left+=(/etc/vgpud)
[[ ${#left[@]} -eq 0 ]] || die "left after purge: ${left[*]}"
check "dpkg --purge removes every file"
echo "package: $passed passed, 0 failed"
