//! vgpu-sgemm: `C = alpha * A * B + beta * C` on a vgpu device, checked
//! against the CPU.

use std::time::Instant;

use clap::Parser;
use vgpu_guest::vgpu_abi::SgemmParams;
use vgpu_guest_tools::reference;
use vgpu_guest_tools::sample::{self, ms};

/// Runs sgemm_f32 on random matrices and compares with a CPU reference.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    common: sample::Common,
    /// Rows of A and C.
    #[arg(short, default_value_t = 256)]
    m: u32,
    /// Columns of B and C.
    #[arg(short, default_value_t = 256)]
    n: u32,
    /// Columns of A, rows of B.
    #[arg(short, default_value_t = 256)]
    k: u32,
    /// Scale of A * B.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    alpha: f32,
    /// Scale of C.
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    beta: f32,
    /// Launches for the timing (the check uses the first).
    #[arg(long, default_value_t = 1)]
    iters: u32,
}

fn run(args: &Args) -> Result<bool, String> {
    let (m, n, k) = (
        args.m.max(1) as usize,
        args.n.max(1) as usize,
        args.k.max(1) as usize,
    );
    let (dev, mut rng) = args.common.start(
        "vgpu-sgemm",
        format_args!(
            "{m} x {n} x {k}, alpha = {}, beta = {}",
            args.alpha, args.beta
        ),
    )?;
    let (a, b, c) = (rng.f32s(m * k), rng.f32s(k * n), rng.f32s(m * n));

    let t = Instant::now();
    let alloc = |len: usize| dev.alloc(len as u64 * 4).map_err(|e| format!("alloc: {e}"));
    let (da, db, dc) = (alloc(m * k)?, alloc(k * n)?, alloc(m * n)?);
    println!("  alloc            {:9.3} ms", ms(t));

    sample::upload(&dev, &[(&da, &a), (&db, &b), (&dc, &c)])?;

    let p = SgemmParams {
        c: dc.addr(),
        a: da.addr(),
        b: db.addr(),
        m: m as u32,
        n: n as u32,
        k: k as u32,
        reserved: 0,
        alpha: args.alpha,
        beta: args.beta,
    };
    let t = Instant::now();
    let first_ns = sample::launches(&dev, &p, 1)?;
    let k_ms = ms(t);
    let flops = 2.0 * (m * n * k) as f64;
    println!(
        "  sgemm_f32        {k_ms:9.3} ms  wall, {:.3} ms device  ({:.2} GFLOP/s device)",
        first_ns as f64 / 1e6,
        flops / first_ns.max(1) as f64
    );

    let got = sample::download(&dev, &dc, m * n)?;

    if args.iters > 1 {
        // Timing only: beta 0 keeps C from growing.
        let p0 = SgemmParams { beta: 0.0, ..p };
        let t = Instant::now();
        let dev_ns = sample::launches(&dev, &p0, args.iters - 1)?;
        let it = f64::from(args.iters - 1);
        println!(
            "  {} more launches {:9.3} ms each wall, {:.3} ms device  ({:.2} GFLOP/s)",
            args.iters - 1,
            ms(t) / it,
            dev_ns as f64 / 1e6 / it,
            flops * it / dev_ns.max(1) as f64
        );
    }

    let t = Instant::now();
    let (want, scale) = reference::sgemm(m, n, k, args.alpha, &a, &b, args.beta, &c);
    let cpu = ms(t);
    println!(
        "  CPU reference    {cpu:9.3} ms  ({:.2} GFLOP/s, f64 accumulation)",
        flops / cpu / 1e6
    );
    // Error bound of a k-term f32 dot product, with margin.
    let rtol = 1e-5 * (k as f64).max(8.0);
    let (bad, worst, at) = reference::compare(&got, &want, Some(&scale), rtol, 1e-30);
    println!(
        "  max error {worst:e} at ({}, {}) (tolerance {rtol:e} * sum|alpha a b| + |beta c|), {bad} mismatch(es)",
        at / n,
        at % n
    );
    if bad > 0 {
        println!(
            "  C[{}][{}] = {} on the device, {} on the CPU",
            at / n,
            at % n,
            got[at],
            want[at]
        );
    }
    Ok(bad == 0)
}

fn main() {
    sample::finish(run(&Args::parse()));
}
