#!/bin/sh
# /init of the guest that runs the vgpu guest test suite (busybox sh).
#
# Loads vgpu.ko, runs vgpu-smi, vgpu-guest-test, the saxpy and sgemm
# samples, reloads the module, runs vgpu-guest-test --quick, and checks
# the kernel log. Prints one marker line per check:
#   VGPU-TEST PASS <name> [detail]
#   VGPU-TEST FAIL <name>: <reason>
#   VGPU-TEST DONE
# then powers the guest off.
#
# The initramfs holds /vgpu.ko and the static programs vgpu-smi,
# vgpu-guest-test, vgpu-saxpy, vgpu-sgemm and (optional, the C interface)
# vgpu-saxpy-c, in /usr/bin or anywhere else in the image (found at boot),
# and (optional) the CUDA driver /usr/lib/vgpu/libcuda.so.1 with the CUDA
# programs of tests/cuda in /usr/libexec/vgpu-cuda-tests;
# tests/vm/guest-suite-initramfs.sh builds such an image.
#
# Kernel command line (all optional):
#   vgpu.mode=full|quick|boot|demo|isolation-write|isolation-check|cuda-bench|host-cuda|multi-device|faults|spatial-faults|repeat|resize|suspend
#                                   (full)
#   vgpu.cuda_bench=N               cuda-bench: iterations (200)
#   vgpu.repeat=PROG:N              repeat: run CUDA program PROG N times
#   vgpu.host_dir=DIR               host-cuda: the host folder of the programs
#   vgpu.host_run=a,b:ARG,c         host-cuda: programs in it to run, in order
#                                   (':' separates a program's arguments)
#                                   ("none" runs nothing)
#   vgpu.cuda_log=1                 libcuda.so.1 says what it refuses (VGPU_CUDA_LOG)
#   vgpu.host_env=K=V,K=V           host-cuda: more environment for the programs
#   vgpu.device=/dev/vgpuN          device under test (/dev/vgpu0)
#   vgpu.expect_mem=BYTES           expected partition memory
#   vgpu.overlap=1                  run streams_overlap too (a GPU backend:
#                                   streams run side by side)
#   vgpu.assert_line=kept|lost      whether a failed assert()'s line survives
#                                   the loss of the device state (kept)
#   vgpu.expect_cu=N                expected compute units
#   vgpu.expect_window=BYTES        expected window size
#   vgpu.expect_devices=N           expected number of /dev/vgpuN
#   vgpu.expect_vendor=0xVVVV vgpu.expect_device_id=0xDDDD
#   vgpu.procs=N                    processes of the multi-process checks (4)
#   vgpu.skip=a,b                   vgpu-guest-test checks to skip
#   vgpu.seed=N                     seed of the random data
#   vgpu.saxpy_n=N                  saxpy elements (1048576)
#   vgpu.sgemm=M,N,K                sgemm shape (128,128,128)
#   vgpu.magic=0xMMMMMMMM           isolation modes: the pattern (0x5a17c0de)
#   vgpu.hold=SECONDS               isolation-write: keep the memory this long
#   vgpu.resize=GROW,SHRINK         resize: the sizes the host sets, bytes
#   vgpu.done_mem=BYTES             suspend: the size the host sets when done
#   vgpu.isolation_bytes=BYTES      isolation-write: device memory to fill
#   vgpu.queues= vgpu.ring_size= vgpu.polled= vgpu.poll_spin_us=
#   vgpu.force_intx= vgpu.watchdog_ms=
#                                   module parameters, passed to insmod
#
# Modes: full runs everything above; quick loads the module and runs
# vgpu-guest-test --quick; boot only boots; isolation-write fills device
# memory (half the partition, or vgpu.isolation_bytes) and the window with
# the magic pattern, prints "VGPU-ISOLATION WRITTEN magic=... device_bytes=...
# window_bytes=... hold=..." when it is in place and keeps it allocated for
# vgpu.hold seconds (another guest starts its check after that line);
# isolation-check allocates all device memory and checks that it is zeroed
# and that neither it nor the window holds the pattern; cuda-bench loads the
# module and runs the CUDA launch and copy benchmark (BENCH lines);
# host-cuda loads the module, mounts the host's root through 9p (QEMU's
# -fsdev ... mount_tag=hostroot) and runs programs of the host's userland
# in it (chroot), through this image's libcuda.so.1 before the host's CUDA
# libraries: CUDA libraries such as cuBLAS that no image could hold;
# multi-device loads the module and runs multi_device, one process on the
# guest's vGPUs (vgpu.expect_devices of them, two by default); resize
# loads the module and runs resize_watch, which keeps data in device
# memory while the host grows and shrinks the vGPU (vgpu.resize), then
# checks that vgpu-smi and the kernel log saw the last size; suspend
# loads the module and runs neighbour while the host suspends and resumes
# the vGPU (until it sets vgpu.done_mem).

