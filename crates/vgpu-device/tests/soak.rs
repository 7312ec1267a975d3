//! Soak: several tenants on one software backend do mixed work for a while
//! (`VGPU_SOAK_SECS`, default 20) while faults are injected at random times
//! from a seeded generator (`VGPU_SOAK_SEED`): malformed commands, bad
//! guest and device addresses, queues disabled with work in flight, ring
//! corruption, resets and a VMM going away and coming back.
//!
//! Each tenant keeps a model of its device memory, and every byte read
//! back (downloads, window copies, kernel results) is checked against it.
//! The test also checks that every tenant makes progress in every 2 s
//! window, and that open fds, threads and resident memory do not grow
//! between a warm-up point and the end.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{assert_status, eventually, open_fds, proc_status_bytes, rss, threads, Rng, MIB};
use vgpu_backend::software::SoftwareBackend;
use vgpu_device::testing::TestVgpu;
use vgpu_device::testing::{software_partition, test_config};
use vgpu_testkit::abi::{self, CmdHeader, SgEntry};
use vgpu_testkit::{bytes_to_f32s, f32s_to_bytes};
use vgpu_testkit::{Chain, Guest, Mode};

const TENANTS: usize = 4;
/// Device memory of each tenant.
const QUOTA: u64 = 16 * MIB;
const QUEUES: u32 = 2;
const QUEUE_SIZE: u16 = 64;
/// Every tenant must make progress in every window of this length.
const WINDOW: Duration = Duration::from_secs(2);
/// Size of each of a tenant's two guest scratch areas.
const AREA: u64 = MIB;
/// Largest transfer of one operation.
const MAX_OP: u64 = 256 << 10;
/// Largest device buffer.
const MAX_BUF: u64 = 512 << 10;
/// Most device buffers a tenant keeps.
const MAX_BUFS: usize = 8;
/// Size of the window (BAR2) of `test_config`.
const WINDOW_SIZE: u64 = MIB;
/// Queue set-ups after which a tenant's VMM restarts, before the kit's
/// guest RAM (never freed) runs out.
const MAX_SETUPS: u32 = 1500;
/// Growth of resident memory (beyond device memory in use) allowed
/// between the warm-up point and the end.
const RSS_SLACK: u64 = 48 * MIB;
/// Growth of the resident heap (beyond device memory in use and the
/// tenants' copy of it) allowed between the warm-up point and the end.
const HEAP_SLACK: u64 = 16 * MIB;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    BadCommand,
    BadAddress,
    QueueToggle,
    RingError,
    Reset,
    Reconnect,
}

const FAULTS: [Fault; 6] = [
    Fault::BadCommand,
    Fault::BadAddress,
    Fault::QueueToggle,
    Fault::RingError,
    Fault::Reset,
    Fault::Reconnect,
];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::BadCommand => "bad_command",
            Fault::BadAddress => "bad_address",
            Fault::QueueToggle => "queue_toggle",
            Fault::RingError => "ring_error",
            Fault::Reset => "reset",
            Fault::Reconnect => "reconnect",
        }
    }
}

/// A device allocation and what the tenant knows of its bytes.
struct Buf {
    addr: u64,
    len: u64,
    /// None after a command that may have written part of it failed.
    data: Option<Vec<u8>>,
}

#[derive(Default)]
struct Counts {
    commands: u64,
    verified: u64,
    faults: [u64; FAULTS.len()],
    resets: u64,
    reconnects: u64,
}

/// Where tenants stop so that the main thread can sample the process
/// while no command runs.
#[derive(Default)]
struct GateState {
    /// Tenants stop at their next operation boundary.
    pause: bool,
    /// Tenants paused.
    paused: usize,
    /// Tenants done with their work, waiting for the final sample.
    finished: usize,
    /// The final sample is taken.
    done: bool,
    /// Tenants whose thread still runs (a failed one leaves early).
    alive: usize,
}

/// What the tenants and the main thread share.
struct Shared {
    deadline: Instant,
    gate: Mutex<GateState>,
    cv: Condvar,
    progress: Vec<AtomicU64>,
    /// Device memory each tenant has allocated, published when it stops.
    device_memory: Vec<AtomicU64>,
}

impl Shared {
    fn gate(&self) -> MutexGuard<'_, GateState> {
        self.gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, GateState>) -> MutexGuard<'a, GateState> {
        self.cv.wait(g).unwrap_or_else(|e| e.into_inner())
    }
}

/// Counts a tenant thread out when it ends, however it ends.
struct Alive<'a>(&'a Shared);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.gate().alive -= 1;
        self.0.cv.notify_all();
    }
}

/// The same float, NaNs being all alike (their payloads may differ with
/// the order of the operands).
fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[track_caller]
fn assert_same_f32s(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len());
    if let Some(i) = (0..got.len()).find(|&i| !same_f32(got[i], want[i])) {
        panic!("{what}: element {i} is {}, want {}", got[i], want[i]);
    }
}

fn floats_at(data: &[u8], off: u64, n: u64) -> Vec<f32> {
    bytes_to_f32s(&data[off as usize..(off + 4 * n) as usize])
}

struct Tenant<'a> {
    id: usize,
    server: &'a TestVgpu,
    shared: &'a Shared,
    rng: Rng,
    guest: Option<Guest>,
    bufs: Vec<Buf>,
    /// Guest scratch area the device reads from.
    send: u64,
    /// Guest scratch area the device writes to.
    recv: u64,
    setups: u32,
    next_fault: Instant,
    counts: Counts,
}

