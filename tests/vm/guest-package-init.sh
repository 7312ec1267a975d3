#!/bin/sh
# PID 1 of the guest-package test's Debian guest (no systemd): checks
# what the installed vgpu-guest package set up, one marker line each:
#   VGPU-TEST PASS <name> [detail]
#   VGPU-TEST FAIL <name>: <reason>
#   VGPU-TEST DONE
# then powers the guest off. ci/vm-guest-package.sh installs it as
# /usr/local/sbin/vgpu-ci-init.
#
# Kernel command line: vgpuci.mem=BYTES (the vGPU's quota),
# vgpuci.count=N (the number of vGPUs).
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

pass() { echo "VGPU-TEST PASS $*"; }
fail() { echo "VGPU-TEST FAIL $1: $2"; }
finish() {
    echo "VGPU-TEST DONE"
    sync
    echo o >/proc/sysrq-trigger
    sleep 10
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -o remount,rw /

read -r cmdline </proc/cmdline
arg() {
    for a in $cmdline; do
        case $a in "vgpuci.$1="*) echo "${a#*=}" ;; esac
    done
}
# The firmware's output ends without a newline: start the markers on a
# line of their own.
echo
mem=$(arg mem)
count=$(arg count)
kernel=$(uname -r)

# The module DKMS built for this kernel, found by modprobe.
ko=$(modinfo -n vgpu 2>/dev/null)
case $ko in
"/lib/modules/$kernel/updates/dkms/"* | "/usr/lib/modules/$kernel/updates/dkms/"*)
    pass dkms-module "$ko" ;;
*) fail dkms-module "modinfo -n vgpu gives '$ko'" ;;
esac

# udev without systemd, as an initramfs runs it.
/lib/systemd/systemd-udevd --daemon
if modprobe vgpu; then
    pass modprobe "vgpu $(cat /sys/module/vgpu/version 2>/dev/null || modinfo -F vermagic vgpu)"
else
    fail modprobe "modprobe vgpu failed"
fi
# Without it, udev loads the module for the PCI function by its alias
# (no modules-load.d entry is needed).
if modprobe -r vgpu; then
    udevadm trigger --action=add --subsystem-match=pci
    udevadm settle --timeout=60
    if [ -d /sys/module/vgpu ]; then
        pass autoload "udev loaded vgpu for the PCI function"
    else
        fail autoload "udev did not load vgpu for the PCI function"
        modprobe vgpu
    fi
else
    fail autoload "modprobe -r vgpu failed"
fi
udevadm settle --timeout=60

i=0
while [ ! -c /dev/vgpu0 ] && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
done
perm=$(stat -c '%G %a' /dev/vgpu0 2>/dev/null)
if [ "$perm" = "vgpu 660" ]; then
    pass udev-rule "/dev/vgpu0 is group vgpu, mode 0660"
else
    fail udev-rule "/dev/vgpu0 is '$perm', expected 'vgpu 660'"
fi
if setpriv --reuid=65534 --regid=65534 --clear-groups sh -c ': <>/dev/vgpu0' 2>/dev/null; then
    fail no-access "a user outside the vgpu group opened /dev/vgpu0"
else
    pass no-access "a user outside the vgpu group cannot open /dev/vgpu0"
fi

if out=$(vgpu-smi 2>&1); then
    pass vgpu-smi "$(echo "$out" | grep -m1 -i vgpu)"
else
    fail vgpu-smi "$(echo "$out" | tail -n 3 | tr '\n' ' ')"
fi

setpriv --reuid=65534 --regid=65534 --clear-groups nvml-check no-access 2>&1 |
    sed -e 's/^PASS /VGPU-TEST PASS nvml-/' -e 's/^FAIL /VGPU-TEST FAIL nvml-/'

bus=$(basename "$(readlink -f /sys/class/vgpu/vgpu0/device)")
setpriv --reuid=vgpuci --regid=vgpuci --init-groups \
    nvml-check "$count" "$mem" "$bus" /usr/lib/vgpu 2>&1 |
    sed -e 's/^PASS /VGPU-TEST PASS nvml-/' -e 's/^FAIL /VGPU-TEST FAIL nvml-/'

finish
