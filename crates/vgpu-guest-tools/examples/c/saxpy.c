// SPDX-License-Identifier: Apache-2.0
/*
 * saxpy through the C interface of the vgpu guest library.
 *
 * Build (after `cargo build --release -p vgpu-guest`):
 *   gcc -O2 -I crates/vgpu-guest/include -I guest-driver/include \
 *       crates/vgpu-guest-tools/examples/c/saxpy.c \
 *       target/release/libvgpu_guest.a -lpthread -ldl -lm -o vgpu-saxpy-c
 * Run: vgpu-saxpy-c [/dev/vgpuN [n]]; prints PASS or FAIL.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpu_abi.h"
#include "vgpu_guest.h"

#define CHECK(call)                                                          \
	do {                                                                 \
		int err_ = (call);                                           \
		if (err_ < 0) {                                              \
			printf("FAIL: %s: %s\n", #call, strerror(-err_));    \
			return 1;                                            \
		}                                                            \
	} while (0)

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "/dev/vgpu0";
	size_t n = argc > 2 ? strtoul(argv[2], NULL, 0) : 100000;
	struct vgpu_device_info info;
	struct vgpu_saxpy_params p;
	vgpu_device *dev;
	uint64_t x, y, bad;
	float *hx, *hy, *out;
	size_t i, wrong = 0;
	int err;

	hx = malloc(n * sizeof(float));
	hy = malloc(n * sizeof(float));
	out = malloc(n * sizeof(float));
	if (!hx || !hy || !out || n == 0) {
		printf("FAIL: no host memory\n");
		return 1;
	}
	for (i = 0; i < n; i++) {
		hx[i] = (float)(i % 1000) / 1000.0f;
		hy[i] = (float)(i % 7) - 3.0f;
	}

	CHECK(vgpu_open(path, &dev));
	CHECK(vgpu_info(dev, &info));
	printf("%s: %04x:%04x, %llu MiB, %u CU, ABI %u.%u\n", path,
	       info.vendor_id, info.device_id,
	       (unsigned long long)(info.mem_size >> 20), info.compute_units,
	       info.abi_version >> 16, info.abi_version & 0xffff);

	CHECK(vgpu_alloc(dev, n * sizeof(float), &x));
	CHECK(vgpu_alloc(dev, n * sizeof(float), &y));
	CHECK(vgpu_copy_to_device(dev, x, hx, n * sizeof(float)));
	CHECK(vgpu_copy_to_device(dev, y, hy, n * sizeof(float)));

	memset(&p, 0, sizeof(p));
	p.y = y;
	p.x = x;
	p.n = n;
	p.a = 2.5f;
	CHECK(vgpu_launch(dev, "saxpy_f32", &p, sizeof(p)));
	CHECK(vgpu_launch(dev, "saxpy_f32", &p, sizeof(p)));
	CHECK(vgpu_synchronize(dev));
	CHECK(vgpu_copy_from_device(dev, out, y, n * sizeof(float)));

	for (i = 0; i < n; i++) {
		float want = hy[i] + 2.5f * hx[i];

		want = want + 2.5f * hx[i];
		if (fabsf(out[i] - want) > 1e-5f * (1.0f + fabsf(want)))
			wrong++;
	}

	/* Errors come back as negative errnos. */
	err = vgpu_copy_to_device(dev, y + n * sizeof(float) - 2, hx, 4);
	if (err != -ERANGE) {
		printf("FAIL: copy past the end: %d, expected -ERANGE\n", err);
		return 1;
	}
	err = vgpu_alloc(dev, info.mem_size + 4096, &bad);
	if (err != -ENOMEM) {
		printf("FAIL: oversized alloc: %d, expected -ENOMEM\n", err);
		return 1;
	}
	CHECK(vgpu_launch(dev, "no_such_kernel", &p, sizeof(p)) == -ENOENT ? 0 : -EPROTO);
	p.n = n + 1;
	CHECK(vgpu_launch(dev, "saxpy_f32", &p, sizeof(p)) == -ERANGE ? 0 : -EPROTO);
	CHECK(vgpu_free(dev, x));
	if (vgpu_free(dev, x) != -ENOENT) {
		printf("FAIL: double free not refused\n");
		return 1;
	}
	vgpu_close(dev);

	if (wrong) {
		printf("FAIL: %zu of %zu elements wrong\n", wrong, n);
		return 1;
	}
	printf("PASS\n");
	return 0;
}