impl<'a> Tenant<'a> {
    fn new(id: usize, server: &'a TestVgpu, shared: &'a Shared, seed: u64) -> Self {
        let mut t = Tenant {
            id,
            server,
            shared,
            rng: Rng(seed),
            guest: None,
            bufs: Vec::new(),
            send: 0,
            recv: 0,
            setups: 0,
            next_fault: Instant::now(),
            counts: Counts::default(),
        };
        t.connect();
        t.schedule_fault();
        t
    }

    fn g(&mut self) -> &mut Guest {
        self.guest.as_mut().expect("connected")
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rng.next_u64() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn queue(&mut self) -> u32 {
        self.below(u64::from(QUEUES)) as u32
    }

    fn schedule_fault(&mut self) {
        let ms = 50 + self.below(350);
        self.next_fault = Instant::now() + Duration::from_millis(ms);
    }

    /// A new VMM: guest RAM, scratch areas, queues and buffers.
    fn connect(&mut self) {
        let mut g = self.server.connect();
        assert_eq!(g.mem_used(), 0, "tenant {}: device memory freed", self.id);
        assert_eq!(g.commands(), 0);
        self.send = g.alloc(AREA, 4096);
        self.recv = g.alloc(AREA, 4096);
        self.guest = Some(g);
        self.setups = 0;
        self.init();
    }

    /// Queues and a few buffers on a function just enabled.
    fn init(&mut self) {
        self.bufs.clear();
        for q in 0..QUEUES {
            self.setup_queue(q);
        }
        for _ in 0..3 {
            self.alloc_buf();
        }
    }

    fn setup_queue(&mut self, q: u32) {
        let mode = if self.chance(50) {
            Mode::Polled
        } else {
            Mode::Interrupt
        };
        self.g().setup_queue(q, QUEUE_SIZE, mode);
        self.setups += 1;
    }

    fn mem_in_use(&self) -> u64 {
        self.bufs.iter().map(|b| b.len).sum()
    }

    #[track_caller]
    fn check_mem_used(&mut self) {
        let want = self.mem_in_use();
        assert_eq!(self.g().mem_used(), want, "tenant {}: MEM_USED", self.id);
    }

    /// Allocates a buffer (a multiple of 4 bytes) and fills it with a
    /// pattern; false when the quota has no room for it.
    fn alloc_buf(&mut self) -> bool {
        let len = (4096 + self.below(MAX_BUF - 4096)) & !3;
        if self.bufs.len() >= MAX_BUFS || self.mem_in_use() + len > QUOTA {
            return false;
        }
        let align = [0, 4, 4096, 64 << 10][self.below(4) as usize];
        let q = self.queue();
        let c = self.g().mem_alloc(q, len, align);
        assert_status(c, abi::STATUS_OK);
        let addr = c.result;
        assert!(align == 0 || addr.is_multiple_of(align));
        self.counts.commands += 1;
        // Device memory comes zeroed, whoever had it before.
        let got = self.download(q, addr, len);
        assert!(
            got.iter().all(|b| *b == 0),
            "tenant {}: new device memory is not zeroed",
            self.id
        );
        self.counts.verified += len;
        let pattern = self.rng.next_u64() as u32;
        assert_status(self.g().fill(q, addr, len, pattern), abi::STATUS_OK);
        self.counts.commands += 1;
        let data = pattern
            .to_le_bytes()
            .iter()
            .copied()
            .cycle()
            .take(len as usize)
            .collect();
        self.bufs.push(Buf {
            addr,
            len,
            data: Some(data),
        });
        self.check_mem_used();
        true
    }

    /// The index of a buffer whose bytes are known, rewriting one that
    /// is not when needed (through the send area, and with a command of
    /// its own: pick ranges before writing scratch areas or posting).
    fn known_buf(&mut self) -> usize {
        let i = self.below(self.bufs.len() as u64) as usize;
        if self.bufs[i].data.is_none() {
            let len = self.bufs[i].len;
            let data = self.rng.bytes(len as usize);
            let addr = self.bufs[i].addr;
            let q = self.queue();
            self.upload(q, addr, &data);
            self.bufs[i].data = Some(data);
        }
        i
    }

    /// A range of at most `max` bytes of a known buffer; `align` applies
    /// to the length.
    fn range(&mut self, max: u64, align: u64) -> (usize, u64, u64) {
        let i = self.known_buf();
        let blen = self.bufs[i].len;
        let len = (1 + self.below(max.min(blen))).max(align) / align * align;
        let off = self.below(blen - len + 1);
        (i, off, len)
    }

    /// Splits `len` bytes into up to four segments scattered over the
    /// guest area at `base`.
    fn scatter(&mut self, base: u64, len: u64) -> Vec<SgEntry> {
        let parts = (1 + self.below(4)).min(len);
        let mut cuts: Vec<u64> = (1..parts).map(|_| 1 + self.below(len - 1)).collect();
        cuts.push(0);
        cuts.push(len);
        cuts.sort_unstable();
        cuts.dedup();
        let mut at = base + self.below(64);
        let mut sg = Vec::new();
        for w in cuts.windows(2) {
            let seg = w[1] - w[0];
            sg.push(SgEntry { addr: at, len: seg });
            at += seg + self.below(256);
        }
        assert!(at <= base + AREA);
        sg
    }

    /// Uploads `data` to device address `dst` through a scattered list.
    fn upload(&mut self, q: u32, dst: u64, data: &[u8]) {
        let sg = self.scatter(self.send, data.len() as u64);
        self.g().write_sg(&sg, data);
        let c = self.g().copy_to_device(q, dst, &sg);
        assert_status(c, abi::STATUS_OK);
        self.counts.commands += 1;
    }

    /// Downloads `len` bytes at device address `src` through a scattered
    /// list whose guest bytes are poisoned first.
    fn download(&mut self, q: u32, src: u64, len: u64) -> Vec<u8> {
        let sg = self.scatter(self.recv, len);
        self.g().write_sg(&sg, &vec![0xa5; len as usize]);
        let c = self.g().copy_from_device(q, src, &sg);
        assert_status(c, abi::STATUS_OK);
        self.counts.commands += 1;
        self.g().read_sg(&sg)
    }

    /// Reads a range back and checks it against the model.
    #[track_caller]
    fn verify(&mut self, i: usize, off: u64, len: u64, what: &str) {
        let q = self.queue();
        let addr = self.bufs[i].addr + off;
        let got = self.download(q, addr, len);
        let want = &self.bufs[i].data.as_ref().expect("known")[off as usize..(off + len) as usize];
        if got != want {
            let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            panic!(
                "tenant {}: {what}: buffer {i} byte {} is {:#x}, want {:#x} ({len} bytes at {off})",
                self.id,
                off as usize + at,
                got[at],
                want[at]
            );
        }
        self.counts.verified += len;
    }

    fn model(&mut self, i: usize) -> &mut Vec<u8> {
        self.bufs[i].data.as_mut().expect("known")
    }

    // ---- work ----

    fn step(&mut self) {
        match self.below(100) {
            0..=21 => self.op_upload(),
            22..=37 => self.op_download(),
            38..=45 => self.op_fill(),
            46..=53 => self.op_device_copy(),
            54..=67 => self.op_kernel(),
            68..=75 => self.op_churn(),
            76..=82 => self.op_window(),
            83..=93 => self.op_batch(),
            _ => {
                let i = self.known_buf();
                let len = self.bufs[i].len;
                self.verify(i, 0, len, "whole buffer");
            }
        }
    }

    fn op_upload(&mut self) {
        let (i, off, len) = self.range(MAX_OP, 1);
        let data = self.rng.bytes(len as usize);
        let q = self.queue();
        let addr = self.bufs[i].addr + off;
        self.upload(q, addr, &data);
        self.model(i)[off as usize..(off + len) as usize].copy_from_slice(&data);
        self.verify(i, off, len, "upload read back");
    }

    fn op_download(&mut self) {
        let (i, off, len) = self.range(MAX_OP, 1);
        self.verify(i, off, len, "download");
    }

    fn op_fill(&mut self) {
        let (i, off, len) = self.range(MAX_OP, 4);
        let pattern = self.rng.next_u64() as u32;
        let q = self.queue();
        let addr = self.bufs[i].addr + off;
        assert_status(self.g().fill(q, addr, len, pattern), abi::STATUS_OK);
        self.counts.commands += 1;
        let bytes = pattern.to_le_bytes();
        for (k, b) in self.model(i)[off as usize..(off + len) as usize]
            .iter_mut()
            .enumerate()
        {
            *b = bytes[k % 4];
        }
        self.verify(i, off, len, "fill");
    }

    fn op_device_copy(&mut self) {
        let (i, src_off, len) = self.range(MAX_OP, 1);
        let j = self.known_buf();
        let jlen = self.bufs[j].len;
        if jlen < len {
            return;
        }
        let dst_off = self.below(jlen - len + 1);
        let q = self.queue();
        let (src, dst) = (self.bufs[i].addr + src_off, self.bufs[j].addr + dst_off);
        let c = self.g().copy_device_to_device(q, dst, src, len);
        assert_status(c, abi::STATUS_OK);
        self.counts.commands += 1;
        let s = src_off as usize..(src_off + len) as usize;
        if i == j {
            // Overlapping ranges of one allocation copy as memmove does.
            self.model(i).copy_within(s, dst_off as usize);
        } else {
            let bytes = self.model(i)[s].to_vec();
            self.model(j)[dst_off as usize..(dst_off + len) as usize].copy_from_slice(&bytes);
        }
        self.verify(j, dst_off, len, "device copy");
    }

    /// `n` floats at a random place of a known buffer: (buffer, offset).
    fn floats(&mut self, n: u64) -> Option<(usize, u64)> {
        let i = self.known_buf();
        let blen = self.bufs[i].len;
        (blen >= 4 * n).then(|| (i, self.below(blen - 4 * n + 1)))
    }

    fn launch<P: vgpu_testkit::abi::ByteValued>(&mut self, entry: &str, p: &P, status: u32) {
        let q = self.queue();
        let c = self.g().launch(q, entry, p);
        assert_status(c, status);
        self.counts.commands += 1;
    }

    /// Downloads the floats at `(i, off)`, checks them against `want` and
    /// takes them into the model.
    fn take_floats(&mut self, i: usize, off: u64, want: &[f32], what: &str) {
        let q = self.queue();
        let len = 4 * want.len() as u64;
        let addr = self.bufs[i].addr + off;
        let got = self.download(q, addr, len);
        assert_same_f32s(&bytes_to_f32s(&got), want, what);
        self.model(i)[off as usize..(off + len) as usize].copy_from_slice(&got);
        self.counts.verified += len;
    }

    fn op_kernel(&mut self) {
        let n = 1 + self.below(16 << 10);
        match self.below(6) {
            0 => {
                let (i, off, len) = self.range(MAX_OP, 4);
                let value = self.rng.next_u64() as u32;
                let p = abi::FillParams {
                    dst: self.bufs[i].addr + off,
                    count: len / 4,
                    value,
                    reserved: 0,
                };
                self.launch("fill_u32", &p, abi::STATUS_OK);
                let bytes = value.to_le_bytes();
                for (k, b) in self.model(i)[off as usize..(off + len) as usize]
                    .iter_mut()
                    .enumerate()
                {
                    *b = bytes[k % 4];
                }
                self.verify(i, off, len, "fill_u32");
            }
            1 => {
                let (i, src_off, len) = self.range(MAX_OP, 1);
                let j = self.known_buf();
                let jlen = self.bufs[j].len;
                if jlen < len {
                    return;
                }
                let dst_off = self.below(jlen - len + 1);
                let overlap = i == j && src_off < dst_off + len && dst_off < src_off + len;
                let p = abi::CopyParams {
                    dst: self.bufs[j].addr + dst_off,
                    src: self.bufs[i].addr + src_off,
                    bytes: len,
                };
                if overlap {
                    self.launch("copy", &p, abi::STATUS_INVALID);
                } else {
                    self.launch("copy", &p, abi::STATUS_OK);
                    let bytes = self.model(i)[src_off as usize..(src_off + len) as usize].to_vec();
                    self.model(j)[dst_off as usize..(dst_off + len) as usize]
                        .copy_from_slice(&bytes);
                }
                self.verify(j, dst_off, len, "copy kernel");
            }
            2 => {
                let (Some((yi, yo)), Some((xi, xo))) = (self.floats(n), self.floats(n)) else {
                    return;
                };
                let a = (self.below(1 << 16) as f32 / 16384.0) - 2.0;
                let p = abi::SaxpyParams {
                    y: self.bufs[yi].addr + yo,
                    x: self.bufs[xi].addr + xo,
                    n,
                    a,
                    reserved: 0,
                };
                let x = floats_at(self.bufs[xi].data.as_ref().expect("known"), xo, n);
                let y = floats_at(self.bufs[yi].data.as_ref().expect("known"), yo, n);
                let want: Vec<f32> = x.iter().zip(&y).map(|(x, y)| a * x + y).collect();
                self.launch("saxpy_f32", &p, abi::STATUS_OK);
                self.take_floats(yi, yo, &want, "saxpy_f32");
            }
            3 => {
                let (Some((ci, co)), Some((ai, ao)), Some((bi, bo))) =
                    (self.floats(n), self.floats(n), self.floats(n))
                else {
                    return;
                };
                let p = abi::VaddParams {
                    c: self.bufs[ci].addr + co,
                    a: self.bufs[ai].addr + ao,
                    b: self.bufs[bi].addr + bo,
                    n,
                };
                let a = floats_at(self.bufs[ai].data.as_ref().expect("known"), ao, n);
                let b = floats_at(self.bufs[bi].data.as_ref().expect("known"), bo, n);
                let want: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + b).collect();
                self.launch("vadd_f32", &p, abi::STATUS_OK);
                self.take_floats(ci, co, &want, "vadd_f32");
            }
            4 => {
                // Inputs on a grid of 2^-23 below 1: the sum is exact.
                let Some((ii, io)) = self.floats(n) else {
                    return;
                };
                let Some((oi, oo)) = self.floats(1) else {
                    return;
                };
                let input = self.rng.f32s(n as usize);
                let addr = self.bufs[ii].addr + io;
                let q = self.queue();
                self.upload(q, addr, &f32s_to_bytes(&input));
                self.model(ii)[io as usize..(io + 4 * n) as usize]
                    .copy_from_slice(&f32s_to_bytes(&input));
                let p = abi::ReduceSumParams {
                    out: self.bufs[oi].addr + oo,
                    input: addr,
                    n,
                };
                self.launch("reduce_sum_f32", &p, abi::STATUS_OK);
                let want = input.iter().map(|v| f64::from(*v)).sum::<f64>() as f32;
                self.take_floats(oi, oo, &[want], "reduce_sum_f32");
            }
            _ => {
                let (m, nn, k) = (1 + self.below(16), 1 + self.below(16), 1 + self.below(16));
                let (Some((ci, co)), Some((ai, ao)), Some((bi, bo))) =
                    (self.floats(m * nn), self.floats(m * k), self.floats(k * nn))
                else {
                    return;
                };
                let alpha = (1 + self.below(4)) as f32 * 0.5;
                let beta = self.below(3) as f32 * 0.5;
                let a = floats_at(self.bufs[ai].data.as_ref().expect("known"), ao, m * k);
                let b = floats_at(self.bufs[bi].data.as_ref().expect("known"), bo, k * nn);
                let c = floats_at(self.bufs[ci].data.as_ref().expect("known"), co, m * nn);
                let (mu, nu, ku) = (m as usize, nn as usize, k as usize);
                let mut want = vec![0f32; mu * nu];
                for r in 0..mu {
                    for col in 0..nu {
                        let mut s = 0f32;
                        for p in 0..ku {
                            s += a[r * ku + p] * b[p * nu + col];
                        }
                        want[r * nu + col] = if beta == 0.0 {
                            alpha * s
                        } else {
                            alpha * s + beta * c[r * nu + col]
                        };
                    }
                }
                let p = abi::SgemmParams {
                    c: self.bufs[ci].addr + co,
                    a: self.bufs[ai].addr + ao,
                    b: self.bufs[bi].addr + bo,
                    m: m as u32,
                    n: nn as u32,
                    k: k as u32,
                    reserved: 0,
                    alpha,
                    beta,
                };
                self.launch("sgemm_f32", &p, abi::STATUS_OK);
                self.take_floats(ci, co, &want, "sgemm_f32");
            }
        }
    }

