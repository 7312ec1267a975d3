// Smaller parts of the API programs reach for: peer copies within one
// device, host allocation flags, stream attributes (an L2 access policy
// hint, copied between streams) and the device of a stream.
#define TEST_NAME "misc_api"
#include "check.h"
#include <cstring>

int main() {
  const size_t n = 1 << 20;
  int *a, *b;
  CHECK(cudaMalloc(&a, n));
  CHECK(cudaMalloc(&b, n));
  CHECK(cudaMemset(a, 0x5a, n));
  CHECK(cudaMemcpyPeer(b, 0, a, 0, n));
  unsigned char *h;
  CHECK(cudaHostAlloc((void **)&h, n, cudaHostAllocPortable));
  CHECK(cudaMemcpy(h, b, n, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) EXPECT(h[i] == 0x5a, "byte %zu = %#x after a peer copy", i, h[i]);
  cudaStream_t s, t;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaStreamCreate(&t));
  CHECK(cudaMemsetAsync(a, 0x33, n, s));
  CHECK(cudaMemcpyPeerAsync(b, 0, a, 0, n, s));
  CHECK(cudaMemcpyAsync(h, b, n, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(h[n - 1] == 0x33, "last byte %#x after an async peer copy", h[n - 1]);
  printf("PASS %s peer-copies\n", TEST_NAME);

  unsigned flags = 0;
  CHECK(cudaHostGetFlags(&flags, h));
  EXPECT(flags == cudaHostAllocPortable, "host flags %#x", flags);
  EXPECT(cudaHostGetFlags(&flags, &flags) != cudaSuccess, "flags of memory not CUDA's");
  cudaGetLastError();
  printf("PASS %s host-flags\n", TEST_NAME);

  cudaStreamAttrValue v = {};
  v.accessPolicyWindow.base_ptr = a;
  v.accessPolicyWindow.num_bytes = n;
  v.accessPolicyWindow.hitRatio = 0.5f;
  v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v));
  cudaStreamAttrValue back = {};
  CHECK(cudaStreamCopyAttributes(t, s));
  CHECK(cudaStreamGetAttribute(t, cudaStreamAttributeAccessPolicyWindow, &back));
  EXPECT(back.accessPolicyWindow.base_ptr == a && back.accessPolicyWindow.num_bytes == n &&
             back.accessPolicyWindow.hitRatio == 0.5f,
         "access policy window read back as %p %zu %f", back.accessPolicyWindow.base_ptr,
         back.accessPolicyWindow.num_bytes, back.accessPolicyWindow.hitRatio);
  int dev = -1;
  CHECK(cudaStreamGetDevice(t, &dev));
  EXPECT(dev == 0, "stream device %d", dev);
  printf("PASS %s stream-attributes\n", TEST_NAME);

  CHECK(cudaStreamDestroy(s));
  CHECK(cudaStreamDestroy(t));
  CHECK(cudaFreeHost(h));
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
