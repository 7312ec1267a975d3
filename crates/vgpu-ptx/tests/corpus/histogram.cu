// 256-bin histogram of bytes: per-block bins in shared memory updated
// with shared atomics, merged into the global bins with global atomics.
extern "C" __global__ void histogram(const unsigned char* data, unsigned* bins, int n)
{
    __shared__ unsigned local[256];
    for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        atomicAdd(&local[data[i]], 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x)
        if (local[b]) atomicAdd(&bins[b], local[b]);
}
