//! fds received with refused or abandoned messages must all be closed.
//!
//! The server runs in this process, so an fd it keeps shows up in
//! /proc/self/fd. This is the only test of its binary: other tests running
//! in parallel would open and close fds of their own.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use common::{assert_serves, guest_ram, open_fds, raw, RawClient, TestServer};
use vfio_user_server::irq::{SET_ACTION_TRIGGER, SET_DATA_EVENTFD, SET_DATA_NONE};
use vfio_user_server::proto::{
    Header, DMA_FLAG_READ, DMA_FLAG_WRITE, FLAG_NO_REPLY, FLAG_TYPE_COMMAND, FLAG_TYPE_REPLY,
    HEADER_SIZE, MAX_MESSAGE_SIZE,
};
use vfio_user_server::sample::regs;
use vmm_sys_util::eventfd::EventFd;

const VERSION: u16 = 1;
const DMA_MAP: u16 = 2;
const DEVICE_GET_REGION_INFO: u16 = 5;
const DEVICE_GET_REGION_IO_FDS: u16 = 6;
const DEVICE_SET_IRQS: u16 = 8;
const REGION_READ: u16 = 9;
const REGION_WRITE: u16 = 10;
const DEVICE_RESET: u16 = 13;
const IRQ_INTX: u32 = 0;
const IRQ_MSIX: u32 = 2;

fn header(msg_id: u16, command: u16, msg_size: u32, flags: u32) -> Vec<u8> {
    Header {
        msg_id,
        command,
        msg_size,
        flags,
        error: 0,
    }
    .encode()
    .to_vec()
}

fn u32s(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn map_req(flags: u32, iova: u64, size: u64) -> Vec<u8> {
    let mut p = u32s(&[32, flags]);
    for v in [0u64, iova, size] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p
}

fn access(offset: u64, region: u32, count: u32) -> Vec<u8> {
    let mut p = offset.to_le_bytes().to_vec();
    p.extend_from_slice(&u32s(&[region, count]));
    p
}

fn set_irqs_req(flags: u32, index: u32, start: u32, count: u32) -> Vec<u8> {
    u32s(&[20, flags, index, start, count])
}

/// Sends a command and checks only that a reply to it comes back.
fn call_any(c: &mut RawClient, command: u16, payload: &[u8], fds: &[RawFd]) {
    let _ = c.call(command, payload, fds);
}

/// Half-closes the connection and reads until the server has closed its end.
fn close_and_wait(mut c: RawClient) {
    let _ = c.stream.shutdown(Shutdown::Write);
    c.stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 4096];
    loop {
        match c.stream.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                assert!(Instant::now() < deadline, "server did not close");
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("read failed: {e}"),
        }
    }
}

