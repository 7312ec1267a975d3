//! Function reset, through CONTROL_RESET and through the vfio-user
//! DEVICE_RESET request, in the middle of work: device memory is freed,
//! registers return to their power-on values, and the function works again
//! once the driver sets it up anew.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{assert_status, eventually, vgpu, Rng, MIB};
use vgpu_testkit::abi::{self, ByteValued};
use vgpu_testkit::{f32s_to_bytes, launch_cmd, Chain, Guest, Mode, RingLayout};

/// Side of the square matrices of the slow launches.
const DIM: u32 = 96;
/// Launches queued before the reset.
const LAUNCHES: u16 = 100;

/// Allocates device memory, then queues [`LAUNCHES`] matrix products on
/// queue 0 and waits until the first has completed. Returns the device
/// addresses allocated.
fn start_work(g: &mut Guest) -> Vec<u64> {
    g.setup_queue(0, 512, Mode::Interrupt);
    g.setup_queue(1, 16, Mode::Polled);
    let bytes = u64::from(DIM * DIM * 4);
    let mats: Vec<u64> = (0..3).map(|_| g.device_alloc(0, bytes)).collect();
    let mut rng = Rng(21);
    for &m in &mats[..2] {
        g.upload(0, m, &f32s_to_bytes(&rng.f32s((DIM * DIM) as usize)));
    }
    let extra = g.device_alloc(1, 3 * MIB);
    assert_eq!(g.mem_used(), 3 * bytes + 3 * MIB);
    g.window_write(0, &[0xab; 4096]);

    let p = abi::SgemmParams {
        c: mats[2],
        a: mats[0],
        b: mats[1],
        m: DIM,
        n: DIM,
        k: DIM,
        reserved: 0,
        alpha: 1.0,
        beta: 1.0,
    };
    let cmd = launch_cmd("sgemm_f32", [1, 1, 1], [256, 1, 1], 48);
    let chain = Chain::command(&cmd).bytes(p.as_slice()).completion();
    for _ in 0..LAUNCHES {
        g.post(0, &chain);
    }
    g.kick(0);
    let first = g
        .wait_used(0, Duration::from_secs(10))
        .expect("first launch");
    assert_status(first.completion(), abi::STATUS_OK);
    let mut all = mats;
    all.push(extra);
    all
}

/// After a reset: power-on registers, memory freed, nothing more completes.
fn assert_reset_state(g: &mut Guest, ring: RingLayout, used_at_reset: u16) {
    assert_eq!(g.mem_used(), 0, "device memory freed");
    assert_eq!(g.commands(), 0);
    assert_eq!(g.read64(abi::REG_BUSY_NS), 0);
    assert_eq!(g.error_count(), 0);
    assert_eq!(g.read32(abi::REG_CONTROL), 0);
    assert_eq!(g.read32(abi::REG_STATUS), 0);
    assert_eq!(g.read32(abi::REG_IRQ_CAUSE), 0);
    for q in 0..g.num_queues() {
        assert_eq!(g.qread32(q, abi::QREG_STATUS), 0, "queue {q} stopped");
        assert_eq!(g.qread32(q, abi::QREG_SIZE), 0);
        assert_eq!(g.qread32(q, abi::QREG_MSIX_VECTOR), q + 1);
        assert_eq!(g.doorbells().polling(q), 0);
        assert_eq!(g.doorbells().avail_idx(q), 0, "doorbell page cleared");
    }
    assert_eq!(g.window_read(0, 4096), vec![0; 4096], "window cleared");
    // Nothing is completed after the reset.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        used_idx(g, ring),
        used_at_reset,
        "completions written after the reset"
    );
}

fn used_idx(g: &Guest, ring: RingLayout) -> u16 {
    g.ram().load_u16(ring.used_idx(), Ordering::Acquire)
}

/// The function works again after the driver sets it up anew, and old
/// device addresses are gone.
fn assert_works_again(g: &mut Guest, old: &[u64]) {
    g.enable_device();
    g.setup_queue(0, 32, Mode::Interrupt);
    for &a in old {
        assert_status(g.mem_free(0, a), abi::STATUS_NOT_FOUND);
    }
    let dev = g.device_alloc(0, 4096);
    let data = Rng(22).bytes(4096);
    g.upload(0, dev, &data);
    assert_eq!(g.download(0, dev, 4096), data);
    assert_eq!(g.mem_used(), 4096);
    g.clear_irqs();
    assert_status(g.nop(0), abi::STATUS_OK);
    assert!(
        g.irqs(1) > 0 || g.wait_irq(1, Duration::from_secs(5)),
        "MSI-X still wired"
    );
}

