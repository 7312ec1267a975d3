// Cooperative groups inside a block: a thread_block, tiles of 32 and of
// 8 threads made by tiled_partition, shuffles and cg::reduce on the
// tiles, a tile of 128 threads (four warps, whose state cooperative
// groups keep in the block's reserved shared memory) with cg::reduce,
// block.sync() between the steps; each block's sum, each tile's and each
// tile's maximum against the CPU.
#define TEST_NAME "coop_groups"
#include "check.h"
#include <algorithm>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <vector>

namespace cg = cooperative_groups;

constexpr int kThreads = 256;

__global__ void sums(const int *in, int *block_sum, int *tile8_sum, int *tile32_max, int *tile128_sum, int n) {
  cg::thread_block block = cg::this_thread_block();
  __shared__ int warp_sums[kThreads / 32];
  int i = blockIdx.x * blockDim.x + block.thread_rank();
  int v = i < n ? in[i] : 0;

  // Tiles of 32, known at compile time: a shuffle-down sum.
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  int s = v;
  for (int off = warp.size() / 2; off > 0; off /= 2) s += warp.shfl_down(s, off);
  if (warp.thread_rank() == 0) warp_sums[warp.meta_group_rank()] = s;
  // And their maximum with cg::reduce.
  int m = cg::reduce(warp, v, cg::greater<int>());
  if (warp.thread_rank() == 0) tile32_max[i / 32] = m;

  // Tiles of 8 made at run time from the block.
  cg::thread_group tile8 = cg::tiled_partition(block, 8);
  int t = cg::reduce(cg::tiled_partition<8>(block), v, cg::plus<int>());
  if (tile8.thread_rank() == 0) tile8_sum[i / 8] = t;

  // A tile of four warps.
  cg::thread_block_tile<128> quad = cg::tiled_partition<128>(block);
  int q = cg::reduce(quad, v, cg::plus<int>());
  if (quad.thread_rank() == 0) tile128_sum[i / 128] = q;

  block.sync();
  if (warp.meta_group_rank() == 0) {
    int w = warp.thread_rank() < warp.meta_group_size() ? warp_sums[warp.thread_rank()] : 0;
    w = cg::reduce(warp, w, cg::plus<int>());
    if (warp.thread_rank() == 0) block_sum[blockIdx.x] = w;
  }
}

int main() {
  const int blocks = 64, n = blocks * kThreads - 100;
  std::vector<int> x(n);
  unsigned s = 17;
  for (int i = 0; i < n; i++) x[i] = (int)(lcg(&s) % 20001) - 10000;
  int *dx, *db, *d8, *d32, *d128;
  CHECK(cudaMalloc(&dx, n * 4));
  CHECK(cudaMalloc(&db, blocks * 4));
  CHECK(cudaMalloc(&d8, blocks * kThreads / 8 * 4));
  CHECK(cudaMalloc(&d32, blocks * kThreads / 32 * 4));
  CHECK(cudaMalloc(&d128, blocks * kThreads / 128 * 4));
  CHECK(cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice));
  sums<<<blocks, kThreads>>>(dx, db, d8, d32, d128, n);
  CHECK(cudaGetLastError());
  std::vector<int> gb(blocks), g8(blocks * kThreads / 8), g32(blocks * kThreads / 32),
      g128(blocks * kThreads / 128);
  CHECK(cudaMemcpy(gb.data(), db, gb.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(g8.data(), d8, g8.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(g32.data(), d32, g32.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(g128.data(), d128, g128.size() * 4, cudaMemcpyDeviceToHost));
  auto at = [&](int i) { return i < n ? x[i] : 0; };
  for (int b = 0; b < blocks; b++) {
    int w = 0;
    for (int i = b * kThreads; i < (b + 1) * kThreads; i++) w += at(i);
    EXPECT(gb[b] == w, "block %d sum %d, want %d", b, gb[b], w);
  }
  for (size_t t = 0; t < g8.size(); t++) {
    int w = 0;
    for (int i = t * 8; i < (int)(t + 1) * 8; i++) w += at(i);
    EXPECT(g8[t] == w, "tile of 8 #%zu sum %d, want %d", t, g8[t], w);
  }
  for (size_t t = 0; t < g32.size(); t++) {
    int w = at(t * 32);
    for (int i = t * 32; i < (int)(t + 1) * 32; i++) w = std::max(w, at(i));
    EXPECT(g32[t] == w, "tile of 32 #%zu max %d, want %d", t, g32[t], w);
  }
  for (size_t t = 0; t < g128.size(); t++) {
    int w = 0;
    for (int i = t * 128; i < (int)(t + 1) * 128; i++) w += at(i);
    EXPECT(g128[t] == w, "tile of 128 #%zu sum %d, want %d", t, g128[t], w);
  }
  printf("PASS %s blocks=%d tiles of 128, 32 and 8\n", TEST_NAME, blocks);
  return 0;
}
