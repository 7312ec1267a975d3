//! The mailbox: frames through shared memory instead of the socket, for
//! hosts that poll. Each direction has one slot (at most one frame is in
//! flight per direction: the protocol is strictly request/reply, and a
//! side writes its next frame only after reading the peer's answer). A
//! sender copies the frame into its slot and bumps the slot's sequence
//! word; a polling receiver sees the bump within a microsecond, with no
//! system call on either side. A receiver that stops polling sets its
//! "asleep" word and blocks on the socket; a sender that sees that word
//! set sends a header-only wake frame on the socket after writing the
//! slot. (Both check after their own write, with sequentially consistent
//! ordering, so a wake is never lost.)
//!
//! The slot is the peer's to write: a frame read from it is copied out
//! first, and its length and header are checked exactly as a socket
//! frame's are. Frames larger than a slot, and frames carrying fds, go
//! on the socket.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::proto::{Header, ProtoError, HEADER_LEN};
use crate::shm::CONTROL_BYTES;
use crate::wire::{self, WireError};

/// Largest frame (header included) that goes through a slot.
pub const SLOT_BYTES: usize = 8 << 10;
/// Kind of the socket frame that wakes a receiver.
pub const WAKE: u16 = 0x7f;
/// Wake frames with nothing behind them tolerated per frame received.
const MAX_SPURIOUS_WAKES: u32 = 64;

/// Offsets in the control area of what carries frames to one side: the
/// sequence and length words the sender writes, the word the receiver sets
/// while it sleeps on the socket, and the slot.
#[derive(Debug, Clone, Copy)]
struct Lane {
    seq: usize,
    len: usize,
    asleep: usize,
    data: usize,
}

impl Lane {
    /// Lane `i`: its words on cache lines apart from the other lane's, its
    /// slot after the first page.
    const fn nth(i: usize) -> Lane {
        Lane {
            seq: 64 * i,
            len: 64 * i + 4,
            asleep: 128 + 64 * i,
            data: 4096 + SLOT_BYTES * i,
        }
    }
}

const TO_HOST: Lane = Lane::nth(0);
const TO_PARENT: Lane = Lane::nth(1);
const _: () = assert!(TO_PARENT.data + SLOT_BYTES <= CONTROL_BYTES);

/// Which end this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The daemon.
    Parent,
    /// The partition host.
    Host,
}

/// One end of the mailbox.
#[derive(Debug)]
pub struct Mailbox {
    base: *mut u8,
    side: Side,
    /// The inbox sequence word last taken.
    seen: u32,
    spin: Duration,
}

// SAFETY: the pointer is to a shared mapping that its owner keeps alive
// (see `new`); all access goes through atomics or byte copies.
unsafe impl Send for Mailbox {}

impl Mailbox {
    /// One end over the control area at `base`.
    ///
    /// # Safety
    /// `base` must be the page-aligned start of a mapping of at least
    /// [`CONTROL_BYTES`] that outlives the mailbox's last use.
    pub unsafe fn new(base: *mut u8, side: Side, spin: Duration) -> Mailbox {
        let mut m = Mailbox {
            base,
            side,
            seen: 0,
            spin,
        };
        m.seen = m.word(m.inbox().seq).load(Ordering::SeqCst);
        m
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        // SAFETY: `off` is one of the 4-byte-aligned offsets above, inside
        // the live control area (see `new`); the peer accesses these words
        // only atomically too.
        unsafe { AtomicU32::from_ptr(self.base.add(off).cast()) }
    }

    /// The lane this end reads.
    fn inbox(&self) -> Lane {
        lane_to(self.side)
    }

    fn outbox(&self) -> Lane {
        lane_to(self.peer())
    }

    fn asleep(&self, side: Side) -> &AtomicU32 {
        self.word(lane_to(side).asleep)
    }

    fn peer(&self) -> Side {
        match self.side {
            Side::Parent => Side::Host,
            Side::Host => Side::Parent,
        }
    }

    /// Sends a frame: through the slot when it fits, else on the socket.
    pub fn send(
        &mut self,
        stream: &UnixStream,
        kind: u16,
        seq: u32,
        payload: &[u8],
    ) -> Result<(), WireError> {
        let total = HEADER_LEN + payload.len();
        if total > SLOT_BYTES {
            return wire::send(stream, kind, seq, payload, None);
        }
        let lane = self.outbox();
        let header = Header {
            kind,
            seq,
            len: payload.len() as u32,
        }
        .encode();
        // SAFETY: `total` bytes at `lane.data` lie inside this end's outbox in
        // the live control area; the peer does not write it.
        unsafe {
            let dst = self.base.add(lane.data);
            std::ptr::copy_nonoverlapping(header.as_ptr(), dst, HEADER_LEN);
            std::ptr::copy_nonoverlapping(payload.as_ptr(), dst.add(HEADER_LEN), payload.len());
        }
        self.word(lane.len).store(total as u32, Ordering::Relaxed);
        self.word(lane.seq).fetch_add(1, Ordering::SeqCst);
        if self.asleep(self.peer()).load(Ordering::SeqCst) != 0 {
            wire::send(stream, WAKE, seq, &[], None)?;
        }
        Ok(())
    }

