#!/usr/bin/env bash
# The project's test command: `bash ci/test.sh`.
#
# On a fresh Debian 12 machine (root) it installs what it needs, checks
# formatting, lints, commit subjects and docs/architecture.md's crate map,
# runs the Rust tests and each benchmark's smoke run, builds the host
# package and installs, runs and purges it (ci/package.sh --test), builds
# QEMU with the vfio-user client, fetches the guest kernel, boots a guest
# against vgpud's test device, then runs the guest driver and test suite in
# two guests at once, an isolation pair and a guest behind a guest IOMMU,
# and last installs the guest package in a Debian guest (DKMS, udev, NVML;
# ci/vm-guest-package.sh). Downloads and builds are cached in
# ${VGPUD_CACHE:-/var/cache/vgpud}, so later runs skip them.
#
# usage: ci/test.sh [--no-vm]
#   --no-vm   stop after the Rust tests (no QEMU build, kernel or guest)
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

with_vm=1
for arg in "$@"; do
    case $arg in
    --no-vm) with_vm=0 ;;
    -h | --help) sed -n '2,13s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown argument: $arg (see --help)" ;;
    esac
done

cd "$VGPUD_ROOT"
LOG_DIR="${VGPUD_ROOT}/target/ci-logs"
mkdir -p "$LOG_DIR"

steps=(setup-host toolchain fmt shellcheck scripts map commits clippy cargo-test bench-smoke fuzz package)
if [[ $with_vm == 1 ]]; then
    steps+=(build-qemu fetch-kernel vm-test vm-gpu-test vm-guest-package)
fi

# --- the steps ---------------------------------------------------------------------
# Each step is called as `step_x || rc=$?`, where bash ignores `set -e`:
# a step returns its failure explicitly.
step_setup_host() {
    bash ci/setup-host.sh
}