export PATH=/bin:/sbin:/usr/bin:/usr/sbin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp 2>/dev/null

MODULE=/vgpu.ko
failed=0

pass() {
    name=$1
    shift
    echo "VGPU-TEST PASS $name${*:+ $*}"
}

fail() {
    echo "VGPU-TEST FAIL $1: $2"
    failed=$((failed + 1))
}

finish() {
    echo "guest: $failed check(s) failed in this script"
    echo "VGPU-TEST DONE"
    sync
    poweroff -f
    # Not reached; if it were, exiting /init panics and the host's
    # -no-reboot stops QEMU.
    sleep 5
    exit 1
}

# --- kernel command line ------------------------------------------------------
mode=full
device=/dev/vgpu0
expect_args=""
test_args=""
modparams=""
procs=4
saxpy_n=1048576
sgemm="128,128,128"
expect_mem=""
expect_devices=""
cuda_bench=200
repeat=""
host_dir=""
host_run=""
host_env=""
magic=0x5a17c0de
hold=0
resize=""
done_mem=""
isolation_bytes=""
assert_line=kept
overlap=0

# shellcheck disable=SC2013  # words, not lines
for word in $(cat /proc/cmdline); do
    value=${word#*=}
    case $word in
    vgpu.mode=*) mode=$value ;;
    vgpu.device=*) device=$value ;;
    vgpu.expect_mem=*)
        expect_args="$expect_args --expect-mem $value"
        expect_mem=$value
        ;;
    vgpu.cuda_bench=*) cuda_bench=$value ;;
    vgpu.repeat=*) repeat=$value ;;
    vgpu.assert_line=*) assert_line=$value ;;
    vgpu.overlap=*) overlap=$value ;;
    vgpu.host_dir=*) host_dir=$value ;;
    vgpu.host_run=*) host_run=$value ;;
    vgpu.host_env=*) host_env=$(echo "$value" | tr ',' ' ') ;;
    vgpu.cuda_log=*) export VGPU_CUDA_LOG="$value" ;;
    vgpu.expect_cu=*) expect_args="$expect_args --expect-cu $value" ;;
    vgpu.expect_window=*) expect_args="$expect_args --expect-window $value" ;;
    vgpu.expect_devices=*)
        expect_devices=$value
        expect_args="$expect_args --expect-devices $value"
        ;;
    vgpu.expect_vendor=*) expect_args="$expect_args --expect-vendor $value" ;;
    vgpu.expect_device_id=*) expect_args="$expect_args --expect-device-id $value" ;;
    vgpu.procs=*) procs=$value ;;
    vgpu.skip=*) test_args="$test_args --skip $value" ;;
    vgpu.seed=*) test_args="$test_args --seed $value" ;;
    vgpu.saxpy_n=*) saxpy_n=$value ;;
    vgpu.sgemm=*) sgemm=$value ;;
    vgpu.magic=*) magic=$value ;;
    vgpu.hold=*) hold=$value ;;
    vgpu.resize=*) resize=$value ;;
    vgpu.done_mem=*) done_mem=$value ;;
    vgpu.isolation_bytes=*) isolation_bytes=$value ;;
    vgpu.queues=* | vgpu.ring_size=* | vgpu.polled=* | vgpu.poll_spin_us=* | \
        vgpu.force_intx=* | vgpu.watchdog_ms=*)
        modparams="$modparams ${word#vgpu.}"
        ;;
    esac
done

# The programs are in /usr/bin, or wherever ci/mkinitramfs.sh --bin put
# them (the host path).
for prog in vgpu-guest-test vgpu-smi vgpu-saxpy vgpu-sgemm vgpu-saxpy-c; do
    command -v "$prog" >/dev/null 2>&1 && continue
    found=$(find / -xdev -type f -name "$prog" 2>/dev/null | head -n 1)
    [ -n "$found" ] && PATH="$PATH:${found%/*}"
