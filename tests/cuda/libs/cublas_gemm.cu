// cuBLAS at the size the benchmarks use: sgemm (fp32) and gemmEx (bf16
// in, bf16 out, fp32 compute) of N x N matrices (8192 unless given),
// each checked on 256 entries against the CPU, and timed over ITERS
// calls between events: one PASS line per GEMM with its TFLOP/s, and a
// BENCH line to compare runs side by side. With LOAD_SECONDS, it then
// keeps the GPU busy with bf16 GEMMs for that long (a saturating tenant
// for the scheduler's shares), replayed as CUDA graphs, printing a LOAD
// line each second, and checks the result again.
//
// usage: cublas_gemm [N] [ITERS] [LOAD_SECONDS]
#define TEST_NAME "cublas"
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "../check.h"

#define CHECK_BLAS(call)                                                     \
  do {                                                                       \
    cublasStatus_t s_ = (call);                                              \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                       \
      printf("FAIL %s: %s at %s:%d: status %d\n", TEST_NAME, #call,          \
             __FILE__, __LINE__, (int)s_);                                   \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

// Element (i, j) of matrix `seed`, in [-1, 1): the device fills the
// matrices with it and the CPU recomputes any element it checks.
__host__ __device__ inline float value(uint32_t i, uint32_t j, uint32_t seed) {
  uint32_t h = i * 0x9e3779b1u ^ (j + seed) * 0x85ebca77u;
  h ^= h >> 15;
  h *= 0x2c1b3c6du;
  h ^= h >> 12;
  return (float)(h & 0xffffff) / 8388608.0f - 1.0f;
}

// Column-major, as cuBLAS takes them.
__global__ void fill_f32(float *m, int n, uint32_t seed) {
  size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (idx < (size_t)n * n)
    m[idx] = value(idx % n, idx / n, seed);
}

__global__ void fill_bf16(__nv_bfloat16 *m, int n, uint32_t seed) {
  size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (idx < (size_t)n * n)
    m[idx] = __float2bfloat16_rn(value(idx % n, idx / n, seed));
}

// Round to bfloat16 as __float2bfloat16_rn does (to nearest, ties even).
static float bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  memcpy(&f, &u, 4);
  return f;
}

static float bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Checks 256 entries of C = A * B; `out(i, j)` reads C from the host
// copy. Within `rel` of the sum of |a * b| over k (rounding of inputs,
// outputs and summation order).
template <typename F>
static void spot_check(const char *name, int n, bool bf16, double rel, F out) {
  unsigned s = 12345;
  double worst = 0;
  for (int t = 0; t < 256; t++) {
    int i = lcg(&s) % n, j = lcg(&s) % n;
    double want = 0, mag = 0;
    for (int k = 0; k < n; k++) {
      float a = value(i, k, 1), b = value(k, j, 2);
      if (bf16) {
        a = bf16_round(a);
        b = bf16_round(b);
      }
      want += (double)a * b;
      mag += fabs((double)a * b);
    }
    double got = out(i, j);
    double err = fabs(got - want) / (mag + 1e-30);
    if (err > worst)
      worst = err;
    EXPECT(err <= rel, "%s C[%d][%d] = %g, expected %g (relative %g)", name, i,
           j, got, want, err);
  }
  printf("  %s: 256 entries within %.2g of the CPU (worst %.2g)\n", name, rel,
         worst);
}

static double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// GEMMs for `seconds` of wall time on stream `s` (the handle's), DEPTH
// launches queued at any moment (an event after each), so the GPU never
// waits for this process: GRAPH GEMMs are captured into one CUDA graph,
// launched as one, so that even a slow CPU keeps a whole GPU busy.
template <typename F>
static void load(int n, double seconds, cudaStream_t s, F gemm) {
  enum { DEPTH = 8, GRAPH = 8 };
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < GRAPH; i++)
    gemm();
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t done[DEPTH];
  for (auto &e : done)
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  double flops = 2.0 * n * (double)n * n;
  double start = now_s(), mark = start;
  long total = 0, since_mark = 0;
  for (long i = 0;; i++) {
    cudaEvent_t &e = done[i % DEPTH];
    if (i >= DEPTH)
      CHECK(cudaEventSynchronize(e));
    double t = now_s();
    if (t - mark >= 1.0) {
      printf("LOAD cublas t=%.0f gemms=%ld tflops=%.1f\n", t - start,
             since_mark, since_mark * flops / (t - mark) / 1e12);
      mark = t;
      since_mark = 0;
    }
    if (t - start >= seconds)
      break;
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(e, s));
    total += GRAPH;
    since_mark += GRAPH;
  }
  CHECK(cudaStreamSynchronize(s));
  double wall = now_s() - start;
  printf("BENCH cublas-load n=%d seconds=%.1f gemms=%ld bf16_tflops=%.2f\n", n,
         wall, total, total * flops / wall / 1e12);
  for (auto &e : done)
    CHECK(cudaEventDestroy(e));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
}

