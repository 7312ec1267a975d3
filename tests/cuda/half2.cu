// Packed half-precision math: __half2 and __nv_bfloat162 arithmetic
// (add, sub, mul, fma with and without relu and saturation, neg, abs,
// min, max) and the conversions to and from float, each lane against
// float math on the CPU rounded to the same type.
#define TEST_NAME "half2"
#include "check.h"
#include <cmath>
#include <cstring>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector>

enum { ADD, SUB, MUL, FMA, FMA_RELU, ADD_SAT, NEG, ABS, MIN, MAX, NOPS };
static const char *names[NOPS] = {"add", "sub", "mul", "fma", "fma_relu",
                                  "add_sat", "neg", "abs", "min", "max"};

__global__ void half_ops(const __half2 *a, const __half2 *b, const __half2 *c, __half2 *out,
                         int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  __half2 x = a[i], y = b[i], z = c[i];
  __half2 *o = out + (size_t)i * NOPS;
  o[ADD] = __hadd2(x, y);
  o[SUB] = __hsub2(x, y);
  o[MUL] = __hmul2(x, y);
  o[FMA] = __hfma2(x, y, z);
  o[FMA_RELU] = __hfma2_relu(x, y, z);
  o[ADD_SAT] = __hadd2_sat(x, y);
  o[NEG] = __hneg2(x);
  o[ABS] = __habs2(x);
  o[MIN] = __hmin2(x, y);
  o[MAX] = __hmax2(x, y);
}

__global__ void bf16_ops(const __nv_bfloat162 *a, const __nv_bfloat162 *b,
                         const __nv_bfloat162 *c, __nv_bfloat162 *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  __nv_bfloat162 x = a[i], y = b[i], z = c[i];
  __nv_bfloat162 *o = out + (size_t)i * NOPS;
  o[ADD] = __hadd2(x, y);
  o[SUB] = __hsub2(x, y);
  o[MUL] = __hmul2(x, y);
  o[FMA] = __hfma2(x, y, z);
  o[FMA_RELU] = __hfma2_relu(x, y, z);
  o[ADD_SAT] = __hadd2_sat(x, y);
  o[NEG] = __hneg2(x);
  o[ABS] = __habs2(x);
  o[MIN] = __hmin2(x, y);
  o[MAX] = __hmax2(x, y);
}

// Floats to half2 and back: the lanes' order and rounding to nearest.
__global__ void convert(const float *f, __half2 *h, float *back, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  __half2 v = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
  h[i] = v;
  back[2 * i] = __low2float(v);
  back[2 * i + 1] = __high2float(v);
}

// The exact result of each operation on one lane, as a double (the
// inputs are chosen so that it is exact), before rounding.
static double reference(int op, double x, double y, double z) {
  switch (op) {
  case ADD: return x + y;
  case SUB: return x - y;
  case MUL: return x * y;
  case FMA: return x * y + z;
  case FMA_RELU: return std::fmax(x * y + z, 0.0);
  case ADD_SAT: return std::fmin(std::fmax(x + y, 0.0), 1.0);
  case NEG: return -x;
  case ABS: return std::fabs(x);
  case MIN: return std::fmin(x, y);
  default: return std::fmax(x, y);
  }
}

template <typename T> static unsigned short bits(T v) {
  unsigned short b;
  memcpy(&b, &v, 2);
  return b;
}