/// Waits up to three seconds for the fd count to reach `target`.
fn settle(target: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let n = open_fds();
        if n == target || Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A serving check whose connection the server has fully released.
fn serve_and_release(server: &TestServer) {
    assert_serves(server);
    let mut c = RawClient::connect_negotiated(&server.path);
    c.call(REGION_READ, &access(regs::ID, 0, 4), &[]);
    close_and_wait(c);
}

/// Refused messages carrying fds, on a negotiated connection.
fn refused_with_fds(c: &mut RawClient, efds: &[RawFd], ram: RawFd) {
    let rw = DMA_FLAG_READ | DMA_FLAG_WRITE;
    let efd_trigger = SET_DATA_EVENTFD | SET_ACTION_TRIGGER;
    // DMA_MAP: two fds, an fd that cannot be mapped, bad arguments.
    call_any(c, DMA_MAP, &map_req(rw, 0x10000, 0x1000), &[ram, efds[0]]);
    call_any(c, DMA_MAP, &map_req(rw, 0x10000, 0x1000), &efds[..1]);
    call_any(c, DMA_MAP, &map_req(rw | 1 << 5, 0x10000, 0x1000), &[ram]);
    call_any(c, DMA_MAP, &map_req(rw, 0x10001, 0x1000), &[ram]);
    call_any(c, DMA_MAP, &map_req(rw, 0x10000, 0x1000)[..20], &[ram]);
    // A mapping kept until the disconnect, then an overlapping one.
    call_any(c, DMA_MAP, &map_req(rw, 0x20000, 0x4000), &[ram]);
    call_any(c, DMA_MAP, &map_req(rw, 0x21000, 0x1000), &[ram]);
    // Commands that take no fds.
    call_any(c, DEVICE_RESET, &[], &efds[..2]);
    call_any(c, REGION_READ, &access(0, 0, 4), efds);
    call_any(c, 99, &[], &efds[..3]);
    call_any(c, VERSION, &[0, 0, 0, 0], &[ram]);
    // SET_IRQS whose fds do not match, or are not eventfds.
    call_any(
        c,
        DEVICE_SET_IRQS,
        &set_irqs_req(efd_trigger, IRQ_MSIX, 0, 2),
        &efds[..3],
    );
    call_any(
        c,
        DEVICE_SET_IRQS,
        &set_irqs_req(efd_trigger, IRQ_MSIX, 0, 0),
        &efds[..1],
    );
    call_any(
        c,
        DEVICE_SET_IRQS,
        &set_irqs_req(efd_trigger, 7, 0, 1),
        &efds[..1],
    );
    let none = SET_DATA_NONE | SET_ACTION_TRIGGER;
    call_any(
        c,
        DEVICE_SET_IRQS,
        &set_irqs_req(none, IRQ_MSIX, 0, 1),
        &efds[..1],
    );
    call_any(
        c,
        DEVICE_SET_IRQS,
        &set_irqs_req(efd_trigger, IRQ_INTX, 0, 1),
        &[ram],
    );
    // Eventfds kept until the disconnect.
    call_any(
        c,
        DEVICE_SET_IRQS,
        &set_irqs_req(efd_trigger, IRQ_MSIX, 0, 2),
        &efds[..2],
    );
    // An unknown message type, a reply nobody asked for and a posted
    // failure, all with fds.
    let id = c.send_flags(REGION_READ, 5, &access(0, 0, 4), &efds[..2]);
    assert_eq!(c.recv().header.msg_id, id);
    c.send_flags(REGION_READ, FLAG_TYPE_REPLY, &access(0, 0, 4), &efds[..4]);
    c.send_flags(
        DEVICE_RESET,
        FLAG_TYPE_COMMAND | FLAG_NO_REPLY,
        &[],
        &efds[..4],
    );
    // fds the server hands out: an ioeventfd and the BAR2 memory.
    let _ = c.call(DEVICE_GET_REGION_IO_FDS, &u32s(&[56, 0, 0, 0]), &[]);
    let _ = c.call(
        DEVICE_GET_REGION_INFO,
        &u32s(&[64, 0, 2, 0, 0, 0, 0, 0]),
        &[],
    );
    assert!(!c.call(REGION_READ, &access(0, 0, 4), &[]).is_error());
}

#[test]
fn test_bad_messages_with_fds_leave_no_fds_open() {
    let server = TestServer::sample();
    serve_and_release(&server);
    std::thread::sleep(Duration::from_millis(100));
    let baseline = open_fds();

    for round in 0..6 {
        let ram = guest_ram(0x10000);
        let efds: Vec<EventFd> = (0..20)
            .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
            .collect();
        let raw_efds: Vec<RawFd> = efds.iter().map(|e| e.as_raw_fd()).collect();

        let mut c = RawClient::connect_negotiated(&server.path);
        refused_with_fds(&mut c, &raw_efds, raw(&ram));
        match round {
            // A plain close.
            0 => close_and_wait(c),
            // A message too large to be trusted, with fds.
            1 => {
                let h = header(1, REGION_WRITE, MAX_MESSAGE_SIZE + 1, FLAG_TYPE_COMMAND);
                c.send_raw(&h, &raw_efds);
                close_and_wait(c);
            }
            // A message too small, with fds.
            2 => {
                c.send_raw(
                    &header(1, REGION_WRITE, 4, FLAG_TYPE_COMMAND),
                    &raw_efds[..8],
                );
                close_and_wait(c);
            }
            // A message cut short, with fds, then a close.
            3 => {
                let mut m = header(1, DMA_MAP, 16 + 32, FLAG_TYPE_COMMAND);
                m.extend_from_slice(&map_req(DMA_FLAG_READ | DMA_FLAG_WRITE, 0x80000, 0x1000)[..8]);
                c.send_raw(&m, &[raw(&ram)]);
                drop(c);
            }
            // The header alone, then the payload carrying the fds.
            4 => {
                c.send_raw(&header(1, DMA_MAP, 16 + 32, FLAG_TYPE_COMMAND), &[]);
                std::thread::sleep(Duration::from_millis(20));
                c.send_raw(
                    &map_req(DMA_FLAG_READ | DMA_FLAG_WRITE, 0x80000, 0x1000),
                    &[raw(&ram), raw_efds[0]],
                );
                let _ = c.recv();
                close_and_wait(c);
            }
            // Fds with a partial header.
            _ => {
                let h = header(1, DEVICE_RESET, 16, FLAG_TYPE_COMMAND);
                c.send_raw(&h[..6], &raw_efds);
                drop(c);
            }
        }

        // fds before VERSION, on a new connection.
        let mut c = RawClient::connect(&server.path);
        loop {
            // Until this connection is the one served: a refused one is closed.
            let r = c
                .stream
                .write_all(&header(1, REGION_READ, 32, FLAG_TYPE_COMMAND));
            let ok = r.is_ok() && c.stream.write_all(&access(0, 0, 4)).is_ok() && {
                let mut hdr = [0u8; HEADER_SIZE];
                c.stream.read_exact(&mut hdr).is_ok()
            };
            if ok {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            c = RawClient::connect(&server.path);
        }
        let rw = DMA_FLAG_READ | DMA_FLAG_WRITE;
        call_any(&mut c, DMA_MAP, &map_req(rw, 0x10000, 0x1000), &[raw(&ram)]);
        let efd_trigger = SET_DATA_EVENTFD | SET_ACTION_TRIGGER;
        let p = set_irqs_req(efd_trigger, IRQ_MSIX, 0, 2);
        call_any(&mut c, DEVICE_SET_IRQS, &p, &raw_efds[..2]);
        close_and_wait(c);

        drop(efds);
        drop(ram);
    }

    serve_and_release(&server);
    let now = settle(baseline);
    assert_eq!(now, baseline, "fds left open after the clients went away");
}
