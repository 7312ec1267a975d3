/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vgpu_guest.h: C interface of the vgpu guest library (libvgpu_guest.a,
 * built from crates/vgpu-guest) over /dev/vgpuN.
 *
 * Every function returns 0 on success or a negative errno, e.g.
 *   -ENOMEM     device memory (the partition's quota) is exhausted
 *   -EINVAL     a bad argument (NULL pointer, bad entry name, size, shape)
 *   -ENOENT     a device address this handle did not allocate, or an
 *               unknown built-in entry point
 *   -ERANGE     a range running past the end of its allocation
 *   -EFAULT     a host buffer the driver could not access
 *   -ENODEV     the function was removed
 *   -EIO        a device failure or reset (also: an internal error)
 * strerror(-ret) describes it. No function aborts the process.
 *
 * A handle is one open file of the device. Memory allocated through it
 * belongs to it alone (other handles and processes cannot name it) and is
 * freed by vgpu_close() or when the process exits. Commands of a handle
 * run in the order they are issued. A handle may be used from several
 * threads.
 *
 * Built-in kernels (vgpu_launch): "fill_u32", "copy", "vadd_f32",
 * "saxpy_f32", "sgemm_f32" and "reduce_sum_f32". Their parameter blocks
 * are the struct vgpu_*_params of vgpu_abi.h (guest-driver/include),
 * passed with exactly their size; the device addresses inside must come
 * from vgpu_alloc() on the same handle.
 *
 * Example:
 *
 *   vgpu_device *dev;
 *   uint64_t x, y;
 *   if (vgpu_open(NULL, &dev) < 0) ...
 *   vgpu_alloc(dev, n * 4, &x);
 *   vgpu_alloc(dev, n * 4, &y);
 *   vgpu_copy_to_device(dev, x, hx, n * 4);
 *   vgpu_copy_to_device(dev, y, hy, n * 4);
 *   struct vgpu_saxpy_params p = { .y = y, .x = x, .n = n, .a = 2.0f };
 *   vgpu_launch(dev, "saxpy_f32", &p, sizeof(p));
 *   int err = vgpu_synchronize(dev);
 *   vgpu_copy_from_device(dev, hy, y, n * 4);
 *   vgpu_close(dev);
 *
 * Link with: -lvgpu_guest -lpthread -ldl -lm (static library of a Rust
 * crate; those are the system libraries it uses).
 */
#ifndef VGPU_GUEST_H
#define VGPU_GUEST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An open device (opaque). */
typedef struct vgpu_device vgpu_device;

/* Identity and state of a device (vgpu_info). */
struct vgpu_device_info {
	uint32_t abi_version;	/* device ABI: major << 16 | minor */
	uint16_t vendor_id;	/* PCI ids */
	uint16_t device_id;
	uint32_t compute_units;
	uint32_t minor;		/* N of /dev/vgpuN */
	uint64_t features;	/* device FEATURES register */
	uint64_t mem_size;	/* device memory of the partition, bytes */
	uint64_t mem_used;	/* device memory in use (all processes), bytes */
	uint64_t window_size;	/* host-visible window, bytes (0: none) */
};

/*
 * Opens a device: path is e.g. "/dev/vgpu0", or NULL for /dev/vgpu0. On
 * success *dev is the new handle.
 */
int vgpu_open(const char *path, vgpu_device **dev);

/*
 * Closes a handle (NULL is ignored): waits for its launched work, then
 * frees all of its device memory. The handle is invalid afterwards.
 */
void vgpu_close(vgpu_device *dev);

/* Fills *info. */
int vgpu_info(vgpu_device *dev, struct vgpu_device_info *info);

/*
 * Allocates size bytes of device memory (zeroed) and stores its device
 * address in *addr. -ENOMEM when the partition has no room left.
 */
int vgpu_alloc(vgpu_device *dev, uint64_t size, uint64_t *addr);

/* Frees memory from vgpu_alloc(); work issued before still runs first. */
int vgpu_free(vgpu_device *dev, uint64_t addr);

/*
 * Copies size bytes from host memory src to device address dst (anywhere
 * inside an allocation of this handle), and waits for the copy.
 */
int vgpu_copy_to_device(vgpu_device *dev, uint64_t dst, const void *src,
			size_t size);

/*
 * Copies size bytes from device address src to host memory dst, after
 * everything issued before, and waits for the copy.
 */
int vgpu_copy_from_device(vgpu_device *dev, void *dst, uint64_t src,
			  size_t size);

/*
 * Launches built-in kernel entry with params_size bytes of parameters
 * (copied before returning; params may be NULL when params_size is 0),
 * without waiting. Errors found when the kernel runs are returned by the
 * next vgpu_synchronize().
 */
int vgpu_launch(vgpu_device *dev, const char *entry, const void *params,
		size_t params_size);

/*
 * Waits until every launch of this handle has completed; returns the
 * first error among them since the last call (0 if none).
 */
int vgpu_synchronize(vgpu_device *dev);

#ifdef __cplusplus
}
#endif

#endif /* VGPU_GUEST_H */
