"""PyTorch on the GPU it is given, checked against the same work on the CPU.

Each check prints one PASS or FAIL line (and goes on after a failure); the
benchmarks print BENCH lines with the figures, to be compared with the
same script run natively on the same GPU.

usage: python3 torch-suite.py [CHECK...] [bench | bench_matmul | bench_mlp | bench_small]
       (default: every check, then the benchmarks when TORCH_BENCH=1;
       "bench" alone: only them; bench_NAME: that one; train_load, a
       GPU-bound training load, two_devices, which needs two GPUs, and
       expandable, which needs PYTORCH_CUDA_ALLOC_CONF=
       expandable_segments:True, only when named)
Environment: VGPU_EXPECT_MEM (bytes): the quota the device must report;
             TORCH_STEPS (200): training steps of the loss check;
             TORCH_LOAD_SECONDS (30): how long train_load trains.
"""

import collections
import math
import os
import sys
import time

from suite import run_checks

t0 = time.monotonic()
import torch  # noqa: E402

print(f"  torch {torch.__version__} imported in {time.monotonic() - t0:.1f} s", flush=True)

EXPECT = int(os.environ.get("VGPU_EXPECT_MEM") or 0)
STEPS = int(os.environ.get("TORCH_STEPS") or 200)
dev = torch.device("cuda")
failed = 0


def close(a, b, tol):
    """Worst relative difference of a GPU result to the CPU's, and its verdict."""
    a = a.detach().float().cpu()
    b = b.detach().float().cpu()
    err = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
    return err <= tol, err


def check_device():
    n = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0)
    p = torch.cuda.get_device_properties(0)
    if EXPECT and p.total_memory != EXPECT:
        return False, f"{p.total_memory} bytes, the quota is {EXPECT}"
    return n >= 1, (f"{n} device(s): {name!r}, cc {p.major}.{p.minor}, "
                    f"{p.multi_processor_count} SMs, {p.total_memory >> 20} MiB")


def check_mem_get_info():
    free, total = torch.cuda.mem_get_info()
    if EXPECT and total != EXPECT:
        return False, f"{total} bytes total, the quota is {EXPECT}"
    return 0 < free <= total, f"{free >> 20} MiB free of {total >> 20} MiB"


def check_tensor_ops():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1 << 16, generator=g)
    y = torch.randn(1 << 16, generator=g)
    want = [(x * 2 + y).sum(), torch.sin(x).abs().max(), (x > y).sum().float(),
            torch.cumsum(x, 0)[-1], torch.sort(x).values[100]]
    xd, yd = x.to(dev), y.to(dev)
    got = [(xd * 2 + yd).sum(), torch.sin(xd).abs().max(), (xd > yd).sum().float(),
           torch.cumsum(xd, 0)[-1], torch.sort(xd).values[100]]
    worst = max(close(a, b, 1e-4)[1] for a, b in zip(got, want))
    return worst <= 1e-4, f"add/sum/sin/max/compare/cumsum/sort, worst {worst:.2g}"


def check_matmul(dtype, tol):
    def run():
        g = torch.Generator().manual_seed(2)
        a = torch.randn(256, 384, generator=g)
        b = torch.randn(384, 128, generator=g)
        want = a @ b
        got = a.to(dev, dtype) @ b.to(dev, dtype)
        ok, err = close(got, want, tol)
        return ok, f"256x384x128 {dtype}, worst {err:.2g}"
    return run


def check_conv2d():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 8, 32, 32, generator=g)
    w = torch.randn(16, 8, 3, 3, generator=g)
    want = torch.nn.functional.conv2d(x, w, padding=1)
    got = torch.nn.functional.conv2d(x.to(dev), w.to(dev), padding=1)
    ok, err = close(got, want, 1e-3)
    return ok and torch.backends.cudnn.is_available(), (
        f"cuDNN {torch.backends.cudnn.version()}, worst {err:.2g}")


def check_autograd():
    g = torch.Generator().manual_seed(4)
    w0 = torch.randn(64, 32, generator=g)
    x = torch.randn(16, 64, generator=g)
    grads = []
    for d in ("cpu", dev):
        w = w0.to(d, copy=True).requires_grad_()
        (torch.tanh(x.to(d) @ w) ** 2).sum().backward()
        grads.append(w.grad)
    ok, err = close(grads[1], grads[0], 1e-4)
    return ok, f"tanh(x @ w)^2 gradient, worst {err:.2g}"


