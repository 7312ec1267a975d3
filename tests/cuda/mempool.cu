// Stream-ordered allocation with memory pools, as pool-based allocators
// (RAPIDS RMM's, PyTorch's cudaMallocAsync backend, CuPy's
// MemoryAsyncPool) use it: the device says it has pools, the default
// pool's release threshold is set, allocations come from the current
// pool and its usage follows them, a pool of the program's own becomes
// the device's current one, and is destroyed with an allocation live;
// and a graph captured with an allocation and its free inside.
#define TEST_NAME "mempool"
#include "check.h"
#include <cstdint>

__global__ void fill(int *p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v + i;
}

static uint64_t attr(cudaMemPool_t pool, cudaMemPoolAttr a) {
  uint64_t v = 0;
  CHECK(cudaMemPoolGetAttribute(pool, a, &v));
  return v;
}

int main() {
  int dev = 0, pools = 0;
  CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev));
  EXPECT(pools == 1, "cudaDevAttrMemoryPoolsSupported = %d", pools);

  cudaMemPool_t def, cur;
  CHECK(cudaDeviceGetDefaultMemPool(&def, dev));
  CHECK(cudaDeviceGetMemPool(&cur, dev));
  EXPECT(def == cur, "the current pool is not the default one at first");
  uint64_t keep = UINT64_MAX;
  CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &keep));
  EXPECT(attr(def, cudaMemPoolAttrReleaseThreshold) == UINT64_MAX, "release threshold not kept");
  printf("PASS %s default-pool\n", TEST_NAME);

  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  const int n = 1 << 20;
  int *p;
  CHECK(cudaMallocAsync(&p, n * sizeof(int), s));
  EXPECT(attr(def, cudaMemPoolAttrUsedMemCurrent) >= n * sizeof(int), "usage %llu after an allocation",
         (unsigned long long)attr(def, cudaMemPoolAttrUsedMemCurrent));
  fill<<<n / 256, 256, 0, s>>>(p, n, 5);
  int last = 0;
  CHECK(cudaMemcpyAsync(&last, p + n - 1, sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaFreeAsync(p, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(last == 5 + n - 1, "last = %d", last);
  EXPECT(attr(def, cudaMemPoolAttrUsedMemCurrent) == 0, "usage %llu after the free",
         (unsigned long long)attr(def, cudaMemPoolAttrUsedMemCurrent));
  EXPECT(attr(def, cudaMemPoolAttrUsedMemHigh) >= n * sizeof(int), "high-water mark lost");
  uint64_t zero = 0;
  CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemHigh, &zero));
  EXPECT(attr(def, cudaMemPoolAttrUsedMemHigh) == 0, "high-water mark not reset");
  CHECK(cudaMemPoolTrimTo(def, 0));
  printf("PASS %s alloc-async-usage\n", TEST_NAME);

  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  cudaMemPool_t mine;
  CHECK(cudaMemPoolCreate(&mine, &props));
  cudaMemAccessDesc access = {};
  access.location = props.location;
  access.flags = cudaMemAccessFlagsProtReadWrite;
  CHECK(cudaMemPoolSetAccess(mine, &access, 1));
  cudaMemAccessFlags flags;
  CHECK(cudaMemPoolGetAccess(&flags, mine, &props.location));
  EXPECT(flags == cudaMemAccessFlagsProtReadWrite, "access %d", (int)flags);
  int *q, *r;
  CHECK(cudaMallocFromPoolAsync(&q, 4096, mine, s));
  EXPECT(attr(mine, cudaMemPoolAttrUsedMemCurrent) >= 4096, "the new pool's usage");
  CHECK(cudaDeviceSetMemPool(dev, mine));
  CHECK(cudaDeviceGetMemPool(&cur, dev));
  EXPECT(cur == mine, "the device's current pool was not set");
  CHECK(cudaMallocAsync(&r, 8192, s));
  EXPECT(attr(mine, cudaMemPoolAttrUsedMemCurrent) >= 4096 + 8192, "cudaMallocAsync not from the current pool");
  EXPECT(attr(def, cudaMemPoolAttrUsedMemCurrent) == 0, "the default pool grew");
  CHECK(cudaFreeAsync(r, s));
  printf("PASS %s own-pool\n", TEST_NAME);

  // Destroyed with an allocation live: the allocation stays usable, and
  // the device goes back to its default pool.
  CHECK(cudaMemPoolDestroy(mine));
  fill<<<16, 256, 0, s>>>(q, 1024, 1);
  CHECK(cudaMemcpyAsync(&last, q + 1023, sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaFreeAsync(q, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(last == 1024, "last = %d after the pool was destroyed", last);
  CHECK(cudaDeviceGetMemPool(&cur, dev));
  EXPECT(cur == def, "the current pool did not go back to the default");
  EXPECT(cudaMemPoolDestroy(def) != cudaSuccess, "the default pool was destroyed");
  cudaGetLastError();
  printf("PASS %s destroy\n", TEST_NAME);

  // Allocated and freed inside a stream capture: the graph keeps the
  // memory for its launches and gives it back when it and its
  // executable are gone.
  int *out;
  CHECK(cudaMalloc(&out, n * sizeof(int)));
  size_t free0 = 0, free1 = 0, total = 0;
  CHECK(cudaMemGetInfo(&free0, &total));
  cudaStream_t cs;
  CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t e;
  CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
  int *tmp;
  CHECK(cudaMallocAsync(&tmp, n * sizeof(int), cs));
  fill<<<n / 256, 256, 0, cs>>>(tmp, n, 3);
  CHECK(cudaMemcpyAsync(out, tmp, n * sizeof(int), cudaMemcpyDeviceToDevice, cs));
  CHECK(cudaFreeAsync(tmp, cs));
  CHECK(cudaStreamEndCapture(cs, &g));
  CHECK(cudaGraphInstantiate(&e, g, 0));
  for (int round = 0; round < 3; round++) {
    CHECK(cudaMemsetAsync(out, 0, n * sizeof(int), cs));
    CHECK(cudaGraphLaunch(e, cs));
    CHECK(cudaMemcpyAsync(&last, out + n - 1, sizeof(int), cudaMemcpyDeviceToHost, cs));
    CHECK(cudaStreamSynchronize(cs));
    EXPECT(last == 3 + n - 1, "round %d: last = %d", round, last);
  }
  CHECK(cudaGraphDestroy(g));
  // The executable still runs with the memory after its graph is gone.
  CHECK(cudaGraphLaunch(e, cs));
  CHECK(cudaStreamSynchronize(cs));
  CHECK(cudaGraphExecDestroy(e));
  CHECK(cudaMemGetInfo(&free1, &total));
  EXPECT(free1 == free0, "%zu bytes free after the graph went, %zu before it", free1, free0);
  CHECK(cudaStreamDestroy(cs));
  CHECK(cudaFree(out));
  printf("PASS %s alloc-in-capture\n", TEST_NAME);

  CHECK(cudaStreamDestroy(s));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
