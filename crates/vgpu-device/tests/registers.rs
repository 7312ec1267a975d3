//! Register reads of identity and partition information, the PCI view of
//! the function, and queue register read-back.

mod common;

use common::MIB;
use vgpu_device::testing::{test_config, TestVgpu};
use vgpu_testkit::abi;
use vgpu_testkit::Mode;

#[test]
fn test_identity_and_partition_registers() {
    let mut config = test_config("regs", 3);
    config.window_size = 2 * MIB;
    // A quota above 4 GiB shows in the high half of REG_MEM_SIZE; the
    // software backend only spends host memory on allocations.
    let memory = (5u64 << 32) + 4096;
    let server = TestVgpu::software(config, memory, 7);
    let mut g = server.connect();

    assert_eq!(g.read32(abi::REG_MAGIC), abi::ABI_MAGIC);
    assert_eq!(
        g.read32(abi::REG_VERSION),
        abi::ABI_VERSION_MAJOR << 16 | abi::ABI_VERSION_MINOR
    );
    let features = g.read64(abi::REG_FEATURES);
    for f in [
        abi::FEATURE_EVENT_IDX,
        abi::FEATURE_POLLED,
        abi::FEATURE_WINDOW,
        abi::FEATURE_TIMESTAMP,
    ] {
        assert!(features & f != 0, "feature {f:#x} offered");
    }
    assert_eq!(g.read64(abi::REG_MEM_SIZE), memory);
    // The same through two 32-bit reads.
    assert_eq!(g.read32(abi::REG_MEM_SIZE), 4096);
    assert_eq!(g.read32(abi::REG_MEM_SIZE + 4), 5);
    assert_eq!(g.read32(abi::REG_COMPUTE_UNITS), 7);
    assert_eq!(g.read32(abi::REG_MAX_QUEUES), 3);
    assert_eq!(g.read64(abi::REG_WINDOW_SIZE), 2 * MIB);
    assert_eq!(g.read32(abi::REG_MAX_QUEUE_SIZE), abi::MAX_QUEUE_SIZE);
    assert_eq!(
        g.read32(abi::REG_DOORBELL_OFFSET) as u64,
        abi::DOORBELL_OFFSET
    );
    assert_eq!(g.read32(abi::REG_STATUS), abi::STATUS_ENABLED);
    assert_eq!(g.read32(abi::REG_CONTROL), abi::CONTROL_ENABLE);
    assert_eq!(g.mem_used(), 0);
    assert_eq!(g.error_count(), 0);
    // Unassigned offsets read as zero.
    assert_eq!(g.read32(0x0fc), 0);
    assert_eq!(g.num_queues(), 3);
}

#[test]
fn test_pci_view_of_the_function() {
    let server = TestVgpu::software(test_config("pci", 2), 16 * MIB, 1);
    let mut g = server.connect();
    let c = g.client();
    let bar0 = c.region(abi::BAR_REGS).expect("BAR0");
    assert_eq!(bar0.size, abi::BAR0_SIZE);
    assert_eq!(
        bar0.sparse_areas.len(),
        1,
        "only the doorbell page is mappable"
    );
    assert_eq!(bar0.sparse_areas[0].offset, abi::DOORBELL_OFFSET);
    assert_eq!(bar0.sparse_areas[0].size, abi::DOORBELL_SIZE);
    let bar2 = c.region(abi::BAR_WINDOW).expect("BAR2");
    assert_eq!(bar2.size, MIB);
    assert!(bar2.file_offset.is_some(), "the window is mappable");
    let mut id = [0u8; 4];
    c.region_read(7, 0, &mut id).unwrap();
    assert_eq!(
        u32::from_le_bytes(id),
        u32::from(abi::PCI_DEVICE_ID) << 16 | u32::from(abi::PCI_VENDOR_ID)
    );
    let mut class = [0u8; 4];
    c.region_read(7, 8, &mut class).unwrap();
    assert_eq!(u32::from_le_bytes(class) >> 8, abi::PCI_CLASS);
    assert_eq!(class[0], abi::PCI_REVISION);
    assert_eq!(c.get_irq_info(2).unwrap().count, abi::MSIX_VECTORS);
}

