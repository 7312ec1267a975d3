// Sum of 32-bit integers: a shared-memory tree per block, then one
// atomicAdd per block; also the maximum through atomicMax.
extern "C" __global__ void reduce_atomic(const int* in, unsigned long long* sum, int* maxv, int n)
{
    extern __shared__ int s[];
    unsigned tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = i < n ? in[i] : 0;
    s[tid] = v;
    if (i < n) atomicMax(maxv, v);
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (tid < stride) s[tid] += s[tid + stride];
        __syncthreads();
    }
    if (tid == 0) atomicAdd(sum, (unsigned long long)(long long)s[0]);
}
