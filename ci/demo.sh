#!/usr/bin/env bash
# Demo: vgpud with its built-in configuration (one software GPU carved into
# two vGPUs) serves two QEMU guests at once. Each guest loads the vgpu
# driver, runs saxpy and sgemm on its vGPU, then two unmodified CUDA
# programs built by nvcc (a tiled matrix multiply and a Thrust sort,
# through the guest's libcuda.so.1), each checked against its own CPU,
# and vgpu-smi; then the host shows its per-vGPU statistics.
#
# Installs what is missing (Debian packages; QEMU with the vfio-user
# client; the guest kernel), all cached in ${VGPUD_CACHE:-/var/cache/vgpud}:
# the first run builds QEMU (about 10 minutes on 2 cores), later ones take
# about a minute. Needs root, like ci/test.sh.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$VGPUD_ROOT"

t_all=$SECONDS
TMP=$(mktemp -d /tmp/vgpud-demo.XXXXXX)
vgpud_pid=""
qemu_pids=()
cleanup() {
    local pid
    for pid in "${qemu_pids[@]}" $vgpud_pid; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${qemu_pids[@]}" $vgpud_pid; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "1/6 host packages"
bash ci/setup-host.sh
log "2/6 QEMU with vfio-user-pci (first run: builds it, about 10 minutes)"
qemu=$(bash ci/build-qemu.sh)
log "3/6 guest kernel"
bash ci/fetch-kernel.sh >/dev/null
log "4/6 vgpud and vgpuctl"
cargo build --release -p vgpud -p vgpuctl
bin="${CARGO_TARGET_DIR:-$VGPUD_ROOT/target}/release"
log "5/6 guest driver, guest tools and initramfs"
bash tests/vm/guest-suite-initramfs.sh "$TMP/initrd.gz"

log "6/6 vgpud (built-in configuration) and two guests"
"$bin/vgpud" default-config | sed 's/^/    /' >&2
mkdir -p "$TMP/run"
"$bin/vgpud" run --allow-root --runtime-dir "$TMP/run" --metrics-address "" </dev/null >"$TMP/vgpud.log" 2>&1 &
vgpud_pid=$!
for _ in $(seq 300); do
    [[ -S $TMP/run/vgpu0.sock && -S $TMP/run/vgpu1.sock && -S $TMP/run/api.sock ]] && break
    kill -0 "$vgpud_pid" 2>/dev/null || { cat "$TMP/vgpud.log" >&2; die "vgpud exited"; }
    sleep 0.1
done
[[ -S $TMP/run/api.sock ]] || { cat "$TMP/vgpud.log" >&2; die "vgpud did not start"; }

for i in 0 1; do
    # shellcheck disable=SC2054  # commas separate QEMU sub-options
    args=(
        -machine q35,accel=tcg -m 512
        -object memory-backend-memfd,id=mem,size=512M,share=on -numa node,memdev=mem
        -nographic -no-reboot -nodefaults -serial stdio -net none
        -L /usr/share/qemu -L /usr/share/seabios
        -kernel "$KERNEL_IMAGE" -initrd "$TMP/initrd.gz"
        -append "console=ttyS0 quiet panic=-1 vgpu.mode=demo vgpu.saxpy_n=1048576"
        -device "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"$TMP/run/vgpu$i.sock\",\"type\":\"unix\"}}"
    )
    timeout -k 10 600 "$qemu" "${args[@]}" </dev/null >"$TMP/guest$i.log" 2>"$TMP/guest$i.qemu.log" &
    qemu_pids+=($!)
done
log "guests booting (TCG); watch: vgpuctl --api $TMP/run/api.sock top"
for pid in "${qemu_pids[@]}"; do
    wait "$pid" || true
done
qemu_pids=()

ok=1
for i in 0 1; do
    printf '\n===== guest %s (on vgpu%s) =====\n' "$i" "$i"
    # What the guest's programs printed, without the kernel's boot noise.
    # (A CUDA program's own PASS lines show once, as the suite's checks.)
    tr -d '\r' <"$TMP/guest$i.log" | sed -n '/^guest: /,$p' | grep -v '^\[ *[0-9.]*\]' |
        grep -v '^  PASS ' | sed 's/^VGPU-TEST //'
    tr -d '\r' <"$TMP/guest$i.log" | grep -q '^VGPU-TEST FAIL' && ok=0
    tr -d '\r' <"$TMP/guest$i.log" | grep -qx 'VGPU-TEST DONE' || ok=0
done

printf '\n===== host: vgpuctl stats =====\n'
"$bin/vgpuctl" --api "$TMP/run/api.sock" stats
printf '\n===== host: vgpuctl list =====\n'
"$bin/vgpuctl" --api "$TMP/run/api.sock" list
echo
if [[ $ok == 1 ]]; then
    log "demo done in $(elapsed "$t_all"): both guests ran saxpy, sgemm and CUDA programs on their vGPUs and got correct results"
else
    log "demo: a guest reported a failure (logs above)"
    exit 1
fi
