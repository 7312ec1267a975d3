//! The driver side of a split virtqueue: descriptor table, available ring
//! and used ring in guest RAM, written and read the way a guest driver
//! does (VIRTIO_RING_F_EVENT_IDX semantics).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};

use vgpu_abi::{self as abi, ByteValued, Completion};
use vm_memory::{MmapRegion, VolatileMemory, VolatileSlice};

/// Descriptor flag: the chain continues in `next`.
pub const VRING_DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the device writes this buffer.
pub const VRING_DESC_F_WRITE: u16 = 2;
/// Descriptor flag: the buffer is an indirect descriptor table.
pub const VRING_DESC_F_INDIRECT: u16 = 4;

/// Bytes of one descriptor table entry.
pub const DESC_SIZE: u64 = 16;
/// Bytes of guest RAM the kit keeps per descriptor for small inline
/// buffers (command structures, completions, short parameter blocks).
pub const SLOT_SIZE: u64 = 256;

/// `vring_need_event`: whether moving the index from `old` to `new` passes
/// `event` (the other side asked to be told when entry `event` is used).
pub fn vring_need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Guest RAM as the test sees it: a shared mapping of the memfd that was
/// DMA-mapped into the device at `iova`.
pub struct Ram {
    region: MmapRegion,
    iova: u64,
}

impl Ram {
    pub(crate) fn new(region: MmapRegion, iova: u64) -> Self {
        Ram { region, iova }
    }

    /// First guest address.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Bytes of RAM.
    pub fn size(&self) -> u64 {
        self.region.len() as u64
    }

    /// Whether `[addr, addr + len)` is inside guest RAM.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.iova
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.iova + self.size())
    }

    fn offset(&self, addr: u64, len: u64) -> usize {
        assert!(
            self.contains(addr, len),
            "guest range {addr:#x}+{len:#x} is outside guest RAM {:#x}+{:#x}",
            self.iova,
            self.size()
        );
        (addr - self.iova) as usize
    }

    fn slice(&self, addr: u64, len: usize) -> VolatileSlice<'_> {
        let off = self.offset(addr, len as u64);
        self.region
            .get_slice(off, len)
            .expect("range checked against the mapping")
    }

    /// Copies `data` to guest address `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) {
        self.slice(addr, data.len()).copy_from(data);
    }

    /// Copies guest memory at `addr` into `buf`.
    pub fn read_into(&self, addr: u64, buf: &mut [u8]) {
        self.slice(addr, buf.len()).copy_to(buf);
    }

    /// Reads `len` bytes at `addr`.
    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.read_into(addr, &mut v);
        v
    }

    /// Writes a plain structure at `addr`.
    pub fn write_obj<T: ByteValued>(&self, addr: u64, v: &T) {
        self.write(addr, v.as_slice());
    }

    /// Reads a plain structure at `addr`.
    pub fn read_obj<T: ByteValued + Default>(&self, addr: u64) -> T {
        let mut v = T::default();
        self.read_into(addr, v.as_mut_slice());
        v
    }

    /// Zeroes `len` bytes at `addr`.
    pub fn zero(&self, addr: u64, len: u64) {
        const CHUNK: u64 = 1 << 16;
        let zeros = [0u8; CHUNK as usize];
        let mut done = 0;
        while done < len {
            let n = CHUNK.min(len - done);
            self.write(addr + done, &zeros[..n as usize]);
            done += n;
        }
    }

    fn atomic_u16(&self, addr: u64) -> &AtomicU16 {
        let off = self.offset(addr, 2);
        self.region
            .get_atomic_ref::<AtomicU16>(off)
            .expect("ring fields are 2-byte aligned")
    }

    /// Loads a little-endian u16 ring field with `order`.
    pub fn load_u16(&self, addr: u64, order: Ordering) -> u16 {
        u16::from_le(self.atomic_u16(addr).load(order))
    }

    /// Stores a little-endian u16 ring field with `order`.
    pub fn store_u16(&self, addr: u64, v: u16, order: Ordering) {
        self.atomic_u16(addr).store(v.to_le(), order);
    }
}

