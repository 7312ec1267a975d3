//! The built-in kernels, checked against the CPU, and the checks of their launches.

use vgpu_guest::vgpu_abi::{
    CopyParams, FillParams, ReduceSumParams, SaxpyParams, SgemmParams, VaddParams,
};
use vgpu_guest::{sys, ByteValued, Device, Dims, Error};
use vgpu_guest_tools::reference;

use crate::{Args, CaseResult};

use super::{download_f32, expect_errno, open, read_back, rng, same, upload_f32, words, Ctx};

pub(super) fn kernel_fill(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let n = 100_003u64;
    let buf = dev.alloc(n * 4).ctx("alloc")?;
    let p = FillParams {
        dst: buf.addr(),
        count: n - 3,
        value: 0x1234_5678,
        reserved: 0,
    };
    let r = dev.run_kernel(&p).ctx("fill_u32")?;
    let back = read_back(&dev, &buf)?;
    for (i, w) in words(&back).enumerate() {
        let want = if (i as u64) < n - 3 { 0x1234_5678 } else { 0 };
        ensure!(w == want, "word {i}: {w:#x}, expected {want:#x}");
    }
    Ok(format!("{} words, device {} us", n - 3, r.device_ns / 1000))
}

pub(super) fn kernel_copy(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let n = 262_147u64;
    let src = dev.alloc(n).ctx("alloc")?;
    let dst = dev.alloc(n + 5).ctx("alloc")?;
    let data = rng(21).bytes(n as usize);
    dev.copy_to_device(&src, 0, &data).ctx("copy to device")?;
    let r = dev
        .run_kernel(&CopyParams {
            dst: dst.addr(),
            src: src.addr(),
            bytes: n,
        })
        .ctx("copy")?;
    let back = read_back(&dev, &dst)?;
    same(&back[..n as usize], &data, "copied bytes")?;
    ensure!(
        back[n as usize..].iter().all(|b| *b == 0),
        "bytes past the copy changed"
    );
    Ok(format!("{n} bytes, device {} us", r.device_ns / 1000))
}

pub(super) fn kernel_vadd(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let n = 65_537usize;
    let mut r = rng(22);
    let (a, b) = (r.f32s(n), r.f32s(n));
    let da = upload_f32(&dev, &a)?;
    let db = upload_f32(&dev, &b)?;
    let dc = dev.alloc(n as u64 * 4).ctx("alloc")?;
    let res = dev
        .run_kernel(&VaddParams {
            c: dc.addr(),
            a: da.addr(),
            b: db.addr(),
            n: n as u64,
        })
        .ctx("vadd_f32")?;
    let got = download_f32(&dev, &dc)?;
    let want = reference::vadd(&a, &b);
    let (bad, worst, at) = reference::compare(&got, &want, None, 1e-6, 1e-7);
    ensure!(bad == 0, "{bad} of {n} differ, worst {worst:e} at {at}");
    Ok(format!(
        "n={n}, max error {worst:e}, device {} us",
        res.device_ns / 1000
    ))
}

pub(super) fn kernel_saxpy(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let n = 65_537usize;
    let mut r = rng(23);
    let (x, mut y) = (r.f32s(n), r.f32s(n));
    let a = 1.75f32;
    let dx = upload_f32(&dev, &x)?;
    let dy = upload_f32(&dev, &y)?;
    let res = dev
        .run_kernel(&SaxpyParams {
            y: dy.addr(),
            x: dx.addr(),
            n: n as u64,
            a,
            reserved: 0,
        })
        .ctx("saxpy_f32")?;
    let got = download_f32(&dev, &dy)?;
    reference::saxpy(a, &x, &mut y);
    let (bad, worst, at) = reference::compare(&got, &y, None, 1e-6, 1e-6);
    ensure!(bad == 0, "{bad} of {n} differ, worst {worst:e} at {at}");
    Ok(format!(
        "n={n}, max error {worst:e}, device {} us",
        res.device_ns / 1000
    ))
}

