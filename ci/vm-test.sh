#!/usr/bin/env bash
# Boot a Linux guest under QEMU (TCG) against `vgpud testdev` over
# vfio-user and check the test device from inside the guest.
#
# The guest's /init is tests/vm/testdev-init.sh; it prints marker lines
# (VGPU-TEST PASS/FAIL name, VGPU-TEST DONE) on the serial console, which
# this script reads. It also checks vgpud's log for the guest's write.
#
# Environment:
#   VM_TIMEOUT=300    seconds before the guest is killed (TCG is slow)
#   VM_LIVE=1         show the guest's serial console while it runs
#   VM_NO_DEVICE=1    boot without the device and without vgpud (checks
#                     QEMU, kernel and initramfs only; for debugging)
#   VM_KEEP=1         keep the temporary folder with the logs
#   VM_LOG_DIR=DIR    put the logs (guest.log, vgpud.log, qemu.log) in DIR
#                     and keep them
#   VGPUD_BIN=PATH    use this vgpud instead of building it
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VM_TIMEOUT=${VM_TIMEOUT:-300}
VM_LIVE=${VM_LIVE:-0}
VM_NO_DEVICE=${VM_NO_DEVICE:-0}
VM_KEEP=${VM_KEEP:-0}
VM_MEM_MB=${VM_MEM_MB:-512}

# Checks that must each print a PASS line in the guest.
if [[ $VM_NO_DEVICE == 1 ]]; then
    EXPECTED=(boot)
else
    EXPECTED=(device class lspci bar0 bar2 enable id scratch scratch-inverse
        bar2-readback bar2-sum)
fi
# vgpud's log line proving the guest's SCRATCH write reached the device.
HOST_WRITE_LINE='testdev: BAR0 write offset=0x8 value=0xdeadbeef'

cd "$VGPUD_ROOT"
t_all=$SECONDS

# --- inputs (cached after the first run) ---------------------------------------
qemu=$(bash ci/build-qemu.sh)
bash ci/fetch-kernel.sh >/dev/null

if [[ -n ${VM_LOG_DIR:-} ]]; then
    mkdir -p "$VM_LOG_DIR"
    TMP=$(cd "$VM_LOG_DIR" && pwd)
    VM_KEEP=1
    rm -f "$TMP/dev.sock"
else
    TMP=$(mktemp -d /tmp/vgpud-vm.XXXXXX)
fi
SOCK="$TMP/dev.sock"
GUEST_LOG="$TMP/guest.log"
QEMU_LOG="$TMP/qemu.log"
VGPUD_LOG="$TMP/vgpud.log"
vgpud_pid=""
qemu_pid=""
tail_pid=""
result=1

