// Inclusive prefix sum of each block's elements (Hillis-Steele, double buffered).
extern "C" __global__ void scan(const unsigned* in, unsigned* out, int n)
{
    extern __shared__ unsigned buf[];
    int tid = threadIdx.x;
    int i = blockIdx.x * blockDim.x + tid;
    int pout = 0, pin = 1;
    buf[tid] = i < n ? in[i] : 0;
    __syncthreads();
    for (int off = 1; off < blockDim.x; off <<= 1) {
        pout = 1 - pout;
        pin = 1 - pout;
        unsigned v = buf[pin * blockDim.x + tid];
        if (tid >= off) v += buf[pin * blockDim.x + tid - off];
        buf[pout * blockDim.x + tid] = v;
        __syncthreads();
    }
    if (i < n) out[i] = buf[pout * blockDim.x + tid];
}
