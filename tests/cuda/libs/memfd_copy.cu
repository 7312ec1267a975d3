// Host <-> device copy rates from what a VMM shares as guest RAM (a
// MAP_SHARED memfd registered with cudaHostRegister, as a partition host
// registers guest memory) against cudaMallocHost memory, and what
// splitting one 16 MiB copy into pieces costs (a guest's copy arrives as
// a scatter-gather list). Natively only: "BENCH name value unit" lines.
//
// usage: memfd_copy
#define TEST_NAME "memfd_copy"
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>

#include "../check.h"

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// GB/s of `reps` copies of `n` bytes, each as pieces of `piece` bytes
// queued back to back, with a wait after each copy when `wait_each`.
static double rate(void *dev, void *host, size_t n, size_t piece, int reps, bool h2d,
                   bool wait_each, cudaStream_t s) {
  auto one = [&] {
    for (size_t off = 0; off < n; off += piece) {
      char *d = (char *)dev + off, *h = (char *)host + off;
      CHECK(cudaMemcpyAsync(h2d ? (void *)d : (void *)h, h2d ? (void *)h : (void *)d, piece,
                            h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s));
    }
    if (wait_each) CHECK(cudaStreamSynchronize(s));
  };
  one();
  CHECK(cudaStreamSynchronize(s));
  double t = now_s();
  for (int i = 0; i < reps; i++) one();
  CHECK(cudaStreamSynchronize(s));
  return (double)n * reps / (now_s() - t) / 1e9;
}

int main() {
  const size_t size = 256 << 20, n = 16 << 20;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  void *dev, *pinned;
  CHECK(cudaMalloc(&dev, size));
  CHECK(cudaMallocHost(&pinned, size));
  memset(pinned, 1, size);
  int fd = memfd_create("guest-ram", 0);
  if (fd < 0 || ftruncate(fd, size) != 0) {
    printf("FAIL memfd_copy: no memfd\n");
    return 1;
  }
  void *ram = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (ram == MAP_FAILED) {
    printf("FAIL memfd_copy: mmap\n");
    return 1;
  }
  memset(ram, 1, size);
  CHECK(cudaHostRegister(ram, size, 0));
  printf("BENCH h2d_16m_pinned %.2f GB/s\n", rate(dev, pinned, n, n, 32, true, false, s));
  printf("BENCH h2d_16m_memfd %.2f GB/s\n", rate(dev, ram, n, n, 32, true, false, s));
  printf("BENCH d2h_16m_memfd %.2f GB/s\n", rate(dev, ram, n, n, 32, false, false, s));
  printf("BENCH h2d_16m_memfd_wait_each %.2f GB/s\n", rate(dev, ram, n, n, 32, true, true, s));
  printf("BENCH h2d_16m_memfd_2m_pieces %.2f GB/s\n", rate(dev, ram, n, 2 << 20, 32, true, false, s));
  printf("BENCH h2d_16m_memfd_2m_pieces_wait_each %.2f GB/s\n",
         rate(dev, ram, n, 2 << 20, 32, true, true, s));
  printf("BENCH h2d_16m_memfd_256k_pieces %.2f GB/s\n", rate(dev, ram, n, 256 << 10, 32, true, false, s));
  printf("PASS memfd_copy\n");
  return 0;
}
