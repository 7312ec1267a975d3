// Managed memory as CUDA's introductions teach it: cudaMallocManaged, the
// host initialises, a kernel works on it, cudaDeviceSynchronize, the host
// reads the result through the same pointer. Then the host changes the
// data between launches, copies and memsets reach managed memory, a
// stream synchronisation hands it back, pointer attributes say managed,
// and prefetches and advice are accepted.
#define TEST_NAME "managed"
#include "check.h"

__global__ void axpy(float a, const float *x, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void count_odd(const int *v, int n, unsigned *odd) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && (v[i] & 1)) atomicAdd(odd, 1u);
}

int main() {
  int dev = 0, managed = 0, concurrent = 1;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, dev));
  CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev));
  EXPECT(managed == 1, "cudaDevAttrManagedMemory = %d", managed);
  printf("PASS %s attributes managed=%d concurrent=%d\n", TEST_NAME, managed, concurrent);

  const int n = 100003;
  float *x, *y;
  CHECK(cudaMallocManaged(&x, n * sizeof(float)));
  CHECK(cudaMallocManaged(&y, n * sizeof(float)));
  for (int i = 0; i < n; i++) {
    x[i] = 1.0f;
    y[i] = 2.0f;
  }
  axpy<<<(n + 255) / 256, 256>>>(3.0f, x, y, n);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < n; i++) EXPECT(y[i] == 5.0f, "y[%d] = %f after one launch, want 5", i, y[i]);
  printf("PASS %s host-init-kernel-host-read\n", TEST_NAME);

  // The host changes x between launches: the device must see it.
  for (int i = 0; i < n; i++) x[i] = (float)(i % 7);
  axpy<<<(n + 255) / 256, 256>>>(2.0f, x, y, n);
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < n; i++) {
    float want = 2.0f * (float)(i % 7) + 5.0f;
    EXPECT(y[i] == want, "y[%d] = %f after the host changed x, want %f", i, y[i], want);
  }
  printf("PASS %s host-writes-between-launches\n", TEST_NAME);

  // A copy out of managed memory right after a launch waits for it.
  float *out = (float *)malloc(n * sizeof(float));
  axpy<<<(n + 255) / 256, 256>>>(1.0f, x, y, n);
  CHECK(cudaMemcpy(out, y, n * sizeof(float), cudaMemcpyDefault));
  for (int i = 0; i < n; i++) {
    float want = 3.0f * (float)(i % 7) + 5.0f;
    EXPECT(out[i] == want, "copied y[%d] = %f, want %f", i, out[i], want);
    EXPECT(y[i] == want, "y[%d] = %f after the copy, want %f", i, y[i], want);
  }
  printf("PASS %s copy-after-launch\n", TEST_NAME);

  // Copies into managed memory (from the host, and from device memory)
  // and a memset, then a kernel and a stream's synchronisation.
  int *v, *dv;
  unsigned *odd;
  const int m = 4096;
  CHECK(cudaMallocManaged(&v, m * sizeof(int)));
  CHECK(cudaMallocManaged(&odd, sizeof(unsigned), cudaMemAttachHost));
  CHECK(cudaMalloc(&dv, m * sizeof(int)));
  int *src = (int *)malloc(m * sizeof(int));
  for (int i = 0; i < m; i++) src[i] = i;
  CHECK(cudaMemcpy(v, src, m * sizeof(int), cudaMemcpyHostToDevice));
  EXPECT(v[m - 1] == m - 1, "v[%d] = %d after a copy into it", m - 1, v[m - 1]);
  CHECK(cudaMemcpy(dv, v, m * sizeof(int), cudaMemcpyDeviceToDevice));
  CHECK(cudaMemset(v, 0, m * sizeof(int)));
  CHECK(cudaMemcpy(v, dv, (m / 2) * sizeof(int), cudaMemcpyDeviceToDevice));
  // The host touches managed memory only while the device is idle.
  CHECK(cudaDeviceSynchronize());
  *odd = 0;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  count_odd<<<(m + 255) / 256, 256, 0, s>>>(v, m, odd);
  CHECK(cudaStreamSynchronize(s));
  EXPECT(*odd == (unsigned)(m / 4), "%u odd values, want %d", *odd, m / 4);
  for (int i = 0; i < m; i++) {
    int want = i < m / 2 ? i : 0;
    EXPECT(v[i] == want, "v[%d] = %d, want %d", i, v[i], want);
  }
  printf("PASS %s copies-memset-stream-sync\n", TEST_NAME);

  cudaPointerAttributes attr;
  CHECK(cudaPointerGetAttributes(&attr, y + 10));
  EXPECT(attr.type == cudaMemoryTypeManaged, "pointer type %d, want managed", (int)attr.type);
  EXPECT(attr.devicePointer == y + 10 && attr.hostPointer == y + 10,
         "device %p, host %p: one address on both sides", attr.devicePointer, attr.hostPointer);
  CHECK(cudaPointerGetAttributes(&attr, dv));
  EXPECT(attr.type == cudaMemoryTypeDevice, "plain device memory reads as type %d", (int)attr.type);
  printf("PASS %s pointer-attributes\n", TEST_NAME);

  cudaMemLocation loc = {};
  loc.type = cudaMemLocationTypeDevice;
  loc.id = dev;
  CHECK(cudaMemAdvise(x, n * sizeof(float), cudaMemAdviseSetReadMostly, loc));
  CHECK(cudaMemPrefetchAsync(x, n * sizeof(float), loc, 0, s));
  EXPECT(cudaMemPrefetchAsync(dv, m * sizeof(int), loc, 0, s) != cudaSuccess,
         "a prefetch of device memory was accepted");
  cudaGetLastError();
  CHECK(cudaStreamSynchronize(s));
  printf("PASS %s prefetch-advise\n", TEST_NAME);

  // Freed and allocated again, many times: nothing leaks, data is fresh.
  for (int round = 0; round < 20; round++) {
    float *t;
    CHECK(cudaMallocManaged(&t, (1 << 20) + round));
    t[0] = (float)round;
    axpy<<<1, 1>>>(1.0f, t, t, 1);
    CHECK(cudaDeviceSynchronize());
    EXPECT(t[0] == 2.0f * round, "round %d: %f", round, t[0]);
    CHECK(cudaFree(t));
  }
  printf("PASS %s alloc-free-rounds\n", TEST_NAME);

  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(dv));
  CHECK(cudaFree(odd));
  CHECK(cudaFree(v));
  CHECK(cudaFree(y));
  CHECK(cudaFree(x));
  free(src);
  free(out);
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