done
export PATH

echo "guest: kernel $(uname -r), $(grep -c ^processor /proc/cpuinfo) cpu(s), $(grep MemTotal /proc/meminfo | tr -s ' ')"
echo "guest: mode $mode, device $device${modparams:+, module parameters$modparams}"

if [ "$mode" = boot ]; then
    pass boot "kernel $(uname -r)"
    finish
fi

# --- helpers --------------------------------------------------------------------

# dmesg_tail N: the last N kernel log lines, indented.
dmesg_tail() {
    dmesg | tail -n "$1" | sed 's/^/  dmesg: /'
}

# load NAME: insmod the module and wait for the device node.
load() {
    name=$1
    # shellcheck disable=SC2086  # parameters are separate words
    if ! out=$(insmod "$MODULE" $modparams 2>&1); then
        fail "$name" "insmod $MODULE$modparams: $out"
        dmesg_tail 20
        return 1
    fi
    i=0
    while [ ! -c "$device" ] && [ $i -lt 50 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    if [ ! -c "$device" ]; then
        fail "$name" "no $device after insmod; vgpu nodes: $(echo /dev/vgpu*)"
        dmesg_tail 20
        return 1
    fi
    ndev=0
    for node in /dev/vgpu[0-9]*; do
        [ -c "$node" ] && ndev=$((ndev + 1))
    done
    pass "$name" "$ndev device(s); $(dmesg | grep -i vgpu | tail -n 1 | sed 's/^\[[^]]*\] //')"
    return 0
}

# sample NAME CMD...: run a sample program; its last line is PASS or FAIL.
sample() {
    name=$1
    shift
    "$@" >/tmp/sample.out 2>&1
    rc=$?
    sed 's/^/  /' /tmp/sample.out
    last=$(tail -n 1 /tmp/sample.out)
    if [ $rc -eq 0 ] && [ "$last" = PASS ]; then
        pass "$name" "$(grep -E 'sgemm_f32|saxpy_f32|^/dev' /tmp/sample.out | tr -s ' ' | sed 's/^ //' | head -n 1)"
    else
        fail "$name" "exit $rc: ${last:-no output}"
    fi
}

# cuda_run LABEL PROGRAM ARGS...: each PASS/FAIL line the program prints
# becomes a check named cuda-LABEL<name>; a program that fails without
# saying so fails too.
cuda_lib=/usr/lib/vgpu
cuda_exec=""
cuda_run() {
    label=$1
    shift
    # shellcheck disable=SC2086  # cuda_exec is a command prefix, host_env words
    $cuda_exec env LD_LIBRARY_PATH=$cuda_lib $host_env "$@" >/tmp/cuda.out 2>&1
    rc=$?
    sed 's/^/  /' /tmp/cuda.out
    cuda_report "$label" "$1" $rc
}

# cuda_report LABEL PROGRAM RC: cuda_run's checks of /tmp/cuda.out.
cuda_report() {
    label=$1
    rc=$3
    said=0
    while read -r word name rest; do
        case $word in
        PASS) pass "cuda-$label$name" "$rest"; said=1 ;;
        FAIL) fail "cuda-$label${name%:}" "$rest"; said=1 ;;
        esac
    done </tmp/cuda.out
    if [ "$rc" -ne 0 ] && [ $said -eq 0 ]; then
        fail "cuda-$label$(basename "$2")" "exit $rc: $(tail -n 1 /tmp/cuda.out)"
    fi
}
cuda_tests=/usr/libexec/vgpu-cuda-tests

# smi_json PATTERN: the first match of sed PATTERN (one \(group\)) in
# vgpu-smi's JSON for this guest's device.
smi_json() {
    vgpu-smi --json -i "${device#/dev/vgpu}" 2>/dev/null | sed -n "s/$1/\1/p" | head -n 1
}

