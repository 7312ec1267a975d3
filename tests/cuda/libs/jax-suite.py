"""JAX on the GPU it is given, checked against NumPy on the CPU.

Each check prints one PASS or FAIL line (and goes on after a failure).

usage: python3 jax-suite.py [CHECK...]   (default: every check)
"""

import logging
import sys
import time

# JAX's CUDA plugin says why it gives up (a failed version check, say)
# only through `logging`, which prints nothing unless configured.
# JAX logs a backend that failed to start at INFO.
logging.basicConfig(level=logging.WARNING, format="  %(name)s: %(message)s")
logging.getLogger("jax").setLevel(logging.INFO)
logging.getLogger("jax_plugins").setLevel(logging.INFO)
t = time.monotonic()
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from suite import run_checks  # noqa: E402

print(f"  jax {jax.__version__} imported in {time.monotonic() - t:.1f} s", flush=True)


def check_devices():
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        # Why each backend did not start (what JAX keeps for this message).
        from jax._src import xla_bridge
        why = dict(getattr(xla_bridge, "_backend_errors", {}))
        if "cuda" not in why:
            # Not tried, or given up on quietly: start it here to see why.
            try:
                xla_bridge._init_backend("cuda")
                why["cuda"] = "starts when asked directly"
            except Exception as e:  # what JAX would have logged
                why["cuda"] = f"{type(e).__name__}: {e}"
        factories = sorted(getattr(xla_bridge, "_backend_factories", {}))
        return False, (f"no GPU among {jax.devices()}; backends that failed: {why}; "
                       f"registered: {factories}")
    return True, f"{len(gpus)} GPU(s): {gpus[0].device_kind!r}"


def check_matmul():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((256, 384), dtype=np.float32)
    b = rng.standard_normal((384, 128), dtype=np.float32)
    # float32 in full: on a GPU JAX's default lets matmuls round to TF32.
    f = jax.jit(lambda x, y: jnp.tanh(jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST)))
    got = np.asarray(f(jax.device_put(a, jax.devices("gpu")[0]), b))
    want = np.tanh(a.astype(np.float64) @ b.astype(np.float64))
    worst = float(np.max(np.abs(got - want)))
    return worst < 1e-3, f"jitted tanh(a @ b) 256x384x128 float32, worst {worst:.2g}"


def check_grad():
    # d/dw sum(tanh(x @ w)^2) = x^T (2 tanh(x @ w) (1 - tanh(x @ w)^2)),
    # worked out on the CPU in float64.
    rng = np.random.default_rng(6)
    x = rng.standard_normal((64, 96), dtype=np.float32)
    w = rng.standard_normal((96, 32), dtype=np.float32) * 0.1
    loss = lambda w_, x_: jnp.sum(jnp.tanh(jnp.matmul(
        x_, w_, precision=jax.lax.Precision.HIGHEST)) ** 2)
    gpu = jax.devices("gpu")[0]
    got = np.asarray(jax.jit(jax.grad(loss))(jax.device_put(w, gpu), jax.device_put(x, gpu)))
    t = np.tanh(x.astype(np.float64) @ w.astype(np.float64))
    want = x.astype(np.float64).T @ (2 * t * (1 - t * t))
    worst = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    return worst < 1e-4, f"jitted gradient of sum(tanh(x @ w)^2), worst relative {worst:.2g}"


CHECKS = {"devices": check_devices, "matmul": check_matmul, "grad": check_grad}

if __name__ == "__main__":
    names = sys.argv[1:] or list(CHECKS)
    sys.exit(1 if run_checks("jax", CHECKS, names) else 0)
