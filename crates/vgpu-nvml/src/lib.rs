//! NVML for vgpud virtual GPU functions: `libnvidia-ml.so.1` inside a
//! guest, over the `vgpu.ko` character devices `/dev/vgpuN`, so that
//! monitoring tools, schedulers and frameworks (PyTorch's allocator, GPU
//! exporters) see the vGPUs as the CUDA driver (`vgpu-cuda`) presents
//! them: the same names, UUIDs, PCI bus ids and memory.
//!
//! * [`api`]: the entry points answered from the devices: initialisation,
//!   system and driver versions, device look-up, identity, PCI
//!   information, memory, utilisation, processes, modes.
//! * [`unsupported`]: every other NVML entry point, exported as
//!   `NVML_ERROR_NOT_SUPPORTED`; [`export`]: the private table NVIDIA's
//!   tools ask for.
//! * [`state`]: the reference-counted initialisation and the device
//!   table behind the handles; [`procs`]: which processes have a device
//!   open; [`format`]: UUIDs and bus ids as text; [`nvml`]: the C types.
//!
//! Diagnostics go through `log`; set `VGPU_NVML_LOG` to `error`, `warn`,
//! `info`, `debug` or `trace` to have them written to standard error (a
//! library writes nothing there unasked).

pub mod api;
pub mod error;
pub mod export;
pub mod ffi;
pub mod format;
pub mod nvml;
pub mod procs;
pub mod state;
pub mod unsupported;

pub use error::{Error, Result};

/// Writes the library's log records to standard error, from the level
/// `VGPU_NVML_LOG` names. This `log` is the library's own copy (a
/// `cdylib` links its dependencies in), so it takes no logger from the
/// program and installs none into it.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!("vgpu-nvml: {}: {}", r.level(), r.args());
        }
    }

    fn flush(&self) {}
}

/// Installs [`StderrLog`] once, when `VGPU_NVML_LOG` asks for it.
fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Some(level) = std::env::var("VGPU_NVML_LOG")
            .ok()
            .and_then(|v| v.parse::<log::LevelFilter>().ok())
        else {
            return;
        };
        if log::set_logger(&StderrLog).is_ok() {
            log::set_max_level(level);
        }
    });
}
