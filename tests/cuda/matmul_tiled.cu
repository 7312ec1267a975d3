// Tiled matrix multiply with shared memory and __syncthreads, checked
// against the same product on the CPU.
#define TEST_NAME "matmul_tiled"
#include "check.h"
#include <cmath>

#define TILE 16

__global__ void matmul(const float *A, const float *B, float *C, int M, int N, int K) {
  __shared__ float As[TILE][TILE];
  __shared__ float Bs[TILE][TILE];
  int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.0f;
  for (int t = 0; t < (K + TILE - 1) / TILE; t++) {
    int ak = t * TILE + threadIdx.x, bk = t * TILE + threadIdx.y;
    As[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[row * K + ak] : 0.0f;
    Bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[bk * N + col] : 0.0f;
    __syncthreads();
    for (int k = 0; k < TILE; k++) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = acc;
}

int main() {
  const int M = 96, N = 80, K = 72;  // edges not multiples of the tile
  float *A = (float *)malloc(M * K * 4), *B = (float *)malloc(K * N * 4), *C = (float *)malloc(M * N * 4);
  unsigned s = 7;
  for (int i = 0; i < M * K; i++) A[i] = (float)(lcg(&s) % 17) - 8.0f;
  for (int i = 0; i < K * N; i++) B[i] = (float)(lcg(&s) % 13) - 6.0f;
  float *dA, *dB, *dC;
  CHECK(cudaMalloc(&dA, M * K * 4));
  CHECK(cudaMalloc(&dB, K * N * 4));
  CHECK(cudaMalloc(&dC, M * N * 4));
  CHECK(cudaMemcpy(dA, A, M * K * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dB, B, K * N * 4, cudaMemcpyHostToDevice));
  dim3 block(TILE, TILE), grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
  matmul<<<grid, block>>>(dA, dB, dC, M, N, K);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(C, dC, M * N * 4, cudaMemcpyDeviceToHost));
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float want = 0;
      for (int k = 0; k < K; k++) want += A[i * K + k] * B[k * N + j];
      EXPECT(C[i * N + j] == want, "C[%d][%d] = %f, want %f", i, j, C[i * N + j], want);
    }
  printf("PASS %s %dx%dx%d\n", TEST_NAME, M, N, K);
  return 0;
}