fn sgemm_check(
    dev: &Device,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
    tag: u64,
) -> Result<(f64, u64), String> {
    let mut r = rng(tag);
    let (a, b, c) = (r.f32s(m * k), r.f32s(k * n), r.f32s(m * n));
    let da = upload_f32(dev, &a)?;
    let db = upload_f32(dev, &b)?;
    let dc = upload_f32(dev, &c)?;
    let res = dev
        .run_kernel(&SgemmParams {
            c: dc.addr(),
            a: da.addr(),
            b: db.addr(),
            m: m as u32,
            n: n as u32,
            k: k as u32,
            reserved: 0,
            alpha,
            beta,
        })
        .ctx("sgemm_f32")?;
    let got = download_f32(dev, &dc)?;
    let (want, scale) = reference::sgemm(m, n, k, alpha, &a, &b, beta, &c);
    let (bad, worst, at) =
        reference::compare(&got, &want, Some(&scale), 1e-5 * (k as f64).max(8.0), 1e-30);
    ensure!(
        bad == 0,
        "{m}x{n}x{k} alpha {alpha} beta {beta}: {bad} of {} differ, worst {worst:e} at ({}, {})",
        m * n,
        at / n,
        at % n
    );
    Ok((worst, res.device_ns))
}

pub(super) fn kernel_sgemm(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let (w1, ns1) = sgemm_check(&dev, 37, 53, 29, 1.5, -0.5, 24)?;
    let (w2, _) = sgemm_check(&dev, 64, 64, 64, 1.0, 0.0, 25)?;
    let (w3, _) = sgemm_check(&dev, 1, 1, 1, 2.0, 1.0, 26)?;
    // beta = 0: C is not read, so NaNs in it do not leak into the result.
    let (m, n, k) = (8usize, 8usize, 8usize);
    let a = dev.alloc((m * k * 4) as u64).ctx("alloc")?;
    let b = dev.alloc((k * n * 4) as u64).ctx("alloc")?;
    let c = dev.alloc((m * n * 4) as u64).ctx("alloc")?;
    dev.fill(&a, 0, a.size(), 1.0f32.to_bits()).ctx("fill")?;
    dev.fill(&b, 0, b.size(), 0.5f32.to_bits()).ctx("fill")?;
    dev.fill(&c, 0, c.size(), 0x7fc0_0000).ctx("fill NaN")?;
    dev.run_kernel(&SgemmParams {
        c: c.addr(),
        a: a.addr(),
        b: b.addr(),
        m: m as u32,
        n: n as u32,
        k: k as u32,
        reserved: 0,
        alpha: 1.0,
        beta: 0.0,
    })
    .ctx("sgemm_f32 beta 0")?;
    let got = download_f32(&dev, &c)?;
    ensure!(
        got.iter().all(|v| *v == 4.0),
        "beta 0 over NaN: {:?}",
        &got[..4]
    );
    Ok(format!(
        "37x53x29, 64^3, 1^3, beta 0 over NaN; max error {:e}; device {} us",
        w1.max(w2).max(w3),
        ns1 / 1000
    ))
}

pub(super) fn kernel_reduce(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let n = 100_003usize;
    let v = rng(27).f32s(n);
    let d = upload_f32(&dev, &v)?;
    let out = dev.alloc(4).ctx("alloc")?;
    let res = dev
        .run_kernel(&ReduceSumParams {
            out: out.addr(),
            input: d.addr(),
            n: n as u64,
        })
        .ctx("reduce_sum_f32")?;
    let got = f64::from(download_f32(&dev, &out)?[0]);
    let want = reference::reduce_sum(&v);
    let abs: f64 = v.iter().map(|x| f64::from(x.abs())).sum();
    let tol = 1e-3 * abs;
    ensure!(
        (got - want).abs() <= tol,
        "sum {got}, expected {want} (tolerance {tol:e})"
    );
    Ok(format!(
        "n={n}, sum {got:.4} vs {want:.4}, error {:e}, device {} us",
        (got - want).abs(),
        res.device_ns / 1000
    ))
}

