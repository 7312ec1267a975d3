//! Shared helpers of the device integration tests.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vgpu_backend::{
    FunctionInfo, HostSink, HostSource, Launch, OpError, Partition, PartitionSpec, Queued,
    QueuedDone,
};
use vgpu_device::testing::{test_config, TestVgpu};
use vgpu_testkit::abi::{self, ByteValued};
use vgpu_testkit::{launch_cmd, Chain, Guest, Mode};

pub const MIB: u64 = 1 << 20;
/// Device memory of the default test partition.
pub const MEMORY: u64 = 64 * MIB;
/// How long a test waits to be sure something does not happen.
pub const QUIET: Duration = Duration::from_millis(100);

/// A vGPU with `queues` queues on a software partition of [`MEMORY`]
/// bytes and two compute units, and a connected guest.
pub fn vgpu(queues: u32) -> (TestVgpu, Guest) {
    vgpu_with_memory(queues, MEMORY)
}

/// Like [`vgpu`] with `memory` bytes of device memory.
pub fn vgpu_with_memory(queues: u32, memory: u64) -> (TestVgpu, Guest) {
    let server = TestVgpu::software(test_config("test", queues), memory, 2);
    let guest = server.connect();
    (server, guest)
}

/// A vGPU with queue 0 set up in interrupt mode (64 entries).
pub fn vgpu_ready() -> (TestVgpu, Guest) {
    let (server, mut g) = vgpu(2);
    g.setup_queue(0, 64, Mode::Interrupt);
    (server, g)
}

/// Asserts a completion's status, naming it on failure.
#[track_caller]
pub fn assert_status(c: abi::Completion, status: u32) {
    assert_eq!(
        c.status,
        status,
        "expected {}, got {} ({c:?})",
        status_name(status),
        status_name(c.status)
    );
}

pub fn status_name(s: u32) -> &'static str {
    match s {
        abi::STATUS_OK => "OK",
        abi::STATUS_INVALID => "INVALID",
        abi::STATUS_FAULT => "FAULT",
        abi::STATUS_NO_MEMORY => "NO_MEMORY",
        abi::STATUS_UNSUPPORTED => "UNSUPPORTED",
        abi::STATUS_NOT_FOUND => "NOT_FOUND",
        abi::STATUS_CANCELLED => "CANCELLED",
        abi::STATUS_OUT_OF_RANGE => "OUT_OF_RANGE",
        abi::STATUS_DEVICE_ERROR => "DEVICE_ERROR",
        abi::STATUS_KERNEL_FAULT => "KERNEL_FAULT",
        _ => "?",
    }
}

/// A small deterministic generator (xorshift64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// Floats in [-1, 1).
    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect()
    }
}

/// Asserts `got` is within `tol` (relative to max(1, |want|)) of `want`.
#[track_caller]
pub fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / w.abs().max(1.0);
        assert!(err <= tol, "element {i}: got {g}, want {w}");
    }
}

/// Polls `cond` until it holds or five seconds pass; returns whether it held.
pub fn eventually(g: &mut Guest, mut cond: impl FnMut(&mut Guest) -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if cond(g) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A NOP command structure in guest RAM.
pub fn nop_in_ram(g: &mut Guest) -> u64 {
    g.alloc_bytes(abi::ByteValued::as_slice(&abi::CmdHeader::default()))
}

/// Open fds of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// Threads of this process.
pub fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .count()
}

/// A memory figure of /proc/self/status (`VmRSS`, `RssAnon`, `RssShmem`...), bytes.
pub fn proc_status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
        * 1024
}

/// Resident memory of this process (VmRSS), bytes.
pub fn rss() -> u64 {
    proc_status_bytes("VmRSS")
}

/// CPU time (user and system) used so far by this process's threads named
/// `name` (as the kernel keeps it: at most 15 bytes).
pub fn thread_cpu(name: &str) -> Duration {
    // SAFETY: sysconf only reads a configuration value.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    let name = &name[..name.len().min(15)];
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = task.expect("task entry").path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        // Fields after the parenthesised name; utime and stime are the
        // 14th and 15th of the whole line.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split(' ').collect();
        for f in fields.get(11..13).unwrap_or_default() {
            ticks += f.parse::<u64>().unwrap_or(0);
        }
    }
    Duration::from_millis(ticks * 1000 / hz)
}

