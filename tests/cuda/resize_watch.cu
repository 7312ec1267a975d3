// A process that keeps checksummed data in device memory while its host
// resizes the vGPU: it reads the total with cudaMemGetInfo until the
// host has grown the quota to GROW bytes, shows that it can allocate
// what the old quota could not hold, says so ("VGPU-RESIZE GROWN") and
// waits until the host has shrunk it to SHRINK bytes; then an allocation
// past the new quota fails as out of memory. The data stays intact
// throughout, and no call fails that should not.
//
// usage: resize_watch GROW SHRINK [HELD_MIB (64)]
// Prints "VGPU-RESIZE READY total=T held=H" once its data is in place.
#define TEST_NAME "resize_watch"
#include "check.h"
#include <cstdint>
#include <ctime>
#include <unistd.h>

__global__ void fill(unsigned *p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = (unsigned)i * 2654435761u ^ seed;
}

// Counts the words that differ from what fill wrote.
__global__ void verify(const unsigned *p, size_t n, unsigned seed,
                       unsigned long long *bad) {
  unsigned long long b = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    b += p[i] != ((unsigned)i * 2654435761u ^ seed);
  if (b) atomicAdd(bad, b);
}

static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static size_t total_now() {
  size_t free = 0, total = 0;
  CHECK(cudaMemGetInfo(&free, &total));
  EXPECT(free <= total, "free %zu above total %zu", free, total);
  return total;
}

// Waits up to 600 s (a guest without KVM is slow) for the total to be
// `want`; returns the seconds it took.
static double wait_total(size_t want) {
  double t0 = now();
  size_t t;
  while ((t = total_now()) != want) {
    EXPECT(now() - t0 < 600, "the total stayed %zu bytes, %zu expected", t, want);
    usleep(50 * 1000);
  }
  return now() - t0;
}

static void check_data(const unsigned *d, size_t n, unsigned seed,
                       unsigned long long *bad, const char *when) {
  CHECK(cudaMemset(bad, 0, sizeof *bad));
  verify<<<64, 256>>>(d, n, seed, bad);
  CHECK(cudaGetLastError());
  unsigned long long h = 0;
  CHECK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
  EXPECT(h == 0, "%llu of %zu words changed %s", h, n, when);
}

int main(int argc, char **argv) {
  EXPECT(argc >= 3, "usage: resize_watch GROW SHRINK [HELD_MIB]");
  const size_t grow = strtoull(argv[1], nullptr, 0);
  const size_t shrink = strtoull(argv[2], nullptr, 0);
  const size_t held = (argc > 3 ? strtoull(argv[3], nullptr, 0) : 64) << 20;
  const unsigned seed = 0x5eedu;
  const size_t n = held / sizeof(unsigned);

  const size_t before = total_now();
  EXPECT(grow > before && shrink < grow && shrink > held,
         "GROW %zu must exceed the total %zu, SHRINK %zu lie between %zu and it",
         grow, before, shrink, held);
  unsigned *d = nullptr;
  unsigned long long *bad = nullptr;
  CHECK(cudaMalloc(&d, held));
  CHECK(cudaMalloc(&bad, sizeof *bad));
  fill<<<64, 256>>>(d, n, seed);
  CHECK(cudaDeviceSynchronize());
  check_data(d, n, seed, bad, "before any resize");
  size_t free0 = 0, total0 = 0;
  CHECK(cudaMemGetInfo(&free0, &total0));
  printf("VGPU-RESIZE READY total=%zu held=%zu\n", total0, held);
  fflush(stdout);

  // Grown: more than the old quota had free fits now.
  double s = wait_total(grow);
  size_t free1 = 0, total1 = 0;
  CHECK(cudaMemGetInfo(&free1, &total1));
  EXPECT(free1 == free0 + (grow - before), "free %zu after growing, %zu expected",
         free1, free0 + (grow - before));
  void *big = nullptr;
  const size_t more = free0 + (16u << 20);
  CHECK(cudaMalloc(&big, more));
  CHECK(cudaMemset(big, 0xa5, more));
  CHECK(cudaFree(big));
  check_data(d, n, seed, bad, "after growing");
  printf("PASS resize_grow total %zu -> %zu bytes seen after %.1f s; %zu bytes allocated, more than were free before\n",
         before, grow, s, more);
  printf("VGPU-RESIZE GROWN\n");
  fflush(stdout);

  // Shrunk: what is past the new quota is refused as on a full GPU.
  s = wait_total(shrink);
  size_t free2 = 0, total2 = 0;
  CHECK(cudaMemGetInfo(&free2, &total2));
  EXPECT(free2 + held <= shrink, "free %zu with %zu held in %zu", free2, held, shrink);
  void *past = nullptr;
  cudaError_t e = cudaMalloc(&past, free2 + (1u << 20));
  EXPECT(e == cudaErrorMemoryAllocation, "an allocation past the shrunk quota gave %s",
         cudaGetErrorString(e));
  (void)cudaGetLastError();
  check_data(d, n, seed, bad, "after shrinking");
  CHECK(cudaFree(d));
  CHECK(cudaFree(bad));
  printf("PASS resize_shrink total %zu bytes seen after %.1f s; an allocation past it is cudaErrorMemoryAllocation; %zu MiB intact throughout\n",
         shrink, s, held >> 20);
  return 0;
}
