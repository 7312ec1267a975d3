// A process that computes while others on the same vGPU fault: rounds of
// a kernel over data that stays in device memory from round to round,
// each checked against the CPU, so a neighbour's fault that took this
// process's memory or work with it shows as a failed call or a wrong
// result. Arguments: ROUNDS (at least this many, default 20), then
// optionally a file whose appearance ends the rounds after ROUNDS (at
// most 600 s), and N, the elements (default 2^18: 1 MiB per array).
#define TEST_NAME "neighbour"
#include "check.h"
#include <cstdint>
#include <cstring>
#include <ctime>
#include <unistd.h>
#include <vector>

// acc = acc * 3 + x (wrapping), and the sum of the new acc: integer work,
// so the CPU's answer is exact.
__global__ void step(unsigned *acc, const unsigned *x, unsigned long long *sum, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned long long v = 0;
  if (i < n) {
    unsigned a = acc[i] * 3u + x[i];
    acc[i] = a;
    v = a;
  }
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  if (threadIdx.x % 32 == 0) atomicAdd(sum, v);
}

static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 20;
  const char *stop = argc > 2 && strcmp(argv[2], "-") != 0 ? argv[2] : nullptr;
  const int n = argc > 3 ? atoi(argv[3]) : 1 << 18;
  EXPECT(rounds > 0 && n > 0 && n % 256 == 0, "usage: neighbour [ROUNDS [STOPFILE|- [N]]]");
  // Each process its own data: two of them side by side compute apart.
  unsigned seed = (unsigned)getpid();
  std::vector<unsigned> acc(n), x(n), got(n);
  for (int i = 0; i < n; i++) acc[i] = lcg(&seed);
  unsigned *dacc, *dx;
  unsigned long long *dsum;
  CHECK(cudaMalloc(&dacc, n * sizeof(unsigned)));
  CHECK(cudaMalloc(&dx, n * sizeof(unsigned)));
  CHECK(cudaMalloc(&dsum, sizeof(unsigned long long)));
  CHECK(cudaMemcpy(dacc, acc.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));

  const double start = now();
  int r = 0;
  for (; r < rounds || (stop && access(stop, F_OK) != 0 && now() - start < 600); r++) {
    for (int i = 0; i < n; i++) x[i] = lcg(&seed);
    CHECK(cudaMemcpy(dx, x.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dsum, 0, sizeof(unsigned long long)));
    step<<<n / 256, 256>>>(dacc, dx, dsum, n);
    CHECK(cudaGetLastError());
    unsigned long long sum = 0, want = 0;
    CHECK(cudaMemcpy(&sum, dsum, sizeof sum, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(got.data(), dacc, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) {
      acc[i] = acc[i] * 3u + x[i];
      want += acc[i];
      EXPECT(got[i] == acc[i], "round %d: element %d is %u, want %u", r, i, got[i], acc[i]);
    }
    EXPECT(sum == want, "round %d: sum %llu, want %llu", r, sum, want);
  }
  CHECK(cudaFree(dacc));
  CHECK(cudaFree(dx));
  CHECK(cudaFree(dsum));
  printf("PASS %s %d rounds of %d elements in %.1f s, each checked\n", TEST_NAME, r, n,
         now() - start);
  return 0;
}
