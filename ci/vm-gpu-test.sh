#!/usr/bin/env bash
# The whole path in real VMs: vgpud (software backend, two vGPUs) serves two
# QEMU guests at once over vfio-user; each guest loads the vgpu kernel
# module and runs the guest test suite, the saxpy and sgemm samples and
# vgpu-smi. A guest keeps data in its vGPU while vgpuctl grows and shrinks
# it (a live resize), and another computes while vgpuctl suspends and
# resumes its vGPU 50 times; two guests whose quotas add up to twice a
# GPU's memory take turns with it. Then one guest runs the suite again behind a guest IOMMU
# (intel-iommu with caching mode), so DMA maps and unmaps follow the
# guest's DMA API. The module the guests load is built and checked first
# by ci/check-guest-driver.sh (W=1, sparse, checkpatch --strict, kernel-doc).
#
# Pass or fail comes from the marker lines the guests print on their serial
# consoles (VGPU-TEST PASS/FAIL name, VGPU-TEST DONE); every guest's full
# log and vgpud's log are printed on failure.
#
# Environment:
#   VM_TIMEOUT=600   seconds before a guest is killed (TCG is slow)
#   VM_KEEP=1        keep the temporary folder with the logs
#   VM_NO_IOMMU=1    skip the guest-IOMMU run
#   VM_LIVE=1        show the first guest's console while it runs
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VM_TIMEOUT=${VM_TIMEOUT:-600}
VM_KEEP=${VM_KEEP:-0}
VM_NO_IOMMU=${VM_NO_IOMMU:-0}
VM_LIVE=${VM_LIVE:-0}
VM_MEM_MB=512
# Quotas of the two vGPUs; each guest checks it sees its own.
MEM_A=$((256 << 20))
MEM_B=$((128 << 20))

cd "$VGPUD_ROOT"
t_all=$SECONDS
TMP=$(mktemp -d /tmp/vgpud-gpu-vm.XXXXXX)
vgpud_pid=""
qemu_pids=()
result=1