/// The doorbell page of BAR0, mapped directly as a VMM maps it into the guest.
pub struct Doorbells {
    region: MmapRegion,
}

impl Doorbells {
    pub(crate) fn new(region: MmapRegion) -> Self {
        Doorbells { region }
    }

    fn word(&self, q: u32, field: u64) -> &AtomicU32 {
        self.region
            .get_atomic_ref::<AtomicU32>(abi::doorbell(q, field) as usize)
            .expect("doorbell slot inside the page")
    }

    /// Writes the queue's DB_AVAIL_IDX word.
    pub fn set_avail_idx(&self, q: u32, idx: u32) {
        self.word(q, abi::DB_AVAIL_IDX)
            .store(idx.to_le(), Ordering::Release);
    }

    /// The queue's DB_AVAIL_IDX word.
    pub fn avail_idx(&self, q: u32) -> u32 {
        u32::from_le(self.word(q, abi::DB_AVAIL_IDX).load(Ordering::Acquire))
    }

    /// The queue's DB_POLLING word (1 while the device polls the queue).
    pub fn polling(&self, q: u32) -> u32 {
        u32::from_le(self.word(q, abi::DB_POLLING).load(Ordering::Acquire))
    }
}

/// One buffer of a descriptor chain.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    /// Device-readable bytes, copied into guest RAM by the kit.
    Bytes(Vec<u8>),
    /// A device-readable guest range.
    Read { addr: u64, len: u32 },
    /// A device-writable guest range.
    Write { addr: u64, len: u32 },
    /// A device-writable [`Completion`] buffer owned by the kit.
    Completion,
}

/// A descriptor chain to submit: buffers in order, linked with NEXT.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    pieces: Vec<Piece>,
}

impl Chain {
    /// An empty chain.
    pub fn new() -> Self {
        Chain::default()
    }

    /// A chain whose first descriptor holds the command structure `cmd`.
    pub fn command<T: ByteValued>(cmd: &T) -> Self {
        Chain::new().bytes(cmd.as_slice())
    }

    /// The chain with context `ctx` in its command's flags (bits 16-31
    /// of the header's second word; ABI 1.5), replacing what was there.
    pub fn in_context(mut self, ctx: u32) -> Self {
        if let Some(Piece::Bytes(b)) = self.pieces.first_mut() {
            if let Some(word) = b.get_mut(4..8) {
                let flags = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                let flags = (flags & !abi::CMD_CTX_MASK) | (ctx << abi::CMD_CTX_SHIFT);
                word.copy_from_slice(&flags.to_le_bytes());
            }
        }
        self
    }

    /// Adds a device-readable descriptor holding `data` (copied into guest RAM).
    pub fn bytes(mut self, data: &[u8]) -> Self {
        self.pieces.push(Piece::Bytes(data.to_vec()));
        self
    }

    /// Adds a device-readable descriptor holding the structure `v`.
    pub fn obj<T: ByteValued>(self, v: &T) -> Self {
        self.bytes(v.as_slice())
    }

    /// Adds a device-readable descriptor for guest range `[addr, addr + len)`.
    pub fn read(mut self, addr: u64, len: u32) -> Self {
        self.pieces.push(Piece::Read { addr, len });
        self
    }

    /// Adds a device-writable descriptor for guest range `[addr, addr + len)`.
    pub fn write(mut self, addr: u64, len: u32) -> Self {
        self.pieces.push(Piece::Write { addr, len });
        self
    }

    /// Adds the device-writable completion descriptor (32 bytes); the kit
    /// reads it back when the chain is used.
    pub fn completion(mut self) -> Self {
        self.pieces.push(Piece::Completion);
        self
    }

    /// Descriptors in the chain.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether the chain has no descriptor.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The inline byte buffers, in chain order.
    pub(crate) fn inline_buffers(&self) -> Vec<&[u8]> {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Bytes(d) => Some(d.as_slice()),
                _ => None,
            })
            .collect()
    }
}

