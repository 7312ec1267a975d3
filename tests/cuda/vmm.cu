// Virtual memory management through the driver API, as allocators that
// grow one contiguous range (PyTorch's expandable segments, XLA's) use
// it: the granularity, an address reservation, two physical chunks
// mapped side by side and made accessible, a kernel and copies across
// their boundary checked against the CPU, a chunk unmapped and mapped
// again elsewhere showing the same bytes, the driver's errors for a
// misaligned and a double mapping, cuMemGetInfo following the physical
// memory, a chunk shared as a POSIX file descriptor, and a reservation
// far larger than the device's memory filled page by page.
#define TEST_NAME "vmm"
#include "driver.h"
#include <cstdint>
#include <cstring>
#include <unistd.h>
#include <vector>

// out[i] = 2 * in[i] + in[n - 1 - i]: each thread reads both sides of
// the range.
__global__ void mirror(const float *in, float *out, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * in[i] + in[n - 1 - i];
}

__global__ void add_index(unsigned *p, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) p[i] += (unsigned)i;
}

static size_t free_mem() {
  size_t f = 0, t = 0;
  CHECK(cudaMemGetInfo(&f, &t));
  return f;
}

int main() {
  SYM(cuCtxGetDevice);
  SYM(cuDeviceGetAttribute);
  SYM(cuMemGetAllocationGranularity);
  SYM(cuMemAddressReserve);
  SYM(cuMemAddressFree);
  SYM(cuMemCreate);
  SYM(cuMemRelease);
  SYM(cuMemMap);
  SYM(cuMemUnmap);
  SYM(cuMemSetAccess);
  SYM(cuMemGetAccess);
  SYM(cuMemRetainAllocationHandle);
  SYM(cuMemGetAllocationPropertiesFromHandle);
  SYM(cuMemExportToShareableHandle);
  SYM(cuMemImportFromShareableHandle);
  SYM(cuMemGetAddressRange_v2);
  SYM(cuPointerGetAttribute);

  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(0));  // the primary context, current for the driver calls
  CUdevice dev;
  DRV(cuCtxGetDevice(&dev));

  int vmm = -1, fd_ok = -1, compress = -1, rdma = -1;
  DRV(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  DRV(cuDeviceGetAttribute(&fd_ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev));
  DRV(cuDeviceGetAttribute(&compress, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, dev));
  DRV(cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev));
  EXPECT(vmm == 1, "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = %d", vmm);
  EXPECT(compress == 0 || compress == 1, "GENERIC_COMPRESSION_SUPPORTED = %d", compress);
  EXPECT(rdma == 0 || rdma == 1, "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = %d", rdma);

  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = fd_ok ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  size_t gran = 0, rec = 0;
  DRV(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  DRV(cuMemGetAllocationGranularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT(gran > 0 && (gran & (gran - 1)) == 0, "minimum granularity %zu", gran);
  EXPECT(rec >= gran && rec % gran == 0, "recommended granularity %zu (minimum %zu)", rec, gran);
  printf("PASS %s granularity %zu\n", TEST_NAME, gran);

  // Four chunks of addresses: two mapped side by side, room to move one.
  const size_t chunk = gran;
  CUdeviceptr va = 0;
  DRV(cuMemAddressReserve(&va, 4 * chunk, 0, 0, 0));
  EXPECT(va != 0 && va % gran == 0, "reservation at %#llx", (unsigned long long)va);
  printf("PASS %s reserve\n", TEST_NAME);

  size_t free0 = free_mem();
  CUmemGenericAllocationHandle h0, h1;
  DRV(cuMemCreate(&h0, chunk, &prop, 0));
  DRV(cuMemCreate(&h1, chunk, &prop, 0));
  size_t free1 = free_mem();
  EXPECT(free0 - free1 == 2 * chunk, "free memory dropped by %zu for %zu physical bytes", free0 - free1,
         2 * chunk);
  CUmemAllocationProp got = {};
  DRV(cuMemGetAllocationPropertiesFromHandle(&got, h1));
  EXPECT(got.type == CU_MEM_ALLOCATION_TYPE_PINNED && got.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
             got.location.id == dev && got.requestedHandleTypes == prop.requestedHandleTypes,
         "properties given back differ");
  printf("PASS %s create\n", TEST_NAME);

  DRV(cuMemMap(va, chunk, 0, h0, 0));
  DRV(cuMemMap(va + chunk, chunk, 0, h1, 0));
  CUmemAccessDesc acc = {};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = dev;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DRV(cuMemSetAccess(va, 2 * chunk, &acc, 1));
  unsigned long long flags = 0;
  DRV(cuMemGetAccess(&flags, &acc.location, va + chunk + 8));
  EXPECT(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "access %llu", flags);
  printf("PASS %s map-access\n", TEST_NAME);

  // Copies in and out across the boundary, and a kernel that reads both
  // sides of it.
  const size_t n = 2 * chunk / sizeof(float);
  std::vector<float> in(n), out(n), want(n);
  unsigned seed = 7;
  for (size_t i = 0; i < n; i++) in[i] = (float)(lcg(&seed) % 1000) / 8.0f;
  for (size_t i = 0; i < n; i++) want[i] = 2.0f * in[i] + in[n - 1 - i];
  float *dva = (float *)va;
  CHECK(cudaMemcpy(dva, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  float *res;
  CHECK(cudaMalloc(&res, n * sizeof(float)));
  mirror<<<(unsigned)((n + 255) / 256), 256>>>(dva, res, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(out.data(), res, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) EXPECT(out[i] == want[i], "mirror[%zu] = %f, want %f", i, out[i], want[i]);
  // The kernel's output back into the mapped range, then out of it.
  CHECK(cudaMemcpy(dva, res, n * sizeof(float), cudaMemcpyDeviceToDevice));
  std::fill(out.begin(), out.end(), 0.0f);
  CHECK(cudaMemcpy(out.data(), dva, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) EXPECT(out[i] == want[i], "copied back [%zu] = %f", i, out[i]);
  printf("PASS %s kernel-across-boundary\n", TEST_NAME);

  // What pointer queries and the address range say of a mapped address.
  CUdeviceptr base = 0;
  size_t len = 0;
  DRV(cuMemGetAddressRange_v2(&base, &len, va + chunk + 100));
  EXPECT(base == va + chunk && len == chunk, "address range %#llx+%zu", (unsigned long long)base, len);
  unsigned mt = 0;
  DRV(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 4));
  EXPECT(mt == CU_MEMORYTYPE_DEVICE, "memory type %u", mt);
  CUmemGenericAllocationHandle again = 0;
  DRV(cuMemRetainAllocationHandle(&again, (void *)(va + chunk + 100)));
  EXPECT(again == h1, "retained handle %llu, mapped %llu", (unsigned long long)again, (unsigned long long)h1);
  DRV(cuMemRelease(again));
  printf("PASS %s pointer-queries\n", TEST_NAME);

  // The driver's answers to a misaligned mapping, a mapping over one,
  // part of a mapping unmapped, and a reservation freed by a wrong size.
  CUresult r = cuMemMap(va + 2 * chunk + 4096, chunk, 0, h0, 0);
  EXPECT(r == CUDA_ERROR_INVALID_VALUE, "misaligned map returned %d", (int)r);
  r = cuMemMap(va, chunk, 0, h1, 0);
  EXPECT(r == CUDA_ERROR_INVALID_VALUE, "double map returned %d", (int)r);
  r = cuMemUnmap(va, chunk / 2);
  EXPECT(r == CUDA_ERROR_INVALID_VALUE, "unmap of half a mapping returned %d", (int)r);
  r = cuMemAddressFree(va, chunk);
  EXPECT(r == CUDA_ERROR_INVALID_VALUE, "free of part of a reservation returned %d", (int)r);
  printf("PASS %s errors\n", TEST_NAME);

  // The second chunk moves: unmapped, mapped again further on, it holds
  // the same bytes.
  DRV(cuMemUnmap(va + chunk, chunk));
  DRV(cuMemMap(va + 3 * chunk, chunk, 0, h1, 0));
  DRV(cuMemSetAccess(va + 3 * chunk, chunk, &acc, 1));
  std::vector<float> moved(chunk / sizeof(float));
  CHECK(cudaMemcpy(moved.data(), (void *)(va + 3 * chunk), chunk, cudaMemcpyDeviceToHost));
  EXPECT(memcmp(moved.data(), want.data() + n / 2, chunk) == 0, "the remapped chunk holds other bytes");
  printf("PASS %s remap\n", TEST_NAME);

  // The first chunk shared as a file descriptor and imported again: one
  // allocation seen at two addresses.
  if (fd_ok) {
    int fd = -1;
    DRV(cuMemExportToShareableHandle(&fd, h0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    CUmemGenericAllocationHandle imp = 0;
    DRV(cuMemImportFromShareableHandle(&imp, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    DRV(cuMemMap(va + chunk, chunk, 0, imp, 0));
    DRV(cuMemSetAccess(va + chunk, chunk, &acc, 1));
    std::vector<float> shared(chunk / sizeof(float));
    CHECK(cudaMemcpy(shared.data(), (void *)(va + chunk), chunk, cudaMemcpyDeviceToHost));
    EXPECT(memcmp(shared.data(), want.data(), chunk) == 0, "the imported chunk holds other bytes");
    DRV(cuMemUnmap(va + chunk, chunk));
    DRV(cuMemRelease(imp));
    printf("PASS %s posix-fd\n", TEST_NAME);
  }

  DRV(cuMemUnmap(va, chunk));
  DRV(cuMemUnmap(va + 3 * chunk, chunk));
  CHECK(cudaFree(res));
  DRV(cuMemRelease(h0));
  DRV(cuMemRelease(h1));
  EXPECT(free_mem() == free0, "free memory %zu after release, %zu before", free_mem(), free0);
  DRV(cuMemAddressFree(va, 4 * chunk));
  printf("PASS %s release\n", TEST_NAME);

  // A reservation far beyond the device's memory costs nothing; pages
  // mapped into it one by one (as expandable segments grow) cost theirs,
  // form one range for a kernel, and all come back.
  size_t total = 0, f = 0;
  CHECK(cudaMemGetInfo(&f, &total));
  size_t big = ((8 * total) / gran + 1) * gran;
  if (big < (64ull << 30)) big = 64ull << 30;
  CUdeviceptr seg = 0;
  DRV(cuMemAddressReserve(&seg, big, 0, 0, 0));
  EXPECT(free_mem() == free0, "a %zu-byte reservation cost %zu bytes", big, free0 - free_mem());
  const int pages = 16;
  std::vector<CUmemGenericAllocationHandle> hs(pages);
  for (int i = 0; i < pages; i++) {
    DRV(cuMemCreate(&hs[i], gran, &prop, 0));
    DRV(cuMemMap(seg + i * gran, gran, 0, hs[i], 0));
    DRV(cuMemSetAccess(seg + i * gran, gran, &acc, 1));
  }
  EXPECT(free0 - free_mem() == pages * gran, "%d pages cost %zu bytes", pages, free0 - free_mem());
  const size_t words = pages * gran / sizeof(unsigned);
  CHECK(cudaMemset((void *)seg, 0, pages * gran));
  add_index<<<(unsigned)((words + 255) / 256), 256>>>((unsigned *)seg, words);
  CHECK(cudaGetLastError());
  std::vector<unsigned> idx(words);
  CHECK(cudaMemcpy(idx.data(), (void *)seg, words * sizeof(unsigned), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < words; i++) EXPECT(idx[i] == (unsigned)i, "page word %zu = %u", i, idx[i]);
  // One unmap over every page, as a segment shrinks.
  DRV(cuMemUnmap(seg, pages * gran));
  for (int i = 0; i < pages; i++) DRV(cuMemRelease(hs[i]));
  EXPECT(free_mem() == free0, "free memory %zu after the pages went, %zu before", free_mem(), free0);
  DRV(cuMemAddressFree(seg, big));
  printf("PASS %s expandable-segment\n", TEST_NAME);
  return 0;
}
