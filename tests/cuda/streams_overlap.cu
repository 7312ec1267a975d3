// Streams run side by side: a kernel on one stream waits for a flag that
// a copy on another stream sets. It sees it only if the copy runs while
// the kernel does (were the streams one queue, the copy would wait for
// the kernel, which gives up after about two seconds). On a GPU only:
// the software backend runs a partition's work one step at a time.
#define TEST_NAME "streams_overlap"
#include "check.h"

__global__ void wait_flag(volatile int *flag, int *seen, long long limit) {
  long long t0 = clock64();
  while (*flag == 0 && clock64() - t0 < limit) {
  }
  *seen = *flag != 0 ? 1 : 2;
}

int main() {
  int *flag, *seen, *one;
  CHECK(cudaMalloc(&flag, sizeof(int)));
  CHECK(cudaMalloc(&seen, sizeof(int)));
  CHECK(cudaMallocHost(&one, sizeof(int)));
  *one = 1;
  CHECK(cudaMemset(flag, 0, sizeof(int)));
  CHECK(cudaMemset(seen, 0, sizeof(int)));
  cudaStream_t k, c;
  CHECK(cudaStreamCreateWithFlags(&k, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
  wait_flag<<<1, 1, 0, k>>>(flag, seen, 4000000000LL);
  CHECK(cudaGetLastError());
  // A query submits the kernel before the copy is queued: in one queue
  // the copy would wait behind it.
  cudaError_t q = cudaStreamQuery(k);
  EXPECT(q == cudaSuccess || q == cudaErrorNotReady, "query: %s", cudaGetErrorString(q));
  CHECK(cudaMemcpyAsync(flag, one, sizeof(int), cudaMemcpyHostToDevice, c));
  CHECK(cudaStreamSynchronize(c));
  CHECK(cudaStreamSynchronize(k));
  int got = 0;
  CHECK(cudaMemcpy(&got, seen, sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT(got == 1, "the kernel did not see the other stream's copy (%d): the streams ran one after the other", got);
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
