#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: two QEMU guests (TCG) on two vGPUs of
# the GPU at once, served by vgpud's CUDA backend (process isolation,
# guest modules allowed), each running the guest suite: the vgpu module,
# the guest tools, and unmodified CUDA programs through the guest's
# libcuda.so.1 (tests/cuda: vector add, tiled matmul, reduction,
# streams, graphs from stream capture, device properties, out of memory
# at the quota, an illegal address that fails only its own process),
# then one guest with both vGPUs (tests/cuda/multi_device.cu).
# Then the launch and copy benchmark (tests/cuda/bench_launch.cu)
# natively and in one guest alone.
# Then, where the machine has a CUDA toolkit with cuBLAS and cuFFT
# (CUDA_HOME, /usr/local/cuda), the programs of tests/cuda/libs built with
# it, natively and in both guests at once, each guest using the machine's
# own userland (its CUDA libraries) through 9p.
#
# usage: tests/vm/gpu-vm.sh BUNDLE.tar.xz     (made by ci/gpu-vm-bundle.sh)
#
# Environment:
#   VM_TIMEOUT=600    seconds before a guest is killed
#   VM_KEEP=1         keep the folder with the logs
#   MEM_A, MEM_B      the two vGPUs' memory quotas (4 GiB, 2 GiB)
#   GPU_DEVICE=0      the CUDA device
#   GPU_SMS=132       its SM count (an H200's)
#   GPU_BACKEND=software  a dry run on the software backend (no GPU)
#   GUEST_APPEND=...  more kernel command line for the suite's guests
#                     (e.g. loglevel=7 to see the driver's messages)
#   CUDA_HOME=/usr/local/cuda  the toolkit of the library programs
#   LIB_RUN=cublas_gemm,cufft  library programs to run (":" before arguments)
#   LIB_RUN_B, LIB_APPEND_B    what the second library guest runs instead,
#                     and more kernel command line for it (to diagnose two
#                     programs in one call; LIB_RUN_B=none leaves it idle)
#   LIB_MEM_MB=4096   RAM of a library guest
#   LIB_SMP=4         vCPUs of a library guest
#   LIB_DIR=DIR       the library guests run LIB_RUN's programs of DIR (built
#                     before; not run natively here) instead of tests/cuda/libs
#                     (ci/cuda-samples.sh guest); the software backend too
#   TWO_RUN=...       then, programs for one library guest with both vGPUs
#                     (e.g. torch-check.sh:two_devices)
#   FAULTS=1          then a guest's process faults 20 times beside two that
#                     compute while the other guest runs checked cuBLAS GEMMs
#                     for FAULT_LOAD_SECONDS (90), saying its rate each second
#   PARTITION_MODE=spatial  the vGPUs are SM groups of one shared partition
#                     host (trusted tenants, guest PTX); with FAULTS=1 guest a
#                     faults 5 times (every vGPU is reset each time) while
#                     guest b runs cuBLAS GEMMs of 10 s, restarted after each
#                     loss, saying its rate each second
#   ONLY_LIBS=1       only the library programs
#   ONLY_BENCH=1      only the launch and copy benchmark
#   BENCH_APPEND=...  more kernel command line for the benchmark's guest
#                     (e.g. vgpu.polled=1 vgpu.poll_spin_us=2000)
#   POLL_US=50        how long each vGPU's worker polls its queues after
#                     activity (vgpud's poll_us; a TCG guest's submissions
#                     come further apart than a native one's)
#   WEIGHT_A, WEIGHT_B  the two vGPUs' weights under the fair policy (1, 1)
#   SHARES=1          sample the scheduler's accounting while the library
#                     guests run and check each 1 s window in which both
#                     vGPUs kept the GPU busy against WEIGHT_A:WEIGHT_B
#                     (tests/vm/shares.py; give both a load, e.g.
#                     LIB_RUN=cublas_gemm:8192:10:60 or torch-check.sh:train_load)
set -euo pipefail
# shellcheck source=ci/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../ci/lib.sh"

