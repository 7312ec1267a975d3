//! A host-side test kit for vgpud virtual GPU functions. It plays both the
//! VMM and the guest driver through the `vfio_user` crate's `Client` (the
//! client cloud-hypervisor uses), over a real UNIX socket. It speaks the
//! guest ABI (`vgpu-abi`) and knows no device model: the device under test
//! comes from above (`vgpu_device::testing` builds a vGPU on this kit).
//!
//! - [`TestServer`] serves any [`PciDevice`] on a socket from a thread of
//!   its own and stops it when dropped.
//! - [`Guest`] is one connection: guest RAM (a memfd DMA-mapped at a
//!   non-zero IOVA) with a bump allocator, an eventfd on every MSI-X
//!   vector, the doorbell page mapped directly, BAR0 register helpers,
//!   queue setup in polled or interrupt mode, and a driver-side ring
//!   writer that submits descriptor chains ([`Chain`]) and reads their
//!   completions back.
//! - Convenience calls for every command ([`Guest::nop`], [`Guest::copy`],
//!   [`Guest::launch`], ...), batch submission ([`Guest::submit_batch`])
//!   and raw chains ([`Guest::submit_raw`], [`Guest::ring_write_desc`]) for
//!   malformed input.
//!
//! Everything here is for tests: misuse and timeouts panic with a message.

#![warn(missing_docs)]

pub mod ch;
mod commands;
mod guest;
pub mod ring;

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use vfio_user_server::{Endpoint, PciDevice, ServerError};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::tempdir::TempDir;

pub use commands::{
    bare_chain, bytes_to_f32s, copy_cmd, f32s_to_bytes, fill_chain, guest_copy_chain, launch_cmd,
    value_chain,
};
pub use guest::{Guest, GuestOptions, WakePolicy, IRQ_MSIX};
pub use ring::{Chain, Mode, RingLayout, Used, VirtqDesc};
pub use vgpu_abi as abi;

/// Default guest RAM size.
pub const DEFAULT_RAM_SIZE: u64 = 64 << 20;
/// Default guest address of guest RAM.
pub const DEFAULT_RAM_IOVA: u64 = 0x1_0000_0000;
/// Default longest wait for a completion.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A device served on a socket in a temporary directory by a thread of its
/// own; stopped and joined on drop.
pub struct TestServer {
    path: PathBuf,
    stop: EventFd,
    thread: Option<JoinHandle<Result<(), ServerError>>>,
    _dir: TempDir,
}

impl TestServer {
    /// Serves `device`; `name` prefixes the endpoint's log lines and names
    /// its thread.
    pub fn start(name: &str, device: Box<dyn PciDevice>) -> TestServer {
        let dir = TempDir::new_with_prefix("/tmp/vgpu-testkit-").expect("temporary directory");
        let path = dir.as_path().join("vgpu.sock");
        let endpoint = Endpoint::new(name, &path, device).expect("endpoint");
        let stop = endpoint.stop_handle().expect("stop handle");
        let thread = std::thread::Builder::new()
            .name(format!("endpoint-{name}"))
            .spawn(move || endpoint.run())
            .expect("endpoint thread");
        TestServer {
            path,
            stop,
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Connects a guest with default options.
    pub fn connect(&self) -> Guest {
        Guest::connect(&self.path, GuestOptions::default())
    }

    /// Connects a guest with `opts`.
    pub fn connect_with(&self, opts: GuestOptions) -> Guest {
        Guest::connect(&self.path, opts)
    }

    /// Whether the endpoint thread still runs.
    pub fn alive(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let outcome = t.join();
            if !std::thread::panicking() {
                match outcome {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => panic!("endpoint failed: {e}"),
                    Err(_) => panic!("endpoint thread panicked"),
                }
            }
        }
    }
}

/// Environment variable naming a file where skipped tests are listed, one
/// line each, so a test run can count them as skipped rather than passed
/// (the test harness has no run-time skip).
pub const SKIP_LOG_ENV: &str = "VGPU_SKIP_LOG";

/// Reports that the calling test is skipping itself, and why: prints
/// `skipped: <why>` and appends `<test name>: <why>` to the file named by
/// [`SKIP_LOG_ENV`] when it is set. The test should return right after.
pub fn skip(why: &str) {
    use std::io::Write;
    println!("skipped: {why}");
    let Some(path) = std::env::var_os(SKIP_LOG_ENV) else {
        return;
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_owned();
    let line = format!("{test}: {}\n", why.replace('\n', " "));
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!(
            "cannot record the skip in {}: {e}",
            Path::new(&path).display()
        );
    }
}