/// The driver's and device's checks of built-in launches.
pub(super) fn kernel_checks(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let x = dev.alloc(4096).ctx("alloc")?;
    let y = dev.alloc(4096).ctx("alloc")?;
    let ok = SaxpyParams {
        y: y.addr(),
        x: x.addr(),
        n: 1024,
        a: 1.0,
        reserved: 0,
    };
    dev.run_kernel(&ok).ctx("valid saxpy")?;
    expect_errno(
        dev.launch_builtin("no_such_kernel", &ok),
        libc::ENOENT,
        "unknown entry point",
    )?;
    expect_errno(
        dev.launch_builtin_bytes("saxpy_f32", Dims::default(), &ok.as_slice()[..24]),
        libc::EINVAL,
        "short parameter block",
    )?;
    expect_errno(
        dev.run_kernel(&SaxpyParams { n: 1025, ..ok }),
        libc::ERANGE,
        "saxpy past the end of y",
    )?;
    expect_errno(
        dev.run_kernel(&SaxpyParams { x: 0x10, ..ok }),
        libc::ENOENT,
        "saxpy on an address not allocated",
    )?;
    let freed = dev.alloc(4096).ctx("alloc")?;
    let freed_addr = freed.addr();
    drop(freed);
    expect_errno(
        dev.run_kernel(&SaxpyParams {
            y: freed_addr,
            ..ok
        }),
        libc::ENOENT,
        "saxpy on freed memory",
    )?;
    expect_errno(
        dev.run_kernel(&SgemmParams {
            c: y.addr(),
            a: x.addr(),
            b: x.addr(),
            m: 1 << 20,
            n: 1 << 20,
            k: 1,
            ..Default::default()
        }),
        libc::ERANGE,
        "sgemm larger than its buffers",
    )?;
    // Launch shapes are checked by the device: the command fails.
    let bad_shapes = [
        Dims {
            grid: [0, 1, 1],
            ..Dims::default()
        },
        Dims {
            block: [2048, 1, 1],
            ..Dims::default()
        },
        Dims {
            grid: [1, 70_000, 1],
            ..Dims::default()
        },
    ];
    for d in bad_shapes {
        match dev.launch_builtin_dims("saxpy_f32", d, &ok) {
            Err(Error::Command { status, source, .. }) => ensure!(
                status == sys::CMD_STATUS_INVALID && source.errno() == libc::EINVAL,
                "shape {d:?}: status {status}, {source}"
            ),
            other => {
                return Err(format!(
                    "shape {d:?}: {other:?}, expected a failed command (INVALID)"
                ))
            }
        }
    }
    // An entry name without its NUL.
    let mut args_l = sys::VgpuLaunchArgs {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        ..Default::default()
    };
    args_l.entry = [b'a'; 32];
    let mut cmd = [sys::VgpuCmd::launch(args_l)];
    // SAFETY: the command has no user pointers (no parameter block).
    let r = unsafe { dev.run_raw(&mut cmd) };
    expect_errno(r, libc::EINVAL, "entry name without NUL")?;
    dev.run_kernel(&ok).ctx("saxpy after the failures")?;
    Ok("ENOENT entry/address, EINVAL params/name, ERANGE ranges, INVALID shapes".into())
}

/// nvcc's tiled matrix multiply, loaded as PTX (on the software backend
/// the PTX executor runs it; on a GPU its driver), against the CPU.
const MATMUL_PTX: &str = include_str!("../../../../../vgpu-ptx/tests/corpus/matmul.ptx");

/// `ptx` declaring PTX ISA 8.0: the corpus comes from a newer nvcc than
/// some drivers accept, and uses nothing newer.
fn portable(ptx: &str) -> Vec<u8> {
    ptx.lines()
        .map(|l| {
            if l.trim_start().starts_with(".version") {
                ".version 8.0"
            } else {
                l
            }
        })
        .flat_map(|l| l.bytes().chain(std::iter::once(b'\n')))
        .collect()
}