    fn op_churn(&mut self) {
        if self.bufs.len() < 3 || (self.chance(50) && self.bufs.len() < MAX_BUFS) {
            self.alloc_buf();
            return;
        }
        let i = self.below(self.bufs.len() as u64) as usize;
        let buf = self.bufs.swap_remove(i);
        let q = self.queue();
        assert_status(self.g().mem_free(q, buf.addr), abi::STATUS_OK);
        assert_status(self.g().mem_free(q, buf.addr), abi::STATUS_NOT_FOUND);
        self.counts.commands += 2;
        self.check_mem_used();
    }

    fn op_window(&mut self) {
        let (i, off, len) = self.range(MAX_OP, 1);
        let data = self.rng.bytes(len as usize);
        let w_in = self.below(WINDOW_SIZE - len + 1);
        let w_out = self.below(WINDOW_SIZE - len + 1);
        let q = self.queue();
        let addr = self.bufs[i].addr + off;
        self.g().window_write(w_in, &data);
        assert_status(
            self.g().copy_window_to_device(q, w_in, addr, len),
            abi::STATUS_OK,
        );
        self.model(i)[off as usize..(off + len) as usize].copy_from_slice(&data);
        assert_status(
            self.g().copy_device_to_window(q, addr, w_out, len),
            abi::STATUS_OK,
        );
        self.counts.commands += 2;
        let got = self.g().window_read(w_out, len as usize);
        assert!(got == data, "tenant {}: window round trip", self.id);
        self.counts.verified += len;
    }