def train(d, steps):
    torch.manual_seed(5)
    net = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                              torch.nn.Linear(128, 128), torch.nn.ReLU(),
                              torch.nn.Linear(128, 1)).to(d)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(256, 32, generator=g)
    y = (x[:, :4].sum(1, keepdim=True)).sin()
    x, y = x.to(d), y.to(d)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses).cpu()


def check_training():
    t = time.monotonic()
    gpu = train(dev, STEPS)
    took = time.monotonic() - t
    cpu = train("cpu", STEPS)
    err = (gpu[-1] - cpu[-1]).abs().item() / cpu[-1].abs().item()
    ok = err <= 2e-2 and gpu[-1] < gpu[0] / 2
    return ok, (f"{STEPS} steps in {took:.1f} s, loss {gpu[0]:.4f} -> {gpu[-1]:.5f} "
                f"(CPU {cpu[-1]:.5f}, {err:.2g} apart)")


def check_events():
    a = torch.randn(1024, 1024, device=dev)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a = a @ a / 1024
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    torch.cuda.synchronize()
    return end.query() and ms > 0, f"10 matmuls 1024 in {ms:.3f} ms by events"


def check_streams():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(512, 512, generator=g)
    xd = x.to(dev)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(s1):
        a = xd @ xd
    with torch.cuda.stream(s2):
        b = xd.t() @ xd
    torch.cuda.current_stream().wait_stream(s1)
    torch.cuda.current_stream().wait_stream(s2)
    got = a + b
    ok, err = close(got, x @ x + x.t() @ x, 1e-3)
    return ok, f"two streams joined, worst {err:.2g}"


def check_two_devices():
    """Two vGPUs in one process: work on each, and tensors moved between
    them (no peer access: copies go through host memory)."""
    n = torch.cuda.device_count()
    if n < 2:
        return False, f"{n} device(s), this check needs two"
    d0, d1 = torch.device("cuda:0"), torch.device("cuda:1")
    if torch.cuda.can_device_access_peer(0, 1):
        return False, "peer access between vGPUs is reported"
    g = torch.Generator().manual_seed(11)
    x = torch.randn(1024, 1024, generator=g)
    a = x.to(d0) @ x.to(d0)
    b = a.to(d1)  # device to device, staged through host memory
    c = (b @ x.to(d1)).to(d0) + a
    want = x @ x @ x + x @ x
    ok, err = close(c, want, 1e-3)
    return ok, f"matmuls on cuda:0 and cuda:1, tensors moved both ways, worst {err:.2g}"