/// A used ring entry as the driver reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Used {
    /// Head descriptor index the device returned.
    pub id: u32,
    /// Bytes the device says it wrote.
    pub len: u32,
    /// The completion, when the chain had a kit completion buffer.
    pub completion: Option<Completion>,
}

impl Used {
    /// The completion; panics when the chain had no kit completion buffer.
    pub fn completion(&self) -> Completion {
        self.completion
            .unwrap_or_else(|| panic!("used entry {} has no completion buffer", self.id))
    }
}

/// An entry of the descriptor table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtqDesc {
    /// Guest address of the buffer.
    pub addr: u64,
    /// Length of the buffer.
    pub len: u32,
    /// `VRING_DESC_F_*`.
    pub flags: u16,
    /// Next descriptor when `flags` has NEXT.
    pub next: u16,
}

impl VirtqDesc {
    /// The 16 bytes of the table entry.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..14].copy_from_slice(&self.flags.to_le_bytes());
        b[14..16].copy_from_slice(&self.next.to_le_bytes());
        b
    }

    /// Decodes a table entry.
    pub fn from_bytes(b: &[u8; 16]) -> Self {
        VirtqDesc {
            addr: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            len: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            flags: u16::from_le_bytes([b[12], b[13]]),
            next: u16::from_le_bytes([b[14], b[15]]),
        }
    }
}

/// Queue mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The device sleeps until REG_WAKE; completions raise the MSI-X vector.
    Interrupt,
    /// The device polls the doorbell page (QCONTROL_POLLED).
    Polled,
}

/// Where a queue's structures live in guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    /// Entries.
    pub size: u16,
    /// Descriptor table.
    pub desc: u64,
    /// Available ring.
    pub avail: u64,
    /// Used ring.
    pub used: u64,
    /// Per-descriptor scratch slots ([`SLOT_SIZE`] bytes each).
    pub slots: u64,
}

/// Size of an available ring entry (a descriptor index).
const AVAIL_ENTRY: u64 = 2;
/// Size of a used ring entry (an id and a length).
const USED_ENTRY: u64 = 8;

/// Address of slot `i` of the ring at `ring` (`flags`, `idx`, then the
/// entries of `entry` bytes; slot `size` is the event field after them).
fn ring_slot(ring: u64, entry: u64, i: u16) -> u64 {
    ring + 4 + entry * u64::from(i)
}

impl RingLayout {
    /// Address of the available ring's `idx`.
    pub fn avail_idx(&self) -> u64 {
        self.avail + 2
    }

    /// Address of available ring entry `i` (modulo the size).
    pub fn avail_entry(&self, i: u16) -> u64 {
        ring_slot(self.avail, AVAIL_ENTRY, i % self.size)
    }

    /// Address of `used_event` (after the available ring).
    pub fn used_event(&self) -> u64 {
        ring_slot(self.avail, AVAIL_ENTRY, self.size)
    }

    /// Address of the used ring's `idx`.
    pub fn used_idx(&self) -> u64 {
        self.used + 2
    }

    /// Address of used ring entry `i` (modulo the size).
    pub fn used_entry(&self, i: u16) -> u64 {
        ring_slot(self.used, USED_ENTRY, i % self.size)
    }

    /// Address of `avail_event` (after the used ring).
    pub fn avail_event(&self) -> u64 {
        ring_slot(self.used, USED_ENTRY, self.size)
    }

    /// Address of descriptor `i`.
    pub fn desc_entry(&self, i: u16) -> u64 {
        self.desc + DESC_SIZE * u64::from(i)
    }

    /// Address of the scratch slot of descriptor `i`.
    pub fn slot(&self, i: u16) -> u64 {
        self.slots + SLOT_SIZE * u64::from(i)
    }
}

struct InFlight {
    descs: Vec<u16>,
    completion: Option<u64>,
}

