//! vgpu-saxpy: `y = a * x + y` on a vgpu device, checked against the CPU.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use vgpu_guest::reference::{self, bytes_f32, f32_bytes, Rng};
use vgpu_guest::vgpu_abi::SaxpyParams;
use vgpu_guest::Device;

/// Runs saxpy_f32 on random vectors and compares with a CPU reference.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Device file.
    #[arg(long, default_value = "/dev/vgpu0")]
    device: PathBuf,
    /// Elements.
    #[arg(short, long, default_value_t = 1 << 20)]
    n: usize,
    /// Scale.
    #[arg(short, long, default_value_t = 2.0, allow_negative_numbers = true)]
    a: f32,
    /// Launches (y accumulates: y + iters * a * x).
    #[arg(long, default_value_t = 1)]
    iters: u32,
    /// Random seed (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn run(args: &Args) -> Result<bool, String> {
    let seed = args.seed.unwrap_or_else(Rng::seed_from_time);
    let n = args.n.max(1);
    let bytes = n as u64 * 4;
    println!(
        "vgpu-saxpy: {}, n = {n}, a = {}, {} launch(es), seed {seed}",
        args.device.display(),
        args.a,
        args.iters
    );
    let mut rng = Rng::new(seed);
    let x = rng.f32s(n);
    let mut y = rng.f32s(n);

    let dev = Device::open(&args.device).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let dx = dev.alloc(bytes).map_err(|e| format!("alloc: {e}"))?;
    let dy = dev.alloc(bytes).map_err(|e| format!("alloc: {e}"))?;
    println!("  alloc            {:9.3} ms  (2 x {} bytes)", ms(t), bytes);

    let t = Instant::now();
    dev.copy_to_device(&dx, 0, &f32_bytes(&x))
        .and_then(|_| dev.copy_to_device(&dy, 0, &f32_bytes(&y)))
        .map_err(|e| format!("copy to device: {e}"))?;
    let up = ms(t);
    println!(
        "  copy to device   {up:9.3} ms  ({:.1} MB/s)",
        2.0 * bytes as f64 / up / 1e3
    );

    let p = SaxpyParams {
        y: dy.addr(),
        x: dx.addr(),
        n: n as u64,
        a: args.a,
        reserved: 0,
    };
    let t = Instant::now();
    let mut dev_ns = 0;
    for _ in 0..args.iters {
        dev_ns += dev
            .run_kernel(&p)
            .map_err(|e| format!("saxpy_f32: {e}"))?
            .device_ns;
    }
    let k = ms(t);
    let flops = 2.0 * n as f64 * f64::from(args.iters);
    println!(
        "  saxpy_f32        {k:9.3} ms  wall, {:.3} ms device  ({:.2} GFLOP/s device)",
        dev_ns as f64 / 1e6,
        flops / (dev_ns.max(1) as f64)
    );

    let t = Instant::now();
    let mut out = vec![0u8; bytes as usize];
    dev.copy_from_device(&dy, 0, &mut out)
        .map_err(|e| format!("copy from device: {e}"))?;
    let down = ms(t);
    println!(
        "  copy from device {down:9.3} ms  ({:.1} MB/s)",
        bytes as f64 / down / 1e3
    );

    let t = Instant::now();
    for _ in 0..args.iters {
        reference::saxpy(args.a, &x, &mut y);
    }
    println!("  CPU reference    {:9.3} ms", ms(t));
    let got = bytes_f32(&out);
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
    let args = Args::parse();
    match run(&args) {
        Ok(true) => println!("PASS"),
        Ok(false) => {
            println!("FAIL");
            std::process::exit(1);
        }
        Err(e) => {
            println!("FAIL: {e}");
            std::process::exit(1);
        }
    }
}
