#!/usr/bin/env bash
# Coverage-guided fuzzing of vgpud's untrusted inputs with cargo-fuzz
# (libFuzzer): vfio-user messages, the vGPU rings and registers, the
# configuration file, the management API's HTTP requests, the
# partition-host protocol, and the CUDA modules a guest loads (PTX text:
# ptx_parse; fatbinaries: fatbin; device printf: printf). The targets
# live in fuzz/ (see fuzz/README.md).
#
# Builds every target, then runs each for SECONDS (default 20) from the
# seeds in fuzz/corpus/<target>/ plus a working corpus kept in
# ${FUZZ_WORK_DIR:-target/fuzz-work}. The repository's corpus is never
# written. Fails when any target finds a crash, a hang or a leak, and
# prints the input and the command that reproduces it.
#
# usage: ci/fuzz.sh [SECONDS_PER_TARGET]
#   FUZZ_TARGETS="a b"  run only these targets
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

seconds=20
for arg in "$@"; do
    case $arg in
    -h | --help) sed -n '2,15s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *[!0-9]* | '') die "SECONDS_PER_TARGET must be a number of seconds, not '$arg' (see --help)" ;;
    *) seconds=$arg ;;
    esac
done
((seconds > 0)) || die "SECONDS_PER_TARGET must be at least 1"

FUZZ_DIR="${VGPUD_ROOT}/fuzz"
WORK_DIR="${FUZZ_WORK_DIR:-${VGPUD_ROOT}/target/fuzz-work}"
# cargo-fuzz passes nightly-only flags (-Z sanitizer, sancov passes) to the
# stable compiler; this lets it accept them.
export RUSTC_BOOTSTRAP=1
# The targets run here without `cargo fuzz run`: give them its ASan options.
export ASAN_OPTIONS="${ASAN_OPTIONS:+${ASAN_OPTIONS}:}detect_odr_violation=0"

cd "$FUZZ_DIR"
t_all=$SECONDS

if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz"
    run_logged "${WORK_DIR}.install.log" cargo install cargo-fuzz --locked ||
        die "cannot install cargo-fuzz"
fi
log "$(cargo fuzz --version); $(rustc --version)"

mkdir -p "$WORK_DIR"
log "building the fuzz targets (address sanitizer)"
t=$SECONDS
run_logged "${WORK_DIR}/build.log" cargo fuzz build || die "build failed"
log "built in $(elapsed "$t")"

read -r -a targets <<<"${FUZZ_TARGETS:-$(cargo fuzz list | tr '\n' ' ')}"
host=$(rustc -vV | sed -n 's/^host: //p')
bin_dir="${FUZZ_DIR}/target/${host}/release"

failed=()
summary=()
for target in "${targets[@]}"; do
    [[ -x "${bin_dir}/${target}" ]] || die "no fuzz target '$target' (cargo fuzz list)"
    corpus="${WORK_DIR}/corpus/${target}"
    artifacts="${WORK_DIR}/artifacts/${target}"
    logfile="${WORK_DIR}/${target}.log"
    rm -rf "$artifacts"
    mkdir -p "$corpus" "$artifacts"
    log "==> $target for ${seconds}s"
    rc=0
    # New inputs go to the first corpus folder (the working one); the
    # seeds are only read.
    "${bin_dir}/${target}" "$corpus" "${FUZZ_DIR}/corpus/${target}" \
        -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
        -print_final_stats=1 -artifact_prefix="${artifacts}/" \
        >"$logfile" 2>&1 || rc=$?
    # "#123 DONE cov: 1 ft: 2 corp: 3/4b lim: 5 exec/s: 6 rss: 7Mb"
    stats=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$logfile" | tail -n1 || true)
    runs=$(sed -n 's/^stat::number_of_executed_units:[[:space:]]*//p' "$logfile" | tail -n1)
    summary+=("$(printf '%-20s runs %-9s %s' "$target" "${runs:-?}" "${stats#*DONE }")")
    mapfile -t found < <(find "$artifacts" -type f | sort)
    if [[ $rc -ne 0 || ${#found[@]} -gt 0 ]]; then
        failed+=("$target")
        log "<== $target FAILED (exit $rc); last lines of $logfile:"
        tail -n 40 "$logfile" >&2
        for input in "${found[@]}"; do
            log "input: $input"
            log "reproduce: (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run $target $input)"
        done
    else
        log "<== $target ok: ${stats:-no final stats in $logfile}"
    fi
done

log "summary (${seconds}s per target, total $(elapsed "$t_all")):"
for line in "${summary[@]}"; do
    printf '    %s\n' "$line" >&2
done
if [[ ${#failed[@]} -gt 0 ]]; then
    die "fuzzing found problems in: ${failed[*]}"
fi
log "no crashes in ${#targets[@]} targets"
