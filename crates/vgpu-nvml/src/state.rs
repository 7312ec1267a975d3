//! The library's process state: how many times it was initialised, and
//! while it is, the vGPUs it found (each `/dev/vgpuN` held open).
//!
//! A handle (`nvmlDevice_t`) is the address of one [`Gpu`] of the current
//! table. Handles are only ever compared with the table's addresses,
//! never followed, so a stale or forged one is an invalid argument.

use std::collections::HashSet;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vgpu_guest::{sys, Device};

use crate::error::{Error, Result};
use crate::format::{self, PciAddr};
use crate::nvml::nvmlDevice_t;
use crate::procs;

/// One vGPU.
pub struct Gpu {
    /// Its NVML index: its place among the devices, by N.
    pub index: u32,
    pub dev: Device,
    pub path: PathBuf,
    /// The device number of `path`.
    pub rdev: u64,
    pub info: sys::VgpuInfo,
    pub name: String,
    pub uuid: String,
    pub pci: PciAddr,
    util: Mutex<UtilSample>,
}

/// The device time counter as last read, for utilisation.
struct UtilSample {
    at: Instant,
    busy_ns: u64,
    /// The utilisation computed then.
    last: u32,
}

/// Below this, a new sample would be noise: report the last one.
const MIN_SAMPLE: Duration = Duration::from_millis(20);

impl Gpu {
    fn open(index: u32, minor: u32, path: PathBuf) -> vgpu_guest::Result<Gpu> {
        let dev = Device::open(&path)?;
        let info = *dev.cached_info();
        let usage = dev.usage()?;
        let rdev = std::fs::metadata(&path).map(|m| m.rdev()).unwrap_or(0);
        Ok(Gpu {
            index,
            // The name and UUID libcuda reports for the same device.
            name: format!("vgpud vGPU {minor}"),
            uuid: format::uuid(&info.uuid()),
            pci: PciAddr::new(info.pci_domain, info.pci_bus, info.pci_devfn),
            dev,
            path,
            rdev,
            info,
            util: Mutex::new(UtilSample {
                at: Instant::now(),
                busy_ns: usage.busy_ns,
                last: 0,
            }),
        })
    }

    /// The function's counters now.
    pub fn usage(&self) -> Result<sys::VgpuUsage> {
        self.dev.usage().map_err(|e| {
            log::warn!("{}: {e}", self.path.display());
            Error::from(&e)
        })
    }

    /// Percent of the time since the last call (or since `nvmlInit`) the
    /// device spent running commands.
    pub fn utilization(&self) -> Result<u32> {
        let busy = self.usage()?.busy_ns;
        let mut s = self.util.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let wall = now.duration_since(s.at);
        if wall >= MIN_SAMPLE {
            let ns = u64::try_from(wall.as_nanos()).unwrap_or(u64::MAX);
            s.last = format::percent(busy.saturating_sub(s.busy_ns), ns);
            s.at = now;
            s.busy_ns = busy;
        }
        Ok(s.last)
    }

    /// The processes with the device open, other than through this
    /// library's own file.
    pub fn processes(&self) -> Vec<u32> {
        let target = procs::Target {
            path: &self.path,
            rdev: self.rdev,
        };
        let me = (std::process::id(), self.dev.as_raw_fd());
        procs::holders(Path::new("/proc"), &target, Some(me))
    }
}

/// The devices of one initialisation.
pub type Gpus = Arc<[Gpu]>;

struct Lib {
    /// Successful `nvmlInit*` calls not yet matched by `nvmlShutdown`.
    refs: u32,
    gpus: Option<Gpus>,
}

static LIB: Mutex<Lib> = Mutex::new(Lib {
    refs: 0,
    gpus: None,
});

fn lib() -> MutexGuard<'static, Lib> {
    // The state stays consistent under a panic (each update is one
    // assignment), so a poisoned lock is used as it is.
    LIB.lock().unwrap_or_else(|p| p.into_inner())
}

/// `nvmlInit*`: the first call finds the devices; later ones count.
pub fn init(flags: u32) -> Result {
    let mut l = lib();
    if l.refs == 0 {
        l.gpus = Some(discover(flags)?);
    }
    l.refs += 1;
    Ok(())
}

