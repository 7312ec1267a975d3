// Kernel parameters past the 4 KiB CUDA allowed before 12.1: a struct
// of 32,756 bytes passed by value beside a pointer, the 32,764 bytes of
// parameters CUDA 12.1 and later allow a kernel, launched through the
// runtime (the driver packs the block by the kernel's layout) and
// through cuLaunchKernel with a packed buffer; the kernel copies every
// byte out and the host compares each with what it passed.
#define TEST_NAME "large_params"
#include "driver.h"
#include <cstring>
#include <vector>

struct Big {
  unsigned char b[32756];
};
static_assert(sizeof(Big) + sizeof(void *) == 32764, "CUDA's largest parameter block");

__global__ void copy_out(unsigned char *out, Big big) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (int)sizeof(big.b);
       i += gridDim.x * blockDim.x)
    out[i] = big.b[i];
}

int main() {
  SYM(cuLaunchKernel);
  static Big big;
  unsigned seed = 12345;
  for (size_t i = 0; i < sizeof(big.b); i++) big.b[i] = (unsigned char)(lcg(&seed) >> 24);
  unsigned char *d;
  CHECK(cudaMalloc(&d, sizeof(big.b)));
  std::vector<unsigned char> h(sizeof(big.b));
  auto check = [&](const char *how) {
    CHECK(cudaMemcpy(h.data(), d, h.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < h.size(); i++)
      EXPECT(h[i] == big.b[i], "%s: byte %zu is %u, passed %u", how, i, h[i], big.b[i]);
  };

  // The runtime's launch.
  CHECK(cudaMemset(d, 0, sizeof(big.b)));
  copy_out<<<8, 128>>>(d, big);
  CHECK(cudaGetLastError());
  check("<<<>>>");
  printf("PASS %s runtime\n", TEST_NAME);

  // The driver's, with the block packed by the caller: the pointer at
  // 0, the struct after it.
  cudaFunction_t rf;
  CHECK(cudaGetFuncBySymbol(&rf, (const void *)copy_out));
  CUfunction f = (CUfunction)rf;
  static unsigned char packed[32764];
  memcpy(packed, &d, sizeof(d));
  memcpy(packed + sizeof(d), &big, sizeof(big));
  size_t size = sizeof(packed);
  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  for (int round = 0; round < 2; round++) {
    for (size_t i = 0; i < sizeof(big.b); i += 97) big.b[i] ^= 0x5a;
    memcpy(packed + sizeof(d), &big, sizeof(big));
    CHECK(cudaMemset(d, 0, sizeof(big.b)));
    DRV(cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, nullptr, nullptr, extra));
    check("cuLaunchKernel");
  }
  printf("PASS %s driver\n", TEST_NAME);
  CHECK(cudaFree(d));
  printf("PASS %s\n", TEST_NAME);
  return 0;
}
