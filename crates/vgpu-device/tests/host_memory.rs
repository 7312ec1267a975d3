//! Guest memory mapped by fd reaches the partition's [`HostMemory`]
//! registry: mapped and unmapped notices, in order, delivered even while
//! a command holds the partition, and copies see the memory as host
//! slices. A recording partition stands in for a backend that registers
//! memory with a driver. (That fd-less mappings are never announced is
//! tested in the engine, whose raw client can make them.)

mod common;

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{assert_status, MIB};
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{
    FunctionInfo, HostMapping, HostMemory, HostSink, HostSource, Launch, OpError, Partition,
    PartitionSpec, Queued, QueuedDone,
};
use vgpu_device::testing::{test_config, TestVgpu};
use vgpu_testkit::abi::{self, ByteValued};
use vgpu_testkit::{launch_cmd, Chain, Mode};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Notice {
    Mapped {
        id: u64,
        len: usize,
        file_len: u64,
        file_offset: u64,
    },
    Unmapped {
        id: u64,
        /// Whether the memory was still mapped in this process.
        still_mapped: bool,
        /// Whether a slow command held the partition meanwhile.
        during_command: bool,
    },
}

#[derive(Default)]
struct Registry {
    notices: Mutex<Vec<Notice>>,
    live: Mutex<Vec<HostMapping>>,
    in_command: AtomicBool,
}

/// Whether `addr` lies in a mapping of this process.
fn is_mapped(addr: usize) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.split_once('-'))
        .any(|(a, b)| {
            let a = usize::from_str_radix(a, 16).unwrap();
            let b = usize::from_str_radix(b, 16).unwrap();
            (a..b).contains(&addr)
        })
}

impl HostMemory for Registry {
    fn mapped(&self, m: HostMapping) {
        self.notices.lock().unwrap().push(Notice::Mapped {
            id: m.id,
            len: m.len,
            file_len: m.file.metadata().unwrap().len(),
            file_offset: m.file_offset,
        });
        self.live.lock().unwrap().push(m);
    }

    fn unmapped(&self, id: u64) {
        let mut live = self.live.lock().unwrap();
        let Some(i) = live.iter().position(|m| m.id == id) else {
            // fd-less mappings have ids too; they were never announced.
            return;
        };
        let m = live.remove(i);
        self.notices.lock().unwrap().push(Notice::Unmapped {
            id,
            still_mapped: is_mapped(m.addr),
            during_command: self.in_command.load(Ordering::SeqCst),
        });
    }
}

/// A software partition that hands out its registry, checks the host
/// slices of every guest copy against it, and makes `fill_u32` of
/// `SLOW_WORDS` words take a while.
struct Recording {
    inner: Box<dyn Partition>,
    registry: Arc<Registry>,
    /// Bytes copied whose slices all lay in announced mappings.
    direct_bytes: Arc<Mutex<u64>>,
}

const SLOW_WORDS: u64 = 7;
const SLOW: Duration = Duration::from_millis(600);

impl Recording {
    /// Checks `slices` against the live mappings and compares their bytes
    /// with what `read` gives; declines, so the copy itself runs as usual.
    fn check(&self, slices: &[vgpu_backend::HostSlice], total: u64) -> Result<bool, OpError> {
        let live = self.registry.live.lock().unwrap();
        let inside = slices.iter().all(|s| {
            live.iter().any(|m| {
                m.id == s.mapping
                    && (s.ptr as usize) >= m.addr
                    && (s.ptr as usize) + s.len <= m.addr + m.len
            })
        });
        let sum: u64 = slices.iter().map(|s| s.len as u64).sum();
        if inside && sum == total {
            *self.direct_bytes.lock().unwrap() += sum;
        }
        Ok(false)
    }
}