/// Loads `ptx` (nvcc's matmul, perhaps renamed), or says why this
/// backend does not run loaded modules.
fn load_matmul(dev: &Device, ptx: &[u8]) -> Result<Result<vgpu_guest::Module, String>, String> {
    match dev.module_load(ptx) {
        Ok(m) => Ok(Ok(m)),
        Err(e) if e.errno() == libc::EOPNOTSUPP => Ok(Err(
            "this backend does not run loaded modules (EOPNOTSUPP)".into(),
        )),
        Err(e) => Err(format!("MODULE_LOAD of nvcc's matmul: {e}")),
    }
}

/// Runs a 96x96 matmul through `launch` and checks it against the CPU;
/// returns the device time.
fn run_matmul(
    dev: &Device,
    launch: impl FnOnce(Dims, &[u8]) -> vgpu_guest::Result<vgpu_guest::CmdResult>,
) -> Result<u64, String> {
    let n = 96usize;
    let mut r = rng(31);
    let a = r.f32s(n * n);
    let b = r.f32s(n * n);
    let (da, db) = (upload_f32(dev, &a)?, upload_f32(dev, &b)?);
    let dc = dev.alloc((n * n * 4) as u64).ctx("alloc")?;
    let mut params = Vec::new();
    for p in [da.addr(), db.addr(), dc.addr()] {
        params.extend_from_slice(&p.to_le_bytes());
    }
    params.extend_from_slice(&(n as u32).to_le_bytes());
    let tiles = n.div_ceil(16) as u32;
    let dims = Dims {
        grid: [tiles, tiles, 1],
        block: [16, 16, 1],
        shared_mem: 0,
    };
    let res = launch(dims, &params).ctx("launch of matmul")?;
    let c = download_f32(dev, &dc)?;
    // C = A * B: sgemm with alpha 1 and beta 0, within 1e-4 * (1 + |C|).
    let (want, _) = reference::sgemm(n, n, n, 1.0, &a, &b, 0.0, &vec![0.0; n * n]);
    let (bad, _, at) = reference::compare(&c, &want, None, 1e-4, 1e-4);
    ensure!(
        bad == 0,
        "{bad} of {} differ, worst C[{}][{}] = {}, expected {}",
        n * n,
        at / n,
        at % n,
        c[at],
        want[at]
    );
    Ok(res.device_ns)
}

pub(super) fn module_matmul(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let m = match load_matmul(&dev, &portable(MATMUL_PTX))? {
        Ok(m) => m,
        Err(why) => return Ok(why),
    };
    let ns = run_matmul(&dev, |dims, params| dev.launch(&m, "matmul", dims, params))?;
    Ok(format!("96x96 from nvcc's PTX, device {} us", ns / 1000))
}

/// A C++ kernel's mangled name: longer than a LAUNCH's name field.
const LONG_NAME: &str =
    "_ZN4vgpu5tests41a_kernel_whose_name_is_longer_than_a_launchILi16EEEvPKfS3_Pfi";