int main(int argc, char **argv) {
  // Each result line reaches the log even if a later call crashes.
  setvbuf(stdout, NULL, _IOLBF, 0);
  int n = argc > 1 ? atoi(argv[1]) : 8192;
  int iters = argc > 2 ? atoi(argv[2]) : 10;
  double load_seconds = argc > 3 ? atof(argv[3]) : 0;
  size_t elems = (size_t)n * n;
  cublasHandle_t h;
  CHECK_BLAS(cublasCreate(&h));
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  unsigned blocks = (unsigned)((elems + 255) / 256);
  double flops = 2.0 * n * (double)n * n * iters;

  // sgemm, fp32.
  float *a, *b, *c;
  CHECK(cudaMalloc(&a, elems * 4));
  CHECK(cudaMalloc(&b, elems * 4));
  CHECK(cudaMalloc(&c, elems * 4));
  fill_f32<<<blocks, 256>>>(a, n, 1);
  fill_f32<<<blocks, 256>>>(b, n, 2);
  CHECK(cudaGetLastError());
  const float one = 1, zero = 0;
  CHECK_BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b,
                         n, &zero, c, n));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaEventRecord(t0));
  for (int r = 0; r < iters; r++)
    CHECK_BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n,
                           b, n, &zero, c, n));
  CHECK(cudaEventRecord(t1));
  CHECK(cudaEventSynchronize(t1));
  float ms;
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  double sgemm_tflops = flops / (ms * 1e-3) / 1e12;
  float *hc = (float *)malloc(elems * 4);
  EXPECT(hc, "no host memory");
  CHECK(cudaMemcpy(hc, c, elems * 4, cudaMemcpyDeviceToHost));
  spot_check("sgemm", n, false, 1e-4,
             [&](int i, int j) { return (double)hc[i + (size_t)j * n]; });
  printf("PASS cublas-sgemm %d^3 fp32, %.1f TFLOP/s\n", n, sgemm_tflops);
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  CHECK(cudaFree(c));

  // gemmEx, bf16 in and out, fp32 compute.
  __nv_bfloat16 *a16, *b16, *c16;
  CHECK(cudaMalloc(&a16, elems * 2));
  CHECK(cudaMalloc(&b16, elems * 2));
  CHECK(cudaMalloc(&c16, elems * 2));
  fill_bf16<<<blocks, 256>>>(a16, n, 1);
  fill_bf16<<<blocks, 256>>>(b16, n, 2);
  CHECK(cudaGetLastError());
  auto gemm16 = [&] {
    CHECK_BLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a16,
                            CUDA_R_16BF, n, b16, CUDA_R_16BF, n, &zero, c16,
                            CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
  };
  gemm16();
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaEventRecord(t0));
  for (int r = 0; r < iters; r++)
    gemm16();
  CHECK(cudaEventRecord(t1));
  CHECK(cudaEventSynchronize(t1));
  CHECK(cudaEventElapsedTime(&ms, t0, t1));
  double bf16_tflops = flops / (ms * 1e-3) / 1e12;
  uint16_t *hc16 = (uint16_t *)hc;
  CHECK(cudaMemcpy(hc16, c16, elems * 2, cudaMemcpyDeviceToHost));
  spot_check("gemmEx-bf16", n, true, 1e-2, [&](int i, int j) {
    return (double)bf16_to_float(hc16[i + (size_t)j * n]);
  });
  printf("PASS cublas-gemmex-bf16 %d^3 bf16, %.1f TFLOP/s\n", n, bf16_tflops);
  printf("BENCH cublas n=%d sgemm_tflops=%.2f bf16_tflops=%.2f\n", n,
         sgemm_tflops, bf16_tflops);
  if (load_seconds > 0) {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_BLAS(cublasSetStream(h, s));
    load(n, load_seconds, s, gemm16);
    CHECK_BLAS(cublasSetStream(h, 0));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaMemcpy(hc16, c16, elems * 2, cudaMemcpyDeviceToHost));
    spot_check("gemmEx-bf16-after-load", n, true, 1e-2, [&](int i, int j) {
      return (double)bf16_to_float(hc16[i + (size_t)j * n]);
    });
    printf("PASS cublas-load-result unchanged after %.0f s of load\n",
           load_seconds);
  }
  free(hc);
  CHECK(cudaFree(a16));
  CHECK(cudaFree(b16));
  CHECK(cudaFree(c16));
  CHECK_BLAS(cublasDestroy(h));
  return 0;
}