    /// Up to 16 uploads and downloads queued at once; later ones see what
    /// earlier ones wrote.
    fn op_batch(&mut self) {
        const SLOT: u64 = 32 << 10;
        let q = self.queue();
        let k = 2 + self.below(15);
        let mut chains = Vec::new();
        // (guest address, expected bytes) of each download.
        let mut downloads = Vec::new();
        // Ranges first: finding one may rewrite a buffer through the
        // scratch areas.
        let ranges: Vec<_> = (0..k).map(|_| self.range(16 << 10, 1)).collect();
        for (s, (i, off, len)) in (0u64..).zip(ranges) {
            let addr = self.bufs[i].addr + off;
            let (kinds, guest) = if self.chance(50) {
                let data = self.rng.bytes(len as usize);
                let guest = self.send + s * SLOT;
                self.g().write(guest, &data);
                self.model(i)[off as usize..(off + len) as usize].copy_from_slice(&data);
                ((abi::COPY_GUEST, abi::COPY_DEVICE, 0, addr), guest)
            } else {
                let guest = self.recv + s * SLOT;
                self.g().write(guest, &vec![0x5a; len as usize]);
                let want = self.model(i)[off as usize..(off + len) as usize].to_vec();
                downloads.push((guest, want));
                ((abi::COPY_DEVICE, abi::COPY_GUEST, addr, 0), guest)
            };
            let cmd = abi::CopyCmd {
                hdr: CmdHeader {
                    opcode: abi::OP_COPY,
                    flags: 0,
                },
                src_kind: kinds.0,
                dst_kind: kinds.1,
                src: kinds.2,
                dst: kinds.3,
                size: len,
                sg_count: 1,
                reserved: 0,
            };
            let sg = SgEntry { addr: guest, len };
            chains.push(
                Chain::command(&cmd)
                    .bytes(abi::ByteValued::as_slice(&sg))
                    .completion(),
            );
        }
        for u in self.g().submit_batch(q, &chains) {
            assert_status(u.completion(), abi::STATUS_OK);
        }
        self.counts.commands += k;
        for (guest, want) in downloads {
            let got = self.g().read(guest, want.len());
            assert!(got == want, "tenant {}: batched download", self.id);
            self.counts.verified += want.len() as u64;
        }
    }

