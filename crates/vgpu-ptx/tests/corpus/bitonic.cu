// Bitonic sort of one block's 512 keys in shared memory (ascending).
#define N 512
extern "C" __global__ void bitonic(int* keys)
{
    __shared__ int s[N];
    int* base = keys + blockIdx.x * N;
    for (int i = threadIdx.x; i < N; i += blockDim.x) s[i] = base[i];
    __syncthreads();
    for (int k = 2; k <= N; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < N; i += blockDim.x) {
                int p = i ^ j;
                if (p > i) {
                    bool up = (i & k) == 0;
                    int a = s[i], b = s[p];
                    if ((a > b) == up) { s[i] = b; s[p] = a; }
                }
            }
            __syncthreads();
        }
    }
    for (int i = threadIdx.x; i < N; i += blockDim.x) base[i] = s[i];
}