impl Partition for Recording {
    fn spec(&self) -> &PartitionSpec {
        self.inner.spec()
    }
    fn kernel_compute_units(&self) -> u32 {
        self.inner.kernel_compute_units()
    }
    fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OpError> {
        self.inner.alloc(size, align)
    }
    fn free(&mut self, addr: u64) -> Result<(), OpError> {
        self.inner.free(addr)
    }
    fn upload(&mut self, dst: u64, src: &dyn HostSource) -> Result<(), OpError> {
        let total = src.len();
        let mut seen = Vec::new();
        src.with_slices(&mut |s| {
            // The slices hold what a read gives.
            for piece in s {
                // SAFETY: valid for reads during this call (HostSource).
                seen.extend_from_slice(unsafe { std::slice::from_raw_parts(piece.ptr, piece.len) });
            }
            self.check(s, total)
        })?;
        if !seen.is_empty() {
            let mut want = vec![0u8; total as usize];
            src.read_at(0, &mut want)?;
            assert_eq!(seen, want, "host slices differ from the guest memory");
        }
        self.inner.upload(dst, src)
    }
    fn download(&mut self, src: u64, dst: &dyn HostSink) -> Result<(), OpError> {
        let total = dst.len();
        dst.with_slices_mut(&mut |s| self.check(s, total))?;
        self.inner.download(src, dst)
    }
    fn copy(&mut self, dst: u64, src: u64, size: u64) -> Result<(), OpError> {
        self.inner.copy(dst, src, size)
    }
    fn fill(&mut self, addr: u64, size: u64, pattern: u32) -> Result<(), OpError> {
        self.inner.fill(addr, size, pattern)
    }
    fn module_load(&mut self, format: u32, image: &[u8]) -> Result<u64, OpError> {
        self.inner.module_load(format, image)
    }
    fn module_unload(&mut self, module: u64) -> Result<(), OpError> {
        self.inner.module_unload(module)
    }
    fn global_info(&mut self, module: u64, name: &str) -> Result<(u64, u64), OpError> {
        self.inner.global_info(module, name)
    }

    fn max_active_clusters(&mut self, launch: &Launch<'_>) -> Result<u32, OpError> {
        self.inner.max_active_clusters(launch)
    }
    fn function_info(&mut self, module: u64, entry: &str) -> Result<FunctionInfo, OpError> {
        self.inner.function_info(module, entry)
    }