    // ---- faults ----

    fn fault(&mut self) {
        let mut kind = FAULTS[self.below(FAULTS.len() as u64) as usize];
        // A VMM restart is rarer than the rest; one is also due before the
        // kit's guest RAM runs out.
        if kind == Fault::Reconnect && self.chance(50) {
            kind = Fault::Reset;
        }
        if self.setups > MAX_SETUPS {
            kind = Fault::Reconnect;
        }
        match kind {
            Fault::BadCommand => self.bad_command(),
            Fault::BadAddress => self.bad_address(),
            Fault::QueueToggle => self.queue_toggle(),
            Fault::RingError => self.ring_error(),
            Fault::Reset => self.reset(),
            Fault::Reconnect => self.reconnect(),
        }
        let k = FAULTS.iter().position(|f| *f == kind).expect("listed");
        self.counts.faults[k] += 1;
    }

    fn bad_command(&mut self) {
        let q = self.queue();
        let i = self.known_buf();
        let addr = self.bufs[i].addr;
        let (c, want) = match self.below(7) {
            0 => {
                let hdr = CmdHeader {
                    opcode: 0x7777,
                    flags: 0,
                };
                (self.g().run_cmd(q, &hdr), abi::STATUS_INVALID)
            }
            1 => {
                let cmd = abi::CopyCmd {
                    hdr: CmdHeader {
                        opcode: abi::OP_COPY,
                        flags: 0,
                    },
                    src_kind: abi::COPY_GUEST,
                    dst_kind: abi::COPY_GUEST,
                    src: 0,
                    dst: 0,
                    size: 64,
                    sg_count: 1,
                    reserved: 0,
                };
                let sg = [SgEntry {
                    addr: self.recv,
                    len: 64,
                }];
                (self.g().copy(q, &cmd, Some(&sg)), abi::STATUS_INVALID)
            }
            2 => (self.g().fill(q, addr, 6, 1), abi::STATUS_INVALID),
            3 => {
                let p = abi::FillParams {
                    dst: addr,
                    count: 1,
                    value: 0,
                    reserved: 0,
                };
                (
                    self.g().launch(q, "no_such_entry", &p),
                    abi::STATUS_NOT_FOUND,
                )
            }
            4 => (self.g().mem_free(q, addr + 4), abi::STATUS_NOT_FOUND),
            5 => (self.g().mem_alloc(q, QUOTA + 1, 0), abi::STATUS_NO_MEMORY),
            _ => (
                self.g().module_load(q, abi::MODULE_FORMAT_PTX, b"not ptx"),
                abi::STATUS_INVALID,
            ),
        };
        assert_status(c, want);
        self.counts.commands += 1;
        self.check_mem_used();
    }