/// Driver state of one queue.
pub(crate) struct DriverQueue {
    pub(crate) layout: RingLayout,
    pub(crate) mode: Mode,
    /// Available index after the last add (published or not).
    next_avail: u16,
    /// Available index last written to the ring.
    pub(crate) published: u16,
    /// Available index at the last notification.
    pub(crate) notified: u16,
    /// Used entries consumed.
    pub(crate) last_used: u16,
    /// Whether `used_event` is moved to `last_used` whenever the driver
    /// publishes or waits (an interrupt for the next completion).
    pub(crate) irq_each: bool,
    free: Vec<u16>,
    inflight: HashMap<u16, InFlight>,
}

impl DriverQueue {
    pub(crate) fn new(layout: RingLayout, mode: Mode) -> Self {
        DriverQueue {
            layout,
            mode,
            next_avail: 0,
            published: 0,
            notified: 0,
            last_used: 0,
            irq_each: mode == Mode::Interrupt,
            free: (0..layout.size).rev().collect(),
            inflight: HashMap::new(),
        }
    }

    /// Free descriptors.
    pub(crate) fn free_descs(&self) -> usize {
        self.free.len()
    }

    /// Chains the device has not returned yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// Writes `chain` into the descriptor table and the next available ring
    /// entry without publishing it. `stage` places inline bytes that do not
    /// fit a descriptor's slot. Returns the head, or None when there are
    /// not enough free descriptors.
    pub(crate) fn add(
        &mut self,
        ram: &Ram,
        chain: &Chain,
        stage: &mut dyn FnMut(&[u8]) -> u64,
    ) -> Option<u16> {
        let n = chain.len();
        assert!(n > 0, "a chain needs at least one descriptor");
        assert!(
            n <= usize::from(self.layout.size),
            "a chain of {n} descriptors does not fit a queue of {}",
            self.layout.size
        );
        if self.free.len() < n {
            return None;
        }
        let idx: Vec<u16> = (0..n).map(|_| self.free.pop().expect("counted")).collect();
        let mut completion = None;
        for (i, piece) in chain.pieces.iter().enumerate() {
            let me = idx[i];
            let slot = self.layout.slot(me);
            let (addr, len, write) = match piece {
                Piece::Bytes(data) => {
                    let addr = if data.len() as u64 <= SLOT_SIZE {
                        ram.write(slot, data);
                        slot
                    } else {
                        stage(data)
                    };
                    (addr, data.len() as u32, false)
                }
                Piece::Read { addr, len } => (*addr, *len, false),
                Piece::Write { addr, len } => (*addr, *len, true),
                Piece::Completion => {
                    // Poison it so a completion the device never wrote shows.
                    let poison = Completion {
                        status: u32::MAX,
                        reserved: u32::MAX,
                        result: u64::MAX,
                        device_ns: u64::MAX,
                        result2: u64::MAX,
                    };
                    ram.write_obj(slot, &poison);
                    completion = Some(slot);
                    (slot, std::mem::size_of::<Completion>() as u32, true)
                }
            };
            let mut flags = if write { VRING_DESC_F_WRITE } else { 0 };
            let next = if i + 1 < n {
                flags |= VRING_DESC_F_NEXT;
                idx[i + 1]
            } else {
                0
            };
            let desc = VirtqDesc {
                addr,
                len,
                flags,
                next,
            };
            ram.write(self.layout.desc_entry(me), &desc.to_bytes());
        }
        let head = idx[0];
        ram.store_u16(
            self.layout.avail_entry(self.next_avail),
            head,
            Ordering::Relaxed,
        );
        self.next_avail = self.next_avail.wrapping_add(1);
        self.inflight.insert(
            head,
            InFlight {
                descs: idx,
                completion,
            },
        );
        Some(head)
    }

    /// Puts `head` into the next available ring entry (for hand-made
    /// descriptor tables) without publishing it.
    pub(crate) fn add_head(&mut self, ram: &Ram, head: u16) {
        ram.store_u16(
            self.layout.avail_entry(self.next_avail),
            head,
            Ordering::Relaxed,
        );
        self.next_avail = self.next_avail.wrapping_add(1);
    }

