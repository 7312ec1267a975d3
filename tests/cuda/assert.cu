// A kernel's assert() that fails: the synchronisation reports
// cudaErrorAssert ("device-side assert triggered", what PyTorch shows
// for a bad index), and each failing thread's line reaches the
// program's standard output, as a GPU prints it; a kernel whose asserts
// hold runs. The next program on the same vGPU runs normally. With the
// argument "lost" (the cuda backend, where the vGPU's context and what it
// printed go with the assertion) the line is not looked for.
#define TEST_NAME "assert"
#include "check.h"
#include <cassert>
#include <cstring>
#include <string>
#include <unistd.h>

__global__ void check(const int *v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) assert(v[i] >= 0);
}

int main(int argc, char **argv) {
  const bool lost = argc > 1 && strcmp(argv[1], "lost") == 0;
  const int n = 64;
  int host[n];
  for (int i = 0; i < n; i++) host[i] = i;
  int *d;
  CHECK(cudaMalloc(&d, sizeof host));
  CHECK(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice));
  check<<<2, 32>>>(d, n);
  CHECK(cudaDeviceSynchronize());
  printf("PASS %s-holds\n", TEST_NAME);

  // One negative value: thread 37 fails its assert.
  host[37] = -1;
  CHECK(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice));
  fflush(stdout);
  FILE *out = tmpfile();
  EXPECT(out != nullptr, "no temporary file");
  int saved = dup(1);
  dup2(fileno(out), 1);
  check<<<2, 32>>>(d, n);
  cudaError_t e = cudaDeviceSynchronize();
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  std::string text;
  rewind(out);
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, out)) > 0) text.append(buf, got);
  fclose(out);
  EXPECT(e == cudaErrorAssert, "a failed assert gave %s", cudaGetErrorName(e));
  EXPECT(strcmp(cudaGetErrorString(e), "device-side assert triggered") == 0, "its text is \"%s\"",
         cudaGetErrorString(e));
  if (lost) {
    printf("PASS %s-fails %s (the context, and what it printed, went with it)\n", TEST_NAME,
           cudaGetErrorName(e));
    return 0;
  }
  EXPECT(text.find("block: [1,0,0], thread: [5,0,0] Assertion `v[i] >= 0` failed.") != std::string::npos,
         "the assertion's line is missing from what was printed:\n%s", text.c_str());
  printf("PASS %s-fails %s, and the device said where\n", TEST_NAME, cudaGetErrorName(e));
  return 0;
}