    fn bad_address(&mut self) {
        let q = self.queue();
        let i = self.known_buf();
        let (addr, len) = (self.bufs[i].addr, self.bufs[i].len);
        let nowhere = self.g().unmapped_addr();
        let (c, want) = match self.below(6) {
            0 => {
                let sg = [SgEntry {
                    addr: nowhere,
                    len: 4096,
                }];
                (self.g().copy_from_device(q, addr, &sg), abi::STATUS_FAULT)
            }
            1 => {
                // The first segment is read before the second faults: the
                // buffer's bytes are unknown afterwards.
                let sg = [
                    SgEntry {
                        addr: self.send,
                        len: 512,
                    },
                    SgEntry {
                        addr: nowhere,
                        len: 512,
                    },
                ];
                let c = self.g().copy_to_device(q, addr, &sg);
                self.bufs[i].data = None;
                (c, abi::STATUS_FAULT)
            }
            2 => (
                self.g().fill(q, addr + len - 4, 8, 7),
                abi::STATUS_OUT_OF_RANGE,
            ),
            3 => (self.g().fence(q, nowhere, 1, 0), abi::STATUS_FAULT),
            4 => (
                self.g().copy_device_to_device(q, addr, addr + len + 16, 16),
                abi::STATUS_OUT_OF_RANGE,
            ),
            _ => {
                let p = abi::SaxpyParams {
                    y: addr + len - 8,
                    x: addr,
                    n: 4,
                    a: 1.0,
                    reserved: 0,
                };
                (
                    self.g().launch(q, "saxpy_f32", &p),
                    abi::STATUS_OUT_OF_RANGE,
                )
            }
        };
        assert_status(c, want);
        self.counts.commands += 1;
    }

    /// Posts up to 8 commands on queue `q` that change no device memory
    /// (downloads and NOPs) and rings, without waiting for them.
    fn post_harmless(&mut self, q: u32) {
        // Ranges first: finding one may run a command of its own.
        let ranges: Vec<_> = (0..self.below(8))
            .map(|_| self.range(16 << 10, 1))
            .collect();
        for (s, (i, off, len)) in (0u64..).zip(ranges) {
            let chain = if self.chance(50) {
                let cmd = abi::CopyCmd {
                    hdr: CmdHeader {
                        opcode: abi::OP_COPY,
                        flags: 0,
                    },
                    src_kind: abi::COPY_DEVICE,
                    dst_kind: abi::COPY_GUEST,
                    src: self.bufs[i].addr + off,
                    dst: 0,
                    size: len,
                    sg_count: 1,
                    reserved: 0,
                };
                let sg = SgEntry {
                    addr: self.recv + s * (32 << 10),
                    len,
                };
                Chain::command(&cmd)
                    .bytes(abi::ByteValued::as_slice(&sg))
                    .completion()
            } else {
                Chain::command(&CmdHeader::default()).completion()
            };
            self.g().post(q, &chain);
        }
        self.g().kick(q);
    }