    /// Takes a new frame from the inbox, if there is one.
    fn take(&mut self, max: u32, buf: &mut Vec<u8>) -> Result<Option<Header>, WireError> {
        let lane = self.inbox();
        let s = self.word(lane.seq).load(Ordering::SeqCst);
        if s == self.seen {
            return Ok(None);
        }
        self.seen = s;
        let total = self.word(lane.len).load(Ordering::Relaxed) as usize;
        if !(HEADER_LEN..=SLOT_BYTES).contains(&total) {
            return Err(ProtoError::Malformed("mailbox frame length").into());
        }
        let mut head = [0u8; HEADER_LEN];
        buf.clear();
        buf.resize(total - HEADER_LEN, 0);
        // SAFETY: `total` bytes at `lane.data` lie inside the inbox slot of the
        // live control area. The peer may be writing them (it is less
        // trusted): they are copied out once and checked as copied.
        unsafe {
            let src = self.base.add(lane.data);
            std::ptr::copy_nonoverlapping(src, head.as_mut_ptr(), HEADER_LEN);
            std::ptr::copy_nonoverlapping(src.add(HEADER_LEN), buf.as_mut_ptr(), buf.len());
        }
        let h = Header::decode(&head, max)?;
        if h.len as usize != buf.len() {
            return Err(ProtoError::Malformed("mailbox frame length").into());
        }
        Ok(Some(h))
    }

    /// Receives a frame whose payload may be at most `max` bytes: polls the
    /// inbox for up to the spin time, then sleeps on the socket (whose
    /// read timeout applies), where large frames and wakes arrive.
    pub fn recv(
        &mut self,
        stream: &mut UnixStream,
        max: u32,
        buf: &mut Vec<u8>,
    ) -> Result<Header, WireError> {
        let start = Instant::now();
        loop {
            if let Some(h) = self.take(max, buf)? {
                return Ok(h);
            }
            if start.elapsed() >= self.spin {
                break;
            }
            std::hint::spin_loop();
        }
        let mut spurious = 0u32;
        loop {
            self.asleep(self.side).store(1, Ordering::SeqCst);
            let r = match self.take(max, buf) {
                Ok(Some(h)) => Ok((h, false)),
                Ok(None) => wire::recv(stream, max, buf, false).map(|(h, _)| (h, true)),
                Err(e) => Err(e),
            };
            self.asleep(self.side).store(0, Ordering::SeqCst);
            let (h, from_socket) = r?;
            if !(from_socket && h.kind == WAKE) {
                return Ok(h);
            }
            if !buf.is_empty() {
                return Err(ProtoError::Malformed("wake with a payload").into());
            }
            if let Some(h) = self.take(max, buf)? {
                return Ok(h);
            }
            spurious += 1;
            if spurious > MAX_SPURIOUS_WAKES {
                return Err(ProtoError::Malformed("wakes with no frame").into());
            }
        }
    }
}

/// A socket, and a mailbox once both ends have set one up.
#[derive(Debug)]
pub struct Conn {
    /// The socket.
    pub stream: UnixStream,
    /// The mailbox, if in use.
    pub mailbox: Option<Mailbox>,
    /// Polling time before sleeping on the socket when there is no mailbox.
    pub spin: Duration,
}

impl Conn {
    /// Sends a frame without fds.
    pub fn send(&mut self, kind: u16, seq: u32, payload: &[u8]) -> Result<(), WireError> {
        match &mut self.mailbox {
            Some(m) => m.send(&self.stream, kind, seq, payload),
            None => wire::send(&self.stream, kind, seq, payload, None),
        }
    }

    /// Receives a frame without fds.
    pub fn recv(&mut self, max: u32, buf: &mut Vec<u8>) -> Result<Header, WireError> {
        match &mut self.mailbox {
            Some(m) => m.recv(&mut self.stream, max, buf),
            None => {
                wire::spin(&self.stream, self.spin);
                wire::recv(&mut self.stream, max, buf, false).map(|(h, _)| h)
            }
        }
    }
}

/// The lane of the frames to `side`.
fn lane_to(side: Side) -> Lane {
    match side {
        Side::Parent => TO_PARENT,
        Side::Host => TO_HOST,
    }
}

