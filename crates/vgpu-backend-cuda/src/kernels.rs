//! The built-in module's CUDA C source, compiled with NVRTC when the
//! backend starts and loaded into every partition's context.
//!
//! Kernels take their work split from their parameters (grid-stride
//! loops), not from the launch grid; the partition picks grid and block.

/// Threads per block of the element-wise and reduction kernels.
pub const BLOCK: u32 = 256;
/// Most blocks of the first reduction pass (its partial sums live in the
/// partition's scratch buffer, as doubles).
pub const REDUCE_BLOCKS: u32 = 1024;
/// sgemm tile: rows and columns of C per block (256 threads, 8 x 8 each).
pub const SGEMM_TILE: u32 = 128;
/// Most blocks in the sgemm grid's y dimension (blocks loop over the rest).
pub const SGEMM_MAX_GRID_Y: u32 = 65535;

/// Kernel names of the built-in module, in [`Funcs`](crate::partition) order.
pub const NAMES: [&str; 11] = [
    "fill_u32",
    "fill_pattern_u8",
    "copy_bytes",
    "copy_u128",
    "vadd_f32",
    "saxpy_f32",
    "sgemm_f32",
    "scale_f32",
    "reduce_partial_f32",
    "reduce_final_f32",
    "nop",
];

/// CUDA C source of the built-in module.
pub const SOURCE: &str = r#"
typedef unsigned long long u64;
typedef unsigned int u32;

#define BLOCK 256

__device__ __forceinline__ u64 first_index() {
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ u64 grid_stride() {
    return (u64)gridDim.x * blockDim.x;
}

// count 32-bit words at a 4-byte aligned dst set to value.
extern "C" __global__ void fill_u32(u32 *dst, u64 count, u32 value) {
    for (u64 i = first_index(); i < count; i += grid_stride()) dst[i] = value;
}

// bytes at dst (any alignment) set to the little-endian 32-bit pattern
// repeated from dst.
extern "C" __global__ void fill_pattern_u8(unsigned char *dst, u64 bytes, u32 pattern) {
    for (u64 i = first_index(); i < bytes; i += grid_stride())
        dst[i] = (unsigned char)(pattern >> (8 * (u32)(i & 3)));
}

// Non-overlapping byte copy, any alignment.
extern "C" __global__ void copy_bytes(unsigned char *__restrict__ dst,
                                      const unsigned char *__restrict__ src, u64 bytes) {
    for (u64 i = first_index(); i < bytes; i += grid_stride()) dst[i] = src[i];
}

// Non-overlapping copy of count 16-byte units, both 16-byte aligned.
extern "C" __global__ void copy_u128(uint4 *__restrict__ dst, const uint4 *__restrict__ src,
                                     u64 count) {
    for (u64 i = first_index(); i < count; i += grid_stride()) dst[i] = src[i];
}

// c[i] = a[i] + b[i]. An input may be c itself (same element read, then written).
extern "C" __global__ void vadd_f32(float *c, const float *a, const float *b, u64 n) {
    for (u64 i = first_index(); i < n; i += grid_stride()) c[i] = __fadd_rn(a[i], b[i]);
}

// y[i] = a * x[i] + y[i], rounded after the product as on the host (no fma).
extern "C" __global__ void saxpy_f32(float *y, const float *x, u64 n, float a) {
    for (u64 i = first_index(); i < n; i += grid_stride())
        y[i] = __fadd_rn(__fmul_rn(a, x[i]), y[i]);
}

// c[i] = beta * c[i]; beta == 0 clears c without reading it.
extern "C" __global__ void scale_f32(float *c, u64 count, float beta) {
    for (u64 i = first_index(); i < count; i += grid_stride())
        c[i] = beta == 0.0f ? 0.0f : beta * c[i];
}

// C = alpha * A * B + beta * C, row-major; A m x k, B k x n, C m x n.
// 128 x 128 tile of C per block, 256 threads computing 8 x 8 each
// (rows ty + 16 i, columns tx + 16 j). C must not overlap A or B.
#define BM 128
#define BN 128
#define BK 8
extern "C" __global__ void __launch_bounds__(256)
sgemm_f32(float *C, const float *A, const float *B, u32 m, u32 n, u32 k, float alpha,
          float beta) {
    __shared__ float As[BK][BM + 4];
    __shared__ float Bs[BK][BN];
    const int tid = threadIdx.x;
    const int tx = tid % 16, ty = tid / 16;
    const u64 col0 = (u64)blockIdx.x * BN;
    for (u64 by = blockIdx.y; by * BM < m; by += gridDim.y) {
        const u64 row0 = by * BM;
        float acc[8][8];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;
        for (u32 k0 = 0; k0 < k; k0 += BK) {
#pragma unroll
            for (int l = 0; l < 4; l++) {
                const int idx = tid + l * 256;
                const int ar = idx / BK, ac = idx % BK;
                const u64 gar = row0 + ar, gac = (u64)k0 + ac;
                As[ac][ar] = (gar < m && gac < k) ? A[gar * k + gac] : 0.0f;
                const int br = idx / BN, bc = idx % BN;
                const u64 gbr = (u64)k0 + br, gbc = col0 + bc;
                Bs[br][bc] = (gbr < k && gbc < n) ? B[gbr * n + gbc] : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < BK; kk++) {
                float a[8], b[8];
#pragma unroll
                for (int i = 0; i < 8; i++) a[i] = As[kk][ty + 16 * i];
#pragma unroll
                for (int j = 0; j < 8; j++) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
                for (int i = 0; i < 8; i++)
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[i][j] += a[i] * b[j];
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u64 r = row0 + ty + 16 * i;
            if (r >= m) continue;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const u64 c = col0 + tx + 16 * j;
                if (c >= n) continue;
                float *p = &C[r * n + c];
                *p = beta == 0.0f ? alpha * acc[i][j] : alpha * acc[i][j] + beta * *p;
            }
        }
    }
}

// First pass of sum(input[0..n]): one double per block in partials.
extern "C" __global__ void reduce_partial_f32(const float *input, u64 n, double *partials) {
    __shared__ double s[BLOCK];
    double acc = 0.0;
    for (u64 i = first_index(); i < n; i += grid_stride()) acc += (double)input[i];
    s[threadIdx.x] = acc;
    __syncthreads();
    for (int w = BLOCK / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = s[0];
}

// Second pass (one block): out[0] = sum(partials[0..count]). Runs after the
// first pass completed, so out may lie inside the input.
extern "C" __global__ void reduce_final_f32(const double *partials, u32 count, float *out) {
    __shared__ double s[BLOCK];
    double acc = 0.0;
    for (u32 i = threadIdx.x; i < count; i += BLOCK) acc += partials[i];
    s[threadIdx.x] = acc;
    __syncthreads();
    for (int w = BLOCK / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = (float)s[0];
}

// Does nothing: launch overhead.
extern "C" __global__ void nop() {}
"#;