/// The fill count whose launch "faults".
pub const POISON: u64 = 7;

/// A software partition whose poisoned launch loses its state.
pub struct Faulting {
    pub inner: Box<dyn Partition>,
    pub lost: bool,
    pub resets: Arc<AtomicU32>,
}

impl Faulting {
    fn check(&self) -> Result<(), OpError> {
        if self.lost {
            Err(OpError::Lost("context gone".into()))
        } else {
            Ok(())
        }
    }
}

impl Partition for Faulting {
    fn spec(&self) -> &PartitionSpec {
        self.inner.spec()
    }
    fn kernel_compute_units(&self) -> u32 {
        self.inner.kernel_compute_units()
    }
    fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OpError> {
        self.check()?;
        self.inner.alloc(size, align)
    }
    fn free(&mut self, addr: u64) -> Result<(), OpError> {
        self.check()?;
        self.inner.free(addr)
    }
    fn upload(&mut self, dst: u64, src: &dyn HostSource) -> Result<(), OpError> {
        self.check()?;
        self.inner.upload(dst, src)
    }
    fn download(&mut self, src: u64, dst: &dyn HostSink) -> Result<(), OpError> {
        self.check()?;
        self.inner.download(src, dst)
    }
    fn copy(&mut self, dst: u64, src: u64, size: u64) -> Result<(), OpError> {
        self.check()?;
        self.inner.copy(dst, src, size)
    }
    fn fill(&mut self, addr: u64, size: u64, pattern: u32) -> Result<(), OpError> {
        self.check()?;
        self.inner.fill(addr, size, pattern)
    }
    fn module_load(&mut self, format: u32, image: &[u8]) -> Result<u64, OpError> {
        self.check()?;
        self.inner.module_load(format, image)
    }
    fn module_unload(&mut self, module: u64) -> Result<(), OpError> {
        self.check()?;
        self.inner.module_unload(module)
    }
    fn global_info(&mut self, module: u64, name: &str) -> Result<(u64, u64), OpError> {
        self.check()?;
        self.inner.global_info(module, name)
    }

    fn max_active_clusters(&mut self, launch: &Launch<'_>) -> Result<u32, OpError> {
        self.check()?;
        self.inner.max_active_clusters(launch)
    }
    fn function_info(&mut self, module: u64, entry: &str) -> Result<FunctionInfo, OpError> {
        self.check()?;
        self.inner.function_info(module, entry)
    }

    fn run_queued(&mut self, steps: &[Queued<'_>], stop: &dyn Fn() -> bool) -> Vec<QueuedDone> {
        vgpu_backend::run_queued_in_order(self, steps, stop)
    }
    fn launch(&mut self, launch: &Launch<'_>) -> Result<(), OpError> {
        self.check()?;
        let poisoned = launch.entry == "fill_u32"
            && abi::FillParams::from_slice(launch.params).is_some_and(|p| p.count == POISON);
        if poisoned {
            self.lost = true;
            return Err(OpError::KernelFault("illegal address".into()));
        }
        self.inner.launch(launch)
    }
    fn memory_used(&self) -> u64 {
        self.inner.memory_used()
    }
    fn set_memory(&mut self, memory: u64) -> Result<(), OpError> {
        self.inner.set_memory(memory)
    }
    fn suspend(&mut self) -> Result<u64, OpError> {
        self.inner.suspend()
    }
    fn resume(&mut self) -> Result<u64, OpError> {
        self.inner.resume()
    }
    fn console(
        &mut self,
        module: u64,
        max: usize,
    ) -> Result<vgpu_backend::console::ConsoleText, OpError> {
        self.inner.console(module, max)
    }
    fn reset(&mut self) {
        self.lost = false;
        self.resets.fetch_add(1, Ordering::SeqCst);
        self.inner.reset()
    }
    fn is_lost(&self) -> bool {
        self.lost
    }
}

/// Launches the built-in `fill_u32` of `count` words at `dst`.
pub fn fill_count(g: &mut Guest, dst: u64, count: u64) -> abi::Completion {
    let p = abi::FillParams {
        dst,
        count,
        value: 9,
        reserved: 0,
    };
    let cmd = launch_cmd("fill_u32", [1, 1, 1], [64, 1, 1], p.as_slice().len() as u32);
    g.submit(0, &Chain::command(&cmd).bytes(p.as_slice()).completion())
        .completion()
}
