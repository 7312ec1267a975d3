//! cloud-hypervisor sends SET_IRQS(INTx, UNMASK) after every trapped BAR
//! access while INTx is on: that request must cost the server no
//! allocation and no log line, and still deliver an interrupt left pending
//! while the line was masked.
//!
//! The allocator and the logger of this test binary count what happens
//! while the unmasks flow, so this file holds this one test only.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{RawClient, TestServer};
use vfio_user_server::proto::{Command, Header, FLAG_TYPE_COMMAND, HEADER_SIZE};
use vfio_user_server::sample::regs;
use vmm_sys_util::eventfd::EventFd;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static LOG_LINES: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

struct CountingLogger;

impl log::Log for CountingLogger {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, _: &log::Record<'_>) {
        LOG_LINES.fetch_add(1, Ordering::Relaxed);
    }
    fn flush(&self) {}
}

static LOGGER: CountingLogger = CountingLogger;

const UNMASKS: usize = 1000;
/// Rounds the unmasks after the first are measured in.
const ROUNDS: usize = 3;
const SET_DATA_NONE: u32 = 1 << 0;
const SET_DATA_EVENTFD: u32 = 1 << 2;
const SET_ACTION_UNMASK: u32 = 1 << 4;
const SET_ACTION_TRIGGER: u32 = 1 << 5;
const IRQ_INTX: u32 = 0;

fn set_irqs_payload(flags: u32, count: u32) -> Vec<u8> {
    let mut p = Vec::new();
    for v in [20, flags, IRQ_INTX, 0, count] {
        p.extend_from_slice(&u32::to_le_bytes(v));
    }
    p
}

fn region_write_payload(off: u64, v: u32) -> Vec<u8> {
    let mut p = off.to_le_bytes().to_vec();
    p.extend_from_slice(&0u32.to_le_bytes());
    p.extend_from_slice(&4u32.to_le_bytes());
    p.extend_from_slice(&v.to_le_bytes());
    p
}

#[test]
fn test_intx_unmask_allocates_nothing_and_logs_nothing() {
    log::set_logger(&LOGGER).unwrap();
    log::set_max_level(log::LevelFilter::Trace);
    let server = TestServer::sample();
    let mut c = RawClient::connect_negotiated(&server.path);
    let intx = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let r = c.call(
        Command::DeviceSetIrqs as u16,
        &set_irqs_payload(SET_DATA_EVENTFD | SET_ACTION_TRIGGER, 1),
        &[intx.as_raw_fd()],
    );
    assert!(!r.is_error());

    // The INTx line fires and masks itself; a second interrupt while it is
    // masked stays pending.
    for _ in 0..2 {
        let r = c.call(
            Command::RegionWrite as u16,
            &region_write_payload(regs::IRQ, 0),
            &[],
        );
        assert!(!r.is_error());
    }
    assert_eq!(intx.read().unwrap(), 1, "one interrupt while masked");

    // UNMASK messages, framed once up front; the replies are read into a
    // buffer on the stack.
    let payload = set_irqs_payload(SET_DATA_NONE | SET_ACTION_UNMASK, 1);
    let mut batch = Vec::with_capacity(UNMASKS * (HEADER_SIZE + payload.len()));
    for i in 0..UNMASKS {
        let header = Header {
            msg_id: 0x1000 + i as u16,
            command: Command::DeviceSetIrqs as u16,
            msg_size: (HEADER_SIZE + payload.len()) as u32,
            flags: FLAG_TYPE_COMMAND,
            error: 0,
        };
        batch.extend_from_slice(&header.encode());
        batch.extend_from_slice(&payload);
    }
    let one = HEADER_SIZE + payload.len();
    let mut reply = [0u8; HEADER_SIZE];
    c.stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();

    // The first unmask delivers the pending interrupt.
    c.stream.write_all(&batch[..one]).unwrap();
    c.stream.read_exact(&mut reply).unwrap();
    assert_eq!(Header::decode(&reply).flags & 0xf0, 0, "not an error");
    assert_eq!(intx.read().unwrap(), 1, "the pending interrupt came");

    // The counters are the whole process's: a thread the test does not
    // control (the harness, the server's others) may allocate once in a
    // while. An allocation per unmask would show in every round, so the
    // quietest round must show none.
    let rounds: Vec<(u64, u64)> = batch[one..]
        .chunks(one * (UNMASKS - 1) / ROUNDS)
        .map(|round| {
            let allocs = ALLOCS.load(Ordering::Relaxed);
            let lines = LOG_LINES.load(Ordering::Relaxed);
            for msg in round.chunks(one) {
                c.stream.write_all(msg).unwrap();
                c.stream.read_exact(&mut reply).unwrap();
            }
            (
                ALLOCS.load(Ordering::Relaxed) - allocs,
                LOG_LINES.load(Ordering::Relaxed) - lines,
            )
        })
        .collect();
    let h = Header::decode(&reply);
    assert_eq!(h.msg_id, 0x1000 + UNMASKS as u16 - 1);
    assert_eq!(h.error, 0);
    assert_eq!(rounds.len(), ROUNDS);
    let fewest_allocs = rounds.iter().map(|r| r.0).min();
    let fewest_lines = rounds.iter().map(|r| r.1).min();
    assert_eq!(
        fewest_allocs,
        Some(0),
        "allocations per round of unmasks: {rounds:?}"
    );
    assert_eq!(
        fewest_lines,
        Some(0),
        "log lines per round of unmasks: {rounds:?}"
    );
    assert!(server.alive());
}