def check_graphs():
    x = torch.zeros(1024, device=dev)
    w = torch.full((1024,), 2.0, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * w + 1
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * w + 1
    sums = []
    for v in (1.0, 3.0):
        x.fill_(v)
        graph.replay()
        sums.append(y.sum().item())
    return sums == [3072.0, 7168.0], f"replayed with new inputs: {sums}"


def check_oom():
    started = time.time()
    free, total = torch.cuda.mem_get_info()
    chunk = 64 << 20
    held = []
    try:
        for _ in range(total // chunk + 2):
            held.append(torch.empty(chunk, dtype=torch.uint8, device=dev))
        return False, f"{len(held) * chunk >> 20} MiB allocated past a {total >> 20} MiB quota"
    except torch.cuda.OutOfMemoryError:
        got = len(held) * chunk
    del held
    torch.cuda.empty_cache()
    again = torch.ones(1 << 20, device=dev).sum().item()
    ok = got <= total and again == float(1 << 20)
    return ok, (f"OutOfMemoryError after {got >> 20} MiB of {total >> 20} MiB; "
                f"after freeing, a sum gives {again:.0f} (at {started:.1f}-{time.time():.1f})")


def check_train_load():
    """A GPU-bound tenant: an MLP's whole training step (4 layers 4096
    wide, batch 4096, bf16) captured as one CUDA graph, replayed for
    TORCH_LOAD_SECONDS (30), a LOAD line each second. Before and after,
    the same 20 steps from the same start give bit-identical losses:
    whatever ran beside it meanwhile changed nothing of this tenant's."""
    seconds = float(os.environ.get("TORCH_LOAD_SECONDS", "30"))
    torch.manual_seed(11)
    width, batch = 4096, 4096
    net = torch.nn.Sequential(*[m for _ in range(3) for m in
                                (torch.nn.Linear(width, width), torch.nn.ReLU())],
                              torch.nn.Linear(width, 1)).to(dev, torch.bfloat16)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device=dev, dtype=torch.bfloat16)
    y = x[:, :8].float().sum(1, keepdim=True).sin()
    start = [p.detach().clone() for p in net.parameters()]
    loss = torch.zeros((), device=dev)

    def step():
        opt.zero_grad(set_to_none=False)
        out = torch.nn.functional.mse_loss(net(x).float(), y)
        out.backward()
        opt.step()
        loss.copy_(out.detach())

    # Warm up on a side stream, as capture wants, then capture one step.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    def run(steps):
        with torch.no_grad():
            for p, p0 in zip(net.parameters(), start):
                p.copy_(p0)
        losses = []
        for _ in range(steps):
            graph.replay()
            losses.append(loss.clone())
        return torch.stack(losses).cpu()

    before = run(20)
    # Eight steps queued at any moment (an event after each), so the GPU
    # never waits for this process and the clock stays near its work.
    queued = collections.deque()
    t0 = mark = time.monotonic()
    n = since = 0
    per_s = []
    while time.monotonic() - t0 < seconds:
        if len(queued) == 8:
            queued.popleft().synchronize()
        graph.replay()
        done = torch.cuda.Event()
        done.record()
        queued.append(done)
        n += 1
        since += 1
        now = time.monotonic()
        if now - mark >= 1.0:
            # The wall clock too, to line this tenant's seconds up with
            # what another guest did meanwhile.
            print(f"LOAD torch t={now - t0:.0f} at={time.time():.1f} steps={since} "
                  f"ms_per_step={(now - mark) * 1e3 / since:.2f}", flush=True)
            per_s.append(since / (now - mark))
            mark, since = now, 0
    torch.cuda.synchronize()
    wall = time.monotonic() - t0
    final = loss.item()
    after = run(20)
    same = torch.equal(before, after)
    ok = same and math.isfinite(final) and final < before[0]
    # Its slowest second against its median one: a stall (another
    # tenant's fault reaching this one) shows here.
    per_s.sort()
    spread = (f"; slowest second {per_s[0]:.1f} steps/s, median {per_s[len(per_s) // 2]:.1f}"
              if per_s else "")
    return ok, (f"{n} graph-replayed steps in {wall:.1f} s ({n / wall:.1f}/s){spread}, loss {final:.5f}; "
                f"20 steps from the start {'identical' if same else 'DIFFERENT'} before and after "
                f"({before[0]:.5f} -> {before[-1]:.5f})")


def check_expandable():
    """Training steps on expandable segments (PYTORCH_CUDA_ALLOC_CONF=
    expandable_segments:True, which the caller sets before PyTorch starts):
    the allocator grows its segments with the driver's virtual memory
    functions, the loss matches the CPU's, and empty_cache() gives the
    memory back to the device."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:True" not in conf:
        return False, "run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    # cuBLAS's handle and workspace first: they stay.
    train(dev, 1)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free0, _ = torch.cuda.mem_get_info()
    reserved0 = torch.cuda.memory_reserved()
    big = torch.empty(64 << 20, dtype=torch.uint8, device=dev).fill_(3)
    gpu = train(dev, 50)
    snap = torch.cuda.memory_snapshot()
    expandable = [s for s in snap if s.get("is_expandable")]
    peak = torch.cuda.memory_reserved()
    took = int(big[-1].item()) == 3
    del big
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free1, _ = torch.cuda.mem_get_info()
    cpu = train("cpu", 50)
    err = (gpu[-1] - cpu[-1]).abs().item() / cpu[-1].abs().item()
    back = free1 >= free0
    ok = (took and bool(expandable) and err <= 2e-2 and back
          and torch.cuda.memory_reserved() <= reserved0)
    return ok, (f"{len(expandable)} expandable segment(s), {peak >> 20} MiB reserved at the "
                f"peak; loss {gpu[-1]:.5f} (CPU {cpu[-1]:.5f}); free {free0 >> 20} -> "
                f"{free1 >> 20} MiB after empty_cache()")


CHECKS = {
    "device": check_device,
    "mem_get_info": check_mem_get_info,
    "tensor-ops": check_tensor_ops,
    "matmul-fp32": check_matmul(torch.float32, 1e-3),
    "matmul-bf16": check_matmul(torch.bfloat16, 3e-2),
    "conv2d": check_conv2d,
    "autograd": check_autograd,
    "training": check_training,
    "events": check_events,
    "streams": check_streams,
    "graphs": check_graphs,
    "oom": check_oom,
    # Not among the default checks: a load for the two-guest share runs,
    # two devices, and expandable segments (an environment of its own).
    "train_load": check_train_load,
    "two_devices": check_two_devices,
    "expandable": check_expandable,
}


def bench_matmul():
    n = 8192
    for dtype in (torch.bfloat16, torch.float32):
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        a @ b
        torch.cuda.synchronize()
        iters = 20 if dtype == torch.bfloat16 else 5
        t = time.monotonic()
        for _ in range(iters):
            a @ b
        torch.cuda.synchronize()
        tf = 2 * n ** 3 * iters / (time.monotonic() - t) / 1e12
        print(f"BENCH torch-matmul n={n} dtype={str(dtype)[6:]} tflops={tf:.1f}", flush=True)
        del a, b
    torch.cuda.empty_cache()


def bench_mlp():
    width, batch, layers = 8192, 8192, 4
    need = 6 * layers * width * width * 2
    if torch.cuda.mem_get_info()[1] < need:
        print(f"  bench mlp skipped: needs {need >> 20} MiB", flush=True)
        return
    torch.manual_seed(8)
    net = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    net = net.to(dev, torch.bfloat16)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=dev, dtype=torch.bfloat16)

    def step():
        opt.zero_grad(set_to_none=True)
        net(x).float().square().mean().backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    iters = 20
    t = time.monotonic()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    dt = (time.monotonic() - t) / iters
    print(f"BENCH torch-mlp-train width={width} batch={batch} layers={layers} bf16 "
          f"steps_per_s={1 / dt:.2f} ms_per_step={dt * 1e3:.2f}", flush=True)
    del net, opt, x
    torch.cuda.empty_cache()


def bench_small():
    torch.manual_seed(9)
    net = torch.nn.Sequential(*[m for _ in range(8)
                                for m in (torch.nn.Linear(256, 256), torch.nn.GELU())]).to(dev)
    x = torch.randn(1, 256, device=dev)
    with torch.no_grad():
        for _ in range(5):
            net(x)
        torch.cuda.synchronize()
        iters = 100
        t = time.monotonic()
        for _ in range(iters):
            net(x)
        # Until here the CPU only queued the work: if this is most of
        # the step, the step waits for the CPU, not for the GPU.
        queued = (time.monotonic() - t) / iters
        torch.cuda.synchronize()
    dt = (time.monotonic() - t) / iters
    print(f"BENCH torch-small-batch1 kernels_per_step=16 ms_per_step={dt * 1e3:.3f} "
          f"ms_to_queue={queued * 1e3:.3f}", flush=True)


def main():
    global failed
    names = sys.argv[1:] or [n for n in CHECKS
                             if n not in ("train_load", "two_devices", "expandable")]
    # "bench" among the names runs the benchmarks, whatever TORCH_BENCH
    # says; "bench_small" (and so on) one of them.
    benches = [bench_matmul, bench_mlp, bench_small]
    chosen = [b for b in benches if b.__name__ in names]
    if not chosen and (os.environ.get("TORCH_BENCH") == "1" or "bench" in names):
        chosen = benches
    names = [n for n in names if n != "bench" and not n.startswith("bench_")]
    if names or not chosen:
        failed += run_checks("torch", CHECKS, names)
    if chosen:
        for b in chosen:
            try:
                b()
            except Exception as e:
                failed += 1
                print(f"FAIL torch-{b.__name__} {type(e).__name__}: {e}", flush=True)
    return 1 if failed else 0


sys.exit(main())