    /// Posts up to 8 uploads and fills per queue and rings, without
    /// waiting: work a reset or a disconnect throws away.
    fn post_anything(&mut self) {
        // Ranges first: finding one may run a command of its own.
        let mut work = Vec::new();
        for q in 0..QUEUES {
            for _ in 0..self.below(8) {
                work.push((q, self.range(64 << 10, 4)));
            }
        }
        for (q, (i, off, len)) in work {
            let addr = self.bufs[i].addr + off;
            let chain = if self.chance(50) {
                let cmd = abi::FillCmd {
                    hdr: CmdHeader {
                        opcode: abi::OP_FILL,
                        flags: 0,
                    },
                    addr,
                    size: len,
                    pattern: 0xdead_beef,
                    reserved: 0,
                };
                Chain::command(&cmd).completion()
            } else {
                let cmd = abi::CopyCmd {
                    hdr: CmdHeader {
                        opcode: abi::OP_COPY,
                        flags: 0,
                    },
                    src_kind: abi::COPY_GUEST,
                    dst_kind: abi::COPY_DEVICE,
                    src: 0,
                    dst: addr,
                    size: len,
                    sg_count: 1,
                    reserved: 0,
                };
                let sg = SgEntry {
                    addr: self.send,
                    len,
                };
                Chain::command(&cmd)
                    .bytes(abi::ByteValued::as_slice(&sg))
                    .completion()
            };
            self.g().post(q, &chain);
        }
        for q in 0..QUEUES {
            self.g().kick(q);
        }
    }

    fn queue_toggle(&mut self) {
        let q = self.queue();
        if self.chance(70) {
            self.post_harmless(q);
        }
        self.g().disable_queue(q);
        assert_eq!(self.g().queue_status(q), 0);
        self.setup_queue(q);
    }

    fn ring_error(&mut self) {
        let q = self.queue();
        let idx = self.g().ring_avail_idx(q);
        let jump = 1 + QUEUE_SIZE + self.below(1000) as u16;
        self.g().ring_set_avail_idx(q, idx.wrapping_add(jump));
        self.g().kick(q);
        self.g().write32(abi::REG_WAKE, q);
        let stopped = eventually(self.g(), |g| g.queue_status(q) & abi::QSTATUS_ERROR != 0);
        assert!(stopped, "tenant {}: queue {q} did not stop", self.id);
        assert_eq!(self.g().queue_error(q), abi::ERR_RING_CORRUPT);
        self.g().disable_queue(q);
        self.setup_queue(q);
    }

    fn reset(&mut self) {
        if self.chance(70) {
            self.post_anything();
        }
        if self.chance(50) {
            self.g().control_reset();
        } else {
            self.g().device_reset();
        }
        assert_eq!(self.g().mem_used(), 0, "tenant {}: reset", self.id);
        assert_eq!(self.g().commands(), 0);
        self.g().enable_device();
        self.counts.resets += 1;
        self.init();
    }

    fn reconnect(&mut self) {
        if self.chance(70) {
            self.post_anything();
        }
        drop(self.guest.take());
        self.counts.reconnects += 1;
        self.connect();
    }

    // ---- the loop ----

    /// Publishes what device memory the model holds (after checking it
    /// against MEM_USED) and stops until the main thread has sampled.
    fn park(&mut self, last: bool) {
        let used = self.mem_in_use();
        self.check_mem_used();
        self.shared.device_memory[self.id].store(used, Ordering::Relaxed);
        let mut gate = self.shared.gate();
        if last {
            gate.finished += 1;
            self.shared.cv.notify_all();
            while !gate.done {
                gate = self.shared.wait(gate);
            }
        } else {
            gate.paused += 1;
            self.shared.cv.notify_all();
            while gate.pause {
                gate = self.shared.wait(gate);
            }
            gate.paused -= 1;
        }
    }

    fn run(mut self) -> Counts {
        loop {
            if self.shared.gate().pause {
                self.park(false);
                continue;
            }
            if Instant::now() >= self.shared.deadline {
                break;
            }
            if Instant::now() >= self.next_fault {
                self.fault();
                self.schedule_fault();
            } else {
                self.step();
            }
            self.shared.progress[self.id].fetch_add(1, Ordering::Relaxed);
        }
        // The final sample, still connected.
        self.park(true);
        self.counts
    }
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    fds: usize,
    threads: usize,
    rss: u64,
    /// Resident anonymous memory: the heap, device memory included.
    anon: u64,
    /// Resident shared memory: guest RAM (memfds) above all.
    shmem: u64,
    device_memory: u64,
}

/// Samples the process once every tenant has stopped at an operation
/// boundary: paused (`last` false) or done with its work.
fn sample(shared: &Shared, last: bool) -> Sample {
    let mut gate = shared.gate();
    gate.pause = !last;
    loop {
        let stopped = if last { gate.finished } else { gate.paused };
        if stopped >= gate.alive {
            break;
        }
        gate = shared.wait(gate);
    }
    let s = Sample {
        fds: open_fds(),
        threads: threads(),
        rss: rss(),
        anon: proc_status_bytes("RssAnon"),
        shmem: proc_status_bytes("RssShmem"),
        device_memory: shared
            .device_memory
            .iter()
            .map(|m| m.load(Ordering::Relaxed))
            .sum(),
    };
    gate.pause = false;
    gate.done = last;
    shared.cv.notify_all();
    s
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
        }
        Err(_) => default,
    }
}