# fault_neighbours: a fault is its own process's. Two programs compute
# and check every result (tests/cuda/neighbour.cu) while a third faults
# 20 times in a row (tests/cuda/illegal_address.cu); each fault run sees
# its illegal address, both neighbours finish correctly, and the vGPU's
# memory in use (MEM_USED) and its contexts are back where they were.
fault_neighbours() {
    used_before=$(smi_json '.*"used":\([0-9]*\).*')
    stop=/tmp/neighbours.stop
    rm -f "$stop"
    # shellcheck disable=SC2086  # host_env words
    env LD_LIBRARY_PATH=$cuda_lib $host_env $cuda_tests/neighbour 3 "$stop" >/tmp/neighbour1.out 2>&1 &
    n1=$!
    # shellcheck disable=SC2086
    env LD_LIBRARY_PATH=$cuda_lib $host_env $cuda_tests/neighbour 3 "$stop" >/tmp/neighbour2.out 2>&1 &
    n2=$!
    runs=0 illegal=0 failed=0 why=""
    t0=$(date +%s)
    while [ $runs -lt 20 ]; do
        runs=$((runs + 1))
        # shellcheck disable=SC2086
        env LD_LIBRARY_PATH=$cuda_lib $host_env $cuda_tests/illegal_address >/tmp/fault.out 2>&1
        line=$(grep '^PASS illegal_address' /tmp/fault.out)
        case $line in
        *cudaErrorIllegalAddress*) illegal=$((illegal + 1)) ;;
        *cudaErrorLaunchFailure*) failed=$((failed + 1)) ;;
        *) [ -n "$why" ] || why="run $runs: $(tail -n 1 /tmp/fault.out)" ;;
        esac
    done
    t1=$(date +%s)
    # Both must still be computing when the last fault is done.
    alive=0
    kill -0 $n1 2>/dev/null && alive=$((alive + 1))
    kill -0 $n2 2>/dev/null && alive=$((alive + 1))
    touch "$stop"
    wait $n1
    neighbour_rc1=$?
    wait $n2
    neighbour_rc2=$?
    if [ -z "$why" ]; then
        pass cuda-fault-runs "$runs runs in $((t1 - t0)) s: $illegal cudaErrorIllegalAddress, $failed cudaErrorLaunchFailure, each sticky"
    else
        fail cuda-fault-runs "$why"
    fi
    for k in 1 2; do
        rc=$neighbour_rc1
        [ $k = 1 ] || rc=$neighbour_rc2
        sed 's/^/  /' /tmp/neighbour$k.out
        if [ "$rc" -eq 0 ] && grep -q '^PASS neighbour' /tmp/neighbour$k.out; then
            pass cuda-fault-neighbour-$k "$(grep '^PASS neighbour' /tmp/neighbour$k.out | cut -d' ' -f3-)"
        else
            fail cuda-fault-neighbour-$k "exit $rc: $(tail -n 1 /tmp/neighbour$k.out)"
        fi
    done
    if [ $alive -eq 2 ]; then
        pass cuda-fault-overlap "both neighbours computed through all $runs faults"
    else
        fail cuda-fault-overlap "only $alive neighbour(s) still ran after the faults"
    fi
    # Closed files free their memory (close waits up to 2 s for it).
    i=0
    used=$(smi_json '.*"used":\([0-9]*\).*')
    while [ "$used" != "$used_before" ] && [ $i -lt 50 ]; do
        sleep 0.1
        i=$((i + 1))
        used=$(smi_json '.*"used":\([0-9]*\).*')
    done
    contexts=$(smi_json '.*"now":\([0-9]*\).*')
    if [ -n "$used" ] && [ "$used" = "$used_before" ] && [ "${contexts:-0}" = 0 ]; then
        pass cuda-fault-memory "MEM_USED back to $used bytes, ${contexts:-0} context(s) left"
    else
        fail cuda-fault-memory "MEM_USED $used bytes, $used_before before; ${contexts:-?} context(s) left"
    fi
}

# check_kernel_log NAME: no oops, BUG, warning splat or lockdep report.
check_kernel_log() {
    bad=$(dmesg | grep -E 'BUG:|WARNING:|Oops|general protection|Call Trace|kernel BUG|lockdep|UBSAN|KASAN|refcount_t:|list_(add|del) corruption' | head -n 5)
    if [ -n "$bad" ]; then
        fail "$1" "$(echo "$bad" | head -n 1)"
        dmesg | grep -B 5 -A 30 -E 'BUG:|WARNING:|Oops|general protection' | head -n 80 | sed 's/^/  dmesg: /'
    else
        pass "$1" "$(dmesg | grep -ci vgpu) vgpu line(s), no splats"
    fi
}

