// cuFFT: a batch of complex-to-complex transforms (forward, then
// inverse) of random data, checked against a direct DFT on the CPU at
// 32 (batch, bin) points, and the round trip against the input.
//
// usage: cufft [SIZE] [BATCH]
#define TEST_NAME "cufft"
#include <cmath>
#include <cufft.h>
#include <vector>

#include "../check.h"

#define CHECK_FFT(call)                                                      \
  do {                                                                       \
    cufftResult r_ = (call);                                                 \
    if (r_ != CUFFT_SUCCESS) {                                               \
      printf("FAIL %s: %s at %s:%d: result %d\n", TEST_NAME, #call,          \
             __FILE__, __LINE__, (int)r_);                                   \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

int main(int argc, char **argv) {
  // Each result line reaches the log even if a later call crashes.
  setvbuf(stdout, NULL, _IOLBF, 0);
  int n = argc > 1 ? atoi(argv[1]) : 4096;
  int batch = argc > 2 ? atoi(argv[2]) : 64;
  size_t elems = (size_t)n * batch;
  std::vector<cufftComplex> x(elems), y(elems), z(elems);
  unsigned s = 777;
  for (auto &v : x) {
    v.x = (float)(lcg(&s) % 20001) / 10000.0f - 1.0f;
    v.y = (float)(lcg(&s) % 20001) / 10000.0f - 1.0f;
  }
  cufftComplex *d;
  CHECK(cudaMalloc(&d, elems * sizeof(cufftComplex)));
  CHECK(cudaMemcpy(d, x.data(), elems * sizeof(cufftComplex),
                   cudaMemcpyHostToDevice));
  cufftHandle plan;
  CHECK_FFT(cufftPlan1d(&plan, n, CUFFT_C2C, batch));
  CHECK_FFT(cufftExecC2C(plan, d, d, CUFFT_FORWARD));
  CHECK(cudaMemcpy(y.data(), d, elems * sizeof(cufftComplex),
                   cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int t = 0; t < 32; t++) {
    int b = lcg(&s) % batch, k = lcg(&s) % n;
    double re = 0, im = 0;
    for (int j = 0; j < n; j++) {
      double a = -2.0 * M_PI * (double)k * j / n;
      const cufftComplex &v = x[(size_t)b * n + j];
      re += v.x * cos(a) - v.y * sin(a);
      im += v.x * sin(a) + v.y * cos(a);
    }
    const cufftComplex &g = y[(size_t)b * n + k];
    double err = hypot(g.x - re, g.y - im) / sqrt((double)n);
    if (err > worst)
      worst = err;
    EXPECT(err < 1e-3, "X[%d][%d] = (%g, %g), expected (%g, %g)", b, k, g.x,
           g.y, re, im);
  }
  // The inverse transform gives n times the input back.
  CHECK_FFT(cufftExecC2C(plan, d, d, CUFFT_INVERSE));
  CHECK(cudaMemcpy(z.data(), d, elems * sizeof(cufftComplex),
                   cudaMemcpyDeviceToHost));
  double round = 0;
  for (size_t i = 0; i < elems; i++)
    round = fmax(round, hypot(z[i].x / n - x[i].x, z[i].y / n - x[i].y));
  EXPECT(round < 1e-4, "inverse of forward is off by %g", round);
  CHECK_FFT(cufftDestroy(plan));
  CHECK(cudaFree(d));
  printf("PASS cufft-c2c %d x %d, DFT error %.2g, round trip %.2g\n", n, batch,
         worst, round);
  return 0;
}
