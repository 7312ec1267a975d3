#!/bin/sh
# /init of the guest booted by ci/vm-test.sh (busybox sh).
#
# Checks vgpud's built-in test device (PCI 1ee7:0001) from inside a Linux
# guest: enumeration, BAR layout, register reads and writes through the
# vfio-user server, and BAR2 memory mapped straight from the server.
#
# Prints one marker line per check, read by the host:
#   VGPU-TEST PASS <name> [detail]
#   VGPU-TEST FAIL <name>: <reason>
#   VGPU-TEST DONE
# then powers the guest off.
#
# Kernel command line: vgpu_test=boot only checks that the guest boots.

export PATH=/bin:/sbin:/usr/bin:/usr/sbin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

VENDOR=0x1ee7
DEVICE=0x0001

# Test device registers (BAR0).
REG_ID=0x00           # reads 0x76677064 ("vgpd")
REG_SCRATCH=0x08      # read/write
REG_SCRATCH_INV=0x0c  # reads ~SCRATCH
REG_BAR2_SUM=0x1c     # wrapping u32 sum of BAR2's first 4096 bytes

# Linux resource flags (include/linux/ioport.h).
IORESOURCE_MEM=0x200
IORESOURCE_PREFETCH=0x2000
IORESOURCE_MEM_64=0x100000

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
    echo "VGPU-TEST DONE"
    sync
    poweroff -f
    # Not reached; if it were, exiting /init panics and the host's
    # -no-reboot stops QEMU.
    sleep 5
    exit 1
}

hex() {
    printf '0x%08x' "$(($1))"
}

# is_hex STRING: a 0x-prefixed hex number (anything else, e.g. an error
# message from devmem, must not reach $((...)), which would abort the shell).
is_hex() {
    case $1 in
    0x* | 0X*) ;;
    *) return 1 ;;
    esac
    case ${1#0[xX]} in
    '' | *[!0-9a-fA-F]*) return 1 ;;
    esac
    return 0
}

# check_eq NAME ACTUAL EXPECTED [DETAIL]: compare two numbers.
check_eq() {
    if is_hex "$2" && [ "$(($2))" -eq "$(($3))" ]; then
        pass "$1" "$(hex "$2")${4:+ $4}"
    else
        fail "$1" "got '${2:-nothing}', expected $(hex "$3")${4:+ ($4)}"
    fi
}

echo "guest: kernel $(uname -r), $(grep -c ^processor /proc/cpuinfo) cpu(s)"

if grep -q 'vgpu_test=boot' /proc/cmdline; then
    pass boot "kernel $(uname -r)"
    finish
fi