/// FUNC_INFO: the device describes a kernel of the process's module (the
/// layout nvcc's matmul declares, its static shared memory), and its
/// handle launches it whatever the length of its name; the driver refuses
/// what is not the process's own.
pub(super) fn module_function(args: &Args) -> CaseResult {
    let dev = open(args)?;
    if dev.cached_info().flags & sys::INFO_FUNC_INFO == 0 {
        return Ok("the device has no FUNC_INFO".into());
    }
    let ptx = String::from_utf8(portable(MATMUL_PTX))
        .map_err(|e| e.to_string())?
        .replace("matmul", LONG_NAME);
    let m = match load_matmul(&dev, ptx.as_bytes())? {
        Ok(m) => m,
        Err(why) => return Ok(why),
    };
    let f = dev.function(&m, LONG_NAME).ctx("FUNC_INFO")?;
    let layout: Vec<(u32, u32)> = f.params.iter().map(|p| (p.offset, p.size)).collect();
    ensure!(
        layout == [(0, 8), (8, 8), (16, 8), (24, 4)] && f.info.params_size == 28,
        "parameters {layout:?} ({} bytes)",
        f.info.params_size
    );
    // Two 16x16 tiles of floats.
    ensure!(
        f.info.shared_static >= 2048 && f.info.max_threads >= 256,
        "attributes {:?}",
        f.info
    );
    let again = dev.function(&m, LONG_NAME).ctx("FUNC_INFO again")?;
    ensure!(
        again.handle == f.handle,
        "a second look-up gave another handle"
    );
    expect_errno(
        dev.function(&m, "no_such_kernel"),
        libc::ENOENT,
        "unknown entry",
    )?;
    let ns = run_matmul(&dev, |dims, params| dev.launch_function(&f, dims, params))?;
    let clusters = occupancy(&dev, &f)?;

    // Another process's module, the built-in module, a forged handle.
    let forged = vgpu_guest::Function {
        handle: f.handle + 1000,
        ..f.clone()
    };
    expect_errno(
        dev.launch_function(&forged, Dims::default(), &[0; 28]),
        libc::ENOENT,
        "launch of a forged function handle",
    )?;
    let builtin = vgpu_guest::Function {
        module: sys::MODULE_BUILTIN_ID,
        ..f.clone()
    };
    expect_errno(
        dev.launch_function(&builtin, Dims::default(), &[0; 28]),
        libc::EINVAL,
        "launch by handle in the built-in module",
    )?;
    let other = open(args)?;
    expect_errno(
        other.launch_function(&f, Dims::default(), &[0; 28]),
        libc::ENOENT,
        "launch of another file's function",
    )?;
    if dev.cached_info().flags & sys::INFO_OCCUPANCY != 0 {
        expect_errno(
            other.max_active_clusters(&f, [256, 1, 1], 0, [1, 1, 1]),
            libc::ENOENT,
            "occupancy of another file's function",
        )?;
        expect_errno(
            dev.max_active_clusters(&forged, [256, 1, 1], 0, [1, 1, 1]),
            libc::ENOENT,
            "occupancy of a forged function handle",
        )?;
    }
    Ok(format!(
        "{}-byte name, 4 parameters, {} bytes static shared; device {} us; {clusters}",
        LONG_NAME.len(),
        f.info.shared_static,
        ns / 1000
    ))
}

/// OCCUPANCY of `f`: at least one block of 256 threads fits, no more
/// clusters of two than blocks alone, and a block the kernel refuses is
/// invalid.
fn occupancy(dev: &Device, f: &vgpu_guest::Function) -> Result<String, String> {
    if dev.cached_info().flags & sys::INFO_OCCUPANCY == 0 {
        return Ok("no OCCUPANCY".into());
    }
    let alone = dev
        .max_active_clusters(f, [256, 1, 1], 0, [1, 1, 1])
        .ctx("OCCUPANCY")?;
    let pairs = dev
        .max_active_clusters(f, [256, 1, 1], 0, [2, 1, 1])
        .ctx("OCCUPANCY of clusters of two")?;
    ensure!(
        alone >= 1 && pairs <= alone,
        "{alone} blocks and {pairs} pairs resident"
    );
    expect_errno(
        dev.max_active_clusters(f, [2048, 1, 1], 0, [1, 1, 1]),
        libc::EINVAL,
        "occupancy of 2048-thread blocks",
    )?;
    Ok(format!("{alone} blocks or {pairs} pairs resident"))
}

/// A module with a `__device__` array, as nvcc writes it.
const GLOBAL_PTX: &str = include_str!("../../../../../vgpu-ptx/tests/corpus/global.ptx");

