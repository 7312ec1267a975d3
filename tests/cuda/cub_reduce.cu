// CUB's reductions: DeviceReduce::Sum over a million ints (the two-call
// form: ask for the temporary storage, then reduce), and BlockReduce of
// each block's ints in a kernel of our own; both against the CPU's sums.
#define TEST_NAME "cub_reduce"
#include "check.h"
#include <cub/cub.cuh>
#include <vector>

constexpr int kThreads = 256;
constexpr int kItems = 4;

// Each block sums its kThreads * kItems ints with BlockReduce.
__global__ void block_sums(const int *in, long long *out, int n) {
  using Reduce = cub::BlockReduce<long long, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  long long v = 0;
  for (int k = 0; k < kItems; k++) {
    int i = (blockIdx.x * kItems + k) * kThreads + threadIdx.x;
    if (i < n) v += in[i];
  }
  long long sum = Reduce(tmp).Sum(v);
  if (threadIdx.x == 0) out[blockIdx.x] = sum;
}

int main() {
  const int n = 1 << 20;
  std::vector<int> x(n);
  unsigned s = 11;
  long long want = 0;
  for (int i = 0; i < n; i++) {
    x[i] = (int)(lcg(&s) % 2001) - 1000;
    want += x[i];
  }
  int *dx;
  CHECK(cudaMalloc(&dx, n * sizeof(int)));
  CHECK(cudaMemcpy(dx, x.data(), n * sizeof(int), cudaMemcpyHostToDevice));

  // DeviceReduce::Sum of ints accumulates in int: the sum fits.
  int *dsum;
  CHECK(cudaMalloc(&dsum, sizeof(int)));
  size_t tmp_bytes = 0;
  CHECK(cub::DeviceReduce::Sum(nullptr, tmp_bytes, dx, dsum, n));
  EXPECT(tmp_bytes > 0, "DeviceReduce::Sum asked for no temporary storage");
  void *tmp;
  CHECK(cudaMalloc(&tmp, tmp_bytes));
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  CHECK(cudaEventRecord(t0));
  CHECK(cub::DeviceReduce::Sum(tmp, tmp_bytes, dx, dsum, n));
  CHECK(cudaEventRecord(t1));
  CHECK(cudaEventSynchronize(t1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  int got = 0;
  CHECK(cudaMemcpy(&got, dsum, sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT(got == want, "DeviceReduce::Sum gave %d, want %lld", got, want);
  printf("PASS %s device n=%d sum=%lld temp=%zu (%.1f ms)\n", TEST_NAME, n, want, tmp_bytes, ms);

  // A tail block that is partly empty.
  const int m = n - 1000;
  const int per_block = kThreads * kItems;
  const int blocks = (m + per_block - 1) / per_block;
  long long *dout;
  CHECK(cudaMalloc(&dout, blocks * sizeof(long long)));
  block_sums<<<blocks, kThreads>>>(dx, dout, m);
  CHECK(cudaGetLastError());
  std::vector<long long> sums(blocks);
  CHECK(cudaMemcpy(sums.data(), dout, blocks * sizeof(long long), cudaMemcpyDeviceToHost));
  for (int b = 0; b < blocks; b++) {
    long long w = 0;
    for (int i = b * per_block; i < (b + 1) * per_block && i < m; i++) w += x[i];
    EXPECT(sums[b] == w, "BlockReduce: block %d summed %lld, want %lld", b, sums[b], w);
  }
  printf("PASS %s block blocks=%d\n", TEST_NAME, blocks);
  CHECK(cudaFree(tmp));
  CHECK(cudaFree(dsum));
  CHECK(cudaFree(dout));
  CHECK(cudaFree(dx));
  return 0;
}
