//! The checks, one file per topic; the helpers they share are here.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use vgpu_guest::{errno_name, Buffer, Device};
use vgpu_guest_tools::reference::{bytes_f32, f32_bytes, Rng};

use crate::{Args, Case};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

pub fn all() -> Vec<Case> {
    macro_rules! case {
        ($name:literal, $quick:expr, $f:path) => {
            Case {
                name: $name,
                quick: $quick,
                run: $f,
            }
        };
    }
    vec![
        case!("probe", true, info::probe),
        case!("info", true, info::info),
        case!("usage", false, info::usage),
        case!("alloc-free", true, memory::alloc_free),
        case!("alloc-quota", false, memory::alloc_quota),
        case!("copy-1b", false, memory::copy_1b),
        case!("copy-4k", true, memory::copy_4k),
        case!("copy-1m", false, memory::copy_1m),
        case!("copy-unaligned", true, memory::copy_unaligned),
        case!("copy-large", false, memory::copy_large),
        case!("copy-device", false, memory::copy_device),
        case!("copy-pinned", true, memory::pinned),
        case!("fill", false, memory::fill),
        case!("kernel-fill_u32", false, kernels::kernel_fill),
        case!("kernel-copy", false, kernels::kernel_copy),
        case!("kernel-vadd_f32", false, kernels::kernel_vadd),
        case!("kernel-saxpy_f32", true, kernels::kernel_saxpy),
        case!("kernel-sgemm_f32", true, kernels::kernel_sgemm),
        case!("kernel-reduce_sum_f32", false, kernels::kernel_reduce),
        case!("kernel-checks", false, kernels::kernel_checks),
        case!("batch", true, batches::batch),
        case!("batch-errors", false, batches::batch_errors),
        case!("module", false, batches::module),
        case!("module-matmul", false, kernels::module_matmul),
        case!("module-function", false, kernels::module_function),
        case!("module-global", false, kernels::module_global),
        case!("console", false, kernels::console),
        case!("window", true, window::window),
        case!("multiprocess", false, processes::multiprocess),
        case!("fault-isolation", false, processes::fault_isolation),
        case!("bad-ioctl", false, ioctl::bad_ioctl),
        case!("process-exit", false, processes::process_exit),
        case!("isolation-write", false, isolation::isolation_write),
        case!("isolation-check", false, isolation::isolation_check),
        case!("lanes", true, lanes::lanes),
        case!("contexts", false, contexts::contexts),
        case!("vmm", false, vmm::vmm),
    ]
}

// ---- helpers -------------------------------------------------------------------

static SEED: AtomicU64 = AtomicU64::new(1);

pub fn set_seed(seed: u64) {
    SEED.store(seed, Ordering::Relaxed);
}

/// A generator for one use, derived from the run's seed.
fn rng(tag: u64) -> Rng {
    Rng::new(SEED.load(Ordering::Relaxed) ^ tag.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Adds context and the errno name to a library error.
trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T> Ctx<T> for vgpu_guest::Result<T> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e} ({})", errno_name(e.errno())))
    }
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        match $cond {
            true => {}
            false => return Err(format!($($fmt)*)),
        }
    };
}

/// `r` must fail with `errno`.
fn expect_errno<T>(r: vgpu_guest::Result<T>, errno: i32, what: &str) -> Result<(), String> {
    match r {
        Ok(_) => Err(format!("{what}: succeeded, expected {}", errno_name(errno))),
        Err(e) if e.errno() == errno => Ok(()),
        Err(e) => Err(format!(
            "{what}: {e} ({}), expected {}",
            errno_name(e.errno()),
            errno_name(errno)
        )),
    }
}

fn open(args: &Args) -> Result<Device, String> {
    open_path(&args.device)
}

fn open_path(path: &Path) -> Result<Device, String> {
    Device::open(path).map_err(|e| format!("open {}: {e}", path.display()))
}

/// The first difference between two byte strings.
fn same(got: &[u8], want: &[u8], what: &str) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} bytes, expected {}",
            got.len(),
            want.len()
        ));
    }
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        let n = got.iter().zip(want).filter(|(a, b)| a != b).count();
        return Err(format!(
            "{what}: {n} byte(s) differ, first at {i:#x}: {:#04x}, expected {:#04x}",
            got[i], want[i]
        ));
    }
    Ok(())
}

fn words(b: &[u8]) -> impl Iterator<Item = u32> + '_ {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

fn read_back(dev: &Device, buf: &Buffer) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; buf.size() as usize];
    dev.copy_from_device(buf, 0, &mut out)
        .ctx("copy from device")?;
    Ok(out)
}

fn upload_f32(dev: &Device, v: &[f32]) -> Result<Buffer, String> {
    let buf = dev.alloc(v.len() as u64 * 4).ctx("alloc")?;
    dev.copy_to_device(&buf, 0, &f32_bytes(v))
        .ctx("copy to device")?;
    Ok(buf)
}

fn download_f32(dev: &Device, buf: &Buffer) -> Result<Vec<f32>, String> {
    Ok(bytes_f32(&read_back(dev, buf)?))
}

fn mib(b: u64) -> String {
    if b >= MIB && b.is_multiple_of(MIB) {
        format!("{} MiB", b / MIB)
    } else if b >= KIB && b.is_multiple_of(KIB) {
        format!("{} KiB", b / KIB)
    } else {
        format!("{b} B")
    }
}

// ---- the checks, by topic (after the helpers: they use `ensure!`) ------------

mod batches;
mod contexts;
mod info;
mod ioctl;
mod isolation;
mod kernels;
mod lanes;
mod memory;
mod processes;
mod vmm;
mod window;
