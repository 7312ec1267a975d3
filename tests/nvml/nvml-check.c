// SPDX-License-Identifier: Apache-2.0
/*
 * Checks the vGPU NVML (libnvidia-ml.so.1) as a program sees it: loaded
 * with dlopen through the loader's path, as NVML's users load it. Prints
 * one line per check, "PASS name detail" or "FAIL name: reason", and
 * exits 1 if any failed.
 *
 * usage: nvml-check COUNT MEMORY BUS_ID [LIBDIR]
 *        nvml-check no-access
 *   COUNT    the number of vGPUs the guest has
 *   MEMORY   the first vGPU's memory quota, bytes
 *   BUS_ID   the first vGPU's PCI address as sysfs names it (0000:00:03.0)
 *   LIBDIR   where the library must come from (/usr/lib/vgpu)
 * The second form is for a user who may not open the devices: NVML's
 * initialisation must say so (NVML_ERROR_NO_PERMISSION).
 *
 * A child process allocates device memory through the CUDA driver
 * (libcuda.so.1, cuMemAlloc) so that NVML has memory in use and a
 * process to report.
 *
 * Only the few NVML and CUDA declarations it needs are written here, as
 * nvml.h and cuda.h declare them.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;

typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
	unsigned int version;
	unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
	unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | 2u << 24))

static int failures;

static void pass(const char *name, const char *fmt, ...)
{
	va_list ap;

	printf("PASS %s ", name);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

static void fail(const char *name, const char *fmt, ...)
{
	va_list ap;

	failures++;
	printf("FAIL %s: ", name);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

static void *lib;

/* The entry point `name` of the library, or exit. */
static void *sym(const char *name)
{
	void *p = dlsym(lib, name);

	if (!p) {
		fail("symbols", "no %s", name);
		exit(1);
	}
	return p;
}

#define NVML(name, ...) ((unsigned int (*)(__VA_ARGS__))sym(#name))

/* Parses domain:bus:device.function, all hexadecimal. */
static int parse_bus_id(const char *s, unsigned int v[4])
{
	return sscanf(s, "%x:%x:%x.%x", &v[0], &v[1], &v[2], &v[3]) == 4;
}

/* GPU- and 8-4-4-4-12 hexadecimal digits. */
static int uuid_ok(const char *s)
{
	static const int groups[] = { 8, 4, 4, 4, 12 };
	int g, i;

	if (strncmp(s, "GPU-", 4))
		return 0;
	s += 4;
	for (g = 0; g < 5; g++) {
		for (i = 0; i < groups[g]; i++, s++)
			if (!isxdigit((unsigned char)*s))
				return 0;
		if (*s != (g < 4 ? '-' : '\0'))
			return 0;
		s++;
	}
	return 1;
}

#define ALLOC_BYTES (64ull << 20)

/*
 * The child: allocates ALLOC_BYTES through libcuda, writes its status
 * to `ready`, and holds the memory until `hold` is closed.
 */
static void holder(int ready, int hold)
{
	void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
	int (*cuInit)(unsigned int);
	int (*cuDeviceGet)(int *, int);
	int (*cuDevicePrimaryCtxRetain)(void **, int);
	int (*cuCtxSetCurrent)(void *);
	int (*cuMemAlloc)(unsigned long long *, size_t);
	unsigned long long dptr = 0;
	void *ctx = NULL;
	int dev = 0, rc = -1;
	char c;

	if (cuda) {
		cuInit = (int (*)(unsigned int))dlsym(cuda, "cuInit");
		cuDeviceGet = (int (*)(int *, int))dlsym(cuda, "cuDeviceGet");
		cuDevicePrimaryCtxRetain =
			(int (*)(void **, int))dlsym(cuda, "cuDevicePrimaryCtxRetain");
		cuCtxSetCurrent = (int (*)(void *))dlsym(cuda, "cuCtxSetCurrent");
		cuMemAlloc = (int (*)(unsigned long long *, size_t))dlsym(cuda, "cuMemAlloc_v2");
		if (cuInit && cuDeviceGet && cuDevicePrimaryCtxRetain && cuCtxSetCurrent &&
		    cuMemAlloc) {
			rc = cuInit(0);
			if (!rc)
				rc = cuDeviceGet(&dev, 0);
			if (!rc)
				rc = cuDevicePrimaryCtxRetain(&ctx, dev);
			if (!rc)
				rc = cuCtxSetCurrent(ctx);
			if (!rc)
				rc = cuMemAlloc(&dptr, ALLOC_BYTES);
		}
	}
	c = rc ? 'E' : 'R';
	if (write(ready, &c, 1) != 1)
		_exit(2);
	while (read(hold, &c, 1) > 0)
		;
	_exit(rc ? 1 : 0);
}