#[test]
fn test_soak() {
    let secs = env_u64("VGPU_SOAK_SECS", 20).max(6);
    let seed = env_u64("VGPU_SOAK_SEED", 0x5eed_50a4);
    let duration = Duration::from_secs(secs);
    // Warm-up: every kind of work and fault has happened a few times.
    let warmup = Duration::from_secs((secs / 5).max(3)) + WINDOW / 2;
    eprintln!("soak: {TENANTS} tenants for {secs} s, seed {seed:#x}");

    let backend = SoftwareBackend::new(TENANTS as u64 * QUOTA, 6);
    let servers: Vec<TestVgpu> = (0..TENANTS)
        .map(|i| {
            let name = format!("soak{i}");
            // Two tenants run kernels on two threads, two on one.
            let units = if i < 2 { 2 } else { 1 };
            TestVgpu::start(
                test_config(&name, QUEUES),
                software_partition(&backend, &name, QUOTA, units),
            )
        })
        .collect();
    let start = Instant::now();
    let shared = Shared {
        deadline: start + duration,
        gate: Mutex::new(GateState {
            alive: TENANTS,
            ..Default::default()
        }),
        cv: Condvar::new(),
        progress: (0..TENANTS).map(|_| AtomicU64::new(0)).collect(),
        device_memory: (0..TENANTS).map(|_| AtomicU64::new(0)).collect(),
    };

    let (counts, windows, warm, end) = std::thread::scope(|s| {
        let tenants: Vec<_> = servers
            .iter()
            .enumerate()
            .map(|(i, server)| {
                let shared = &shared;
                let tenant_seed = seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64 + 1));
                std::thread::Builder::new()
                    .name(format!("tenant{i}"))
                    .spawn_scoped(s, move || {
                        let _alive = Alive(shared);
                        Tenant::new(i, server, shared, tenant_seed).run()
                    })
                    .expect("tenant thread")
            })
            .collect();

        // Progress of each tenant in each whole window.
        let mut windows: Vec<Vec<u64>> = Vec::new();
        let mut last = vec![0u64; TENANTS];
        let mut warm = None;
        let mut boundary = start + WINDOW;
        while boundary <= shared.deadline {
            if warm.is_none() && start + warmup < boundary {
                std::thread::sleep((start + warmup).saturating_duration_since(Instant::now()));
                warm = Some(sample(&shared, false));
            }
            std::thread::sleep(boundary.saturating_duration_since(Instant::now()));
            let now: Vec<u64> = shared
                .progress
                .iter()
                .map(|p| p.load(Ordering::Relaxed))
                .collect();
            windows.push(now.iter().zip(&last).map(|(n, l)| n - l).collect());
            last = now;
            boundary += WINDOW;
        }
        let end = sample(&shared, true);
        let counts: Vec<Counts> = tenants
            .into_iter()
            .map(|t| match t.join() {
                Ok(c) => c,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect();
        (counts, windows, warm.expect("warm-up sample"), end)
    });

    let total = |f: &dyn Fn(&Counts) -> u64| counts.iter().map(f).sum::<u64>();
    let faults: Vec<String> = FAULTS
        .iter()
        .enumerate()
        .map(|(k, f)| format!("{} {}", f.name(), total(&|c| c.faults[k])))
        .collect();
    let max = windows.iter().flatten().max().copied().unwrap_or(0);
    let min = windows.iter().flatten().min().copied().unwrap_or(0);
    eprintln!(
        "soak summary: {TENANTS} tenants, {secs} s, seed {seed:#x}: commands {}, bytes verified {}, \
         faults {} ({}), resets {}, reconnects {}, progress per {:?} window max {max} min {min}; \
         fds {} -> {}, threads {} -> {}, rss {:.1} -> {:.1} MiB (anonymous {:.1} -> {:.1}, \
         shared {:.1} -> {:.1}, device memory {:.1} -> {:.1})",
        total(&|c| c.commands),
        total(&|c| c.verified),
        total(&|c| c.faults.iter().sum()),
        faults.join(", "),
        total(&|c| c.resets),
        total(&|c| c.reconnects),
        WINDOW,
        warm.fds,
        end.fds,
        warm.threads,
        end.threads,
        mib(warm.rss),
        mib(end.rss),
        mib(warm.anon),
        mib(end.anon),
        mib(warm.shmem),
        mib(end.shmem),
        mib(warm.device_memory),
        mib(end.device_memory),
    );

    for (w, progress) in windows.iter().enumerate() {
        for (t, p) in progress.iter().enumerate() {
            assert!(
                *p > 0,
                "tenant {t} made no progress in window {w} ({progress:?})"
            );
        }
    }
    for (k, f) in FAULTS.iter().enumerate() {
        assert!(
            total(&|c| c.faults[k]) > 0,
            "no {} fault injected",
            f.name()
        );
    }
    assert!(
        end.fds <= warm.fds,
        "open fds grew: {} -> {}",
        warm.fds,
        end.fds
    );
    assert!(
        end.threads <= warm.threads,
        "threads grew: {} -> {}",
        warm.threads,
        end.threads
    );
    // Device memory is host heap here, and so is the tenants' model of it;
    // guest RAM (shared memory) grows as queue set-ups take fresh rings
    // from the kit's allocator.
    let heap = |s: &Sample| s.anon.saturating_sub(2 * s.device_memory);
    assert!(
        heap(&end) <= heap(&warm) + HEAP_SLACK,
        "heap beside device memory and its model grew by {:.1} MiB",
        mib(heap(&end)) - mib(heap(&warm))
    );
    let host = |s: &Sample| s.rss.saturating_sub(s.device_memory);
    assert!(
        host(&end) <= host(&warm) + RSS_SLACK,
        "resident memory beside device memory grew by {:.1} MiB",
        mib(host(&end)) - mib(host(&warm))
    );
}