/// `nvmlShutdown`: the last one closes the devices.
pub fn shutdown() -> Result {
    let mut l = lib();
    match l.refs {
        0 => Err(Error::Uninitialized),
        1 => {
            l.refs = 0;
            l.gpus = None;
            Ok(())
        }
        _ => {
            l.refs -= 1;
            Ok(())
        }
    }
}

/// The devices, while initialised.
pub fn gpus() -> Result<Gpus> {
    lib().gpus.clone().ok_or(Error::Uninitialized)
}

/// Looks up a handle among `gpus`.
pub fn gpu(gpus: &Gpus, handle: nvmlDevice_t) -> Result<&Gpu> {
    gpus.iter()
        .find(|g| std::ptr::eq(*g, handle.cast::<Gpu>()))
        .ok_or(Error::InvalidArgument)
}

/// The handle of `g`.
pub fn handle(g: &Gpu) -> nvmlDevice_t {
    std::ptr::from_ref(g).cast()
}

/// Opens every `/dev/vgpuN`. A device that cannot be opened is left out
/// (and logged); none at all fails, as NVML's initialisation does without
/// a GPU, unless `NVML_INIT_FLAG_NO_GPUS`.
fn discover(flags: u32) -> Result<Gpus> {
    let mut gpus = Vec::new();
    let mut first_error = None;
    for (minor, path) in Device::list() {
        match Gpu::open(gpus.len() as u32, minor, path.clone()) {
            Ok(g) => gpus.push(g),
            Err(e) => {
                log::warn!("{}: {e}", path.display());
                first_error.get_or_insert(Error::from(&e));
            }
        }
    }
    log::debug!("{} vGPU(s)", gpus.len());
    if gpus.is_empty() && flags & crate::nvml::INIT_FLAG_NO_GPUS == 0 {
        return Err(match first_error {
            Some(Error::NoPermission) => Error::NoPermission,
            _ if !Path::new("/sys/module/vgpu").exists() => Error::DriverNotLoaded,
            _ => Error::NotFound,
        });
    }
    Ok(gpus.into())
}

/// Logs, once per name, that a program called an entry point this
/// library does not implement; `NVML_ERROR_NOT_SUPPORTED`, or
/// `NVML_ERROR_UNINITIALIZED` before `nvmlInit`.
pub fn not_supported(name: &'static str) -> Result {
    gpus()?;
    static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if seen.get_or_insert_with(HashSet::new).insert(name) {
        log::debug!("{name} is not supported on a vGPU");
    }
    Err(Error::NotSupported)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The tests that touch the process-wide state, one at a time.
    pub static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn calls_before_init_are_uninitialized_and_init_is_counted() {
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!(gpus().err(), Some(Error::Uninitialized));
        assert_eq!(shutdown(), Err(Error::Uninitialized));
        assert_eq!(
            not_supported("nvmlDeviceGetTemperature"),
            Err(Error::Uninitialized)
        );
        // Without devices (this machine has no /dev/vgpuN), the flag lets
        // initialisation succeed with none.
        if !Device::list().is_empty() {
            return;
        }
        assert!(init(0).is_err());
        init(crate::nvml::INIT_FLAG_NO_GPUS).unwrap();
        init(crate::nvml::INIT_FLAG_NO_GPUS).unwrap();
        assert_eq!(gpus().unwrap().len(), 0);
        assert_eq!(
            not_supported("nvmlDeviceGetTemperature"),
            Err(Error::NotSupported)
        );
        shutdown().unwrap();
        assert!(gpus().is_ok(), "still initialised once");
        shutdown().unwrap();
        assert_eq!(gpus().err(), Some(Error::Uninitialized));
    }

    #[test]
    fn handles_not_handed_out_are_invalid() {
        let gpus: Gpus = Vec::new().into();
        assert_eq!(
            gpu(&gpus, std::ptr::null()).err(),
            Some(Error::InvalidArgument)
        );
        assert_eq!(
            gpu(&gpus, 0x1000 as nvmlDevice_t).err(),
            Some(Error::InvalidArgument)
        );
    }
}
