"""CuPy on the GPU it is given, checked against NumPy on the CPU.

Each check prints one PASS or FAIL line and the rest still run.

usage: python3 cupy-suite.py [CHECK...]   (default: every check but
       illegal_address, which ends its process's context)
Environment: VGPU_EXPECT_MEM (bytes): the quota the device must report.
"""

import os
import sys
import time

from suite import run_checks

t0 = time.monotonic()
import numpy as np  # noqa: E402
import cupy as cp  # noqa: E402

print(f"  cupy {cp.__version__} imported in {time.monotonic() - t0:.1f} s", flush=True)

EXPECT = int(os.environ.get("VGPU_EXPECT_MEM") or 0)
rng = np.random.default_rng(1)


def worst(got, want):
    """Worst difference of a GPU result to the CPU's, relative to the CPU's largest value."""
    got = cp.asnumpy(got).astype(np.float64)
    want = np.asarray(want, dtype=np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def check_device():
    n = cp.cuda.runtime.getDeviceCount()
    p = cp.cuda.runtime.getDeviceProperties(0)
    name = p["name"].decode()
    if EXPECT and p["totalGlobalMem"] != EXPECT:
        return False, f"{p['totalGlobalMem']} bytes, the quota is {EXPECT}"
    return n >= 1, (f"{n} device(s): {name!r}, cc {p['major']}.{p['minor']}, "
                    f"{p['multiProcessorCount']} SMs, {p['totalGlobalMem'] >> 20} MiB")


def check_mem_get_info():
    free, total = cp.cuda.runtime.memGetInfo()
    if EXPECT and total != EXPECT:
        return False, f"{total} bytes total, the quota is {EXPECT}"
    return 0 < free <= total, f"{free >> 20} MiB free of {total >> 20} MiB"


def check_arithmetic():
    x = rng.standard_normal(1 << 16).astype(np.float32)
    y = rng.standard_normal(1 << 16).astype(np.float32)
    xd, yd = cp.asarray(x), cp.asarray(y)
    errs = [worst(xd * 2 + yd, x * 2 + y), worst(cp.sin(xd), np.sin(x)),
            worst(cp.sort(xd), np.sort(x)), worst(cp.cumsum(xd), np.cumsum(x))]
    return max(errs) < 1e-4, f"add/sin/sort/cumsum, worst {max(errs):.2g}"


def check_reductions():
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    xd = cp.asarray(x)
    errs = [worst(xd.sum(axis=1), x.sum(axis=1)), worst(xd.max(axis=0), x.max(axis=0)),
            worst(xd.mean().reshape(1), [x.mean()]),
            worst(cp.count_nonzero(xd > 0).reshape(1), [np.count_nonzero(x > 0)])]
    return max(errs) < 1e-4, f"sum/max/mean/count_nonzero, worst {max(errs):.2g}"


def check_matmul():
    a = rng.standard_normal((256, 384)).astype(np.float32)
    b = rng.standard_normal((384, 128)).astype(np.float32)
    err = worst(cp.asarray(a) @ cp.asarray(b), a.astype(np.float64) @ b)
    return err < 1e-4, f"256x384x128 float32, worst {err:.2g}"


def check_elementwise():
    k = cp.ElementwiseKernel("float32 x, float32 y, float32 a", "float32 z",
                             "z = a * x * x + y", "vgpu_axx_y")
    x = rng.standard_normal(10000).astype(np.float32)
    y = rng.standard_normal(10000).astype(np.float32)
    err = worst(k(cp.asarray(x), cp.asarray(y), np.float32(3)), 3 * x * x + y)
    return err < 1e-5, f"ElementwiseKernel compiled by NVRTC, worst {err:.2g}"


def check_raw_kernel():
    src = r'''
    extern "C" __global__ void scan_block(const float* x, float* y, int n) {
        __shared__ float s[256];
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        s[threadIdx.x] = i < n ? x[i] : 0.0f;
        __syncthreads();
        for (int d = 1; d < blockDim.x; d *= 2) {
            float v = threadIdx.x >= d ? s[threadIdx.x - d] : 0.0f;
            __syncthreads();
            s[threadIdx.x] += v;
            __syncthreads();
        }
        if (i < n) y[i] = s[threadIdx.x];
    }
    '''
    k = cp.RawKernel(src, "scan_block")
    n = 256 * 40
    x = rng.standard_normal(n).astype(np.float32)
    y = cp.empty(n, dtype=cp.float32)
    k((n // 256,), (256,), (cp.asarray(x), y, np.int32(n)))
    want = np.cumsum(x.reshape(-1, 256), axis=1).reshape(-1)
    err = worst(y, want)
    return err < 1e-4, f"RawKernel with shared memory, {n} elements, worst {err:.2g}"


def check_oom():
    free, total = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    held = []
    chunk = 64 << 20
    try:
        for _ in range(total // chunk + 2):
            held.append(cp.empty(chunk, dtype=cp.uint8))
        return False, f"{len(held) * chunk >> 20} MiB allocated past a {total >> 20} MiB quota"
    except cp.cuda.memory.OutOfMemoryError:
        got = len(held) * chunk
    del held
    pool.free_all_blocks()
    again = float(cp.ones(1 << 20, dtype=cp.float32).sum())
    ok = got <= total and again == float(1 << 20)
    return ok, (f"OutOfMemoryError after {got >> 20} MiB of {total >> 20} MiB; "
                f"after freeing, a sum gives {again:.0f}")


def check_illegal_address():
    """A kernel storing through a wild pointer: the launch's process gets
    CUDA's illegal-address error (its context is gone afterwards, so this
    check runs last, alone in its process, and is not among the defaults)."""
    k = cp.RawKernel(r'''
    extern "C" __global__ void poke(unsigned long long p) { *(volatile int*)p = 1; }
    ''', "poke")
    t = time.time()
    try:
        k((1,), (1,), (np.uint64(0x10),))
        cp.cuda.runtime.deviceSynchronize()
    except cp.cuda.runtime.CUDARuntimeError as e:
        return "IllegalAddress" in str(e) or "illegal" in str(e).lower(), \
            f"{e} (at {t:.1f})"
    except cp.cuda.driver.CUDADriverError as e:
        return "ILLEGAL_ADDRESS" in str(e), f"{e} (at {t:.1f})"
    return False, "a store to address 0x10 completed"


CHECKS = {
    "device": check_device,
    "mem_get_info": check_mem_get_info,
    "arithmetic": check_arithmetic,
    "reductions": check_reductions,
    "matmul": check_matmul,
    "elementwise": check_elementwise,
    "raw-kernel": check_raw_kernel,
    "oom": check_oom,
    "illegal_address": check_illegal_address,
}


def main():
    names = sys.argv[1:] or [n for n in CHECKS if n != "illegal_address"]
    return 1 if run_checks("cupy", CHECKS, names) else 0


sys.exit(main())