#[test]
fn test_queue_registers_read_back() {
    let server = TestVgpu::software(test_config("qregs", 4), 16 * MIB, 1);
    let mut g = server.connect();
    for q in 0..4 {
        assert_eq!(g.qread32(q, abi::QREG_MSIX_VECTOR), q + 1, "default vector");
        assert_eq!(g.qread32(q, abi::QREG_STATUS), 0);
    }
    g.setup_queue(2, 128, Mode::Polled);
    let l = g.layout(2);
    assert_eq!(g.qread32(2, abi::QREG_SIZE), 128);
    assert_eq!(
        g.qread32(2, abi::QREG_CONTROL),
        abi::QCONTROL_ENABLE | abi::QCONTROL_POLLED
    );
    assert_eq!(g.qread32(2, abi::QREG_STATUS), abi::QSTATUS_ENABLED);
    assert_eq!(g.qread32(2, abi::QREG_ERROR), abi::ERR_NONE);
    for (reg, addr) in [
        (abi::QREG_DESC, l.desc),
        (abi::QREG_AVAIL, l.avail),
        (abi::QREG_USED, l.used),
    ] {
        assert_eq!(g.read64(abi::queue_reg(2, reg)), addr);
        assert_eq!(g.qread32(2, reg + 4), (addr >> 32) as u32);
    }
    // Out-of-range vectors are refused, "no vector" is accepted.
    g.qwrite32(0, abi::QREG_MSIX_VECTOR, abi::MSIX_VECTORS);
    assert_eq!(g.qread32(0, abi::QREG_MSIX_VECTOR), 1);
    g.qwrite32(0, abi::QREG_MSIX_VECTOR, abi::MSIX_NO_VECTOR);
    assert_eq!(g.qread32(0, abi::QREG_MSIX_VECTOR), abi::MSIX_NO_VECTOR);
    // IRQ mask is read-write.
    g.write32(abi::REG_IRQ_MASK, abi::IRQ_CAUSE_ERROR);
    assert_eq!(g.read32(abi::REG_IRQ_MASK), abi::IRQ_CAUSE_ERROR);
}

#[test]
fn test_config_space_is_pcie_sized_with_an_empty_extended_list() {
    let server = TestVgpu::software(test_config("pcie", 1), 16 * MIB, 1);
    let mut g = server.connect();
    let c = g.client();
    assert_eq!(c.region(7).expect("config region").size, 4096);
    c.region_write(7, 0x100, &[0xff; 4]).unwrap();
    c.region_write(7, 0xffe, &[0xff; 2]).unwrap();
    let mut ext = vec![0xa5u8; 0xf00];
    c.region_read(7, 0x100, &mut ext).unwrap();
    assert!(
        ext.iter().all(|b| *b == 0),
        "extended config space reads zero"
    );
}

#[test]
fn test_odd_bar0_accesses_get_what_hardware_gives() {
    let server = TestVgpu::software(test_config("odd", 1), 16 * MIB, 1);
    let mut g = server.connect();
    let magic = abi::ABI_MAGIC.to_le_bytes();
    let version = g.read32(abi::REG_VERSION).to_le_bytes();
    let c = g.client();
    let mut b = [0u8; 3];
    c.region_read(abi::BAR_REGS, abi::REG_MAGIC + 1, &mut b)
        .unwrap();
    assert_eq!(b, [magic[1], magic[2], magic[3]]);
    let mut b = [0u8; 8];
    c.region_read(abi::BAR_REGS, abi::REG_MAGIC + 2, &mut b)
        .unwrap();
    assert_eq!(
        b[..6],
        [magic[2], magic[3], version[0], version[1], version[2], version[3]]
    );
    // A hole in the register block reads as zero at any width.
    let mut b = [0xffu8; 2];
    c.region_read(abi::BAR_REGS, 0x3fe, &mut b).unwrap();
    assert_eq!(b, [0, 0]);
    // Straddling the last register and the doorbell page: the register's
    // bytes, then the page's.
    let mut b = [0xffu8; 8];
    c.region_read(abi::BAR_REGS, abi::DOORBELL_OFFSET - 4, &mut b)
        .unwrap();
    assert_eq!(b, [0; 8]);
    // Narrow writes to registers are dropped; to the doorbell page they land.
    c.region_write(abi::BAR_REGS, abi::REG_CONTROL, &[1])
        .unwrap();
    c.region_write(
        abi::BAR_REGS,
        abi::REG_IRQ_MASK + 2,
        &[0xff, 0xff, 0xff, 0xff],
    )
    .unwrap();
    c.region_write(abi::BAR_REGS, abi::DOORBELL_OFFSET + 8, &[7, 0])
        .unwrap();
    let mut b = [0u8; 2];
    c.region_read(abi::BAR_REGS, abi::DOORBELL_OFFSET + 8, &mut b)
        .unwrap();
    assert_eq!(b, [7, 0]);
    // The MSI-X table and PBA are the VMM's: zero, writes ignored.
    c.region_write(abi::BAR_REGS, abi::MSIX_PBA_OFFSET, &[0xff; 4])
        .unwrap();
    let mut b = [0xffu8; 4];
    c.region_read(abi::BAR_REGS, abi::MSIX_PBA_OFFSET, &mut b)
        .unwrap();
    assert_eq!(b, [0; 4]);
    assert_eq!(
        g.read32(abi::REG_CONTROL),
        abi::CONTROL_ENABLE,
        "the byte write was dropped"
    );
    assert_eq!(
        g.read32(abi::REG_IRQ_MASK),
        0,
        "the unaligned write was dropped"
    );
    let counters = server.counters();
    assert_eq!(
        counters
            .odd_reads
            .load(std::sync::atomic::Ordering::Relaxed),
        4
    );
    assert_eq!(
        counters
            .dropped_writes
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}