# --- cuda-bench: the CUDA launch and copy figures -------------------------------------
if [ "$mode" = cuda-bench ]; then
    load insmod || finish
    cuda_run "" $cuda_tests/bench_launch "$cuda_bench"
    finish
fi

# --- host-cuda: programs and CUDA libraries of the host's userland --------------------
if [ "$mode" = host-cuda ]; then
    load insmod || finish
    for m in netfs 9pnet 9pnet_virtio 9p; do
        insmod /lib/modules-9p/$m.ko || { fail 9p "insmod $m.ko"; finish; }
    done
    mkdir -p /host
    if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=1048576,cache=loose hostroot /host; then
        fail 9p "mount of the host's root"
        finish
    fi
    # The programs' folder moves to /mnt before the host's /tmp is covered.
    mount -o bind "/host$host_dir" /host/mnt || { fail 9p "no $host_dir on the host"; finish; }
    mount -t proc proc /host/proc
    mount -t sysfs sysfs /host/sys
    mount -t devtmpfs devtmpfs /host/dev
    mount -t tmpfs tmpfs /host/tmp
    mkdir -p /host/tmp/vgpu
    cp /usr/lib/vgpu/* /host/tmp/vgpu/
    pass 9p "the host's userland at /host, programs of $host_dir"
    cuda_exec="chroot /host"
    cuda_lib=/tmp/vgpu:/usr/local/cuda/lib64
    host_env="$host_env VGPU_EXPECT_MEM=$expect_mem"
    for item in $(echo "$host_run" | tr ',' ' '); do
        # "none": this guest's vGPU stays idle (the other guest runs alone).
        [ "$item" = none ] && continue
        prog=${item%%:*}
        args=""
        [ "$prog" != "$item" ] && args=$(echo "${item#*:}" | tr ':' ' ')
        # shellcheck disable=SC2086  # separate arguments
        HOME=/tmp cuda_run "" /mnt/$prog $args
    done
    finish
fi

# --- repeat: one CUDA program again and again (a test that fails now and then) -------
if [ "$mode" = repeat ]; then
    load insmod || finish
    prog=${repeat%%:*}
    n=${repeat#*:}
    i=0
    while [ "$i" -lt "$n" ]; do
        i=$((i + 1))
        cuda_run "run$i-" $cuda_tests/"$prog"
    done
    finish
fi

# Milliseconds since boot.
uptime_ms() {
    read -r up _ </proc/uptime
    echo "${up%.*}${up#*.}0"
}

# fault_shared: on a spatial GPU (partitions in one shared host process)
# a fault is every process's. Each of 5 rounds: a neighbour computes and
# a process faults; the faulting one sees its illegal address (sticky),
# the neighbour a CUDA error, never a wrong result; the function is reset
# and a fresh process computes correctly; the time from the fault to that
# process's result is said. Memory in use ends where it began.
fault_shared() {
    used_before=$(smi_json '.*"used":\([0-9]*\).*')
    rounds=5 r=0 why="" times="" illegal=0 failed=0
    while [ $r -lt $rounds ]; do
        r=$((r + 1))
        stop=/tmp/shared.stop
        rm -f "$stop"
        # shellcheck disable=SC2086  # host_env words
        env LD_LIBRARY_PATH=$cuda_lib $host_env $cuda_tests/neighbour 1 "$stop" >/tmp/nb.out 2>&1 &
        nb=$!
        sleep 2
        # shellcheck disable=SC2086
        env LD_LIBRARY_PATH=$cuda_lib $host_env $cuda_tests/illegal_address >/tmp/fault.out 2>&1
        t0=$(uptime_ms)
        touch "$stop"
        wait $nb
        nb_rc=$?
        k=0
        # shellcheck disable=SC2086
        until env LD_LIBRARY_PATH=$cuda_lib $host_env $cuda_tests/neighbour 1 - >/tmp/fresh.out 2>&1; do
            k=$((k + 1))
            [ $k -lt 50 ] || break
            sleep 0.1
        done
        t1=$(uptime_ms)
        times="$times $((t1 - t0))"
        # The faulting launch reports the illegal address; when the
        # host's end reaches the process first, the launch failure.
        if grep -q 'cudaErrorIllegalAddress' /tmp/fault.out; then
            illegal=$((illegal + 1))
        elif grep -q 'cudaErrorLaunchFailure' /tmp/fault.out; then
            failed=$((failed + 1))
        else
            [ -n "$why" ] || why="round $r: the faulting process: $(tail -n 1 /tmp/fault.out)"
        fi
        if grep -q '^FAIL neighbour: round' /tmp/nb.out; then
            [ -n "$why" ] || why="round $r: the neighbour saw a wrong result: $(tail -n 1 /tmp/nb.out)"
        elif [ $nb_rc -eq 0 ]; then
            [ -n "$why" ] || why="round $r: the neighbour went on: $(tail -n 1 /tmp/nb.out)"
        elif grep -q 'named symbol not found' /tmp/nb.out; then
            [ -n "$why" ] || why="round $r: the neighbour got a misleading error: $(tail -n 1 /tmp/nb.out)"
        elif ! grep -q '^PASS neighbour' /tmp/fresh.out; then
            [ -n "$why" ] || why="round $r: no fresh process computed: $(tail -n 1 /tmp/fresh.out)"
        fi
        sed 's/^/  [neighbour] /' /tmp/nb.out
    done
    if [ -z "$why" ]; then
        pass cuda-shared-faults "$rounds faults: $illegal seen as cudaErrorIllegalAddress, $failed as cudaErrorLaunchFailure; the neighbour failed with a CUDA error (no wrong result), a fresh process computed after (ms from the fault:$times)"
    else
        fail cuda-shared-faults "$why"
    fi
    used=$(smi_json '.*"used":\([0-9]*\).*')
    if [ -n "$used" ] && [ "$used" = "$used_before" ]; then
        pass cuda-shared-memory "MEM_USED back to $used bytes"
    else
        fail cuda-shared-memory "MEM_USED $used bytes, $used_before before"
    fi
}

# --- spatial-faults: faults on a GPU whose partitions share one process -------------
if [ "$mode" = spatial-faults ]; then
    load insmod || finish
    fault_shared
    check_kernel_log kernel-log
    finish
fi

# --- faults: a process faulting over and over beside two that compute ----------------
if [ "$mode" = faults ]; then
    load insmod || finish
    fault_neighbours
    check_kernel_log kernel-log
    finish
fi

# --- resize: the host resizes the vGPU while a process keeps data in it -------------
# The host reads the program's VGPU-RESIZE lines from the console as they
# come, and resizes the vGPU to GROW, then to SHRINK (vgpu.resize).
if [ "$mode" = resize ]; then
    load insmod || finish
    grow=${resize%%,*}
    shrink=${resize#*,}
    { env LD_LIBRARY_PATH=$cuda_lib $cuda_tests/resize_watch "$grow" "$shrink"; echo $? >/tmp/cuda.rc; } 2>&1 |
        tee /tmp/cuda.out
    cuda_report "" resize_watch "$(cat /tmp/cuda.rc)"
    # vgpu-smi and the kernel log know the size the host set last.
    total=$(smi_json '.*"total":\([0-9]*\).*')
    if [ "$total" = "$shrink" ]; then
        pass resize-smi "vgpu-smi says $total bytes"
    else
        fail resize-smi "vgpu-smi says ${total:-nothing}, $shrink expected"
    fi
    line=$(dmesg | grep "device memory now $((shrink >> 20)) MiB" | tail -n 1)
    if [ -n "$line" ]; then
        pass resize-kernel-log "$(echo "$line" | sed 's/^\[[^]]*\] //')"
    else
        fail resize-kernel-log "no line of the resize to $((shrink >> 20)) MiB"
        dmesg_tail 10
    fi
    check_kernel_log kernel-log
    finish
fi

# --- suspend: the host suspends and resumes the vGPU under a computing process -------
# neighbour computes and checks every round while the host suspends and
# resumes the vGPU again and again; the host says it is done by resizing
# the vGPU to vgpu.done_mem bytes, which vgpu-smi reads.
if [ "$mode" = suspend ]; then
    load insmod || finish
    stop=/tmp/suspend.stop
    env LD_LIBRARY_PATH=$cuda_lib $cuda_tests/neighbour 20 "$stop" >/tmp/cuda.out 2>&1 &
    nb=$!
    echo "VGPU-SUSPEND READY"
    i=0
    while [ "$(smi_json '.*"total":\([0-9]*\).*')" != "$done_mem" ] && [ $i -lt 6000 ]; do
        kill -0 $nb 2>/dev/null || break
        sleep 0.1
        i=$((i + 1))
    done
    touch "$stop"
    wait $nb
    rc=$?
    sed 's/^/  /' /tmp/cuda.out
    cuda_report "" neighbour $rc
    check_kernel_log kernel-log
    finish
fi

# --- multi-device: one process on two vGPUs ----------------------------------------
if [ "$mode" = multi-device ]; then
    load insmod || finish
    cuda_run "" $cuda_tests/multi_device "${expect_devices:-2}"
    vgpu-smi | sed 's/^/  /'
    check_kernel_log kernel-log
    finish
fi

# --- demo: what a user of a vGPU does ------------------------------------------------
if [ "$mode" = demo ]; then
    load insmod || finish
    echo "=== vgpu-smi"
    vgpu-smi
    echo "=== saxpy on the vGPU, checked against the guest CPU"
    sample saxpy vgpu-saxpy --device "$device" -n "$saxpy_n"
    echo "=== sgemm on the vGPU, checked against the guest CPU"
    sample sgemm vgpu-sgemm --device "$device" -m 256 -n 256 -k 256
    echo "=== unmodified CUDA programs: built by nvcc, run by the CUDA runtime"
    echo "    through the vGPU's libcuda.so.1, checked against the guest CPU"
    cuda_run "" $cuda_tests/matmul_tiled
    cuda_run "" $cuda_tests/thrust_sort
    echo "=== vgpu-smi after the work"
    vgpu-smi
    finish
fi

# --- isolation modes ------------------------------------------------------------
case $mode in
isolation-write | isolation-check)
    load insmod || finish
    if [ "$mode" = isolation-write ]; then
        # shellcheck disable=SC2086
        vgpu-guest-test --device "$device" --no-done --isolation-write "$magic" \
            --hold "$hold" ${isolation_bytes:+--isolation-bytes $isolation_bytes} $test_args
    else
        # shellcheck disable=SC2086
        vgpu-guest-test --device "$device" --no-done --isolation-check "$magic" $test_args
    fi
    vgpu-smi
    check_kernel_log kernel-log
    finish
    ;;
full | quick) ;;
*)
    fail mode "unknown vgpu.mode=$mode"
    finish
    ;;
esac

# --- first load -------------------------------------------------------------------
if ! load insmod; then
    finish
fi

if [ "$mode" = quick ]; then
    # shellcheck disable=SC2086
    vgpu-guest-test --device "$device" --no-done --quick $expect_args $test_args
    check_kernel_log kernel-log
    finish
fi

# --- vgpu-smi ---------------------------------------------------------------------
out=$(vgpu-smi 2>&1)
rc=$?
echo "$out" | sed 's/^/  /'
if [ $rc -eq 0 ] && echo "$out" | grep -q '1ee7:0100'; then
    pass smi "$(echo "$out" | grep -c '1ee7:0100') device(s) listed"
else
    fail smi "exit $rc: $(echo "$out" | tail -n 1)"
fi
out=$(vgpu-smi --json 2>&1)
rc=$?
case $out in
'{'*'"devices":['*)
    if [ $rc -eq 0 ]; then pass smi-json; else fail smi-json "exit $rc"; fi
    ;;
*) fail smi-json "exit $rc: $(echo "$out" | head -c 200)" ;;
esac

# --- PCI Express config space: 4 KiB through the VMM, the extended part empty ---
config_space() {
    for d in /sys/bus/pci/drivers/vgpu/0000:*; do
        [ -e "$d/config" ] || continue
        size=$(stat -c %s "$d/config")
        nonzero=$(dd if="$d/config" bs=256 skip=1 count=15 2>/dev/null | tr -d '\000' | wc -c)
        if [ "$size" = 4096 ] && [ "$nonzero" = 0 ]; then
            pass config-space "${d##*/}: 4096 bytes, no extended capability"
        else
            fail config-space "${d##*/}: $size bytes, $nonzero non-zero byte(s) past 0x100"
        fi
        return
    done
    fail config-space "no function bound to the vgpu driver"
}
config_space
out=$(vgpu-smi -l 0.2 -c 3 2>&1)
rc=$?
reports=$(echo "$out" | grep -c 'VGPU-SMI')
if [ $rc -eq 0 ] && [ "$reports" -eq 3 ]; then
    pass smi-loop "3 reports"
