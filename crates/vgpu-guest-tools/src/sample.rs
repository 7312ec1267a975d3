//! What the sample programs (`vgpu-saxpy`, `vgpu-sgemm`) share: timed
//! copies and launches that print their figures, and the verdict.

use std::fmt;
use std::path::PathBuf;
use std::time::Instant;

use crate::reference::{bytes_f32, f32_bytes, Rng};
use vgpu_guest::{Buffer, BuiltinKernel, Device};

/// The options of every sample beside its own.
#[derive(clap::Args, Debug)]
pub struct Common {
    /// Device file.
    #[arg(long, default_value = "/dev/vgpu0")]
    pub device: PathBuf,
    /// Random seed (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl Common {
    /// Prints the heading of the run of `name` (the device, `what` and
    /// the seed, so that a run can be repeated) and opens the device;
    /// returns it with the run's random numbers.
    pub fn start(&self, name: &str, what: fmt::Arguments<'_>) -> Result<(Device, Rng), String> {
        let seed = self.seed.unwrap_or_else(Rng::seed_from_time);
        println!("{name}: {}, {what}, seed {seed}", self.device.display());
        let dev = Device::open(&self.device).map_err(|e| e.to_string())?;
        Ok((dev, Rng::new(seed)))
    }
}

/// Milliseconds since `t`.
pub fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Copies each vector to the start of its buffer; prints the time and
/// rate of them all.
pub fn upload(dev: &Device, copies: &[(&Buffer, &[f32])]) -> Result<(), String> {
    let t = Instant::now();
    for (buf, v) in copies {
        dev.copy_to_device(buf, 0, &f32_bytes(v))
            .map_err(|e| format!("copy to device: {e}"))?;
    }
    let up = ms(t);
    let bytes: usize = copies.iter().map(|(_, v)| v.len() * 4).sum();
    println!(
        "  copy to device   {up:9.3} ms  ({:.1} MB/s)",
        bytes as f64 / up / 1e3
    );
    Ok(())
}

/// Copies `len` floats back from the start of `buf`; prints the time and
/// rate.
pub fn download(dev: &Device, buf: &Buffer, len: usize) -> Result<Vec<f32>, String> {
    let t = Instant::now();
    let mut out = vec![0u8; len * 4];
    dev.copy_from_device(buf, 0, &mut out)
        .map_err(|e| format!("copy from device: {e}"))?;
    let down = ms(t);
    println!(
        "  copy from device {down:9.3} ms  ({:.1} MB/s)",
        out.len() as f64 / down / 1e3
    );
    Ok(bytes_f32(&out))
}

/// Runs the kernel of `params` `count` times in a row; returns their
/// device time, ns.
pub fn launches<K: BuiltinKernel>(dev: &Device, params: &K, count: u32) -> Result<u64, String> {
    let mut device_ns = 0;
    for _ in 0..count {
        device_ns += dev
            .run_kernel(params)
            .map_err(|e| format!("{}: {e}", K::ENTRY))?
            .device_ns;
    }
    Ok(device_ns)
}

/// Prints the verdict of a run and exits with status 1 unless it passed.
pub fn finish(outcome: Result<bool, String>) {
    match outcome {
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
