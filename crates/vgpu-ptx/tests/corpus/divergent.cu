// Divergent loops and called functions: the Collatz step count of each
// value, a gcd by repeated remainder, and conversions, through
// non-inlined device functions (emitted as .func and call).
__device__ __noinline__ unsigned collatz(unsigned long long x)
{
    unsigned steps = 0;
    while (x != 1) {
        x = (x & 1) ? 3 * x + 1 : x / 2;
        ++steps;
    }
    return steps;
}
__device__ __noinline__ int gcd(int a, int b)
{
    while (b != 0) { int t = a % b; a = b; b = t; }
    return a < 0 ? -a : a;
}
__device__ __noinline__ float mix(float x, int k)
{
    float acc = 0.0f;
    for (int i = 0; i < k; ++i) acc += sqrtf(x + i) / (1.0f + i);
    return acc;
}
extern "C" __global__ void divergent(const int* in, unsigned* steps, int* g, float* f, long long* q, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = in[i];
    steps[i] = collatz((unsigned long long)(v < 1 ? 1 : v));
    g[i] = gcd(v, 36 + (i % 7) * 6);
    if (i & 1)
        f[i] = mix((float)v, i % 5);
    else
        f[i] = (float)v * 0.5f - 1.0f;
    q[i] = (long long)v * 1000003LL / (i + 1) - (v >> 2) + __float2int_rn(f[i]);
}