# stop PID NAME: SIGTERM, then SIGKILL after 5 s; reap it.
stop() {
    local pid=$1 name=$2
    [[ -n $pid ]] || return 0
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name (pid $pid) ignored SIGTERM; killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    stop "$qemu_pid" qemu
    stop "$tail_pid" tail
    stop "$vgpud_pid" vgpud
    rm -f "$SOCK"
    if [[ $VM_KEEP == 1 || $result -ne 0 ]]; then
        log "logs kept in $TMP"
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- vgpud ------------------------------------------------------------------------
qemu_device_args=()
kernel_extra=""
if [[ $VM_NO_DEVICE == 1 ]]; then
    log "VM_NO_DEVICE=1: booting without the vfio-user device"
    kernel_extra="vgpu_test=boot"
else
    if [[ -z ${VGPUD_BIN:-} ]]; then
        log "cargo build --release -p vgpud"
        cargo build --release -p vgpud
        VGPUD_BIN="${CARGO_TARGET_DIR:-$VGPUD_ROOT/target}/release/vgpud"
    fi
    [[ -x $VGPUD_BIN ]] || die "no vgpud binary at $VGPUD_BIN"
    log "starting $VGPUD_BIN testdev --socket $SOCK"
    "$VGPUD_BIN" testdev --socket "$SOCK" </dev/null >"$VGPUD_LOG" 2>&1 &
    vgpud_pid=$!
    rc=0
    for _ in $(seq 300); do
        [[ -S $SOCK ]] && break
        if ! kill -0 "$vgpud_pid" 2>/dev/null; then
            wait "$vgpud_pid" || rc=$?
            vgpud_pid=""
            cat "$VGPUD_LOG" >&2
            die "vgpud exited (status ${rc:-0}) before creating $SOCK"
        fi
        sleep 0.1
    done
    [[ -S $SOCK ]] || { cat "$VGPUD_LOG" >&2; die "no socket at $SOCK after 30 s"; }
    log "vgpud listening (pid $vgpud_pid)"
    qemu_device_args=(-device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$SOCK\",\"type\":\"unix\"}}")
fi

# --- guest -----------------------------------------------------------------------
bash ci/mkinitramfs.sh --init tests/vm/testdev-init.sh --bin /usr/bin/lspci "$TMP/initrd.gz"

# shellcheck disable=SC2054  # commas separate QEMU sub-options
qemu_args=(
    -machine q35,accel=tcg
    -m "$VM_MEM_MB"
    # Guest RAM in a shared memfd, so the server can map it for DMA.
    -object "memory-backend-memfd,id=mem,size=${VM_MEM_MB}M,share=on"
    -numa node,memdev=mem
    -nographic -no-reboot -nodefaults -serial stdio -net none
    -L /usr/share/qemu -L /usr/share/seabios
    -kernel "$KERNEL_IMAGE"
    -initrd "$TMP/initrd.gz"
    -append "console=ttyS0 quiet panic=-1${kernel_extra:+ $kernel_extra}"
    "${qemu_device_args[@]}"
)
log "booting the guest (TCG, timeout ${VM_TIMEOUT}s; serial log: $GUEST_LOG)"
# The command line, quoted for a shell where needed (shown on failure).
for a in "$qemu" "${qemu_args[@]}"; do
    if [[ $a =~ ^[A-Za-z0-9_./,=:+-]+$ ]]; then
        printf '%s ' "$a"
    else
        printf "'%s' " "${a//\'/\'\\\'\'}"
    fi
done >"$TMP/qemu.cmdline"
t_boot=$SECONDS
timeout -k 10 "$VM_TIMEOUT" "$qemu" "${qemu_args[@]}" </dev/null >"$GUEST_LOG" 2>"$QEMU_LOG" &
qemu_pid=$!
if [[ $VM_LIVE == 1 ]]; then
    # Follow the console on stderr, without the firmware's terminal resets
    # and screen clears (ESC c, ESC [ ... ) and the serial line's CRs.
    tail -n +1 -f --pid="$qemu_pid" "$GUEST_LOG" |
        sed -u -e 's/\x1bc/\n/g' -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' -e 's/\r$//' >&2 &
    tail_pid=$!
fi
qemu_rc=0
wait "$qemu_pid" || qemu_rc=$?
qemu_pid=""
if [[ -n $tail_pid ]]; then
    wait "$tail_pid" 2>/dev/null || true
    tail_pid=""
fi
log "QEMU exited with status $qemu_rc after $(elapsed "$t_boot")"

# --- verdict -------------------------------------------------------------------------
# The serial console ends lines with CR LF.
guest=$(tr -d '\r' <"$GUEST_LOG")
passed=0
failed=0
problems=()

if ! grep -qE '^VGPU-TEST (PASS|FAIL) ' <<<"$guest"; then
    problems+=("the guest reported no checks (no VGPU-TEST lines on its console)")
fi
for name in "${EXPECTED[@]}"; do
    if grep -qE "^VGPU-TEST PASS ${name}( |$)" <<<"$guest"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        reason=$(grep -E "^VGPU-TEST FAIL ${name}:" <<<"$guest" | head -n1 || true)
        if [[ -n $reason ]]; then
            problems+=("$reason")
        elif grep -qE '^VGPU-TEST (PASS|FAIL) ' <<<"$guest"; then
            problems+=("guest check \"$name\" did not report")
        fi
    fi
done
while read -r line; do
    [[ -n $line ]] || continue
    name=${line#VGPU-TEST FAIL }
    name=${name%%:*}
    [[ " ${EXPECTED[*]} " == *" $name "* ]] && continue
    failed=$((failed + 1))
    problems+=("$line")
done < <(grep -E '^VGPU-TEST FAIL ' <<<"$guest" || true)

if [[ $VM_NO_DEVICE != 1 ]]; then
    if grep -qF "$HOST_WRITE_LINE" "$VGPUD_LOG"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        problems+=("host: vgpud log has no line '$HOST_WRITE_LINE'")
    fi
fi

grep -qx 'VGPU-TEST DONE' <<<"$guest" || problems+=("guest did not finish (no 'VGPU-TEST DONE')")
if [[ $qemu_rc -eq 124 || $qemu_rc -eq 137 ]]; then
    problems+=("QEMU killed after the ${VM_TIMEOUT}s timeout")
elif [[ $qemu_rc -ne 0 ]]; then
    problems+=("QEMU exited with status $qemu_rc")
fi

grep -E '^VGPU-TEST (PASS|FAIL)' <<<"$guest" | sed 's/^VGPU-TEST /  /' >&2 || true

if [[ ${#problems[@]} -eq 0 ]]; then
    result=0
    log "PASS: all ${passed} checks passed in $(elapsed "$t_all")"
else
    [[ $failed -gt 0 ]] || failed=1
    log "FAIL:"
    for p in "${problems[@]}"; do
        printf '  %s\n' "$p" >&2
    done
    if [[ $VM_LIVE != 1 ]]; then
        printf '\n----- guest serial log (%s) -----\n' "$GUEST_LOG" >&2
        cat <<<"$guest" >&2
    fi
    printf '\n----- QEMU stderr (%s) -----\n' "$QEMU_LOG" >&2
    cat "$QEMU_LOG" >&2
    printf '\n----- QEMU command line -----\n%s\n' "$(cat "$TMP/qemu.cmdline")" >&2
    if [[ $VM_NO_DEVICE != 1 ]]; then
        printf '\n----- vgpud log (%s) -----\n' "$VGPUD_LOG" >&2
        cat "$VGPUD_LOG" >&2
    fi
    printf -- '-----\n' >&2
fi
echo "vm-test: $passed passed, $failed failed"
exit "$result"