cleanup() {
    local pid
    for pid in "${qemu_pids[@]}" $vgpud_pid; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${qemu_pids[@]}" $vgpud_pid; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ $VM_KEEP == 1 || $result -ne 0 ]]; then
        log "logs kept in $TMP"
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- build -------------------------------------------------------------------------
qemu=$(bash ci/build-qemu.sh)
bash ci/fetch-kernel.sh >/dev/null

# W=1 and sparse without warnings, checkpatch --strict and kernel-doc clean.
bash ci/check-guest-driver.sh

log "vgpud"
cargo build --release -p vgpud -p vgpu-partition-host -p vgpuctl
vgpud="${CARGO_TARGET_DIR:-$VGPUD_ROOT/target}/release/vgpud"
vgpuctl=("${CARGO_TARGET_DIR:-$VGPUD_ROOT/target}/release/vgpuctl" --api "$TMP/run/api.sock")

VGPU_KO="$VGPUD_ROOT/guest-driver/vgpu.ko" bash tests/vm/guest-suite-initramfs.sh "$TMP/initrd.gz"
make -s -C "$KERNEL_HEADERS" M="$VGPUD_ROOT/guest-driver" clean >/dev/null 2>&1 || true
mkdir -p "$TMP/run"

cat >"$TMP/vgpud.toml" <<EOF
[daemon]
runtime_dir = "$TMP/run"
metrics_address = ""

[[gpu]]
name = "gpu0"
backend = "software"
memory = "1GiB"
compute_units = 2
# Each guest process's context holds memory of its own, as on a GPU:
# the guests' accounting checks count it.
context_memory = "8MiB"

[[vgpu]]
name = "a"
gpu = "gpu0"
socket = "a.sock"
memory = $MEM_A
compute_units = 1

[[vgpu]]
name = "b"
gpu = "gpu0"
socket = "b.sock"
memory = $MEM_B
compute_units = 1
EOF
"$vgpud" run --allow-root --config "$TMP/vgpud.toml" </dev/null >"$TMP/vgpud.log" 2>&1 &
vgpud_pid=$!
for _ in $(seq 300); do
    [[ -S $TMP/run/a.sock && -S $TMP/run/b.sock ]] && break
    kill -0 "$vgpud_pid" 2>/dev/null || { cat "$TMP/vgpud.log" >&2; die "vgpud exited"; }
    sleep 0.1
done
[[ -S $TMP/run/b.sock ]] || { cat "$TMP/vgpud.log" >&2; die "vgpud did not create its sockets"; }
log "vgpud serving a.sock and b.sock (pid $vgpud_pid)"

QEMU=$qemu
QEMU_FIRMWARE=(-L /usr/share/qemu -L /usr/share/seabios)
GUEST_KERNEL=$KERNEL_IMAGE
GUEST_INITRD=$TMP/initrd.gz
# shellcheck source=vm-guests.sh
. "$VGPUD_ROOT/ci/vm-guests.sh"

# host_fail LABEL MESSAGE [LOG]: a check made on the host failed: says
# so with the end of LOG, and counts it.
host_fail() {
    log "[$1] $2"
    if [[ -n ${3:-} ]]; then
        tail -n 40 "$3" >&2
    fi
    failed=$((failed + 1))
    ok=0
}

# --- two guests at once, one vGPU each ----------------------------------------------------
t=$SECONDS
boot guest-a "$TMP/run/a.sock" "$MEM_A"
boot guest-b "$TMP/run/b.sock" "$MEM_B"
if [[ $VM_LIVE == 1 ]]; then
    tail -n +1 -f --pid="${qemu_pids[0]}" "$TMP/guest-a.log" | sed -u 's/\r$//' >&2 &
fi
for pid in "${qemu_pids[@]}"; do
    wait "$pid" || true
done
qemu_pids=()
log "two guests done in $(elapsed "$t")"
ok=1
verdict guest-a || ok=0
verdict guest-b || ok=0

# --- isolation: what one guest leaves in its vGPU never shows in the other's ---------------
t=$SECONDS
boot iso-write "$TMP/run/a.sock" "$MEM_A" "" "vgpu.mode=isolation-write vgpu.hold=60"
# The checker starts once the writer has filled its memory.
for _ in $(seq 600); do
    grep -q 'VGPU-ISOLATION WRITTEN' "$TMP/iso-write.log" 2>/dev/null && break
    kill -0 "${qemu_pids[0]}" 2>/dev/null || break
    sleep 0.2
done
boot iso-check "$TMP/run/b.sock" "$MEM_B" "" "vgpu.mode=isolation-check"
wait "${qemu_pids[1]}" || true
kill -TERM "${qemu_pids[0]}" 2>/dev/null || true
wait "${qemu_pids[0]}" || true
qemu_pids=()
log "isolation guests done in $(elapsed "$t")"
verdict iso-check || ok=0
if ! grep -q 'VGPU-ISOLATION WRITTEN' "$TMP/iso-write.log"; then
    host_fail iso-write "the writer did not fill its memory" "$TMP/iso-write.log"
fi

# --- one guest with both vGPUs: one process uses them together ----------------------------
t=$SECONDS
BOOT_QEMU_EXTRA=(-device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$TMP/run/b.sock\",\"type\":\"unix\"}}")
boot guest-two "$TMP/run/a.sock" "$MEM_A" "" "vgpu.mode=multi-device vgpu.expect_devices=2"
BOOT_QEMU_EXTRA=()
wait "${qemu_pids[0]}" || true
qemu_pids=()
log "two-vGPU guest done in $(elapsed "$t")"
verdict guest-two || ok=0

# --- a live resize: the host grows and shrinks a vGPU under a running process --------------
# The guest keeps 64 MiB of checked data in its vGPU while vgpuctl grows
# it, then shrinks it; a shrink below what it holds is refused.
t=$SECONDS
GROW=$((512 << 20))
SHRINK=$((160 << 20))
boot guest-resize "$TMP/run/a.sock" "$MEM_A" "" "vgpu.mode=resize vgpu.resize=$GROW,$SHRINK"
# await GUEST LINE: waits until GUEST printed LINE (or ended).
await() {
    while ! grep -q "$2" "$TMP/$1.log" 2>/dev/null; do
        kill -0 "${qemu_pids[0]}" 2>/dev/null || return 1
        sleep 0.2
    done
}
resize_ok=1
if await guest-resize 'VGPU-RESIZE READY'; then
    if out=$("${vgpuctl[@]}" set a --memory 32MiB 2>&1); then
        log "[resize] a shrink below what the guest holds was not refused: $out"
        resize_ok=0
    else
        log "[resize] refused as it should be: $out"
    fi
    "${vgpuctl[@]}" set a --memory "$GROW" >&2 || resize_ok=0
    if await guest-resize 'VGPU-RESIZE GROWN'; then
        "${vgpuctl[@]}" set a --memory "$SHRINK" >&2 || resize_ok=0
    fi
fi
wait "${qemu_pids[0]}" || true
qemu_pids=()
"${vgpuctl[@]}" set a --memory "$MEM_A" >&2 || resize_ok=0
log "resize guest done in $(elapsed "$t")"
verdict guest-resize || ok=0
if [[ $resize_ok == 1 ]]; then
    passed=$((passed + 1))
else
    host_fail resize "the host's side of the resize failed"
fi

# --- suspend and resume: 50 times under a process that computes and checks ----------------
t=$SECONDS
DONE_MEM=$((MEM_A + (1 << 20)))
boot guest-suspend "$TMP/run/a.sock" "$MEM_A" "" "vgpu.mode=suspend vgpu.done_mem=$DONE_MEM"
cycles=0
if await guest-suspend 'VGPU-SUSPEND READY'; then
    for _ in $(seq 50); do
        "${vgpuctl[@]}" suspend a >/dev/null || break
        sleep 0.05
        "${vgpuctl[@]}" resume a >/dev/null || break
        cycles=$((cycles + 1))
    done
fi
"${vgpuctl[@]}" set a --memory "$DONE_MEM" >/dev/null || true
wait "${qemu_pids[0]}" || true
qemu_pids=()
"${vgpuctl[@]}" set a --memory "$MEM_A" >/dev/null || true
log "suspend guest done in $(elapsed "$t"): $cycles suspends and resumes"
verdict guest-suspend || ok=0
if [[ $cycles == 50 ]] && "${vgpuctl[@]}" --json show a | tr -d ' \n' | grep -q '"suspends":50,'; then
    passed=$((passed + 1))
else
    host_fail suspend "$cycles of 50 suspends and resumes; vgpuctl show says: $("${vgpuctl[@]}" show a | grep suspends)"
fi

# --- one guest behind a guest IOMMU ---------------------------------------------------------
if [[ $VM_NO_IOMMU != 1 ]]; then
    t=$SECONDS
    boot guest-iommu "$TMP/run/a.sock" "$MEM_A" iommu
    wait "${qemu_pids[0]}" || true
    qemu_pids=()
    log "IOMMU guest done in $(elapsed "$t")"
    verdict guest-iommu || ok=0
fi

# --- a spatial GPU: its partitions in one shared host, which faults end ------------------
# A daemon of its own (its log has the shared host's ends, on purpose):
# a software GPU in spatial mode with process isolation, whose kernel
# faults lose every partition of the shared host, as on a GPU.
t=$SECONDS
mkdir -p "$TMP/run-spatial"
cat >"$TMP/vgpud-spatial.toml" <<EOF
[daemon]
runtime_dir = "$TMP/run-spatial"
metrics_address = ""

[[gpu]]
name = "spatial"
backend = "software"
memory = "1GiB"
compute_units = 2
partition_mode = "spatial"
isolation = "process"

[[vgpu]]
name = "s"
gpu = "spatial"
socket = "s.sock"
memory = $MEM_A
compute_units = 1
EOF
"$vgpud" run --allow-root --config "$TMP/vgpud-spatial.toml" </dev/null >"$TMP/vgpud-spatial.log" 2>&1 &
spatial_pid=$!
for _ in $(seq 300); do
    [[ -S $TMP/run-spatial/s.sock ]] && break
    kill -0 "$spatial_pid" 2>/dev/null || break
    sleep 0.1
done
if [[ -S $TMP/run-spatial/s.sock ]]; then
    boot guest-spatial "$TMP/run-spatial/s.sock" "$MEM_A" "" "vgpu.mode=spatial-faults"
    wait "${qemu_pids[0]}" || true
    qemu_pids=()
    verdict guest-spatial || ok=0
    # Each fault ended the shared host, and a fresh one served after it.
    ends=$(grep -c 'shared partition host .* ends: the device state' "$TMP/vgpud-spatial.log" || true)
    if [[ $ends -ge 5 ]] && ! grep -q 'panicked' "$TMP/vgpud-spatial.log"; then
        log "[spatial] the shared host ended $ends times and was replaced"
    else
        host_fail spatial "the shared host ended $ends times (5 expected)" "$TMP/vgpud-spatial.log"
    fi
else
    host_fail spatial "vgpud did not create its socket" "$TMP/vgpud-spatial.log"
fi
kill -TERM "$spatial_pid" 2>/dev/null || true
wait "$spatial_pid" || true
log "spatial guest done in $(elapsed "$t")"

# --- an oversubscribed GPU: two guests whose quotas add up to twice its memory -------------
# Each computes and checks every result (neighbour, three times over)
# while the daemon moves the other's memory out and back in turns.
t=$SECONDS
mkdir -p "$TMP/run-over"
cat >"$TMP/vgpud-over.toml" <<EOF
[daemon]
runtime_dir = "$TMP/run-over"
metrics_address = ""

[[gpu]]
name = "over"
backend = "software"
memory = "256MiB"
compute_units = 2
oversubscribe = true

[[vgpu]]
name = "x"
gpu = "over"
socket = "x.sock"
memory = "256MiB"
compute_units = 1

[[vgpu]]
name = "y"
gpu = "over"
socket = "y.sock"
memory = "256MiB"
compute_units = 1
EOF
"$vgpud" run --allow-root --config "$TMP/vgpud-over.toml" </dev/null >"$TMP/vgpud-over.log" 2>&1 &
over_pid=$!
for _ in $(seq 300); do
    [[ -S $TMP/run-over/y.sock ]] && break
    kill -0 "$over_pid" 2>/dev/null || break
    sleep 0.1
done
if [[ -S $TMP/run-over/y.sock ]]; then
    boot guest-over-x "$TMP/run-over/x.sock" $((256 << 20)) "" "vgpu.mode=repeat vgpu.repeat=neighbour:3"
    boot guest-over-y "$TMP/run-over/y.sock" $((256 << 20)) "" "vgpu.mode=repeat vgpu.repeat=neighbour:3"
    for pid in "${qemu_pids[@]}"; do
        wait "$pid" || true
    done
    qemu_pids=()
    verdict guest-over-x || ok=0
    verdict guest-over-y || ok=0
    over_ctl=("${vgpuctl[0]}" --api "$TMP/run-over/api.sock")
    moved=()
    for n in x y; do
        moved+=("$("${over_ctl[@]}" --json show "$n" | tr -d ' \n' | grep -o '"evictions":[0-9]*' | cut -d: -f2)")
    done
    if [[ ${moved[0]:-0} -gt 0 && ${moved[1]:-0} -gt 0 ]]; then
        log "[oversubscribe] both vGPUs took turns: moved out ${moved[0]} and ${moved[1]} times"
        passed=$((passed + 1))
    else
        host_fail oversubscribe "the vGPUs did not take turns (moved out: ${moved[*]})" "$TMP/vgpud-over.log"
    fi
else
    host_fail oversubscribe "vgpud did not create its sockets" "$TMP/vgpud-over.log"
fi
kill -TERM "$over_pid" 2>/dev/null || true
wait "$over_pid" || true
log "oversubscribed guests done in $(elapsed "$t")"

if grep -qE 'panicked|ERROR' "$TMP/vgpud.log"; then
    log "vgpud logged errors or panics"
    ok=0
    failed=$((failed + 1))
fi
if [[ $ok == 1 ]]; then
    result=0
    log "PASS: $passed guest checks in $(elapsed "$t_all")"
else
    printf '\n----- vgpud log -----\n' >&2
    cat "$TMP/vgpud.log" >&2
    log "FAIL"
fi
echo "vm-gpu-test: $passed passed, $failed failed"
exit "$result"