/// FUNC_INFO of a global: where the backend placed a module variable;
/// the file may copy to and from it (cudaMemcpyToSymbol) but not free
/// it, and it goes with its module. Backends that keep module variables
/// out of device memory refuse the look-up.
pub(super) fn module_global(args: &Args) -> CaseResult {
    let dev = open(args)?;
    if dev.cached_info().flags & sys::INFO_FUNC_INFO == 0 {
        return Ok("the device has no FUNC_INFO".into());
    }
    let m = match load_matmul(&dev, GLOBAL_PTX.as_bytes())? {
        Ok(m) => m,
        Err(why) => return Ok(why),
    };
    let (addr, size) = match dev.global(&m, "table") {
        Err(e) if e.errno() == libc::EOPNOTSUPP => {
            expect_errno(dev.global(&m, "x"), libc::EOPNOTSUPP, "another global")?;
            return Ok(
                "this backend keeps module variables out of device memory (EOPNOTSUPP)".into(),
            );
        }
        r => r.ctx("FUNC_INFO of a global")?,
    };
    ensure!(size == 64, "table is {size} bytes");
    let data: Vec<u8> = (0..64).collect();
    dev.copy_to_device_addr(addr, &data)
        .ctx("copy to the global")?;
    let mut back = vec![0u8; 64];
    dev.copy_from_device_addr(addr, &mut back)
        .ctx("copy from the global")?;
    ensure!(back == data, "the global reads back {back:?}");
    expect_errno(dev.free_raw(addr), libc::EINVAL, "FREE of a global")?;
    expect_errno(
        dev.global(&m, "no_such_global"),
        libc::ENOENT,
        "unknown global",
    )?;
    drop(m);
    expect_errno(
        dev.copy_to_device_addr(addr, &data),
        libc::ENOENT,
        "copy to the global of an unloaded module",
    )?;
    Ok(format!("{size} bytes at {addr:#x}, copied both ways"))
}

/// A kernel calling `printf`, as nvcc lays it out.
const PRINTF_PTX: &str = include_str!("../../../../../vgpu-ptx/tests/corpus/printf.ptx");

/// CONSOLE: a module that prints says so at load; what its kernels
/// print comes back once, in pieces of the buffer given, to the file that
/// loaded it and no other.
pub(super) fn console(args: &Args) -> CaseResult {
    const THREADS: u32 = 40;
    let dev = open(args)?;
    if dev.cached_info().flags & sys::INFO_CONSOLE == 0 {
        return Ok("the device has no CONSOLE".into());
    }
    let m = match load_matmul(&dev, PRINTF_PTX.as_bytes())? {
        Ok(m) => m,
        Err(why) => return Ok(why),
    };
    ensure!(m.prints(), "MODULE_LOAD did not say the module prints");
    let f = dev.function(&m, "say").ctx("FUNC_INFO of say")?;
    let out = dev.alloc(u64::from(THREADS) * 4).ctx("ALLOC")?;
    // Smaller than the output: it comes in pieces.
    let piece = 256;
    let dims = Dims {
        grid: [1, 1, 1],
        block: [THREADS, 1, 1],
        shared_mem: 0,
    };
    dev.launch_function(&f, dims, &out.addr().to_le_bytes())
        .ctx("LAUNCH of say")?;
    let (text, dropped) = dev.console(&m, piece).ctx("CONSOLE")?;
    let mut got: Vec<String> = String::from_utf8_lossy(&text)
        .lines()
        .map(str::to_string)
        .collect();
    got.sort();
    let mut want: Vec<String> = (0..THREADS)
        .map(|t| format!("thread {t} of {THREADS}: 1.500000 ok"))
        .collect();
    want.sort();
    ensure!(
        got == want && dropped == 0,
        "printed {text:?}, {dropped} bytes dropped"
    );
    let (again, _) = dev.console(&m, piece).ctx("CONSOLE again")?;
    ensure!(again.is_empty(), "the output came twice: {again:?}");
    // Another file's module is not this file's to read.
    dev.launch_function(&f, dims, &out.addr().to_le_bytes())
        .ctx("LAUNCH of say")?;
    let other = open(args)?;
    expect_errno(
        other.console(&m, piece),
        libc::ENOENT,
        "CONSOLE of another file's module",
    )?;
    let (text, _) = dev.console(&m, piece).ctx("CONSOLE after the refusal")?;
    ensure!(
        text.len() == want.iter().map(|l| l.len() + 1).sum::<usize>(),
        "{} bytes after another file's refused CONSOLE",
        text.len()
    );
    Ok(format!(
        "{THREADS} lines, {} bytes in pieces of 256; refused to another file",
        text.len()
    ))
}
