# Guests of the VM tests, sourced by ci/vm-gpu-test.sh and
# tests/vm/gpu-vm.sh: boot starts one against a vGPU socket, verdict reads
# the marker lines it printed (VGPU-TEST PASS/FAIL name, VGPU-TEST DONE).
#
# The caller sets: QEMU (the binary), QEMU_FIRMWARE (an array of -L
# options), GUEST_KERNEL, GUEST_INITRD, VM_MEM_MB, VM_TIMEOUT, TMP (where
# the logs go), and an array qemu_pids (boot appends to it); optionally
# BOOT_MEM_MB (this guest's RAM instead of VM_MEM_MB) and an array
# BOOT_QEMU_EXTRA (more QEMU options).
# shellcheck shell=bash
# shellcheck disable=SC2034  # passed, failed are the caller's counters

# boot NAME SOCKET EXPECT_MEM [iommu] [EXTRA_APPEND]: starts a guest in the background.
boot() {
    local name=$1 sock=$2 mem=$3 iommu=${4:-} extra=${5:-}
    # shellcheck disable=SC2054  # commas separate QEMU sub-options
    local machine=(-machine q35,accel=tcg) append="console=ttyS0 quiet panic=-1 vgpu.expect_mem=$mem $extra"
    if [[ -n $iommu ]]; then
        # shellcheck disable=SC2054  # commas separate QEMU sub-options
        machine=(-machine q35,accel=tcg,kernel-irqchip=split -device intel-iommu,caching-mode=on,intremap=on)
        # With interrupt remapping the kernel panics when its early timer
        # check misses ticks, which TCG on a loaded host can: skip it.
        append+=" intel_iommu=on no_timer_check"
    fi
    local mem_mb=${BOOT_MEM_MB:-$VM_MEM_MB}
    # shellcheck disable=SC2054
    local args=(
        "${machine[@]}" -m "$mem_mb"
        -object "memory-backend-memfd,id=mem,size=${mem_mb}M,share=on" -numa node,memdev=mem
        -nographic -no-reboot -nodefaults -serial stdio -net none
        "${QEMU_FIRMWARE[@]}"
        -kernel "$GUEST_KERNEL" -initrd "$GUEST_INITRD" -append "$append"
        -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$sock\",\"type\":\"unix\"}}"
        ${BOOT_QEMU_EXTRA[@]+"${BOOT_QEMU_EXTRA[@]}"}
    )
    timeout -k 10 "$VM_TIMEOUT" "$QEMU" "${args[@]}" </dev/null >"$TMP/$name.log" 2>"$TMP/$name.qemu.log" &
    qemu_pids+=($!)
}

# verdict NAME: checks one guest's log; prints its checks; returns 1 on failure.
passed=0
failed=0
verdict() {
    local name=$1 log_text ok=1
    log_text=$(tr -d '\r' <"$TMP/$name.log")
    local n_pass n_fail
    n_pass=$(grep -cE '^VGPU-TEST PASS ' <<<"$log_text" || true)
    n_fail=$(grep -cE '^VGPU-TEST FAIL ' <<<"$log_text" || true)
    passed=$((passed + n_pass))
    failed=$((failed + n_fail))
    grep -E '^VGPU-TEST (PASS|FAIL)' <<<"$log_text" | sed "s/^VGPU-TEST /  [$name] /" >&2 || true
    if [[ $n_fail -gt 0 || $n_pass -eq 0 ]]; then
        ok=0
    fi
    if ! grep -qx 'VGPU-TEST DONE' <<<"$log_text"; then
        log "[$name] the guest did not finish (no VGPU-TEST DONE)"
        failed=$((failed + 1))
        ok=0
    fi
    if [[ $ok == 0 ]]; then
        printf '\n----- guest %s serial log -----\n%s\n----- QEMU stderr -----\n' "$name" "$log_text" >&2
        cat "$TMP/$name.qemu.log" >&2
        return 1
    fi
}