else
    fail smi-loop "exit $rc, $reports report(s): $(echo "$out" | tail -n 1)"
fi
# This shell (pid 1) holds the device open: vgpu-smi lists it.
exec 3<>"$device"
out=$(vgpu-smi 2>&1)
exec 3>&-
line=$(echo "$out" | grep -E '^\| +[0-9]+ +1 +1 +init ')
if [ -n "$line" ]; then
    pass smi-processes "$(echo "$line" | tr -s ' ')"
else
    fail smi-processes "pid 1 not listed: $(echo "$out" | grep -A3 Processes: | tail -n 1)"
fi

# --- the suite --------------------------------------------------------------------
# shellcheck disable=SC2086
vgpu-guest-test --device "$device" --no-done --procs "$procs" $expect_args $test_args
echo "guest: vgpu-guest-test exited with $?"

# --- samples ------------------------------------------------------------------------
sample saxpy vgpu-saxpy --device "$device" -n "$saxpy_n"
m=$(echo "$sgemm" | cut -d, -f1)
n=$(echo "$sgemm" | cut -d, -f2)
k=$(echo "$sgemm" | cut -d, -f3)
sample sgemm vgpu-sgemm --device "$device" -m "${m:-128}" -n "${n:-128}" -k "${k:-128}"
# The C interface (libvgpu_guest.a), when the image has the sample.
if command -v vgpu-saxpy-c >/dev/null 2>&1; then
    sample c-api vgpu-saxpy-c "$device" 100000
