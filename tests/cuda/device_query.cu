// What a program sees of the device: its properties, the memory quota
// (cudaMemGetInfo, totalGlobalMem), and out-of-memory at the quota, where
// the memory it read as free is what it could allocate.
// Usage: device_query [EXPECTED_TOTAL_BYTES]
#define TEST_NAME "device_query"
#include "check.h"
#include <cstring>
#include <vector>

int main(int argc, char **argv) {
  int count = 0, drv = 0, rt = 0;
  CHECK(cudaGetDeviceCount(&count));
  EXPECT(count >= 1, "%d devices", count);
  CHECK(cudaDriverGetVersion(&drv));
  CHECK(cudaRuntimeGetVersion(&rt));
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0));
  EXPECT(strstr(p.name, "vGPU") != nullptr, "name \"%s\"", p.name);
  EXPECT(p.multiProcessorCount >= 1 && p.warpSize == 32, "SMs %d warp %d", p.multiProcessorCount, p.warpSize);
  size_t free_b = 0, total = 0;
  CHECK(cudaMemGetInfo(&free_b, &total));
  EXPECT(total == p.totalGlobalMem, "cudaMemGetInfo total %zu, totalGlobalMem %zu", total, p.totalGlobalMem);
  if (argc > 1) {
    size_t want = strtoull(argv[1], nullptr, 0);
    EXPECT(total == want, "total memory %zu, the vGPU's quota is %zu", total, want);
  }
  printf("PASS %s \"%s\" cc %d.%d, %d SMs, %zu MiB (%zu free), driver %d runtime %d\n", TEST_NAME, p.name,
         p.major, p.minor, p.multiProcessorCount, total >> 20, free_b >> 20, drv, rt);

  // Allocate in 1/8ths of the quota until the device says no: never past
  // the quota, and the process keeps working after freeing.
#undef TEST_NAME
#define TEST_NAME "out_of_memory"
  std::vector<void *> held;
  size_t chunk = total / 8, got = 0;
  for (;;) {
    void *q = nullptr;
    cudaError_t e = cudaMalloc(&q, chunk);
    if (e == cudaErrorMemoryAllocation) break;
    CHECK(e);
    held.push_back(q);
    got += chunk;
    EXPECT(got <= total, "allocated %zu bytes of a %zu-byte quota", got, total);
  }
  EXPECT(!held.empty(), "nothing allocated");
  // What was free before the context's first allocation is what it can
  // allocate: the context's own memory was counted from the start.
  EXPECT(got <= free_b && got + chunk > free_b, "%zu MiB allocated in %zu MiB chunks, %zu MiB were free",
         got >> 20, chunk >> 20, free_b >> 20);
  (void)cudaGetLastError();
  for (void *q : held) CHECK(cudaFree(q));
  void *q = nullptr;
  CHECK(cudaMalloc(&q, chunk));
  CHECK(cudaFree(q));
  printf("PASS %s after %zu MiB of %zu\n", TEST_NAME, got >> 20, total >> 20);
  return 0;
}
