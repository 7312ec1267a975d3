// 1-D 7-point stencil with a shared-memory halo, in double precision.
#define R 3
#define B 128
__constant__ double weights[2 * R + 1] = {0.05, 0.1, 0.2, 0.3, 0.2, 0.1, 0.05};
extern "C" __global__ void stencil(const double* in, double* out, int n)
{
    __shared__ double tile[B + 2 * R];
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    int l = threadIdx.x + R;
    tile[l] = g < n ? in[g] : 0.0;
    if (threadIdx.x < R) {
        int left = g - R, right = g + B;
        tile[l - R] = left >= 0 ? in[left] : 0.0;
        tile[l + B] = right < n ? in[right] : 0.0;
    }
    __syncthreads();
    if (g < n) {
        double acc = 0.0;
        for (int k = -R; k <= R; ++k) acc = fma(weights[k + R], tile[l + k], acc);
        out[g] = acc;
    }
}