else
    echo "guest: no vgpu-saxpy-c in the image; C interface sample skipped"
fi

# --- unmodified CUDA programs, through the guest's libcuda.so.1 ----------------------
if [ -e /usr/lib/vgpu/libcuda.so.1 ] && [ -x $cuda_tests/vector_add ]; then
    for prog in vector_add matmul_tiled reduce streams streams_order graphs graph_nodes graph_events address_space pitched managed host_func graph_update mempool misc_api driver_api contexts module_load large_params l2_persisting stream_memops memcpy_batch graph_generic graph_copies printf thrust_sort cub_reduce half2 coop_groups cooperative symbols vmm texture surface graph_memory; do
        cuda_run "" $cuda_tests/$prog
    done
    cuda_run shared- $cuda_tests/vector_add_shared
    cuda_run cuda12- $cuda_tests/vector_add_cuda12
    if [ "$overlap" = 1 ]; then
        cuda_run "" $cuda_tests/streams_overlap
    fi
    cuda_run cuda12-shared- $cuda_tests/vector_add_cuda12_shared
    cuda_run "" $cuda_tests/device_query ${expect_mem:+"$expect_mem"}
    # A failed assert() and a fault end their own process's work only:
    # the next program runs.
    cuda_run "" $cuda_tests/assert "$assert_line"
    cuda_run after-assert- $cuda_tests/vector_add
    cuda_run "" $cuda_tests/illegal_address
    cuda_run after-fault- $cuda_tests/vector_add
    fault_neighbours
    # Past the vGPU's contexts at once, a process's first allocation is
    # refused as out of memory.
    cuda_run "" $cuda_tests/context_limit "$(smi_json '.*"max":\([0-9]*\).*')"
else
    echo "guest: no libcuda.so.1 or CUDA programs in the image; CUDA checks skipped"
fi

vgpu-smi | sed 's/^/  /'

# --- unload and reload ---------------------------------------------------------------
if out=$(rmmod vgpu 2>&1); then
    if [ -e "$device" ]; then
        fail rmmod "$device still present after rmmod"
    else
        pass rmmod
    fi
else
    fail rmmod "$out"
    dmesg_tail 20
fi

if load reload-insmod; then
    # shellcheck disable=SC2086
    vgpu-guest-test --device "$device" --no-done --quick --prefix reload- $expect_args $test_args
    echo "guest: vgpu-guest-test --quick exited with $?"
fi

check_kernel_log kernel-log
finish