fn reset_mid_work(reset: impl FnOnce(&mut Guest)) {
    let (_s, mut g) = vgpu(2);
    let old = start_work(&mut g);
    let ring = g.layout(0);
    let used_before = used_idx(&g, ring);
    let t = Instant::now();
    reset(&mut g);
    let took = t.elapsed();
    let used_at_reset = used_idx(&g, ring);
    eprintln!(
        "reset took {took:?}; {used_before} -> {used_at_reset} of {LAUNCHES} launches completed"
    );
    assert!(
        used_before < LAUNCHES,
        "the reset came while work was queued"
    );
    assert_reset_state(&mut g, ring, used_at_reset);
    assert_works_again(&mut g, &old);
}

#[test]
fn test_control_reset_mid_work() {
    reset_mid_work(|g| g.control_reset());
}

#[test]
fn test_device_reset_mid_work() {
    reset_mid_work(|g| g.device_reset());
}

#[test]
fn test_reset_of_an_idle_function_and_repeated_resets() {
    let (_s, mut g) = vgpu(2);
    for _ in 0..3 {
        g.setup_queue(0, 16, Mode::Interrupt);
        let a = g.device_alloc(0, MIB);
        assert_eq!(g.mem_used(), MIB);
        g.control_reset();
        assert_eq!(g.mem_used(), 0);
        g.enable_device();
        g.setup_queue(0, 16, Mode::Interrupt);
        assert_status(g.mem_free(0, a), abi::STATUS_NOT_FOUND);
        g.device_reset();
        assert_eq!(g.read32(abi::REG_STATUS), 0);
        g.enable_device();
        assert_eq!(g.read32(abi::REG_STATUS), abi::STATUS_ENABLED);
    }
}

#[test]
fn test_reset_clears_a_queue_error() {
    let (_s, mut g) = vgpu(1);
    g.setup_queue(0, 16, Mode::Interrupt);
    let idx = g.ring_avail_idx(0);
    g.ring_set_avail_idx(0, idx.wrapping_add(100));
    g.set_wake_policy(vgpu_testkit::WakePolicy::Always);
    g.kick(0);
    assert!(eventually(&mut g, |g| g.queue_status(0)
        & abi::QSTATUS_ERROR
        != 0));
    assert!(g.error_count() > 0);
    g.device_reset();
    assert_eq!(g.queue_status(0), 0);
    assert_eq!(g.error_count(), 0);
    assert_eq!(
        g.error_entry(0),
        abi::ErrorLogEntry::default(),
        "error log cleared"
    );
    g.enable_device();
    g.setup_queue(0, 16, Mode::Interrupt);
    assert_status(g.nop(0), abi::STATUS_OK);
}

/// Queues `n` matrix products of side `dim` on queue 0 (size 1024), waits
/// for the first to complete, resets with `reset` and returns how many
/// completed between the reset request and its return.
fn completions_during_reset(n: u16, dim: u32, reset: impl FnOnce(&mut Guest)) -> (u16, Duration) {
    let (_s, mut g) = vgpu(1);
    g.setup_queue(0, 1024, Mode::Interrupt);
    let bytes = u64::from(dim * dim * 4);
    let m: Vec<u64> = (0..3).map(|_| g.device_alloc(0, bytes)).collect();
    let p = abi::SgemmParams {
        c: m[2],
        a: m[0],
        b: m[1],
        m: dim,
        n: dim,
        k: dim,
        reserved: 0,
        alpha: 1.0,
        beta: 1.0,
    };
    let cmd = launch_cmd("sgemm_f32", [1, 1, 1], [256, 1, 1], 48);
    let chain = Chain::command(&cmd).bytes(p.as_slice()).completion();
    let ring = g.layout(0);
    for _ in 0..n {
        g.post(0, &chain);
    }
    g.kick(0);
    assert!(eventually(&mut g, |g| used_idx(g, ring) > 0));
    let before = used_idx(&g, ring);
    let t = Instant::now();
    reset(&mut g);
    let took = t.elapsed();
    let after = used_idx(&g, ring);
    (after - before, took)
}

#[test]
fn test_reset_stops_queued_work_at_once() {
    for round in 0..5 {
        let (ran, took) = completions_during_reset(200, 64, |g| g.control_reset());
        // The command running when the reset arrives may finish, and one
        // more may have been completing while the request was in flight.
        assert!(
            ran <= 2,
            "round {round}: {ran} commands completed during a reset that took {took:?}"
        );
    }
}

#[test]
fn test_vmm_disconnect_resets_the_function() {
    let (s, mut g) = vgpu(2);
    g.setup_queue(0, 16, Mode::Interrupt);
    g.device_alloc(0, 2 * MIB);
    g.window_write(100, b"left behind");
    drop(g);
    // A restarted VMM finds the function as new.
    let mut g = s.connect();
    assert_eq!(g.mem_used(), 0);
    assert_eq!(g.queue_status(0), 0);
    assert_eq!(g.window_read(100, 11), vec![0; 11]);
    g.setup_queue(0, 16, Mode::Interrupt);
    assert_status(g.nop(0), abi::STATUS_OK);
}
