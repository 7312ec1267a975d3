// The other half of link_main.cu (see there).
__device__ int bias = 1000;
static __device__ int table[4] = {10, 20, 30, 40};

__device__ int poly(int x) { return 3 * x * x + table[x % 4]; }