    fn run_queued(&mut self, steps: &[Queued<'_>], stop: &dyn Fn() -> bool) -> Vec<QueuedDone> {
        vgpu_backend::run_queued_in_order(self, steps, stop)
    }
    fn launch(&mut self, launch: &Launch<'_>) -> Result<(), OpError> {
        let slow = launch.entry == "fill_u32"
            && abi::FillParams::from_slice(launch.params).is_some_and(|p| p.count == SLOW_WORDS);
        if slow {
            self.registry.in_command.store(true, Ordering::SeqCst);
            std::thread::sleep(SLOW);
            self.registry.in_command.store(false, Ordering::SeqCst);
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
        self.inner.reset()
    }
    fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }
    fn host_memory(&self) -> Option<Arc<dyn HostMemory>> {
        Some(self.registry.clone())
    }
}

fn start() -> (TestVgpu, Arc<Registry>, Arc<Mutex<u64>>) {
    let backend = SoftwareBackend::new(64 * MIB, 2);
    let inner = vgpu_device::testing::software_partition(&backend, "rec", 64 * MIB, 2);
    let registry = Arc::new(Registry::default());
    let direct_bytes = Arc::new(Mutex::new(0));
    let p = Recording {
        inner,
        registry: registry.clone(),
        direct_bytes: direct_bytes.clone(),
    };
    (
        TestVgpu::start(test_config("rec", 2), Box::new(p)),
        registry,
        direct_bytes,
    )
}

fn memfd(size: u64) -> std::fs::File {
    let f = vfio_user_server::memfd::create(c"vgpu-test-extra", size).unwrap();
    f.set_len(size).unwrap();
    f
}

#[test]
fn test_mapped_memory_reaches_the_registry_and_copies_see_it() {
    let (server, registry, direct) = start();
    let mut g = server.connect();
    let ram = g.ram().size();
    let first = registry.notices.lock().unwrap().clone();
    let [Notice::Mapped {
        id: ram_id,
        len,
        file_len,
        file_offset: 0,
    }] = first.as_slice()
    else {
        panic!("{first:?}");
    };
    assert_eq!((*len as u64, *file_len), (ram, ram));
    let ram_id = *ram_id;

    g.setup_queue(0, 64, Mode::Interrupt);
    let dev = g.device_alloc(0, MIB);
    // Two pieces of guest RAM with a gap: the copies offer both slices.
    let sg = g.alloc_sg(&[3000, 5000]);
    let data: Vec<u8> = (0..8000u32).map(|i| (i * 7) as u8).collect();
    g.write_sg(&sg, &data);
    assert_status(g.copy_to_device(0, dev, &sg), abi::STATUS_OK);
    let back = g.alloc_sg(&[8000]);
    assert_status(g.copy_from_device(0, dev, &back), abi::STATUS_OK);
    assert_eq!(g.read_sg(&back), data);
    assert_eq!(*direct.lock().unwrap(), 16000);

    // Memory the VMM adds and removes later, at an offset of its file.
    let extra = memfd(4 * MIB);
    g.client()
        .dma_map(MIB, 1 << 40, 2 * MIB, extra.as_raw_fd())
        .unwrap();
    g.client().dma_unmap(1 << 40, 2 * MIB).unwrap();
    let all = registry.notices.lock().unwrap().clone();
    assert_eq!(all.len(), 3, "{all:?}");
    let Notice::Mapped {
        id: extra_id,
        len,
        file_offset,
        ..
    } = all[1]
    else {
        panic!("{all:?}");
    };
    assert_ne!(extra_id, ram_id);
    assert_eq!((len as u64, file_offset), (2 * MIB, MIB));
    assert_eq!(
        all[2],
        Notice::Unmapped {
            id: extra_id,
            still_mapped: true,
            during_command: false
        }
    );

    // The VMM going away unmaps guest RAM, still mapped when announced.
    drop(g);
    let deadline = Instant::now() + Duration::from_secs(5);
    while registry.notices.lock().unwrap().len() < 4 {
        assert!(Instant::now() < deadline, "no unmapped notice for RAM");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        registry.notices.lock().unwrap()[3],
        Notice::Unmapped {
            id: ram_id,
            still_mapped: true,
            during_command: false
        }
    );
}

#[test]
fn test_unmap_notice_does_not_wait_for_a_running_command() {
    let (server, registry, _) = start();
    let mut g = server.connect();
    g.setup_queue(0, 64, Mode::Interrupt);
    let dev = g.device_alloc(0, 4096);
    let extra = memfd(MIB);
    g.client()
        .dma_map(0, 1 << 40, MIB, extra.as_raw_fd())
        .unwrap();
    // A command that holds the partition for a while.
    let params = abi::FillParams {
        dst: dev,
        count: SLOW_WORDS,
        value: 1,
        reserved: 0,
    };
    let cmd = launch_cmd("fill_u32", [1, 1, 1], [1, 1, 1], 24);
    let chain = Chain::command(&cmd).bytes(params.as_slice()).completion();
    g.post(0, &chain);
    g.kick(0);
    let deadline = Instant::now() + SLOW;
    while !registry.in_command.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the slow command did not start");
        std::thread::sleep(Duration::from_millis(1));
    }
    let t = Instant::now();
    g.client().dma_unmap(1 << 40, MIB).unwrap();
    let took = t.elapsed();
    assert!(took < SLOW / 2, "DMA_UNMAP waited {took:?} for the command");
    assert!(matches!(
        registry.notices.lock().unwrap().last(),
        Some(Notice::Unmapped {
            still_mapped: true,
            during_command: true,
            ..
        })
    ));
    let used = g.wait_used(0, Duration::from_secs(5)).expect("completion");
    assert_status(used.completion(), abi::STATUS_OK);
}

#[test]
fn test_window_copies_offer_no_slices() {
    let (server, registry, direct) = start();
    let mut g = server.connect();
    g.setup_queue(0, 64, Mode::Interrupt);
    let dev = g.device_alloc(0, 4096);
    g.window_write(0, &[5u8; 4096]);
    assert_status(g.copy_window_to_device(0, 0, dev, 4096), abi::STATUS_OK);
    assert_eq!(*direct.lock().unwrap(), 0);
    // Only guest RAM was ever announced.
    assert_eq!(registry.notices.lock().unwrap().len(), 1);
}