int main() {
  const int n = 4096;
  unsigned s = 5;
  // Multiples of 1/256 below 4 for half, of 1/64 below 4 for bfloat16:
  // sums and products of them are exact in double and in float.
  auto pick = [&](int scale, int range) {
    return (double)((int)(lcg(&s) % (2 * range + 1)) - range) / scale;
  };
  std::vector<__half2> ha(n), hb(n), hc(n), hout(n * NOPS);
  std::vector<__nv_bfloat162> ba(n), bb(n), bc(n), bout(n * NOPS);
  std::vector<double> hin(n * 6), bin(n * 6);
  for (int i = 0; i < n * 6; i++) {
    hin[i] = pick(256, 1023);
    bin[i] = pick(64, 255);
  }
  for (int i = 0; i < n; i++) {
    ha[i] = __floats2half2_rn((float)hin[6 * i], (float)hin[6 * i + 1]);
    hb[i] = __floats2half2_rn((float)hin[6 * i + 2], (float)hin[6 * i + 3]);
    hc[i] = __floats2half2_rn((float)hin[6 * i + 4], (float)hin[6 * i + 5]);
    ba[i] = __floats2bfloat162_rn((float)bin[6 * i], (float)bin[6 * i + 1]);
    bb[i] = __floats2bfloat162_rn((float)bin[6 * i + 2], (float)bin[6 * i + 3]);
    bc[i] = __floats2bfloat162_rn((float)bin[6 * i + 4], (float)bin[6 * i + 5]);
  }
  void *d[8];
  for (int k = 0; k < 3; k++) CHECK(cudaMalloc(&d[k], n * 4));
  CHECK(cudaMalloc(&d[3], n * 4 * NOPS));
  for (int k = 4; k < 7; k++) CHECK(cudaMalloc(&d[k], n * 4));
  CHECK(cudaMalloc(&d[7], n * 4 * NOPS));
  CHECK(cudaMemcpy(d[0], ha.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d[1], hb.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d[2], hc.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d[4], ba.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d[5], bb.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d[6], bc.data(), n * 4, cudaMemcpyHostToDevice));
  half_ops<<<n / 128, 128>>>((__half2 *)d[0], (__half2 *)d[1], (__half2 *)d[2],
                             (__half2 *)d[3], n);
  CHECK(cudaGetLastError());
  bf16_ops<<<n / 128, 128>>>((__nv_bfloat162 *)d[4], (__nv_bfloat162 *)d[5],
                             (__nv_bfloat162 *)d[6], (__nv_bfloat162 *)d[7], n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(hout.data(), d[3], n * 4 * NOPS, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(bout.data(), d[7], n * 4 * NOPS, cudaMemcpyDeviceToHost));

  for (int i = 0; i < n; i++) {
    for (int op = 0; op < NOPS; op++) {
      for (int lane = 0; lane < 2; lane++) {
        const double *h = &hin[6 * i + lane], *b = &bin[6 * i + lane];
        __half hw = __float2half_rn((float)reference(op, h[0], h[2], h[4]));
        __half hg = lane ? __high2half(hout[i * NOPS + op]) : __low2half(hout[i * NOPS + op]);
        EXPECT(bits(hg) == bits(hw), "half %s(%g, %g, %g) lane %d: %#06x, want %#06x (%g)",
               names[op], h[0], h[2], h[4], lane, bits(hg), bits(hw), __half2float(hw));
        __nv_bfloat16 bw = __float2bfloat16_rn((float)reference(op, b[0], b[2], b[4]));
        __nv_bfloat16 bg =
            lane ? __high2bfloat16(bout[i * NOPS + op]) : __low2bfloat16(bout[i * NOPS + op]);
        EXPECT(bits(bg) == bits(bw), "bf16 %s(%g, %g, %g) lane %d: %#06x, want %#06x (%g)",
               names[op], b[0], b[2], b[4], lane, bits(bg), bits(bw), __bfloat162float(bw));
      }
    }
  }
  printf("PASS %s half2 and bfloat162, %d ops x %d pairs\n", TEST_NAME, NOPS, n);

  // Conversions: floats that round, ties to even, and the lanes' order.
  std::vector<float> f(2 * n), back(2 * n);
  for (int i = 0; i < 2 * n; i++) f[i] = (float)pick(1 << 20, 1 << 22) * 3.0f;
  f[0] = 1.0f + 1.0f / 2048;  // a tie: rounds to 1.0
  f[1] = 1.0f + 3.0f / 2048;  // a tie: rounds up to 1 + 2/1024
  float *df, *dback;
  __half2 *dh;
  CHECK(cudaMalloc(&df, 2 * n * 4));
  CHECK(cudaMalloc(&dback, 2 * n * 4));
  CHECK(cudaMalloc(&dh, n * 4));
  CHECK(cudaMemcpy(df, f.data(), 2 * n * 4, cudaMemcpyHostToDevice));
  convert<<<n / 128, 128>>>(df, dh, dback, n);
  CHECK(cudaGetLastError());
  std::vector<__half2> hv(n);
  CHECK(cudaMemcpy(hv.data(), dh, n * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(back.data(), dback, 2 * n * 4, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 2 * n; i++) {
    __half w = __float2half_rn(f[i]);
    __half g = i % 2 ? __high2half(hv[i / 2]) : __low2half(hv[i / 2]);
    EXPECT(bits(g) == bits(w), "convert %.9g: %#06x, want %#06x", f[i], bits(g), bits(w));
    EXPECT(back[i] == __half2float(w), "back to float %.9g: %.9g, want %.9g", f[i], back[i],
           __half2float(w));
  }
  EXPECT(__half2float(__low2half(hv[0])) == 1.0f, "the tie 1 + 2^-11 did not round to even");
  printf("PASS %s conversions n=%d\n", TEST_NAME, 2 * n);
  return 0;
}
