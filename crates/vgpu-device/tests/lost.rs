//! A partition that loses its device state (what a kernel fault does to a
//! GPU context): the command fails, STATUS.FATAL is set and an error is
//! logged with the error vector raised, once; everything fails until the
//! driver resets the function, which resets the partition and clears it.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_status, MIB};
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{
    FunctionInfo, HostSink, HostSource, Launch, OpError, Partition, PartitionSpec, Queued,
    QueuedDone,
};
use vgpu_device::testing::{test_config, TestVgpu};
use vgpu_testkit::abi::{self, ByteValued};
use vgpu_testkit::{launch_cmd, Chain, Guest, Mode};

/// The fill count whose launch "faults".
const POISON: u64 = 7;

/// A software partition whose poisoned launch loses its state.
struct Faulting {
    inner: Box<dyn Partition>,
    lost: bool,
    resets: Arc<AtomicU32>,
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

fn fill(g: &mut Guest, dst: u64, count: u64) -> abi::Completion {
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

#[test]
fn a_lost_partition_sets_fatal_once_and_a_reset_recovers_it() {
    let backend = SoftwareBackend::new(16 * MIB, 2);
    let inner = vgpu_device::testing::software_partition(&backend, "lost", 16 * MIB, 2);
    let resets = Arc::new(AtomicU32::new(0));
    let p = Faulting {
        inner,
        lost: false,
        resets: resets.clone(),
    };
    let server = TestVgpu::start(test_config("lost", 2), Box::new(p));
    let mut g = server.connect();
    g.setup_queue(0, 64, Mode::Interrupt);
    let buf = g.device_alloc(0, 4096);
    assert_status(fill(&mut g, buf, 16), abi::STATUS_OK);
    assert_eq!(g.read32(abi::REG_STATUS) & abi::STATUS_FATAL, 0);
    let errors = g.error_count();
    let resets_before = resets.load(Ordering::SeqCst);
    g.clear_irqs();

    // The faulting launch says what happened; the state is lost all the same.
    assert_status(fill(&mut g, buf, POISON), abi::STATUS_KERNEL_FAULT);
    assert_ne!(
        g.read32(abi::REG_STATUS) & abi::STATUS_FATAL,
        0,
        "FATAL set"
    );
    assert!(g.wait_irq(abi::MSIX_ERROR_VECTOR, Duration::from_secs(5)));
    let logged = g.errors_since(errors);
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0].code, abi::ERR_BACKEND);
    // Every command fails until the reset, and logs nothing more.
    assert_status(fill(&mut g, buf, 16), abi::STATUS_DEVICE_ERROR);
    assert_eq!(g.error_count(), errors + 1);

    // What the guest driver does on FATAL.
    g.control_reset();
    assert_eq!(
        g.read32(abi::REG_STATUS) & abi::STATUS_FATAL,
        0,
        "FATAL cleared"
    );
    assert_eq!(resets.load(Ordering::SeqCst), resets_before + 1);
    g.enable_device();
    g.setup_queue(0, 64, Mode::Interrupt);
    let buf = g.device_alloc(0, 4096);
    assert_status(fill(&mut g, buf, 16), abi::STATUS_OK);
}
