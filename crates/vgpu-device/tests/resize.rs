//! A live resize of a function's memory: the quota moves, the register
//! says so, the driver hears of it, and the guest's data stays.

mod common;

use std::time::Duration;

use common::MIB;
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::OpError;
use vgpu_device::testing::{software_partition, test_config, TestVgpu};
use vgpu_testkit::abi;
use vgpu_testkit::Mode;

#[test]
fn test_a_resize_moves_the_quota_and_tells_the_driver() {
    let backend = SoftwareBackend::new(32 * MIB, 2);
    let server = TestVgpu::start(
        test_config("resize", 1),
        software_partition(&backend, "resize", 8 * MIB, 2),
    );
    let resize = server.memory();
    let mut g = server.connect();
    assert!(g.read64(abi::REG_FEATURES) & abi::FEATURE_RESIZE != 0);
    g.setup_queue(0, 16, Mode::Interrupt);
    assert_eq!(g.read64(abi::REG_MEM_SIZE), 8 * MIB);
    let a = g.device_alloc(0, 6 * MIB);
    assert_eq!(
        g.run(0, &vgpu_testkit::fill_chain(a, 6 * MIB, 0xabad_cafe))
            .status,
        abi::STATUS_OK
    );
    assert_eq!(g.mem_alloc(0, 4 * MIB, 0).status, abi::STATUS_NO_MEMORY);

    // Grow: at once, with an interrupt on the error vector.
    g.clear_irqs();
    resize.resize(16 * MIB).expect("grow");
    assert!(g.wait_irq(abi::MSIX_ERROR_VECTOR, Duration::from_secs(10)));
    assert_eq!(
        g.read32(abi::REG_IRQ_CAUSE) & abi::IRQ_CAUSE_CONFIG,
        abi::IRQ_CAUSE_CONFIG
    );
    g.write32(abi::REG_IRQ_CAUSE, abi::IRQ_CAUSE_CONFIG);
    assert_eq!(g.read32(abi::REG_IRQ_CAUSE) & abi::IRQ_CAUSE_CONFIG, 0);
    assert_eq!(g.read64(abi::REG_MEM_SIZE), 16 * MIB);
    assert_eq!(g.error_count(), 0, "a resize is no error");
    let b = g.device_alloc(0, 10 * MIB);

    // Shrinking below what the guest holds is refused; nothing changes.
    assert!(matches!(resize.resize(12 * MIB), Err(OpError::Invalid(_))));
    assert_eq!(g.read64(abi::REG_MEM_SIZE), 16 * MIB);
    // More than the GPU has left (32 MiB less the 16 held) does not fit.
    assert!(matches!(
        resize.resize(40 * MIB),
        Err(OpError::NoMemory { .. })
    ));
    assert_eq!(g.read64(abi::REG_MEM_SIZE), 16 * MIB);
    assert_eq!(backend.unclaimed().memory, 16 * MIB);

    // Shrink to what is held once the guest let go of some.
    assert_eq!(g.mem_free(0, b).status, abi::STATUS_OK);
    resize.resize(6 * MIB).expect("shrink");
    assert_eq!(g.read64(abi::REG_MEM_SIZE), 6 * MIB);
    assert_eq!(backend.unclaimed().memory, 26 * MIB);
    assert_eq!(g.mem_alloc(0, 4096, 0).status, abi::STATUS_NO_MEMORY);
    // The data stayed where it was.
    let sg = g.alloc_sg(&[6 * MIB]);
    assert_eq!(g.copy_from_device(0, a, &sg).status, abi::STATUS_OK);
    let back = g.read_sg(&sg);
    assert!(back
        .chunks_exact(4)
        .all(|w| u32::from_le_bytes(w.try_into().unwrap()) == 0xabad_cafe));
}

#[test]
fn test_a_resize_before_a_vmm_comes_is_read_with_no_interrupt() {
    let backend = SoftwareBackend::new(32 * MIB, 2);
    let server = TestVgpu::start(
        test_config("resize-early", 1),
        software_partition(&backend, "resize-early", 8 * MIB, 2),
    );
    server.memory().resize(12 * MIB).expect("before any VMM");
    let mut g = server.connect();
    assert_eq!(g.read64(abi::REG_MEM_SIZE), 12 * MIB);
    assert_eq!(g.read32(abi::REG_IRQ_CAUSE) & abi::IRQ_CAUSE_CONFIG, 0);
}
