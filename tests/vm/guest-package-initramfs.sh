#!/bin/sh
# /init of the initramfs that boots the guest-package test's Debian root
# (busybox sh): loads the modules in /lib/modules/order (virtio-blk,
# ext4 and what they need), mounts /dev/vda and hands over to the root's
# /usr/local/sbin/vgpu-ci-init (tests/vm/guest-package-init.sh).
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
while read -r m; do
    insmod "/lib/modules/$m" || echo "VGPU-TEST FAIL boot: insmod $m"
done </lib/modules/order
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
done
mkdir -p /newroot
if ! mount -t ext4 /dev/vda /newroot; then
    echo "VGPU-TEST FAIL boot: cannot mount /dev/vda"
    echo "VGPU-TEST DONE"
    poweroff -f
fi
umount /proc /sys /dev
exec switch_root /newroot /usr/local/sbin/vgpu-ci-init