    /// Asks for an interrupt at the next completion (`used_event` =
    /// entries consumed), unless interrupts are suppressed.
    pub(crate) fn arm_irq(&self, ram: &Ram) {
        if self.irq_each {
            ram.store_u16(self.layout.used_event(), self.last_used, Ordering::Release);
        }
    }

    /// Makes everything added so far visible to the device (avail idx),
    /// with an interrupt asked for at the next completion.
    pub(crate) fn publish(&mut self, ram: &Ram) {
        self.arm_irq(ram);
        ram.store_u16(self.layout.avail_idx(), self.next_avail, Ordering::Release);
        self.published = self.next_avail;
    }

    /// Writes an arbitrary available index (for corrupt-ring tests).
    pub(crate) fn force_avail_idx(&mut self, ram: &Ram, idx: u16) {
        ram.store_u16(self.layout.avail_idx(), idx, Ordering::Release);
        self.next_avail = idx;
        self.published = idx;
    }

    /// Takes the next used entry, if the device has written one.
    pub(crate) fn poll_used(&mut self, ram: &Ram) -> Option<Used> {
        let used_idx = ram.load_u16(self.layout.used_idx(), Ordering::Acquire);
        if used_idx == self.last_used {
            return None;
        }
        let at = self.layout.used_entry(self.last_used);
        let mut elem = [0u8; 8];
        ram.read_into(at, &mut elem);
        let id = u32::from_le_bytes([elem[0], elem[1], elem[2], elem[3]]);
        let len = u32::from_le_bytes([elem[4], elem[5], elem[6], elem[7]]);
        self.last_used = self.last_used.wrapping_add(1);
        let completion = u16::try_from(id)
            .ok()
            .and_then(|h| self.inflight.remove(&h))
            .and_then(|f| {
                self.free.extend(f.descs.iter().rev());
                f.completion
            })
            .map(|addr| ram.read_obj::<Completion>(addr));
        Some(Used {
            id,
            len,
            completion,
        })
    }

    /// Sets `used_event`; `each` makes the kit move it to the next
    /// completion whenever it publishes or waits, otherwise it stays.
    pub(crate) fn set_used_event(&mut self, ram: &Ram, event: u16, each: bool) {
        self.irq_each = each;
        ram.store_u16(self.layout.used_event(), event, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_vring_need_event() {
        assert!(vring_need_event(0, 1, 0));
        assert!(!vring_need_event(1, 1, 0));
        assert!(vring_need_event(5, 8, 3));
        assert!(!vring_need_event(9, 8, 3));
        // Wrap-around.
        assert!(vring_need_event(0xffff, 2, 0xfffe));
        assert!(!vring_need_event(2, 2, 0xfffe));
    }

    #[test]
    fn test_layout_offsets() {
        let l = RingLayout {
            size: 8,
            desc: 0x1000,
            avail: 0x2000,
            used: 0x3000,
            slots: 0x4000,
        };
        assert_eq!(l.avail_entry(9), 0x2000 + 4 + 2);
        assert_eq!(l.used_event(), 0x2000 + 4 + 16);
        assert_eq!(l.used_entry(3), 0x3000 + 4 + 24);
        assert_eq!(l.avail_event(), 0x3000 + 4 + 64);
        assert_eq!(l.desc_entry(2), 0x1020);
        let d = VirtqDesc {
            addr: 0x1122_3344_5566_7788,
            len: 0x99aa_bbcc,
            flags: 3,
            next: 0x0102,
        };
        assert_eq!(VirtqDesc::from_bytes(&d.to_bytes()), d);
        assert_eq!(d.to_bytes()[12..], [3, 0, 2, 1]);
    }

    #[test]
    fn test_chain_builder() {
        let c = Chain::command(&abi::CmdHeader::default())
            .read(0x10, 4)
            .write(0x20, 8)
            .completion();
        assert_eq!(c.len(), 4);
        assert!(!c.is_empty());
        assert!(Chain::new().is_empty());
    }
}