# --- find the device ----------------------------------------------------------
dev=""
for d in /sys/bus/pci/devices/*; do
    if [ "$(cat "$d/vendor")" = "$VENDOR" ] && [ "$(cat "$d/device")" = "$DEVICE" ]; then
        dev=$d
        break
    fi
done
if [ -z "$dev" ]; then
    fail device "no PCI device $VENDOR:$DEVICE; devices present:"
    for d in /sys/bus/pci/devices/*; do
        echo "  $(basename "$d") $(cat "$d/vendor"):$(cat "$d/device") class $(cat "$d/class")"
    done
    finish
fi
bdf=$(basename "$dev")
pass device "$bdf"

# --- identity -------------------------------------------------------------------
class=$(cat "$dev/class")
if [ "$class" = 0xff0000 ]; then
    pass class "$class"
else
    fail class "class is $class, expected 0xff0000"
fi

if command -v lspci >/dev/null 2>&1; then
    line=$(lspci -n -s "$bdf" 2>&1)
    echo "guest: lspci -n -s $bdf: $line"
    case $line in
    *"ff00: 1ee7:0001"*) pass lspci ;;
    *) fail lspci "lspci -n did not list ff00: 1ee7:0001: $line" ;;
    esac
else
    fail lspci "no lspci in the initramfs"
fi

# --- BARs -------------------------------------------------------------------------
# Line N+1 of the resource file is BAR N: "start end flags".
bar_field() { # BAR FIELD(1=start 2=end 3=flags)
    sed -n "$(($1 + 1))p" "$dev/resource" | cut -d' ' -f"$2"
}
bar0_start=$(bar_field 0 1)
bar0_end=$(bar_field 0 2)
bar0_flags=$(bar_field 0 3)
bar2_start=$(bar_field 2 1)
bar2_end=$(bar_field 2 2)
bar2_flags=$(bar_field 2 3)
echo "guest: resource:"
sed -n '1,6p' "$dev/resource" | sed 's/^/  /'

bar0_size=$((bar0_end - bar0_start + 1))
if [ "$((bar0_start))" -ne 0 ] && [ "$bar0_size" -eq 4096 ] &&
    [ "$((bar0_flags & IORESOURCE_MEM))" -ne 0 ]; then
    pass bar0 "mmio $(hex "$bar0_start") size $bar0_size"
else
    fail bar0 "start $bar0_start end $bar0_end flags $bar0_flags (want 4096-byte MMIO)"
fi

bar2_size=$((bar2_end - bar2_start + 1))
if [ "$((bar2_start))" -ne 0 ] && [ "$bar2_size" -eq 65536 ] &&
    [ "$((bar2_flags & IORESOURCE_MEM))" -ne 0 ] &&
    [ "$((bar2_flags & IORESOURCE_MEM_64))" -ne 0 ]; then
    pf=""
    [ "$((bar2_flags & IORESOURCE_PREFETCH))" -ne 0 ] && pf=" prefetchable"
    pass bar2 "mmio64$pf $(printf '0x%x' "$bar2_start") size $bar2_size"
else
    fail bar2 "start $bar2_start end $bar2_end flags $bar2_flags (want 65536-byte 64-bit MMIO)"
fi

# --- enable memory decoding -------------------------------------------------------
echo 1 >"$dev/enable" 2>/dev/null
# PCI_COMMAND (config offset 4), bit 1: memory space enable.
cmd=$(hexdump -s 4 -n 2 -e '1/2 "%u"' "$dev/config" 2>/dev/null)
case $cmd in '' | *[!0-9]*) cmd="" ;; esac
if [ "$(cat "$dev/enable")" = 1 ] && [ -n "$cmd" ] && [ "$((cmd & 2))" -ne 0 ]; then
    pass enable "command $(printf '0x%04x' "$cmd")"
else
    fail enable "enable=$(cat "$dev/enable") command=${cmd:-unreadable}"
fi

if [ "$((bar0_start))" -eq 0 ] || [ "$((bar2_start))" -eq 0 ]; then
    fail id "skipped: BARs not assigned"
    finish
fi

# --- registers (BAR0) ----------------------------------------------------------
rd32() { devmem "$(printf '0x%x' "$(($1 + $2))")" 32 2>&1; }
wr32() { devmem "$(printf '0x%x' "$(($1 + $2))")" 32 "$3" 2>&1; }

check_eq id "$(rd32 "$bar0_start" $REG_ID)" 0x76677064

wr32 "$bar0_start" $REG_SCRATCH 0xdeadbeef
check_eq scratch "$(rd32 "$bar0_start" $REG_SCRATCH)" 0xdeadbeef
# RAM would read back 0 or garbage here; only the device computes ~SCRATCH.
check_eq scratch-inverse "$(rd32 "$bar0_start" $REG_SCRATCH_INV)" 0x21524110

# --- BAR2: memory shared with the server ---------------------------------------
echo "guest: BAR2 sum before writing: $(rd32 "$bar0_start" $REG_BAR2_SUM)"
wr32 "$bar2_start" 0 0x11111111
wr32 "$bar2_start" 4 0x22222222
w0=$(rd32 "$bar2_start" 0)
w1=$(rd32 "$bar2_start" 4)
if is_hex "$w0" && is_hex "$w1" && [ "$((w0))" -eq "$((0x11111111))" ] &&
    [ "$((w1))" -eq "$((0x22222222))" ]; then
    pass bar2-readback "$w0 $w1"
else
    fail bar2-readback "read '$w0' '$w1', expected 0x11111111 0x22222222"
fi
# The server sums what the guest wrote into BAR2 (the rest is zero).
check_eq bar2-sum "$(rd32 "$bar0_start" $REG_BAR2_SUM)" 0x33333333

echo "guest: $failed check(s) failed"
finish
