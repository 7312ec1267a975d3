// cudaMemcpyBatchAsync (CUDA 12.8 on): independent copies of every
// direction queued as one call, a stack source read before the call
// returns (cudaMemcpySrcAccessOrderDuringApiCall), and malformed batches
// refused.
#define TEST_NAME "memcpy_batch"
#include "check.h"
#include <cstring>

int main() {
  const size_t n = 4096;
  unsigned *d0, *d1, *d2, *pinned;
  CHECK(cudaMalloc(&d0, n * sizeof(unsigned)));
  CHECK(cudaMalloc(&d1, n * sizeof(unsigned)));
  CHECK(cudaMalloc(&d2, n * sizeof(unsigned)));
  CHECK(cudaMallocHost(&pinned, n * sizeof(unsigned)));
  unsigned seed = 5;
  unsigned *init = new unsigned[n];
  for (size_t i = 0; i < n; i++) init[i] = lcg(&seed);
  CHECK(cudaMemcpy(d0, init, n * sizeof(unsigned), cudaMemcpyHostToDevice));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));

  {
    unsigned stack[64];
    for (int i = 0; i < 64; i++) stack[i] = 1000u + i;
    void *dsts[3] = {d1, pinned, d2};
    const void *srcs[3] = {stack, d0, d0};
    size_t sizes[3] = {sizeof(stack), n * sizeof(unsigned), n * sizeof(unsigned)};
    cudaMemcpyAttributes attrs[2] = {};
    attrs[0].srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
    attrs[1].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t idxs[2] = {0, 1};
    CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 3, attrs, idxs, 2, s));
    // The stack source was read during the call: changing it now changes
    // nothing.
    memset(stack, 0xff, sizeof(stack));
    CHECK(cudaStreamSynchronize(s));
  }
  unsigned got[64];
  CHECK(cudaMemcpy(got, d1, sizeof(got), cudaMemcpyDeviceToHost));
  for (int i = 0; i < 64; i++) EXPECT(got[i] == 1000u + i, "stack copy: word %d is %u", i, got[i]);
  for (size_t i = 0; i < n; i++) EXPECT(pinned[i] == init[i], "device -> pinned: word %zu differs", i);
  CHECK(cudaMemcpy(init + 0, d2, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) EXPECT(init[i] == pinned[i], "device -> device: word %zu differs", i);

  // Malformed batches: attributes not starting at copy 0, more attribute
  // sets than copies, an unknown access order.
  void *dst[1] = {d1};
  const void *src[1] = {d0};
  size_t size[1] = {16};
  cudaMemcpyAttributes a = {};
  a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t bad_idx = 1, idx0 = 0;
  EXPECT(cudaMemcpyBatchAsync(dst, src, size, 1, &a, &bad_idx, 1, s) == cudaErrorInvalidValue,
         "attributes from copy 1 taken");
  (void)cudaGetLastError();
  cudaMemcpyAttributes two[2] = {a, a};
  size_t idx2[2] = {0, 0};
  EXPECT(cudaMemcpyBatchAsync(dst, src, size, 1, two, idx2, 2, s) == cudaErrorInvalidValue,
         "two attribute sets for one copy taken");
  (void)cudaGetLastError();
  a.srcAccessOrder = (cudaMemcpySrcAccessOrder)9;
  EXPECT(cudaMemcpyBatchAsync(dst, src, size, 1, &a, &idx0, 1, s) == cudaErrorInvalidValue,
         "an unknown access order taken");
  (void)cudaGetLastError();

  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFree(d0));
  CHECK(cudaFree(d1));
  CHECK(cudaFree(d2));
  delete[] init;
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
