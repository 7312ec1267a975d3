// Cooperative launches: a grid that synchronises with cooperative
// groups' grid.sync(), sized as the CUDA programming guide sizes one
// (blocks per multiprocessor from the occupancy API times the
// multiprocessors), launched with cudaLaunchCooperativeKernel and with
// cudaLaunchKernelEx's cooperative attribute. Phase one sums each
// block's share, phase two sums the blocks' sums, phase three compares
// every element with the mean; all against the CPU. A grid one block
// larger than fits is cudaErrorCooperativeLaunchTooLarge.
#define TEST_NAME "cooperative"
#include "check.h"
#include <cooperative_groups.h>
#include <vector>

namespace cg = cooperative_groups;

constexpr int kThreads = 128;

__global__ void two_phase(const int *in, long long *partial, long long *total, int *above,
                          int n) {
  cg::grid_group grid = cg::this_grid();
  cg::thread_block block = cg::this_thread_block();
  __shared__ long long s[kThreads];
  long long v = 0;
  for (unsigned long long i = grid.thread_rank(); i < (unsigned long long)n; i += grid.size())
    v += in[i];
  s[block.thread_rank()] = v;
  block.sync();
  for (int off = kThreads / 2; off > 0; off /= 2) {
    if (block.thread_rank() < off) s[block.thread_rank()] += s[block.thread_rank() + off];
    block.sync();
  }
  if (block.thread_rank() == 0) partial[blockIdx.x] = s[0];
  // Every block's sum is written before any thread reads them.
  grid.sync();
  if (grid.thread_rank() == 0) {
    long long t = 0;
    for (unsigned b = 0; b < gridDim.x; b++) t += partial[b];
    *total = t;
  }
  grid.sync();
  const long long t = *total;
  // Above the mean: in[i] * n > total, in integers.
  for (unsigned long long i = grid.thread_rank(); i < (unsigned long long)n; i += grid.size())
    above[i] = (long long)in[i] * n > t;
}

int main() {
  int dev = 0;
  CHECK(cudaGetDevice(&dev));
  int coop = 0, sms = 0, per_sm = 0;
  CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  EXPECT(coop == 1, "cudaDevAttrCooperativeLaunch is %d", coop);
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, two_phase, kThreads, 0));
  EXPECT(per_sm >= 1, "%d blocks per multiprocessor", per_sm);
  const int blocks = per_sm * sms;

  const int n = 50000;
  std::vector<int> x(n);
  unsigned seed = 7;
  for (int i = 0; i < n; i++) x[i] = (int)(lcg(&seed) % 200001) - 100000;
  long long want = 0;
  for (int v : x) want += v;

  int *dx, *dabove;
  long long *dpartial, *dtotal;
  CHECK(cudaMalloc(&dx, n * sizeof(int)));
  CHECK(cudaMalloc(&dabove, n * sizeof(int)));
  CHECK(cudaMalloc(&dpartial, (blocks + 1) * sizeof(long long)));
  CHECK(cudaMalloc(&dtotal, sizeof(long long)));
  CHECK(cudaMemcpy(dx, x.data(), n * sizeof(int), cudaMemcpyHostToDevice));

  auto check = [&](const char *how) {
    long long total = 0;
    std::vector<int> above(n);
    CHECK(cudaMemcpy(&total, dtotal, sizeof(total), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(above.data(), dabove, n * sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(total == want, "%s: sum %lld, want %lld", how, total, want);
    for (int i = 0; i < n; i++)
      EXPECT(above[i] == ((long long)x[i] * n > want), "%s: element %d above the mean: %d", how,
             i, above[i]);
  };

  int nn = n;
  void *args[] = {&dx, &dpartial, &dtotal, &dabove, &nn};
  CHECK(cudaMemset(dabove, 0xff, n * sizeof(int)));
  CHECK(cudaLaunchCooperativeKernel((void *)two_phase, dim3(blocks), dim3(kThreads), args, 0,
                                    nullptr));
  CHECK(cudaDeviceSynchronize());
  check("cudaLaunchCooperativeKernel");

  // The launch attribute asks for the same.
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(kThreads);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CHECK(cudaMemset(dabove, 0xff, n * sizeof(int)));
  CHECK(cudaMemset(dtotal, 0, sizeof(long long)));
  CHECK(cudaLaunchKernelEx(&cfg, two_phase, (const int *)dx, dpartial, dtotal, dabove, n));
  CHECK(cudaDeviceSynchronize());
  check("cudaLaunchKernelEx");

  // One block more than can be resident at once.
  cudaError_t e = cudaLaunchCooperativeKernel((void *)two_phase, dim3(blocks + 1),
                                              dim3(kThreads), args, 0, nullptr);
  EXPECT(e == cudaErrorCooperativeLaunchTooLarge, "a grid of %d blocks: %s", blocks + 1,
         cudaGetErrorString(e));
  // Not sticky: the next call goes on.
  cudaGetLastError();
  CHECK(cudaDeviceSynchronize());

  CHECK(cudaFree(dx));
  CHECK(cudaFree(dabove));
  CHECK(cudaFree(dpartial));
  CHECK(cudaFree(dtotal));
  printf("PASS %s blocks=%d (%d per SM x %d SMs) n=%d\n", TEST_NAME, blocks, per_sm, sms, n);
  return 0;
}