step_toolchain() {
    command -v cargo >/dev/null || die "cargo not found (the Rust toolchain comes with the machine)"
    local missing=()
    cargo fmt --version >/dev/null 2>&1 || missing+=(rustfmt)
    cargo clippy --version >/dev/null 2>&1 || missing+=(clippy)
    if [[ ${#missing[@]} -gt 0 ]]; then
        command -v rustup >/dev/null || die "missing ${missing[*]} and no rustup to add them"
        log "adding rustup components: ${missing[*]}"
        rustup component add "${missing[@]}" || return 1
    fi
    log "$(rustc --version); $(cargo fmt --version); $(cargo clippy --version)"
}

step_fmt() {
    cargo fmt --all -- --check
}

step_shellcheck() {
    shellcheck -x ci/*.sh .ci/run tests/vm/*.sh tests/cuda/*.sh tests/cuda/libs/*.sh \
        resources/guest/debian/post* resources/guest/debian/prerm
}

step_scripts() {
    # The test tools' own tests (the GPU runs' judges, the map check).
    python3 -B -m unittest discover -s tests/vm -p '*_test.py' &&
        python3 -B -m unittest discover -s ci -p '*_test.py'
}

step_commits() {
    # Commit subjects: `component: summary`, at most 72 columns.
    bash ci/check-commits.sh
}

step_map() {
    # docs/architecture.md's crate table and code map against the manifests.
    python3 -B ci/check-map.py
}

step_clippy() {
    cargo clippy --workspace --all-targets -- -D warnings
}

cargo_passed=0
cargo_failed=0
cargo_skipped=0
step_cargo_test() {
    local rc=0
    # Tests that need hardware this machine lacks (a CUDA driver) return
    # early and list themselves here; they are counted as skipped.
    local skip_log="$LOG_DIR/cargo-test.skipped"
    rm -f "$skip_log"
    VGPU_SKIP_LOG="$skip_log" cargo test --workspace 2>&1 |
        tee "$LOG_DIR/cargo-test.log" || rc=$?
    # Add up the "test result: ok. N passed; M failed; ..." lines.
    read -r cargo_passed cargo_failed < <(
        sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' \
            "$LOG_DIR/cargo-test.log" |
            awk '{p += $1; f += $2} END {print p + 0, f + 0}'
    )
    if [[ -s $skip_log ]]; then
        cargo_skipped=$(wc -l <"$skip_log")
        cargo_passed=$((cargo_passed - cargo_skipped))
        log "skipped (counted as neither passed nor failed):"
        sed 's/^/    /' "$skip_log" >&2
    fi
    return "$rc"
}

step_bench_smoke() {
    # Every benchmark binary in its smoke mode (`--test`: each part for a
    # fraction of a second), so that one that panics, hangs or measures
    # nothing (a ratio without a baseline) fails here. Those that need a
    # GPU print "skipped" and pass without one.
    local rc=0
    cargo test --workspace --bench '*' --no-fail-fast -- --test 2>&1 |
        tee "$LOG_DIR/bench-smoke.log" || rc=$?
    return "$rc"
}

step_fuzz() {
    # A short run of every fuzz target; longer campaigns: bash ci/fuzz.sh 180
    bash ci/fuzz.sh "${FUZZ_SECONDS:-10}"
}

package_passed=0
step_package() {
    local rc=0
    bash ci/package.sh --test | tee "$LOG_DIR/package.out" || rc=$?
    package_passed=$(sed -n 's/^package: \([0-9]*\) passed.*/\1/p' "$LOG_DIR/package.out" | tail -n1)
    package_passed=${package_passed:-0}
    return "$rc"
}

step_build_qemu() {
    bash ci/build-qemu.sh >/dev/null
}

step_fetch_kernel() {
    bash ci/fetch-kernel.sh >/dev/null
}

vm_passed=0
vm_failed=0
step_vm_test() {
    local rc=0
    bash ci/vm-test.sh | tee "$LOG_DIR/vm-test.out" || rc=$?
    read -r vm_passed vm_failed < <(
        sed -n 's/^vm-test: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$LOG_DIR/vm-test.out" |
            tail -n1
    )
    vm_passed=${vm_passed:-0}
    vm_failed=${vm_failed:-0}
    return "$rc"
}

gpu_vm_passed=0
gpu_vm_failed=0
step_vm_gpu_test() {
    local rc=0
    bash ci/vm-gpu-test.sh | tee "$LOG_DIR/vm-gpu-test.out" || rc=$?
    read -r gpu_vm_passed gpu_vm_failed < <(
        sed -n 's/^vm-gpu-test: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$LOG_DIR/vm-gpu-test.out" |
            tail -n1
    )
    gpu_vm_passed=${gpu_vm_passed:-0}
    gpu_vm_failed=${gpu_vm_failed:-0}
    vm_passed=$((vm_passed + gpu_vm_passed))
    vm_failed=$((vm_failed + gpu_vm_failed))
    return "$rc"
}

guest_pkg_passed=0
guest_pkg_failed=0
step_vm_guest_package() {
    local rc=0
    bash ci/vm-guest-package.sh | tee "$LOG_DIR/vm-guest-package.out" || rc=$?
    read -r guest_pkg_passed guest_pkg_failed < <(
        sed -n 's/^guest-package: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' \
            "$LOG_DIR/vm-guest-package.out" | tail -n1
    )
    guest_pkg_passed=${guest_pkg_passed:-0}
    guest_pkg_failed=${guest_pkg_failed:-0}
    vm_passed=$((vm_passed + guest_pkg_passed))
    vm_failed=$((vm_failed + guest_pkg_failed))
    return "$rc"
}

# --- runner --------------------------------------------------------------------------
timings=()
summary() {
    local status=$1
    log "summary:"
    local t
    for t in "${timings[@]}"; do
        printf '    %s\n' "$t" >&2
    done
    log "total $(elapsed "$t_all"); cargo tests: $cargo_passed passed, $cargo_failed failed, $cargo_skipped skipped; package checks: $package_passed passed; vm checks: $vm_passed passed, $vm_failed failed"
    local failed=$((cargo_failed + vm_failed))
    if [[ $status -ne 0 && $failed -eq 0 ]]; then
        failed=1
    fi
    echo "ci: $((cargo_passed + package_passed + vm_passed)) passed, $failed failed, $cargo_skipped skipped"
}

t_all=$SECONDS
n=0
for s in "${steps[@]}"; do
    n=$((n + 1))
    log "==> [$n/${#steps[@]}] $s"
    t=$SECONDS
    rc=0
    "step_${s//-/_}" || rc=$?
    if [[ $rc -ne 0 ]]; then
        timings+=("$(printf '%-16s FAILED after %s' "$s" "$(elapsed "$t")")")
        log "<== $s FAILED (exit $rc) after $(elapsed "$t")"
        summary 1
        exit 1
    fi
    timings+=("$(printf '%-16s ok %s' "$s" "$(elapsed "$t")")")
    log "<== $s ok ($(elapsed "$t"))"
done
summary 0
