// Persisting L2 accesses as programs tune them: the device's persisting
// capacity and largest access policy window (nonzero, within its L2),
// the context's set-aside limit up to that capacity and refused past
// it, a stream's access policy window set, read back and refused past
// the largest, kernels run on that stream and checked against the CPU,
// and the persisting lines reset.
#define TEST_NAME "l2_persisting"
#include "check.h"
#include <vector>

__global__ void scale_add(int *data, int n, int k) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    data[i] = data[i] * k + i;
}

int main() {
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0));
  EXPECT(p.persistingL2CacheMaxSize > 0 && p.persistingL2CacheMaxSize <= p.l2CacheSize,
         "persisting L2 of %d bytes in an L2 of %d", p.persistingL2CacheMaxSize, p.l2CacheSize);
  EXPECT(p.accessPolicyMaxWindowSize > 0, "largest access policy window %d",
         p.accessPolicyMaxWindowSize);

  size_t limit = 0;
  CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, p.persistingL2CacheMaxSize));
  CHECK(cudaDeviceGetLimit(&limit, cudaLimitPersistingL2CacheSize));
  EXPECT(limit == (size_t)p.persistingL2CacheMaxSize, "limit %zu, set %d", limit,
         p.persistingL2CacheMaxSize);
  EXPECT(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, (size_t)1 << 40) ==
             cudaErrorInvalidValue,
         "a set-aside past the capacity was accepted");
  cudaGetLastError();
  printf("PASS %s limit\n", TEST_NAME);

  const int n = 1 << 16;
  std::vector<int> h(n), want(n);
  for (int i = 0; i < n; i++) h[i] = want[i] = i % 1000 - 500;
  int *d;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  CHECK(cudaMemcpy(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  cudaStreamAttrValue v = {};
  v.accessPolicyWindow.base_ptr = d;
  v.accessPolicyWindow.num_bytes = n * sizeof(int);
  v.accessPolicyWindow.hitRatio = 1.0f;
  v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v));
  cudaStreamAttrValue got = {};
  CHECK(cudaStreamGetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &got));
  EXPECT(got.accessPolicyWindow.base_ptr == d &&
             got.accessPolicyWindow.num_bytes == n * sizeof(int) &&
             got.accessPolicyWindow.hitProp == cudaAccessPropertyPersisting,
         "the window read back is not the one set");
  cudaStreamAttrValue wide = v;
  wide.accessPolicyWindow.num_bytes = (size_t)p.accessPolicyMaxWindowSize + 4096;
  EXPECT(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &wide) ==
             cudaErrorInvalidValue,
         "a window past the largest was accepted");
  cudaGetLastError();

  for (int k = 2; k <= 4; k++) {
    scale_add<<<64, 256, 0, s>>>(d, n, k);
    CHECK(cudaGetLastError());
    for (int i = 0; i < n; i++) want[i] = want[i] * k + i;
  }
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) EXPECT(h[i] == want[i], "data[%d] = %d, want %d", i, h[i], want[i]);
  CHECK(cudaCtxResetPersistingL2Cache());
  printf("PASS %s window\n", TEST_NAME);

  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(d));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
