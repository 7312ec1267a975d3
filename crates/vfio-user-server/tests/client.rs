//! Drives the engine through the `vfio_user` crate's `Client` (the client
//! cloud-hypervisor uses) and through a raw client for what that `Client`
//! lacks (fd-less DMA, ioeventfds, posted writes), over a real socket.

mod common;

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use common::{guest_ram, le32, RawClient, TestServer};
use vfio_user::Client;
use vfio_user_server::proto::{Command, FLAG_NO_REPLY, FLAG_TYPE_COMMAND, FLAG_TYPE_REPLY};
use vfio_user_server::sample::{regs, BAR2_SIZE, SAMPLE_ID};
use vmm_sys_util::eventfd::EventFd;

const VFIO_IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
const VFIO_IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
const IRQ_MSIX: u32 = 2;
const GUEST_RAM: u64 = 1 << 20;
const GUEST_BASE: u64 = 0x1_0000_0000;

fn read32(c: &mut Client, region: u32, off: u64) -> u32 {
    let mut b = [0u8; 4];
    c.region_read(region, off, &mut b).unwrap();
    u32::from_le_bytes(b)
}

fn write32(c: &mut Client, region: u32, off: u64, v: u32) {
    c.region_write(region, off, &v.to_le_bytes()).unwrap();
}

/// Connects once, as a VMM does (a client that arrives while the server
/// tears down the previous one waits in the backlog).
fn connect(server: &TestServer) -> Client {
    Client::new(&server.path).unwrap_or_else(|e| panic!("cannot connect: {e}"))
}

fn device_dma(c: &mut Client, cmd: u32, addr: u64, len: u32) -> u32 {
    write32(c, 0, regs::DMA_ADDR_LO, addr as u32);
    write32(c, 0, regs::DMA_ADDR_HI, (addr >> 32) as u32);
    write32(c, 0, regs::DMA_LEN, len);
    write32(c, 0, regs::DMA_CMD, cmd);
    read32(c, 0, regs::DMA_STATUS)
}

#[test]
fn test_client_negotiates_and_sees_regions() {
    let server = TestServer::sample();
    let mut c = connect(&server);
    let bar0 = c.region(0).unwrap();
    assert_eq!(bar0.size, 4096);
    assert!(bar0.file_offset.is_none());
    let bar2 = c.region(2).unwrap();
    assert_eq!(bar2.size, BAR2_SIZE);
    assert!(bar2.file_offset.is_some(), "BAR2 comes with an fd");
    assert_eq!(bar2.sparse_areas.len(), 1);
    assert_eq!(bar2.sparse_areas[0].size, BAR2_SIZE);
    assert_eq!(c.region(1).unwrap().size, 0);
    assert_eq!(read32(&mut c, 7, 0), 0x0001_1ee7);
    assert_eq!(read32(&mut c, 7, 8) >> 8, 0xff0000);
    assert_eq!(read32(&mut c, 0, regs::ID), SAMPLE_ID);
    let msix = c.get_irq_info(IRQ_MSIX).unwrap();
    assert_eq!(msix.count, 2);
}

#[test]
fn test_client_region_write_reaches_device() {
    let server = TestServer::sample();
    let mut c = connect(&server);
    write32(&mut c, 0, regs::SCRATCH, 0xdead_beef);
    assert_eq!(read32(&mut c, 0, regs::SCRATCH), 0xdead_beef);
    assert_eq!(read32(&mut c, 0, regs::SCRATCH_INV), 0x2152_4110);
}

#[test]
fn test_client_mmap_bar2_is_device_memory() {
    let server = TestServer::sample();
    let mut c = connect(&server);
    let fo = c.region(2).unwrap().file_offset.as_ref().unwrap();
    let file = fo.file().try_clone().unwrap();
    let start = fo.start();
    // What a VMM does when it maps the area into the guest.
    file.write_all_at(&0x1111_1111u32.to_le_bytes(), start)
        .unwrap();
    file.write_all_at(&0x2222_2222u32.to_le_bytes(), start + 4)
        .unwrap();
    assert_eq!(read32(&mut c, 0, regs::BAR2_SUM), 0x3333_3333);
}

