//! The partition host's command line.

use std::ffi::OsString;
use std::time::Duration;

/// File name of the partition host program.
pub const HOST_PROGRAM: &str = "vgpu-partition-host";

/// The backend a partition host opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InnerBackend {
    /// The software backend with this much memory and these worker threads.
    Software {
        /// Bytes.
        memory: u64,
        /// Worker threads.
        compute_units: u32,
    },
    /// A CUDA GPU: in isolated mode a context per partition, each host
    /// with its own GPU address space; in spatial mode green contexts of
    /// one shared host (its SM groups are one process's).
    Cuda {
        /// CUDA device index.
        device: u32,
        /// Whether guests may load PTX: with one partition per process a
        /// loaded kernel reaches only its own tenant's memory; in a shared
        /// host, every partition's of the process.
        guest_ptx: bool,
        /// Spatial mode (green contexts); its hosts are shared.
        spatial: bool,
    },
}

impl InnerBackend {
    /// Its command-line arguments.
    pub fn to_args(&self) -> Vec<OsString> {
        let v: Vec<String> = match *self {
            InnerBackend::Software {
                memory,
                compute_units,
            } => vec![
                "--backend".into(),
                "software".into(),
                "--memory".into(),
                memory.to_string(),
                "--compute-units".into(),
                compute_units.to_string(),
            ],
            InnerBackend::Cuda {
                device,
                guest_ptx,
                spatial,
            } => {
                let mut v = vec![
                    "--backend".into(),
                    "cuda".into(),
                    "--device".into(),
                    device.to_string(),
                ];
                if guest_ptx {
                    v.push("--guest-ptx".into());
                }
                if spatial {
                    v.push("--spatial".into());
                }
                v
            }
        };
        v.into_iter().map(OsString::from).collect()
    }
}

/// What a partition host is told on its command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostOptions {
    /// What to open.
    pub backend: InnerBackend,
    /// How long it polls for the next message before it sleeps.
    pub spin: Duration,
}

impl HostOptions {
    /// Its command-line arguments (without `--fd`).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut v = self.backend.to_args();
        v.push("--spin-us".into());
        v.push(self.spin.as_micros().to_string().into());
        v
    }
}

/// A parsed partition host command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostArgs {
    /// What to open.
    pub backend: InnerBackend,
    /// How long to poll for the next message before sleeping.
    pub spin: Duration,
    /// The inherited socket: to the daemon, or, for a shared host, to
    /// the launcher, which sends it one socket per partition.
    pub fd: i32,
    /// One host serves every partition of the backend (`--shared`, added
    /// by a launcher of shared hosts): they share its fate.
    pub shared: bool,
}

impl HostArgs {
    /// Parses `--backend software --memory N --compute-units N` or
    /// `--backend cuda --device N [--guest-ptx] [--spatial]`, plus `--fd
    /// N`, optionally `--spin-us N` (at most a second) and `--shared`.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<HostArgs, String> {
        let mut backend = None;
        let (mut memory, mut units, mut device, mut fd) = (None, None, None, None);
        let mut spin = Duration::ZERO;
        let (mut guest_ptx, mut spatial, mut shared) = (false, false, false);
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            let flag = match a.as_str() {
                "--guest-ptx" => Some(&mut guest_ptx),
                "--spatial" => Some(&mut spatial),
                "--shared" => Some(&mut shared),
                _ => None,
            };
            if let Some(f) = flag {
                *f = true;
                continue;
            }
            let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
            let num = |v: &str| {
                v.parse::<u64>()
                    .map_err(|_| format!("{a}: bad number {v:?}"))
            };
            match a.as_str() {
                "--backend" => backend = Some(v),
                "--spin-us" => {
                    spin = Duration::from_micros(num(&v)?);
                    if spin > Duration::from_secs(1) {
                        return Err(format!("{a}: at most 1000000"));
                    }
                }
                "--memory" => memory = Some(num(&v)?),
                "--compute-units" => {
                    units = Some(u32::try_from(num(&v)?).map_err(|_| format!("{a}: too large"))?)
                }
                "--device" => {
                    device = Some(u32::try_from(num(&v)?).map_err(|_| format!("{a}: too large"))?)
                }
                "--fd" => {
                    fd = Some(
                        i32::try_from(num(&v)?)
                            .ok()
                            .filter(|&f| f > 2)
                            .ok_or_else(|| format!("{a}: bad descriptor {v:?}"))?,
                    )
                }
                _ => return Err(format!("unknown argument {a:?}")),
            }
        }
        let backend = match backend.as_deref() {
            Some("software") => InnerBackend::Software {
                memory: memory.ok_or("--memory is required")?,
                compute_units: units.ok_or("--compute-units is required")?,
            },
            Some("cuda") => InnerBackend::Cuda {
                device: device.unwrap_or(0),
                guest_ptx,
                spatial,
            },
            Some(other) => return Err(format!("unknown backend {other:?}")),
            None => return Err("--backend is required".into()),
        };
        Ok(HostArgs {
            backend,
            spin,
            fd: fd.ok_or("--fd is required")?,
            shared,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<HostArgs, String> {
        HostArgs::parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn test_args_roundtrip_and_refusals() {
        for b in [
            InnerBackend::Software {
                memory: 1 << 30,
                compute_units: 2,
            },
            InnerBackend::Cuda {
                device: 1,
                guest_ptx: true,
                spatial: false,
            },
            InnerBackend::Cuda {
                device: 0,
                guest_ptx: false,
                spatial: true,
            },
        ] {
            let spin = Duration::from_micros(20);
            let mut args: Vec<String> = HostOptions { backend: b, spin }
                .to_args()
                .into_iter()
                .map(|a| a.into_string().unwrap())
                .collect();
            args.extend(["--fd".into(), "5".into()]);
            assert_eq!(
                HostArgs::parse(args),
                Ok(HostArgs {
                    backend: b,
                    spin,
                    fd: 5,
                    shared: false,
                })
            );
        }
        assert!(
            parse("--backend cuda --spatial --shared --fd 4")
                .unwrap()
                .shared
        );
        for bad in [
            "--backend software --memory 1 --compute-units 1",
            "--backend software --memory 1 --fd 4",
            "--backend software --memory x --compute-units 1 --fd 4",
            "--backend cuda --fd 2",
            "--backend cuda --fd -1",
            "--backend other --fd 4",
            "--backend cuda --fd",
            "--backend cuda --what 1 --fd 4",
            "--fd 4",
            "--backend cuda --spin-us 1000001 --fd 4",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(parse("--backend cuda --fd 4").unwrap().spin, Duration::ZERO);
    }
}