/// Zeroes the mailbox words of a control area before a new pair of ends
/// uses it, so nothing a previous host left there is read.
///
/// # Safety
/// As for [`Mailbox::new`]; no end may be in use.
pub unsafe fn clear(base: *mut u8) {
    for off in [TO_HOST, TO_PARENT]
        .iter()
        .flat_map(|l| [l.seq, l.len, l.asleep])
    {
        // SAFETY: an aligned word of the live control area (the caller's
        // promise), accessed atomically.
        unsafe { AtomicU32::from_ptr(base.add(off).cast()) }.store(0, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::Staging;

    fn pair(spin: Duration) -> (Staging, Mailbox, Mailbox) {
        let st = Staging::create(4096).unwrap();
        // SAFETY: `st` outlives both ends in every test.
        let p = unsafe { Mailbox::new(st.control(), Side::Parent, spin) };
        // SAFETY: as above.
        let h = unsafe { Mailbox::new(st.control(), Side::Host, spin) };
        (st, p, h)
    }

    #[test]
    fn test_frames_both_ways_through_slots_and_socket() {
        for spin in [Duration::ZERO, Duration::from_millis(5)] {
            let (_st, mut p, mut h) = pair(spin);
            let (mut a, mut b) = UnixStream::pair().unwrap();
            b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let t = std::thread::spawn(move || {
                let mut buf = Vec::new();
                for i in 0..200u32 {
                    let hd = h.recv(&mut b, 1 << 20, &mut buf).unwrap();
                    assert_eq!((hd.kind, hd.seq), (3, i));
                    let len = if i % 50 == 7 { SLOT_BYTES } else { 8 };
                    assert_eq!(buf.len(), len);
                    h.send(&b, 0x8003, i, &buf).unwrap();
                }
            });
            let mut buf = Vec::new();
            for i in 0..200u32 {
                let len = if i % 50 == 7 { SLOT_BYTES } else { 8 };
                if i % 10 == 0 {
                    // The host has gone to sleep on the socket.
                    std::thread::sleep(Duration::from_millis(10) + spin);
                }
                p.send(&a, 3, i, &vec![i as u8; len]).unwrap();
                let hd = p.recv(&mut a, 1 << 20, &mut buf).unwrap();
                assert_eq!((hd.kind, hd.seq, buf.len()), (0x8003, i, len));
                assert!(buf.iter().all(|&x| x == i as u8));
            }
            t.join().unwrap();
        }
    }

    #[test]
    fn test_bad_slot_contents_are_refused() {
        let (st, mut p, _h) = pair(Duration::from_millis(1));
        let (mut a, _b) = UnixStream::pair().unwrap();
        // A length over the slot.
        let w = |off: usize| {
            // SAFETY: a word of the live control area.
            unsafe { AtomicU32::from_ptr(st.control().add(off).cast()) }
        };
        w(TO_PARENT.len).store(SLOT_BYTES as u32 + 1, Ordering::SeqCst);
        w(TO_PARENT.seq).fetch_add(1, Ordering::SeqCst);
        let mut buf = Vec::new();
        assert!(matches!(
            p.recv(&mut a, 4096, &mut buf),
            Err(WireError::Proto(ProtoError::Malformed(_)))
        ));
        // Puts a header saying `len` in the inbox slot, whose length says
        // `slot_len` bytes follow it.
        let plant = |len: u32, slot_len: u32| {
            let head = Header {
                kind: 1,
                seq: 1,
                len,
            }
            .encode();
            // SAFETY: inside the inbox slot of the live control area.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    head.as_ptr(),
                    st.control().add(TO_PARENT.data),
                    HEADER_LEN,
                )
            };
            w(TO_PARENT.len).store(HEADER_LEN as u32 + slot_len, Ordering::SeqCst);
            w(TO_PARENT.seq).fetch_add(1, Ordering::SeqCst);
        };
        // A header whose length disagrees with the slot's.
        plant(100, 4);
        assert!(p.recv(&mut a, 4096, &mut buf).is_err());
        // Over the receiver's bound.
        plant(8, 8);
        assert!(matches!(
            p.recv(&mut a, 4, &mut buf),
            Err(WireError::Proto(ProtoError::TooLong { .. }))
        ));
    }

    #[test]
    fn test_wakes_without_frames_are_bounded() {
        let (_st, mut p, _h) = pair(Duration::ZERO);
        let (mut a, b) = UnixStream::pair().unwrap();
        for _ in 0..=MAX_SPURIOUS_WAKES {
            wire::send(&b, WAKE, 0, &[], None).unwrap();
        }
        let mut buf = Vec::new();
        assert!(matches!(
            p.recv(&mut a, 4096, &mut buf),
            Err(WireError::Proto(ProtoError::Malformed(
                "wakes with no frame"
            )))
        ));
    }
}
