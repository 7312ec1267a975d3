//! A partition that loses its device state (what a kernel fault does to a
//! GPU context): the command fails, STATUS.FATAL is set and an error is
//! logged with the error vector raised, once; everything fails until the
//! driver resets the function, which resets the partition and clears it.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_status, fill_count as fill, Faulting, MIB, POISON};
use vgpu_backend::software::SoftwareBackend;
use vgpu_device::testing::{test_config, TestVgpu};
use vgpu_testkit::abi;
use vgpu_testkit::Mode;

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