#[test]
fn test_client_dma_map_fd_and_device_access() {
    let server = TestServer::sample();
    let mut c = connect(&server);
    let ram = guest_ram(GUEST_RAM);
    c.dma_map(0, GUEST_BASE, GUEST_RAM, ram.as_raw_fd())
        .unwrap();

    // Guest memory -> device memory.
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    ram.write_all_at(&pattern, 0x2000).unwrap();
    assert_eq!(device_dma(&mut c, 1, GUEST_BASE + 0x2000, 4096), 0);
    let mut back = vec![0u8; 4096];
    c.region_read(2, 0, &mut back).unwrap();
    assert_eq!(back, pattern);

    // Device memory -> guest memory.
    c.region_write(2, 0, b"from the device").unwrap();
    assert_eq!(device_dma(&mut c, 2, GUEST_BASE + 0x8000, 15), 0);
    let mut got = [0u8; 15];
    ram.read_exact_at(&mut got, 0x8000).unwrap();
    assert_eq!(&got, b"from the device");

    // Outside the mapping, or straddling its end: a DMA fault, nothing touched.
    let efault = libc::EFAULT as u32;
    assert_eq!(
        device_dma(&mut c, 2, GUEST_BASE + GUEST_RAM - 8, 15),
        efault
    );
    assert_eq!(device_dma(&mut c, 1, GUEST_BASE - 4096, 16), efault);

    // After unmap, the memory is out of reach.
    c.dma_unmap(GUEST_BASE, GUEST_RAM).unwrap();
    assert_eq!(device_dma(&mut c, 1, GUEST_BASE + 0x2000, 16), efault);
}

#[test]
fn test_client_msix_eventfd_delivery() {
    let server = TestServer::sample();
    let mut c = connect(&server);
    let efd = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    c.set_irqs(
        IRQ_MSIX,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
        1,
        1,
        &[efd.as_raw_fd()],
    )
    .unwrap();
    write32(&mut c, 0, regs::IRQ, 1);
    assert_eq!(efd.read().unwrap(), 1);
    // Vector 0 has no eventfd: nothing arrives on vector 1's.
    write32(&mut c, 0, regs::IRQ, 0);
    assert!(efd.read().is_err());
}

#[test]
fn test_client_reset_returns_power_on_state() {
    let server = TestServer::sample();
    let mut c = connect(&server);
    write32(&mut c, 0, regs::SCRATCH, 42);
    c.region_write(2, 0, &[0xff; 64]).unwrap();
    c.reset().unwrap();
    assert_eq!(read32(&mut c, 0, regs::SCRATCH), 0);
    assert_eq!(read32(&mut c, 0, regs::BAR2_SUM), 0);
}

#[test]
fn test_client_reconnect_gets_fresh_device() {
    let server = TestServer::sample();
    let ram = guest_ram(GUEST_RAM);
    {
        let mut c = connect(&server);
        c.dma_map(0, GUEST_BASE, GUEST_RAM, ram.as_raw_fd())
            .unwrap();
        write32(&mut c, 0, regs::SCRATCH, 7);
        c.shutdown().unwrap();
    }
    // A restarted VMM connects to the same socket without a server restart.
    let mut c = connect(&server);
    assert_eq!(read32(&mut c, 0, regs::SCRATCH), 0, "device was reset");
    assert_eq!(
        device_dma(&mut c, 1, GUEST_BASE, 16),
        libc::EFAULT as u32,
        "old mappings were dropped"
    );
    c.dma_map(0, GUEST_BASE, GUEST_RAM, ram.as_raw_fd())
        .unwrap();
    assert_eq!(device_dma(&mut c, 1, GUEST_BASE, 16), 0);
    assert!(server.alive());
}