[[ $# -eq 1 && -f $1 ]] || {
    sed -n '3,40s/^# \{0,1\}//p' "$0" >&2
    exit 2
}
VM_TIMEOUT=${VM_TIMEOUT:-600}
VM_KEEP=${VM_KEEP:-0}
VM_MEM_MB=512
MEM_A=${MEM_A:-$((4 << 30))}
MEM_B=${MEM_B:-$((2 << 30))}
TMP=$(mktemp -d /tmp/vgpud-gpu-vm.XXXXXX)
vgpud_pid=""
qemu_pids=()
result=1

# shellcheck disable=SC2317  # run by the EXIT trap
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

t_all=$SECONDS
tar -C "$TMP" -xJf "$1"
B=$TMP/gpu-vm
log "bundle of commit $(cat "$B/commit" 2>/dev/null || echo unknown)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2

mkdir -p "$TMP/run"
if [[ ${GPU_BACKEND:-cuda} == software ]]; then
    # A dry run of this script on a machine without a GPU.
    gpu_section=$(printf '[[gpu]]\nname = "gpu0"\nbackend = "software"\nmemory = "8GiB"\ncompute_units = 2')
    cus=1
elif [[ ${PARTITION_MODE:-isolated} == spatial ]]; then
    # Spatial mode: each vGPU an SM group (in granules of 8) of one host.
    cus=$(((${GPU_SMS:-132} / 2 - 8) / 8 * 8))
    gpu_section=$(printf '[[gpu]]\nname = "gpu0"\nbackend = "cuda"\ndevice = %s\npartition_mode = "spatial"\nisolation = "process"\nguest_ptx = true\ntrusted_tenants = true\npartition_host = "%s"' \
        "${GPU_DEVICE:-0}" "$B/bin/vgpu-partition-host")
else
    # Isolated mode time-shares the GPU; each vGPU gets half its SMs' time.
    cus=$((${GPU_SMS:-132} / 2))
    gpu_section=$(printf '[[gpu]]\nname = "gpu0"\nbackend = "cuda"\ndevice = %s\npartition_mode = "isolated"\nisolation = "process"\nguest_ptx = true\npartition_host = "%s"' \
        "${GPU_DEVICE:-0}" "$B/bin/vgpu-partition-host")
fi
cat >"$TMP/vgpud.toml" <<TOML
[daemon]
runtime_dir = "$TMP/run"
metrics_address = ""

$gpu_section

[[vgpu]]
name = "a"
gpu = "gpu0"
socket = "a.sock"
memory = $MEM_A
compute_units = $cus
weight = ${WEIGHT_A:-1}
poll_us = ${POLL_US:-50}

[[vgpu]]
name = "b"
gpu = "gpu0"
socket = "b.sock"
memory = $MEM_B
compute_units = $cus
weight = ${WEIGHT_B:-1}
poll_us = ${POLL_US:-50}
TOML
RUST_LOG=${RUST_LOG:-info} "$B/bin/vgpud" run --allow-root --config "$TMP/vgpud.toml" </dev/null >"$TMP/vgpud.log" 2>&1 &
vgpud_pid=$!
for _ in $(seq 600); do
    [[ -S $TMP/run/a.sock && -S $TMP/run/b.sock ]] && break
    kill -0 "$vgpud_pid" 2>/dev/null || { cat "$TMP/vgpud.log" >&2; die "vgpud exited"; }
    sleep 0.1
done
[[ -S $TMP/run/b.sock ]] || { cat "$TMP/vgpud.log" >&2; die "vgpud did not create its sockets"; }
log "vgpud serving two vGPUs of the GPU (pid $vgpud_pid)"

# sample_stats: the scheduler's accounting every 0.1 s, one line each:
# the time, then the daemon's JSON.
sample_stats() {
    while sleep 0.1; do
        printf '%s ' "$(date +%s.%N)"
        "$B/bin/vgpuctl" --api "$TMP/run/api.sock" --json stats | tr -d '\n'
        echo
    done
}

# sample_gpu_apps: every process with a CUDA context on the GPU and the
# device memory it holds, every half second: "pid, MiB" lines.
sample_gpu_apps() {
    while sleep 0.5; do
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null
    done
}

# report_contexts FILE: what a context costs, from the samples in FILE
# (the partition hosts' own memory: the least each host held while it
# ran, which is its CUDA context before it allocated), and the context
# starts the daemon counted with their mean time.
report_contexts() {
    local hosts
    hosts=$(pgrep -d'|' -f vgpu-partition-host || true)
    [[ -s $1 ]] && awk -F', *' '{ if (!($1 in least) || $2 + 0 < least[$1]) least[$1] = $2 + 0 }
        END { for (p in least) print least[p] }' "$1" | sort -n |
        awk '{ v[NR] = $1 }
            END { if (NR == 0) { print "no CUDA processes sampled"; exit }
                  printf "%d processes with a CUDA context; own memory at least %d MiB, median %d MiB, most %d MiB\n", NR, v[1], v[int((NR + 1) / 2)], v[NR] }' |
        sed 's/^/  [contexts] /' >&2
    [[ -n $hosts ]] && log "partition hosts alive now: ${hosts//|/ }"
    "$B/bin/vgpuctl" --api "$TMP/run/api.sock" --json stats 2>/dev/null |
        python3 -c 'import json,sys
d = json.load(sys.stdin)
for v in d.get("vgpus", []):
    n = v.get("context_starts", 0)
    mean = v.get("context_start_seconds", 0) / n * 1000 if n else 0
    name, reused, faults = v.get("name"), v.get("context_reuses", 0), v.get("kernel_faults", 0)
    print(f"vGPU {name}: {n} context starts, mean {mean:.0f} ms, {reused} reused, {faults} kernel faults")' |
        sed 's/^/  [contexts] /' >&2 || true
}

# QEMU alone gets the libraries it was built with.
QEMU=$TMP/qemu
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$B/lib" "$B/bin/qemu-system-x86_64" >"$QEMU"
chmod +x "$QEMU"
QEMU_FIRMWARE=(-L "$B/firmware")
GUEST_KERNEL=$B/vmlinuz
GUEST_INITRD=$B/initrd.gz
# shellcheck source=ci/vm-guests.sh
. "$VGPUD_ROOT/ci/vm-guests.sh"

ok=1
if [[ ${ONLY_LIBS:-0} != 1 ]]; then
    if [[ ${ONLY_BENCH:-0} != 1 ]]; then
        # On a GPU a failed assert() ends the vGPU's context, and the
        # line it printed goes with it.
        suite="${GUEST_APPEND:-}"
        [[ ${GPU_BACKEND:-cuda} != software ]] && suite+=" vgpu.assert_line=lost vgpu.overlap=1"
        boot guest-a "$TMP/run/a.sock" "$MEM_A" "" "$suite"
        boot guest-b "$TMP/run/b.sock" "$MEM_B" "" "$suite"
        sampler=""
        if command -v nvidia-smi >/dev/null; then
            sample_gpu_apps >"$TMP/apps.csv" &
            sampler=$!
        fi
        for pid in "${qemu_pids[@]}"; do
            wait "$pid" || true
        done
        qemu_pids=()
        if [[ -n $sampler ]]; then
            kill "$sampler" 2>/dev/null || true
            wait "$sampler" 2>/dev/null || true
            report_contexts "$TMP/apps.csv"
        fi
        verdict guest-a || ok=0
        verdict guest-b || ok=0
        # One guest with both vGPUs: one process uses the two devices.
        BOOT_QEMU_EXTRA=(-device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$TMP/run/b.sock\",\"type\":\"unix\"}}")
        boot guest-two "$TMP/run/a.sock" "$MEM_A" "" "vgpu.mode=multi-device vgpu.expect_devices=2 ${GUEST_APPEND:-}"
        unset BOOT_QEMU_EXTRA
        wait "${qemu_pids[0]}" || true
        qemu_pids=()
        verdict guest-two || ok=0
    fi
    # --- the launch and copy benchmark: natively, then in one guest alone ------------
    if [[ ${GPU_BACKEND:-cuda} != software ]]; then
        log "bench_launch natively on the GPU"
        "$B/cuda-tests/bench_launch" 200 | sed 's/^/  [native] /' >&2 || ok=0
    fi
    boot guest-bench "$TMP/run/a.sock" "$MEM_A" "" "vgpu.mode=cuda-bench vgpu.cuda_bench=200 ${BENCH_APPEND:-}"
    wait "${qemu_pids[0]}" || true
    qemu_pids=()
    grep -E 'BENCH' "$TMP/guest-bench.log" | tr -d '\r' | sed 's/^ */  [guest] /' >&2 || true
    verdict guest-bench || ok=0
    report_contexts /dev/null
fi

# --- CUDA libraries of the machine's userland: natively, then in both guests -------
cuda_home=${CUDA_HOME:-/usr/local/cuda}
lib_run=${LIB_RUN:-cublas_gemm,cufft}
if [[ ${ONLY_BENCH:-0} == 1 ]]; then
    :
elif [[ -n ${LIB_DIR:-} || (${GPU_BACKEND:-cuda} != software && -x $cuda_home/bin/nvcc) ]]; then
    lib_dir=${LIB_DIR:-$TMP/libtests}
    [[ -n ${LIB_DIR:-} ]] || log "building tests/cuda/libs with $cuda_home"
    if [[ -n ${LIB_DIR:-} ]] || bash "$VGPUD_ROOT/tests/cuda/libs/build.sh" "$TMP/libtests" "$cuda_home" >"$TMP/libs-build.log" 2>&1; then
        # LIB_DIR's programs were run natively by whoever built them.
        native_run=$lib_run
        [[ -n ${LIB_DIR:-} ]] && native_run=none
        for item in ${native_run//,/ }; do
            prog=${item%%:*}
            [[ $prog == none ]] && continue
            args=()
            [[ $prog != "$item" ]] && IFS=: read -ra args <<<"${item#*:}"
            log "$prog natively"
            LD_LIBRARY_PATH=$cuda_home/lib64 "$TMP/libtests/$prog" "${args[@]}" 2>&1 |
                sed 's/^/  [native] /' >&2 || ok=0
        done
        BOOT_MEM_MB=${LIB_MEM_MB:-4096}
        # shellcheck disable=SC2054  # commas separate QEMU sub-options
        BOOT_QEMU_EXTRA=(-cpu max -smp "${LIB_SMP:-4}"
            -fsdev local,id=hostroot,path=/,security_model=none,readonly=on
            -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot)
        libs="vgpu.mode=host-cuda vgpu.host_dir=$lib_dir ${GUEST_APPEND:-}"
        boot guest-libs-a "$TMP/run/a.sock" "$MEM_A" "" "$libs vgpu.host_run=$lib_run"
        boot guest-libs-b "$TMP/run/b.sock" "$MEM_B" "" \
            "$libs vgpu.host_run=${LIB_RUN_B:-$lib_run} ${LIB_APPEND_B:-}"
        sampler=""
        if [[ ${SHARES:-0} == 1 ]]; then
            sample_stats >"$TMP/stats.jsonl" &
            sampler=$!
        fi
        for pid in "${qemu_pids[@]}"; do
            wait "$pid" || true
        done
        qemu_pids=()
        if [[ -n $sampler ]]; then
            kill "$sampler" 2>/dev/null || true
            wait "$sampler" 2>/dev/null || true
            log "shares of GPU time, weights ${WEIGHT_A:-1}:${WEIGHT_B:-1}"
            if python3 "$VGPUD_ROOT/tests/vm/shares.py" "$TMP/stats.jsonl" \
                a="${WEIGHT_A:-1}:$TMP/guest-libs-a.log" b="${WEIGHT_B:-1}:$TMP/guest-libs-b.log" >"$TMP/shares.txt"; then
                passed=$((passed + 1))
            else
                failed=$((failed + 1))
                ok=0
            fi
            sed 's/^/  [shares] /' "$TMP/shares.txt" >&2
        fi
        verdict guest-libs-a || ok=0
        verdict guest-libs-b || ok=0
        grep -hE 'BENCH' "$TMP/guest-libs-a.log" "$TMP/guest-libs-b.log" | tr -d '\r' | sed 's/^ */  [guest] /' >&2 || true
        if [[ -n ${TWO_RUN:-} ]]; then
            # One guest with both vGPUs runs TWO_RUN.
            BOOT_QEMU_EXTRA+=(-device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$TMP/run/b.sock\",\"type\":\"unix\"}}")
            boot guest-libs-two "$TMP/run/a.sock" "$MEM_A" "" "$libs vgpu.expect_devices=2 vgpu.host_run=$TWO_RUN"
            wait "${qemu_pids[0]}" || true
            qemu_pids=()
            verdict guest-libs-two || ok=0
        fi
        if [[ ${FAULTS:-0} == 1 && ${PARTITION_MODE:-isolated} == spatial ]]; then
            # Spatial: every fault ends the shared host, so the bystander's
            # GEMMs (runs of 10 s, one after the other) are cut and resumed.
            bys="cublas_gemm:8192:3:10"
            for _ in $(seq 8); do bys="$bys,cublas_gemm:8192:3:10"; done
            boot guest-libs-bystander "$TMP/run/b.sock" "$MEM_B" "" "$libs vgpu.host_run=$bys"
            bystander=${qemu_pids[0]}
            for _ in $(seq 600); do
                grep -q 'LOAD' "$TMP/guest-libs-bystander.log" 2>/dev/null && break
                kill -0 "$bystander" 2>/dev/null || break
                sleep 0.5
            done
            log "the bystander computes; guest a faults beside it (spatial)"
            unset BOOT_MEM_MB BOOT_QEMU_EXTRA
            boot guest-faults "$TMP/run/a.sock" "$MEM_A" "" "vgpu.mode=spatial-faults ${GUEST_APPEND:-}"
            wait "${qemu_pids[1]}" || true
            log "the faults are over"
            wait "$bystander" || true
            qemu_pids=()
            verdict guest-faults || ok=0
            # The bystander's cut runs fail by design; its rate says when.
            grep -hE 'LOAD|PASS|FAIL' "$TMP/guest-libs-bystander.log" | tr -d '\r' | sed 's/^ */  [bystander] /' >&2 || true
            grep -c 'shared partition host .* ends' "$TMP/vgpud.log" | sed 's/^/  [spatial] shared host ends: /' >&2 || true
        elif [[ ${FAULTS:-0} == 1 ]]; then
            # A bystander: guest b keeps the GPU busy with checked cuBLAS
            # GEMMs, saying its rate each second, while a process of
            # guest a faults 20 times beside two that compute.
            boot guest-libs-bystander "$TMP/run/b.sock" "$MEM_B" "" \
                "$libs vgpu.host_run=cublas_gemm:8192:3:${FAULT_LOAD_SECONDS:-90}"
            bystander=${qemu_pids[0]}
            for _ in $(seq 600); do
                grep -q 'LOAD' "$TMP/guest-libs-bystander.log" 2>/dev/null && break
                kill -0 "$bystander" 2>/dev/null || break
                sleep 0.5
            done
            log "the bystander computes; guest a faults beside it"
            unset BOOT_MEM_MB BOOT_QEMU_EXTRA
            boot guest-faults "$TMP/run/a.sock" "$MEM_A" "" "vgpu.mode=faults ${GUEST_APPEND:-}"
            faulting=${qemu_pids[1]}
            wait "$faulting" || true
            log "the faults are over"
            wait "$bystander" || true
            qemu_pids=()
            verdict guest-faults || ok=0
            verdict guest-libs-bystander || ok=0
            grep -hE 'LOAD|PASS|FAIL' "$TMP/guest-libs-bystander.log" | tr -d '\r' | sed 's/^ */  [bystander] /' >&2 || true
            grep -hE 'cuda-fault' "$TMP/guest-faults.log" | tr -d '\r' | sed 's/^ */  [faults] /' >&2 || true
            report_contexts /dev/null
        fi
        unset BOOT_MEM_MB BOOT_QEMU_EXTRA
    else
        cat "$TMP/libs-build.log" >&2
        log "the library programs did not build"
        ok=0
    fi
else
    log "no CUDA toolkit at $cuda_home: cuBLAS and cuFFT skipped"
fi

if grep -qE 'panicked' "$TMP/vgpud.log"; then
    log "vgpud panicked"
    ok=0
fi
if [[ $ok == 1 ]]; then
    result=0
    log "PASS: $passed guest checks in $(elapsed "$t_all")"
else
    printf '\n----- vgpud log -----\n' >&2
    tail -n 200 "$TMP/vgpud.log" >&2
    log "FAIL"
fi
echo "gpu-vm: $passed passed, $failed failed"
exit "$result"
