//! vgpu-saxpy: `y = a * x + y` on a vgpu device, checked against the CPU.

use std::time::Instant;

use clap::Parser;
use vgpu_guest::vgpu_abi::SaxpyParams;
use vgpu_guest_tools::reference;
use vgpu_guest_tools::sample::{self, ms};

/// Runs saxpy_f32 on random vectors and compares with a CPU reference.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    #[command(flatten)]
    common: sample::Common,
    /// Elements.
    #[arg(short, long, default_value_t = 1 << 20)]
    n: usize,
    /// Scale.
    #[arg(short, long, default_value_t = 2.0, allow_negative_numbers = true)]
    a: f32,
    /// Launches (y accumulates: y + iters * a * x).
    #[arg(long, default_value_t = 1)]
    iters: u32,
}

fn run(args: &Args) -> Result<bool, String> {
    let n = args.n.max(1);
    let bytes = n as u64 * 4;
    let (dev, mut rng) = args.common.start(
        "vgpu-saxpy",
        format_args!("n = {n}, a = {}, {} launch(es)", args.a, args.iters),
    )?;
    let x = rng.f32s(n);
    let mut y = rng.f32s(n);

    let t = Instant::now();
    let dx = dev.alloc(bytes).map_err(|e| format!("alloc: {e}"))?;
    let dy = dev.alloc(bytes).map_err(|e| format!("alloc: {e}"))?;
    println!("  alloc            {:9.3} ms  (2 x {} bytes)", ms(t), bytes);

    sample::upload(&dev, &[(&dx, &x), (&dy, &y)])?;

    let p = SaxpyParams {
        y: dy.addr(),
        x: dx.addr(),
        n: n as u64,
        a: args.a,
        reserved: 0,
    };
    let t = Instant::now();
    let dev_ns = sample::launches(&dev, &p, args.iters)?;
    let k = ms(t);
    let flops = 2.0 * n as f64 * f64::from(args.iters);
    println!(
        "  saxpy_f32        {k:9.3} ms  wall, {:.3} ms device  ({:.2} GFLOP/s device)",
        dev_ns as f64 / 1e6,
        flops / (dev_ns.max(1) as f64)
    );

    let got = sample::download(&dev, &dy, n)?;

    let t = Instant::now();
    for _ in 0..args.iters {
        reference::saxpy(args.a, &x, &mut y);
    }
    println!("  CPU reference    {:9.3} ms", ms(t));
    let (rtol, atol) = (1e-6 * f64::from(args.iters.max(1)), 1e-6);
    let (bad, worst, at) = reference::compare(&got, &y, None, rtol, atol);
    println!(
        "  max error {worst:e} at {at} (tolerance {atol:e} + {rtol:e} * |y|), {bad} mismatch(es)"
    );
    if bad > 0 {
        println!(
            "  y[{at}] = {} on the device, {} on the CPU",
            got[at], y[at]
        );
    }
    Ok(bad == 0)
}

fn main() {
    sample::finish(run(&Args::parse()));
}