#[test]
fn test_second_client_waits_until_first_leaves() {
    let server = TestServer::sample();
    let mut first = connect(&server);
    write32(&mut first, 0, regs::SCRATCH, 5);
    let mut second = RawClient::connect(&server.path);
    let mut version = vec![0, 0, 0, 0];
    version.extend_from_slice(br#"{"capabilities":{"max_msg_fds":1}}"#);
    version.push(0);
    let id = second.send(Command::Version as u16, &version, &[]);
    // Held, neither answered nor closed, while the first is served.
    second
        .stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let held = (&second.stream).read(&mut [0u8; 1]);
    assert!(
        matches!(&held, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "the second client must wait: {held:?}"
    );
    assert_eq!(read32(&mut first, 0, regs::ID), SAMPLE_ID);
    first.shutdown().unwrap();
    drop(first);
    // Served as soon as the first is gone, on a reset device.
    second
        .stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let reply = second.recv();
    assert_eq!(reply.header.msg_id, id);
    assert!(!reply.is_error());
    let r = second.call(
        Command::RegionRead as u16,
        &region_read_payload(0, regs::SCRATCH, 4),
        &[],
    );
    assert!(!r.is_error());
    assert_eq!(r.payload[16..20], 0u32.to_le_bytes(), "device was reset");
}

/// Builds a REGION_WRITE payload of a 32-bit register.
fn region_write_payload(region: u32, off: u64, v: u32) -> Vec<u8> {
    let mut p = off.to_le_bytes().to_vec();
    p.extend_from_slice(&region.to_le_bytes());
    p.extend_from_slice(&4u32.to_le_bytes());
    p.extend_from_slice(&le32(v));
    p
}

fn region_read_payload(region: u32, off: u64, count: u32) -> Vec<u8> {
    let mut p = off.to_le_bytes().to_vec();
    p.extend_from_slice(&region.to_le_bytes());
    p.extend_from_slice(&count.to_le_bytes());
    p
}

fn raw_read32(c: &mut RawClient, off: u64) -> u32 {
    let r = c.call(9, &region_read_payload(0, off, 4), &[]);
    assert!(!r.is_error());
    u32::from_le_bytes(r.payload[16..20].try_into().unwrap())
}

#[test]
fn test_posted_writes_are_ordered_before_reads() {
    let server = TestServer::sample();
    let mut c = RawClient::connect(&server.path);
    c.negotiate();
    for v in 1..=50u32 {
        c.send_flags(
            10,
            FLAG_TYPE_COMMAND | FLAG_NO_REPLY,
            &region_write_payload(0, regs::SCRATCH, v),
            &[],
        );
    }
    // No reply was sent for the posted writes: the next message is this read's reply.
    assert_eq!(raw_read32(&mut c, regs::SCRATCH), 50);
    assert_eq!(raw_read32(&mut c, regs::WRITE_COUNT), 50);
}

#[test]
fn test_fdless_dma_is_served_through_dma_read_write_requests() {
    let server = TestServer::sample();
    let mut c = RawClient::connect(&server.path);
    c.negotiate();
    // DMA_MAP without an fd: the client keeps the memory.
    let mut map = Vec::new();
    for v in [32u32, 3] {
        map.extend_from_slice(&v.to_le_bytes());
    }
    for v in [0u64, 0x4000_0000, 0x10000] {
        map.extend_from_slice(&v.to_le_bytes());
    }
    assert!(!c.call(2, &map, &[]).is_error());
    let mut client_mem = vec![0u8; 0x10000];
    for (i, b) in client_mem.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }

    for (off, v) in [
        (regs::DMA_ADDR_LO, 0x4000_0100u32),
        (regs::DMA_ADDR_HI, 0),
        (regs::DMA_LEN, 300),
    ] {
        assert!(!c.call(10, &region_write_payload(0, off, v), &[]).is_error());
    }
    // DMA_CMD=1 makes the device read client memory while serving this write:
    // a DMA_READ request arrives before the write's reply.
    let write_id = c.send(10, &region_write_payload(0, regs::DMA_CMD, 1), &[]);
    let req = c.recv();
    assert_eq!(req.header.command, 11, "expected DMA_READ");
    assert_eq!(req.header.flags & 0xf, FLAG_TYPE_COMMAND);
    let addr = u64::from_le_bytes(req.payload[0..8].try_into().unwrap());
    let count = u64::from_le_bytes(req.payload[8..16].try_into().unwrap());
    assert_eq!((addr, count), (0x4000_0100, 300));
    // Meanwhile the client sends a request of its own; it must be served after.
    let read_id = c.send(9, &region_read_payload(0, regs::SCRATCH_INV, 4), &[]);
    let off = (addr - 0x4000_0000) as usize;
    let mut reply = req.payload[0..16].to_vec();
    reply.extend_from_slice(&client_mem[off..off + count as usize]);
    c.send_raw(
        &{
            let h = vfio_user_server::proto::Header {
                msg_id: req.header.msg_id,
                command: 11,
                msg_size: (16 + reply.len()) as u32,
                flags: FLAG_TYPE_REPLY,
                error: 0,
            };
            let mut b = h.encode().to_vec();
            b.extend_from_slice(&reply);
            b
        },
        &[],
    );
    let w = c.recv();
    assert_eq!(w.header.msg_id, write_id);
    assert!(!w.is_error());
    let r = c.recv();
    assert_eq!(r.header.msg_id, read_id);
    assert_eq!(
        u32::from_le_bytes(r.payload[16..20].try_into().unwrap()),
        !0u32
    );
    assert_eq!(raw_read32(&mut c, regs::DMA_STATUS), 0);
    let got = c.call(9, &region_read_payload(2, 0, 300), &[]);
    assert_eq!(&got.payload[16..], &client_mem[0x100..0x100 + 300]);
}

#[test]
fn test_fdless_dma_client_error_is_a_device_fault() {
    let server = TestServer::sample();
    let mut c = RawClient::connect(&server.path);
    c.negotiate();
    let mut map = Vec::new();
    for v in [32u32, 3] {
        map.extend_from_slice(&v.to_le_bytes());
    }
    for v in [0u64, 0x4000_0000, 0x1000] {
        map.extend_from_slice(&v.to_le_bytes());
    }
    assert!(!c.call(2, &map, &[]).is_error());
    for (off, v) in [
        (regs::DMA_ADDR_LO, 0x4000_0000u32),
        (regs::DMA_ADDR_HI, 0),
        (regs::DMA_LEN, 8),
    ] {
        c.call(10, &region_write_payload(0, off, v), &[]);
    }
    let write_id = c.send(10, &region_write_payload(0, regs::DMA_CMD, 2), &[]);
    let req = c.recv();
    assert_eq!(req.header.command, 12, "expected DMA_WRITE");
    let h = vfio_user_server::proto::Header {
        msg_id: req.header.msg_id,
        command: 12,
        msg_size: 16,
        flags: FLAG_TYPE_REPLY | vfio_user_server::proto::FLAG_ERROR,
        error: libc::EFAULT as u32,
    };
    c.send_raw(&h.encode(), &[]);
    assert_eq!(c.recv().header.msg_id, write_id);
    assert_eq!(raw_read32(&mut c, regs::DMA_STATUS), libc::EFAULT as u32);
}

#[test]
fn test_ioeventfd_doorbell_reaches_device() {
    let server = TestServer::sample();
    let mut c = RawClient::connect(&server.path);
    c.negotiate();
    let mut p = Vec::new();
    for v in [256u32, 0, 0, 0] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    let r = c.call(6, &p, &[]);
    assert!(!r.is_error());
    let count = u32::from_le_bytes(r.payload[12..16].try_into().unwrap());
    assert_eq!(count, 1);
    let offset = u64::from_le_bytes(r.payload[16..24].try_into().unwrap());
    assert_eq!(offset, regs::DOORBELL);
    assert_eq!(r.fds.len(), 1);
    // SAFETY: the fd came with the reply and is owned by this File; EventFd takes it over.
    let efd = unsafe {
        EventFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(
            r.fds.into_iter().next().unwrap(),
        ))
    };
    efd.write(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while raw_read32(&mut c, regs::DOORBELL_COUNT) == 0 {
        assert!(Instant::now() < deadline, "doorbell never arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Asking with a small argsz returns the size needed and no fds.
    let mut p = Vec::new();
    for v in [16u32, 0, 0, 0] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    let r = c.call(6, &p, &[]);
    assert_eq!(u32::from_le_bytes(r.payload[0..4].try_into().unwrap()), 56);
    assert!(r.fds.is_empty());
}

#[test]
fn test_qemu_style_range_unmaps_remove_everything_inside() {
    let server = TestServer::sample();
    let mut c = connect(&server);
    let ram = guest_ram(4 << 20);
    c.dma_map(0, 0, 1 << 20, ram.as_raw_fd()).unwrap();
    c.dma_map(1 << 20, 0x1_0000_0000, 1 << 20, ram.as_raw_fd())
        .unwrap();
    // The guest enabling its IOMMU: unmaps in large power-of-two chunks,
    // some covering nothing, some covering several mappings.
    let mut size = 1u64 << 32;
    while size <= 1 << 47 {
        c.dma_unmap(size, size).unwrap();
        size <<= 1;
    }
    assert_eq!(
        device_dma(&mut c, 1, 0x1_0000_0000, 16),
        libc::EFAULT as u32
    );
    assert_eq!(
        device_dma(&mut c, 1, 0, 16),
        0,
        "low mapping untouched so far"
    );
    c.dma_unmap(0, 1 << 32).unwrap();
    assert_eq!(device_dma(&mut c, 1, 0, 16), libc::EFAULT as u32);
}

#[test]
fn test_region_info_small_argsz_announces_size_without_caps_flag() {
    let server = TestServer::sample();
    let mut c = RawClient::connect(&server.path);
    c.negotiate();
    let query = |c: &mut RawClient, argsz: u32| {
        let mut p = Vec::new();
        for v in [argsz, 0, 2, 0] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        p.extend_from_slice(&[0u8; 16]);
        let r = c.call(5, &p, &[]);
        assert!(!r.is_error());
        let word = |i: usize| u32::from_le_bytes(r.payload[i..i + 4].try_into().unwrap());
        (word(0), word(4), word(12), r.payload.len(), r.fds.len())
    };
    const CAPS: u32 = 1 << 3;
    // Too small for the sparse-mmap capability: the size needed, no caps
    // and no CAPS flag (QEMU refuses CAPS with cap_offset 0).
    let (argsz, flags, cap_offset, len, fds) = query(&mut c, 32);
    assert_eq!(
        (argsz, flags & CAPS, cap_offset, len, fds),
        (64, 0, 0, 32, 1)
    );
    let (argsz, flags, cap_offset, len, _) = query(&mut c, 64);
    assert_eq!((argsz, flags & CAPS, cap_offset, len), (64, CAPS, 32, 64));
}

/// INTx with a resample eventfd, as a VMM with KVM's irqfd sets it up:
/// the device's INTx masks itself when it fires, a second one waits, and
/// a write to the unmask eventfd (the guest's end of interrupt) delivers
/// it. An fd that is not an eventfd is dropped rather than spun on.
#[test]
fn test_intx_unmask_eventfd_delivers_the_pending_interrupt() {
    const IRQ_INTX: u32 = 0;
    const VFIO_IRQ_SET_ACTION_UNMASK: u32 = 1 << 4;
    let server = TestServer::sample();
    let mut c = connect(&server);
    let trigger = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let resample = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    c.set_irqs(
        IRQ_INTX,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
        0,
        1,
        &[trigger.as_raw_fd()],
    )
    .unwrap();
    c.set_irqs(
        IRQ_INTX,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_UNMASK,
        0,
        1,
        &[resample.as_raw_fd()],
    )
    .unwrap();
    // MSI-X is off: the sample device raises INTx.
    write32(&mut c, 0, regs::IRQ, 0);
    assert_eq!(trigger.read().unwrap(), 1);
    write32(&mut c, 0, regs::IRQ, 0);
    assert!(trigger.read().is_err(), "INTx is masked until the EOI");
    resample.write(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match trigger.read() {
            Ok(n) => {
                assert_eq!(n, 1);
                break;
            }
            Err(_) => {
                assert!(Instant::now() < deadline, "the pending INTx never came");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
    // A pipe whose writer is gone is always readable: the engine drops it
    // and keeps serving.
    let mut fds = [0; 2];
    // SAFETY: pipe writes two new fds into `fds`.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both fds were just created and are owned here.
    let (rd, wr) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    drop(wr);
    c.set_irqs(
        IRQ_INTX,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_UNMASK,
        0,
        1,
        &[rd.as_raw_fd()],
    )
    .unwrap();
    use std::os::unix::fs::MetadataExt;
    let pipe = format!("pipe:[{}]", rd.metadata().unwrap().ino());
    let deadline = Instant::now() + Duration::from_secs(5);
    while epoll_watches(&pipe) {
        assert!(
            Instant::now() < deadline,
            "the event loop still watches a dead unmask fd"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Still serving.
    write32(&mut c, 0, regs::IRQ, 0);
}

/// Whether an epoll instance of this process watches an fd whose
/// `/proc/self/fd` link reads `target` (e.g. `pipe:[123]`).
fn epoll_watches(target: &str) -> bool {
    let link = |fd: &str| std::fs::read_link(format!("/proc/self/fd/{fd}")).ok();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|fd| link(fd).is_some_and(|l| l.to_string_lossy() == "anon_inode:[eventpoll]"))
        .filter_map(|fd| std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok())
        .any(|info| {
            info.lines()
                .filter_map(|l| l.strip_prefix("tfd:")?.split_whitespace().next())
                .any(|tfd| link(tfd).is_some_and(|l| l.to_string_lossy() == target))
        })
}
