// Thrust's sort on the device: 100,000 ints as keys alone, then as keys
// with values (a stable sort by key), each checked against std::sort and
// std::stable_sort of the same data on the CPU.
#define TEST_NAME "thrust_sort"
#include "check.h"
#include <algorithm>
#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/host_vector.h>
#include <thrust/sort.h>
#include <utility>
#include <vector>

int main() {
  const int n = 100000;
  std::vector<int> keys(n), vals(n);
  unsigned s = 7;
  for (int i = 0; i < n; i++) {
    // Negative keys and many repeats: the sort must order signed ints and
    // keep equal keys' values in their first order.
    keys[i] = (int)(lcg(&s) % 20011) - 10000;
    vals[i] = i;
  }

  thrust::device_vector<int> dk(keys.begin(), keys.end());
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  CHECK(cudaEventRecord(t0));
  thrust::sort(dk.begin(), dk.end());
  CHECK(cudaEventRecord(t1));
  CHECK(cudaDeviceSynchronize());
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  thrust::host_vector<int> got = dk;
  std::vector<int> want = keys;
  std::sort(want.begin(), want.end());
  for (int i = 0; i < n; i++)
    EXPECT(got[i] == want[i], "keys: element %d is %d, want %d", i, (int)got[i], want[i]);
  printf("PASS %s keys n=%d min=%d max=%d (%.1f ms)\n", TEST_NAME, n, want[0], want[n - 1], ms);

  thrust::device_vector<int> k2(keys.begin(), keys.end()), v2(vals.begin(), vals.end());
  thrust::sort_by_key(k2.begin(), k2.end(), v2.begin());
  CHECK(cudaDeviceSynchronize());
  thrust::host_vector<int> gk = k2, gv = v2;
  std::vector<std::pair<int, int>> pairs(n);
  for (int i = 0; i < n; i++) pairs[i] = {keys[i], vals[i]};
  std::stable_sort(pairs.begin(), pairs.end(),
                   [](const std::pair<int, int> &a, const std::pair<int, int> &b) {
                     return a.first < b.first;
                   });
  for (int i = 0; i < n; i++)
    EXPECT(gk[i] == pairs[i].first && gv[i] == pairs[i].second,
           "key-value: element %d is (%d, %d), want (%d, %d)", i, (int)gk[i], (int)gv[i],
           pairs[i].first, pairs[i].second);
  printf("PASS %s key-value n=%d\n", TEST_NAME, n);
  return 0;
}
