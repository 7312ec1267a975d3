// Library math (inlined from libdevice) and integer intrinsics, with a
// struct passed by value and half-precision conversions (as inline PTX:
// cuda_fp16.h needs the CCCL headers, a wheel of their own).
struct Scale { float mul; int add; double dmul; };
extern "C" __global__ void math(const float* x, float* f, double* d, unsigned* u, Scale s, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = __ldg(&x[i]);
    f[8 * i + 0] = expf(v);
    f[8 * i + 1] = logf(fabsf(v) + 1.0f);
    f[8 * i + 2] = sinf(v);
    f[8 * i + 3] = cosf(v);
    f[8 * i + 4] = powf(fabsf(v), 1.5f);
    f[8 * i + 5] = tanhf(v);
    f[8 * i + 6] = fmodf(v * s.mul, 3.0f);
    unsigned short h;
    float back;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    asm("cvt.f32.f16 %0, %1;" : "=f"(back) : "h"(h));
    f[8 * i + 7] = back;
    d[2 * i + 0] = exp((double)v) * s.dmul;
    d[2 * i + 1] = sqrt(fabs((double)v));
    unsigned b = __float_as_uint(v) + s.add;
    u[4 * i + 0] = __popc(b) + (__brev(b) << 8);
    u[4 * i + 1] = __ffs(b) + 64 * __clz(b);
    u[4 * i + 2] = __byte_perm(b, 0x01020304u, 0x5140);
    u[4 * i + 3] = __funnelshift_l(b, ~b, i & 31);
}