int main(int argc, char **argv)
{
	unsigned int expect_count, want[4], got[4], count = 0, n, i, found;
	unsigned long long expect_mem, used_before;
	const char *libdir = argc > 4 ? argv[4] : "/usr/lib/vgpu";
	nvmlDevice_t dev = NULL, other = NULL;
	char name[96], uuid[96], small[4], ver[80];
	nvmlProcessInfo_t procs[16];
	nvmlUtilization_t util;
	nvmlMemory_v2_t mem2;
	struct link_map *map;
	nvmlPciInfo_t pci;
	nvmlMemory_t mem;
	int ready[2], hold[2], major = 0, minor = 0, cuda_version = 0;
	unsigned int temp, rc;
	char status;
	pid_t child;

	if (argc == 2 && !strcmp(argv[1], "no-access")) {
		lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
		if (!lib) {
			fail("no-access", "%s", dlerror());
			return 1;
		}
		rc = NVML(nvmlInit_v2, void)();
		if (rc == NVML_ERROR_NO_PERMISSION)
			pass("no-access", "nvmlInit_v2 = %u outside the vgpu group", rc);
		else
			fail("no-access", "nvmlInit_v2 = %u outside the vgpu group", rc);
		return failures ? 1 : 0;
	}
	if (argc < 4) {
		fprintf(stderr, "usage: %s COUNT MEMORY BUS_ID [LIBDIR]\n", argv[0]);
		return 2;
	}
	expect_count = strtoul(argv[1], NULL, 0);
	expect_mem = strtoull(argv[2], NULL, 0);
	if (!parse_bus_id(argv[3], want)) {
		fprintf(stderr, "bad bus id %s\n", argv[3]);
		return 2;
	}

	lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	if (!lib) {
		fail("dlopen", "%s", dlerror());
		return 1;
	}
	if (dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map->l_name &&
	    !strncmp(map->l_name, libdir, strlen(libdir)))
		pass("dlopen", "libnvidia-ml.so.1 is %s", map->l_name);
	else
		fail("dlopen", "libnvidia-ml.so.1 is not from %s", libdir);

	rc = NVML(nvmlDeviceGetCount_v2, unsigned int *)(&count);
	if (rc == NVML_ERROR_UNINITIALIZED)
		pass("before-init", "nvmlDeviceGetCount_v2 = %u", rc);
	else
		fail("before-init", "nvmlDeviceGetCount_v2 before nvmlInit = %u", rc);

	rc = NVML(nvmlInit_v2, void)();
	if (rc) {
		fail("init", "nvmlInit_v2 = %u", rc);
		return 1;
	}
	rc = NVML(nvmlInitWithFlags, unsigned int)(0);
	if (rc == NVML_SUCCESS)
		pass("init", "nvmlInit_v2, nvmlInitWithFlags");
	else
		fail("init", "nvmlInitWithFlags = %u", rc);

	rc = NVML(nvmlDeviceGetCount_v2, unsigned int *)(&count);
	if (!rc && count == expect_count)
		pass("count", "%u", count);
	else
		fail("count", "rc %u, %u devices, expected %u", rc, count, expect_count);

	rc = NVML(nvmlSystemGetDriverVersion, char *, unsigned int)(ver, sizeof(ver));
	if (!rc)
		rc = NVML(nvmlSystemGetCudaDriverVersion_v2, int *)(&cuda_version);
	if (!rc && cuda_version == 13000)
		pass("versions", "driver %s, CUDA %d", ver, cuda_version);
	else
		fail("versions", "rc %u, CUDA %d", rc, cuda_version);

	rc = NVML(nvmlDeviceGetHandleByIndex_v2, unsigned int, nvmlDevice_t *)(0, &dev);
	if (rc) {
		fail("handle", "nvmlDeviceGetHandleByIndex_v2(0) = %u", rc);
		return 1;
	}
	rc = NVML(nvmlDeviceGetName, nvmlDevice_t, char *, unsigned int)(dev, name, sizeof(name));
	if (!rc && !strncmp(name, "vgpud vGPU ", 11))
		pass("name", "%s", name);
	else
		fail("name", "rc %u, \"%s\"", rc, rc ? "" : name);
	rc = NVML(nvmlDeviceGetName, nvmlDevice_t, char *, unsigned int)(dev, small, sizeof(small));
	if (rc == NVML_ERROR_INSUFFICIENT_SIZE)
		pass("name-small-buffer", "= %u", rc);
	else
		fail("name-small-buffer", "a 4-byte buffer gave %u", rc);

	rc = NVML(nvmlDeviceGetUUID, nvmlDevice_t, char *, unsigned int)(dev, uuid, sizeof(uuid));
	if (!rc && uuid_ok(uuid))
		pass("uuid", "%s", uuid);
	else
		fail("uuid", "rc %u, \"%s\"", rc, rc ? "" : uuid);
	rc = NVML(nvmlDeviceGetHandleByUUID, const char *, nvmlDevice_t *)(uuid, &other);
	if (!rc && other == dev)
		pass("handle-by-uuid", "%s", uuid);
	else
		fail("handle-by-uuid", "rc %u, handle %p, expected %p", rc, (void *)other, (void *)dev);

	rc = NVML(nvmlDeviceGetPciInfo_v3, nvmlDevice_t, nvmlPciInfo_t *)(dev, &pci);
	if (!rc && parse_bus_id(pci.busId, got) && !memcmp(got, want, sizeof(got)) &&
	    pci.domain == want[0] && pci.bus == want[1] && pci.device == want[2])
		pass("pci", "%s (sysfs %s), id %08x", pci.busId, argv[3], pci.pciDeviceId);
	else
		fail("pci", "rc %u, \"%s\", sysfs %s", rc, rc ? "" : pci.busId, argv[3]);
	other = NULL;
	rc = NVML(nvmlDeviceGetHandleByPciBusId_v2, const char *, nvmlDevice_t *)(argv[3], &other);
	if (!rc && other == dev) {
		other = NULL;
		rc = NVML(nvmlDeviceGetHandleByPciBusId_v2, const char *,
			  nvmlDevice_t *)(pci.busId, &other);
	}
	if (!rc && other == dev)
		pass("handle-by-pci", "%s and %s", argv[3], pci.busId);
	else
		fail("handle-by-pci", "rc %u for %s or %s", rc, argv[3], pci.busId);

	rc = NVML(nvmlDeviceGetCudaComputeCapability, nvmlDevice_t, int *, int *)(dev, &major, &minor);
	if (!rc && major == 9 && minor == 0)
		pass("compute-capability", "%d.%d", major, minor);
	else
		fail("compute-capability", "rc %u, %d.%d", rc, major, minor);

	rc = NVML(nvmlDeviceGetMemoryInfo, nvmlDevice_t, nvmlMemory_t *)(dev, &mem);
	if (!rc && mem.total == expect_mem && mem.used + mem.free == mem.total)
		pass("memory", "total %llu, used %llu", mem.total, mem.used);
	else
		fail("memory", "rc %u, total %llu (expected %llu), used %llu, free %llu", rc,
		     mem.total, expect_mem, mem.used, mem.free);
	used_before = mem.used;
	memset(&mem2, 0, sizeof(mem2));
	mem2.version = NVML_MEMORY_V2;
	rc = NVML(nvmlDeviceGetMemoryInfo_v2, nvmlDevice_t, nvmlMemory_v2_t *)(dev, &mem2);
	if (!rc && mem2.total == expect_mem)
		pass("memory-v2", "total %llu", mem2.total);
	else
		fail("memory-v2", "rc %u, total %llu", rc, mem2.total);

	rc = NVML(nvmlDeviceGetUtilizationRates, nvmlDevice_t, nvmlUtilization_t *)(dev, &util);
	if (!rc && util.gpu <= 100)
		pass("utilization", "gpu %u%%", util.gpu);
	else
		fail("utilization", "rc %u, gpu %u", rc, util.gpu);

	/* A process holding device memory through the CUDA driver. */
	if (pipe(ready) || pipe(hold)) {
		fail("holder", "pipe");
		return 1;
	}
	child = fork();
	if (child == 0) {
		close(ready[0]);
		close(hold[1]);
		holder(ready[1], hold[0]);
	}
	close(ready[1]);
	close(hold[0]);
	if (read(ready[0], &status, 1) != 1 || status != 'R') {
		fail("holder", "the CUDA child could not allocate device memory");
	} else {
		rc = NVML(nvmlDeviceGetMemoryInfo, nvmlDevice_t, nvmlMemory_t *)(dev, &mem);
		if (!rc && mem.used >= used_before + ALLOC_BYTES)
			pass("memory-used", "%llu -> %llu with %llu allocated by pid %d",
			     used_before, mem.used, ALLOC_BYTES, (int)child);
		else
			fail("memory-used", "rc %u, used %llu -> %llu", rc, used_before, mem.used);

		n = 0;
		rc = NVML(nvmlDeviceGetComputeRunningProcesses_v3, nvmlDevice_t, unsigned int *,
			  nvmlProcessInfo_t *)(dev, &n, NULL);
		if (rc == NVML_ERROR_INSUFFICIENT_SIZE && n >= 1)
			pass("processes-count", "%u", n);
		else
			fail("processes-count", "rc %u, %u", rc, n);
		n = 16;
		rc = NVML(nvmlDeviceGetComputeRunningProcesses_v3, nvmlDevice_t, unsigned int *,
			  nvmlProcessInfo_t *)(dev, &n, procs);
		found = 0;
		for (i = 0; !rc && i < n; i++)
			if (procs[i].pid == (unsigned int)child)
				found = 1;
		if (found && n == 1)
			pass("processes", "pid %d has the device open", (int)child);
		else
			fail("processes", "rc %u, %u processes, pid %d %s", rc, n, (int)child,
			     found ? "listed" : "missing");
	}
	close(hold[1]);
	waitpid(child, NULL, 0);

	rc = NVML(nvmlDeviceGetTemperature, nvmlDevice_t, unsigned int, unsigned int *)(dev, 0, &temp);
	if (rc == NVML_ERROR_NOT_SUPPORTED)
		pass("not-supported", "nvmlDeviceGetTemperature = %u", rc);
	else
		fail("not-supported", "nvmlDeviceGetTemperature = %u", rc);

	rc = NVML(nvmlDeviceGetName, nvmlDevice_t, char *, unsigned int)
		((nvmlDevice_t)(void *)0x1000, name, sizeof(name));
	if (rc == NVML_ERROR_INVALID_ARGUMENT)
		pass("bad-handle", "= %u", rc);
	else
		fail("bad-handle", "a forged handle gave %u", rc);

	rc = NVML(nvmlShutdown, void)();
	if (!rc)
		rc = NVML(nvmlShutdown, void)();
	if (!rc && NVML(nvmlShutdown, void)() == NVML_ERROR_UNINITIALIZED &&
	    NVML(nvmlDeviceGetCount_v2, unsigned int *)(&count) == NVML_ERROR_UNINITIALIZED)
		pass("shutdown", "two initialisations, two shutdowns");
	else
		fail("shutdown", "rc %u", rc);
	return failures ? 1 : 0;
}
