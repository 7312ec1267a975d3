// Float sum with warp shuffles: each warp reduces with __shfl_down_sync,
// lane 0 of each warp adds its partial into the result.
extern "C" __global__ void reduce_shfl(const float* in, float* out, int n)
{
    float v = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        v += in[i];
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, v);
}
// Per-warp votes: ballot of positive values, and whether all/any are.
extern "C" __global__ void warp_vote(const int* in, unsigned* ballot, int* all, int* any)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = in[i];
    unsigned b = __ballot_sync(0xffffffffu, v > 0);
    int a = __all_sync(0xffffffffu, v > 0);
    int y = __any_sync(0xffffffffu, v > 0);
    int x = __shfl_xor_sync(0xffffffffu, v, 1);
    int u = __shfl_up_sync(0xffffffffu, v, 3);
    int w = __shfl_sync(0xffffffffu, v, 7);
    if ((threadIdx.x & 31) == 0) {
        ballot[i / 32] = b;
        all[i / 32] = a;
        any[i / 32] = y;
    }
    ballot[1024 + i] = x + 3 * u + 7 * w;
}
