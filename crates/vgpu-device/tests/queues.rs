//! Queues: interrupt and polled mode, interrupts and their suppression,
//! batches, several queues at once, and rings that are broken or out of
//! reach (the queue stops with an error, the others carry on).

mod common;

use std::time::{Duration, Instant};

use common::{assert_status, eventually, nop_in_ram, vgpu, QUIET};
use vgpu_device::testing::{test_config, TestVgpu};
use vgpu_testkit::abi::{self, CmdHeader};
use vgpu_testkit::ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use vgpu_testkit::{launch_cmd, Chain, Guest, Mode, VirtqDesc, WakePolicy};

fn polled_vgpu(queues: u32, poll_spin: Duration) -> (TestVgpu, Guest) {
    let mut config = test_config("polled", queues);
    config.poll_spin = poll_spin;
    let server = TestVgpu::software(config, 16 << 20, 1);
    let guest = server.connect();
    (server, guest)
}

fn nop_chain() -> Chain {
    Chain::command(&CmdHeader::default()).completion()
}

#[test]
fn test_interrupt_mode_raises_the_queue_vector() {
    let (_s, mut g) = vgpu(4);
    g.setup_queue(0, 32, Mode::Interrupt);
    assert_eq!(
        g.try_setup_queue(1, 32, Mode::Interrupt, 5),
        abi::QSTATUS_ENABLED
    );
    assert_eq!(
        g.try_setup_queue(2, 32, Mode::Interrupt, abi::MSIX_NO_VECTOR),
        abi::QSTATUS_ENABLED
    );
    assert_eq!(g.qread32(1, abi::QREG_MSIX_VECTOR), 5);

    g.clear_irqs();
    assert_status(g.nop(0), abi::STATUS_OK);
    assert!(
        g.wait_irq(1, Duration::from_secs(5)),
        "vector 1 fires for queue 0"
    );
    g.clear_irqs();
    assert_status(g.nop(1), abi::STATUS_OK);
    assert!(
        g.wait_irq(5, Duration::from_secs(5)),
        "vector 5 fires for queue 1"
    );
    assert_eq!(g.irqs(2), 0, "queue 1's default vector stays quiet");
    g.clear_irqs();
    assert_status(g.nop(2), abi::STATUS_OK);
    std::thread::sleep(QUIET);
    for v in 0..abi::MSIX_VECTORS {
        assert_eq!(
            g.irqs(v),
            0,
            "vector {v} fired for a queue without a vector"
        );
    }
    assert!(g.read32(abi::REG_IRQ_CAUSE) & abi::IRQ_CAUSE_QUEUE != 0);
    g.write32(abi::REG_IRQ_CAUSE, abi::IRQ_CAUSE_QUEUE);
    assert_eq!(
        g.read32(abi::REG_IRQ_CAUSE) & abi::IRQ_CAUSE_QUEUE,
        0,
        "write 1 to clear"
    );
}

#[test]
fn test_one_interrupt_per_completion_with_event_index() {
    let (_s, mut g) = vgpu(1);
    g.setup_queue(0, 16, Mode::Interrupt);
    g.clear_irqs();
    for _ in 0..40 {
        assert_status(g.nop(0), abi::STATUS_OK);
    }
    // Each completion passed used_event once.
    assert!(eventually(&mut g, |g| g.irqs(1) == 40));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(g.irqs(1), 40);
    assert_eq!(g.irqs(abi::MSIX_ERROR_VECTOR), 0);
}

#[test]
fn test_used_event_suppresses_interrupts_and_fence_irq_overrides() {
    let (_s, mut g) = vgpu(1);
    g.setup_queue(0, 32, Mode::Interrupt);
    let addr = g.alloc(8, 8);
    g.suppress_irqs(0, true);
    g.clear_irqs();
    for _ in 0..5 {
        assert_status(g.nop(0), abi::STATUS_OK);
    }
    assert_status(g.fence(0, addr, 1, 0), abi::STATUS_OK);
    std::thread::sleep(QUIET);
    assert_eq!(g.irqs(1), 0, "suppressed by used_event");
    assert_status(g.fence(0, addr, 2, abi::FENCE_FLAG_IRQ), abi::STATUS_OK);
    assert!(
        g.wait_irq(1, Duration::from_secs(5)),
        "FENCE_FLAG_IRQ interrupts anyway"
    );
    assert_eq!(g.read(addr, 8), 2u64.to_le_bytes());
    g.suppress_irqs(0, false);
    g.clear_irqs();
    assert_status(g.nop(0), abi::STATUS_OK);
    assert!(g.wait_irq(1, Duration::from_secs(5)));
}

#[test]
fn test_polled_queue_runs_on_the_doorbell_page_alone() {
    // A long spin keeps the device polling for the whole test.
    let (_s, mut g) = polled_vgpu(1, Duration::from_secs(2));
    g.setup_queue(0, 32, Mode::Polled);
    assert!(
        eventually(&mut g, |g| g.doorbells().polling(0) == 1),
        "device polls"
    );
    g.set_wake_policy(WakePolicy::Never);
    for i in 0..200u64 {
        let addr = g.alloc(8, 8);
        assert_status(g.fence(0, addr, i, 0), abi::STATUS_OK);
        assert_eq!(g.read(addr, 8), i.to_le_bytes());
    }
    assert_eq!(g.wakes(), 0, "no trapped write was needed");
    assert_eq!(
        g.doorbells().avail_idx(0),
        200,
        "the doorbell slot holds the avail index"
    );
}

#[test]
fn test_polled_device_sleeps_when_idle_and_is_woken() {
    let (_s, mut g) = polled_vgpu(1, Duration::from_millis(1));
    g.setup_queue(0, 32, Mode::Polled);
    // The kit writes WAKE only when it reads POLLING as 0 at submit; the
    // device may have started a spin of its own just before (a wake-up
    // it owed to something else), so a round retries until its command
    // found the device asleep. Every command must complete either way.
    for round in 0..5 {
        let woken = (0..50).any(|_| {
            assert!(
                eventually(&mut g, |g| g.doorbells().polling(0) == 0),
                "device sleeps after its spin"
            );
            let wakes = g.wakes();
            assert_status(g.nop(0), abi::STATUS_OK);
            g.wakes() == wakes + 1
        });
        assert!(woken, "round {round}: a sleeping device is woken");
    }
}

#[test]
fn test_interrupt_queue_never_reports_polling() {
    let (_s, mut g) = vgpu(2);
    g.setup_queue(0, 32, Mode::Interrupt);
    g.setup_queue(1, 32, Mode::Polled);
    for _ in 0..20 {
        assert_status(g.nop(0), abi::STATUS_OK);
        assert_eq!(g.doorbells().polling(0), 0);
    }
}

fn run_batch(g: &mut Guest, n: usize) -> Duration {
    let chains = vec![nop_chain(); n];
    let start = Instant::now();
    let used = g.submit_batch(0, &chains);
    let took = start.elapsed();
    assert_eq!(used.len(), n);
    for u in used {
        assert_status(u.completion(), abi::STATUS_OK);
    }
    took
}

#[test]
fn test_batch_submission_interrupt_mode() {
    let (_s, mut g) = vgpu(1);
    g.setup_queue(0, 256, Mode::Interrupt);
    let n = 5000;
    let took = run_batch(&mut g, n);
    assert_eq!(g.commands(), n as u64);
    eprintln!(
        "interrupt mode: {n} NOPs in {took:?} ({:.0}/s), {} wakes",
        n as f64 / took.as_secs_f64(),
        g.wakes()
    );
    assert!(g.wakes() < n as u64 / 2, "batches share notifications");
}

#[test]
fn test_batch_submission_polled_mode() {
    let (_s, mut g) = polled_vgpu(1, Duration::from_millis(5));
    g.setup_queue(0, 256, Mode::Polled);
    let n = 5000;
    let took = run_batch(&mut g, n);
    assert_eq!(g.commands(), n as u64);
    eprintln!(
        "polled mode: {n} NOPs in {took:?} ({:.0}/s), {} wakes",
        n as f64 / took.as_secs_f64(),
        g.wakes()
    );
}

#[test]
fn test_small_ring_wraps_many_times() {
    let (_s, mut g) = vgpu(1);
    g.setup_queue(0, 2, Mode::Interrupt);
    let addr = g.alloc(8, 8);
    for i in 0..300u64 {
        assert_status(g.fence(0, addr, i, 0), abi::STATUS_OK);
    }
    assert_eq!(g.read(addr, 8), 299u64.to_le_bytes());
    assert_eq!(g.ring_used_idx(0), 300);
}

#[test]
fn test_queues_run_side_by_side() {
    let (_s, mut g) = vgpu(4);
    for q in 0..4 {
        let mode = if q % 2 == 0 {
            Mode::Interrupt
        } else {
            Mode::Polled
        };
        g.setup_queue(q, 64, mode);
    }
    let n = 30u64;
    let base = g.alloc(4 * n * 8, 8);
    for i in 0..n {
        for q in 0..4u32 {
            let addr = base + (u64::from(q) * n + i) * 8;
            let cmd = abi::FenceCmd {
                hdr: CmdHeader {
                    opcode: abi::OP_FENCE,
                    flags: 0,
                },
                addr,
                value: (u64::from(q) << 32) | i,
            };
            g.post(q, &Chain::command(&cmd).completion());
        }
    }
    for q in 0..4 {
        g.kick(q);
    }
    for q in 0..4 {
        for _ in 0..n {
            let used = g.wait_used(q, Duration::from_secs(10)).expect("completion");
            assert_status(used.completion(), abi::STATUS_OK);
        }
    }
    for q in 0..4u64 {
        for i in 0..n {
            let v = g.read(base + (q * n + i) * 8, 8);
            assert_eq!(v, ((q << 32) | i).to_le_bytes());
        }
    }
    assert_eq!(g.commands(), 4 * n);
}

/// Waits until queue `q` is stopped by an error and returns QREG_ERROR.
fn wait_queue_error(g: &mut Guest, q: u32) -> u32 {
    assert!(
        eventually(g, |g| g.queue_status(q) & abi::QSTATUS_ERROR != 0),
        "queue {q} did not stop"
    );
    g.queue_error(q)
}

/// Checks that the newest error log entry concerns queue `q` with `code`,
/// that the error vector fired and IRQ_CAUSE_ERROR is set.
fn assert_error_reported(g: &mut Guest, errors_before: u32, q: u32, code: u32) {
    assert!(
        g.wait_irq(abi::MSIX_ERROR_VECTOR, Duration::from_secs(5)),
        "error vector fires"
    );
    let errors = g.errors_since(errors_before);
    assert!(
        errors.iter().any(|e| e.queue == q && e.code == code),
        "no error {code} of queue {q} in {errors:?}"
    );
    assert!(g.read32(abi::REG_IRQ_CAUSE) & abi::IRQ_CAUSE_ERROR != 0);
}

/// Two queues working; returns the error count before the test breaks one.
fn two_queues(g: &mut Guest) -> u32 {
    g.setup_queue(0, 16, Mode::Interrupt);
    g.setup_queue(1, 16, Mode::Interrupt);
    g.set_wake_policy(WakePolicy::Always);
    assert_status(g.nop(0), abi::STATUS_OK);
    assert_status(g.nop(1), abi::STATUS_OK);
    g.clear_irqs();
    g.error_count()
}

/// The other queue still works and the broken one recovers after being
/// disabled and set up again.
fn assert_others_work_and_recovery(g: &mut Guest) {
    for _ in 0..3 {
        assert_status(g.nop(1), abi::STATUS_OK);
    }
    g.disable_queue(0);
    assert_eq!(g.queue_status(0), 0, "disable clears the error");
    g.setup_queue(0, 16, Mode::Interrupt);
    assert_status(g.nop(0), abi::STATUS_OK);
}

#[test]
fn test_avail_index_jump_stops_only_that_queue() {
    let (_s, mut g) = vgpu(2);
    let before = two_queues(&mut g);
    let idx = g.ring_avail_idx(0);
    g.ring_set_avail_idx(0, idx.wrapping_add(17));
    g.kick(0);
    assert_eq!(wait_queue_error(&mut g, 0), abi::ERR_RING_CORRUPT);
    assert_error_reported(&mut g, before, 0, abi::ERR_RING_CORRUPT);
    assert_eq!(g.queue_status(1), abi::QSTATUS_ENABLED);
    assert_others_work_and_recovery(&mut g);
}

/// Makes descriptors 0 and 1 of queue 0 a NOP with a completion buffer,
/// linked by `desc0_next`/`desc1`, and publishes head 0.
fn post_raw_nop(g: &mut Guest, desc1: VirtqDesc, desc0_next: u16) -> u64 {
    let nop = nop_in_ram(g);
    let completion = g.alloc(32, 8);
    g.write(completion, &[0xee; 32]);
    g.ring_write_desc(
        0,
        0,
        VirtqDesc {
            addr: nop,
            len: 8,
            flags: VRING_DESC_F_NEXT,
            next: desc0_next,
        },
    );
    let desc1 = VirtqDesc {
        addr: if desc1.addr == 0 {
            completion
        } else {
            desc1.addr
        },
        ..desc1
    };
    g.ring_write_desc(0, 1, desc1);
    g.ring_push_head(0, 0);
    g.kick(0);
    completion
}

#[test]
fn test_descriptor_loop_does_not_disturb_other_queues() {
    let (_s, mut g) = vgpu(2);
    two_queues(&mut g);
    post_raw_nop(
        &mut g,
        VirtqDesc {
            addr: 0,
            len: 32,
            flags: VRING_DESC_F_NEXT | VRING_DESC_F_WRITE,
            next: 0,
        },
        1,
    );
    // Whatever the device makes of the loop, it must not hang or spin on it.
    std::thread::sleep(QUIET);
    assert_status(g.nop(1), abi::STATUS_OK);
    assert_others_work_and_recovery(&mut g);
}

#[test]
fn test_descriptor_loop_is_ring_corruption() {
    let (_s, mut g) = vgpu(2);
    let before = two_queues(&mut g);
    post_raw_nop(
        &mut g,
        VirtqDesc {
            addr: 0,
            len: 32,
            flags: VRING_DESC_F_NEXT | VRING_DESC_F_WRITE,
            next: 0,
        },
        1,
    );
    assert_eq!(wait_queue_error(&mut g, 0), abi::ERR_RING_CORRUPT);
    assert_error_reported(&mut g, before, 0, abi::ERR_RING_CORRUPT);
    assert_others_work_and_recovery(&mut g);
}

#[test]
fn test_next_index_out_of_range_is_ring_corruption() {
    let (_s, mut g) = vgpu(2);
    let before = two_queues(&mut g);
    post_raw_nop(
        &mut g,
        VirtqDesc {
            addr: 0,
            len: 32,
            flags: VRING_DESC_F_WRITE,
            next: 0,
        },
        200,
    );
    assert_eq!(wait_queue_error(&mut g, 0), abi::ERR_RING_CORRUPT);
    assert_error_reported(&mut g, before, 0, abi::ERR_RING_CORRUPT);
    assert_others_work_and_recovery(&mut g);
}

#[test]
fn test_head_index_out_of_range_stops_only_that_queue() {
    let (_s, mut g) = vgpu(2);
    let before = two_queues(&mut g);
    g.ring_push_head(0, 16 + 3);
    g.kick(0);
    let code = wait_queue_error(&mut g, 0);
    assert!(g.wait_irq(abi::MSIX_ERROR_VECTOR, Duration::from_secs(5)));
    let errors = g.errors_since(before);
    assert!(
        errors.iter().any(|e| e.queue == 0 && e.code == code),
        "{errors:?}"
    );
    assert_others_work_and_recovery(&mut g);
}

#[test]
fn test_head_index_out_of_range_is_ring_corruption() {
    let (_s, mut g) = vgpu(2);
    let before = two_queues(&mut g);
    g.ring_push_head(0, 16 + 3);
    g.kick(0);
    assert_eq!(wait_queue_error(&mut g, 0), abi::ERR_RING_CORRUPT);
    assert_error_reported(&mut g, before, 0, abi::ERR_RING_CORRUPT);
}

#[test]
fn test_descriptor_buffer_in_unmapped_memory_faults_the_command_only() {
    let (_s, mut g) = vgpu(2);
    let before = two_queues(&mut g);
    let bad = g.unmapped_addr();
    // The command buffer is out of reach: a per-command FAULT.
    let c = g.run(0, &Chain::new().read(bad, 8).completion());
    assert_status(c, abi::STATUS_FAULT);
    // The completion buffer is out of reach: returned with length 0.
    let nop = nop_in_ram(&mut g);
    let used = g
        .submit_raw(0, &[(nop, 8, false), (bad, 32, true)])
        .expect("used");
    assert_eq!(used.len, 0);
    assert_eq!(g.queue_status(0), abi::QSTATUS_ENABLED);
    assert_eq!(
        g.error_count(),
        before,
        "no device error for a command fault"
    );
    assert_status(g.nop(0), abi::STATUS_OK);
    assert_status(g.nop(1), abi::STATUS_OK);
}

#[test]
fn test_indirect_table_in_unmapped_memory_is_ring_corruption() {
    let (_s, mut g) = vgpu(2);
    let before = two_queues(&mut g);
    let bad = g.unmapped_addr();
    g.ring_write_desc(
        0,
        0,
        VirtqDesc {
            addr: bad,
            len: 32,
            flags: VRING_DESC_F_INDIRECT,
            next: 0,
        },
    );
    g.ring_push_head(0, 0);
    g.kick(0);
    assert_eq!(wait_queue_error(&mut g, 0), abi::ERR_RING_CORRUPT);
    assert_error_reported(&mut g, before, 0, abi::ERR_RING_CORRUPT);
    assert_others_work_and_recovery(&mut g);
}

#[test]
fn test_rings_outside_mapped_memory_fail_at_enable() {
    let (_s, mut g) = vgpu(2);
    g.setup_queue(1, 16, Mode::Interrupt);
    let bad = g.unmapped_addr();
    let desc = g.alloc(16 * 16, 4096);
    let avail = g.alloc(64, 64);
    let used = g.alloc(256, 64);
    let end = g.ram().iova() + g.ram().size();
    let cases = [
        (bad, avail, used),
        (desc, bad, used),
        (desc, avail, bad),
        (0, avail, used),
        // The used ring runs past the end of guest RAM.
        (desc, avail, end - 64),
        (end - 16 * 8, avail, used),
    ];
    for (i, (d, a, u)) in cases.into_iter().enumerate() {
        g.clear_irqs();
        let before = g.error_count();
        let status = g.enable_queue_raw(0, 16, d, a, u, abi::QCONTROL_ENABLE);
        assert_eq!(status, abi::QSTATUS_ERROR, "case {i}");
        assert_eq!(g.queue_error(0), abi::ERR_RING_ADDRESS, "case {i}");
        assert_error_reported(&mut g, before, 0, abi::ERR_RING_ADDRESS);
        g.qwrite32(0, abi::QREG_CONTROL, 0);
    }
    assert_status(g.nop(1), abi::STATUS_OK);
    g.setup_queue(0, 16, Mode::Interrupt);
    assert_status(g.nop(0), abi::STATUS_OK);
}

#[test]
fn test_bad_queue_sizes_fail_at_enable() {
    let (_s, mut g) = vgpu(1);
    let desc = g.alloc(16 * 4096, 4096);
    let avail = g.alloc(6 + 2 * 4096, 64);
    let used = g.alloc(6 + 8 * 4096, 64);
    for size in [0, 3, 12, abi::MAX_QUEUE_SIZE * 2, 65536, u32::MAX] {
        let before = g.error_count();
        g.clear_irqs();
        let status = g.enable_queue_raw(0, size, desc, avail, used, abi::QCONTROL_ENABLE);
        assert_eq!(status, abi::QSTATUS_ERROR, "size {size}");
        assert_eq!(g.queue_error(0), abi::ERR_QUEUE_CONFIG, "size {size}");
        assert_error_reported(&mut g, before, 0, abi::ERR_QUEUE_CONFIG);
        g.qwrite32(0, abi::QREG_CONTROL, 0);
    }
    let status = g.enable_queue_raw(
        0,
        abi::MAX_QUEUE_SIZE,
        desc,
        avail,
        used,
        abi::QCONTROL_ENABLE,
    );
    assert_eq!(status, abi::QSTATUS_ENABLED);
}

#[test]
fn test_ring_registers_are_locked_while_enabled() {
    let (_s, mut g) = vgpu(1);
    g.setup_queue(0, 16, Mode::Interrupt);
    let layout = g.layout(0);
    let before = g.error_count();
    g.qwrite32(0, abi::QREG_SIZE, 32);
    g.qwrite64(0, abi::QREG_DESC, 0x1000);
    assert_eq!(g.qread32(0, abi::QREG_SIZE), 16);
    assert_eq!(g.qread32(0, abi::QREG_DESC), layout.desc as u32);
    let errors = g.errors_since(before);
    assert!(
        !errors.is_empty()
            && errors
                .iter()
                .all(|e| e.code == abi::ERR_REGISTER && e.queue == 0)
    );
    // The vector may change at any time.
    g.qwrite32(0, abi::QREG_MSIX_VECTOR, 9);
    assert_eq!(g.qread32(0, abi::QREG_MSIX_VECTOR), 9);
    g.clear_irqs();
    assert_status(g.nop(0), abi::STATUS_OK);
    assert!(g.wait_irq(9, Duration::from_secs(5)));
    assert_eq!(g.queue_status(0), abi::QSTATUS_ENABLED);
}

#[test]
fn test_queues_beyond_the_offered_ones_ignore_writes() {
    let (_s, mut g) = vgpu(2);
    g.qwrite32(2, abi::QREG_SIZE, 16);
    g.qwrite32(2, abi::QREG_CONTROL, abi::QCONTROL_ENABLE);
    assert_eq!(g.qread32(2, abi::QREG_SIZE), 0);
    assert_eq!(g.qread32(2, abi::QREG_STATUS), 0);
    assert_eq!(g.qread32(abi::MAX_QUEUES - 1, abi::QREG_STATUS), 0);
}

#[test]
fn test_busy_queue_does_not_starve_another() {
    let (_s, mut g) = vgpu(2);
    g.setup_queue(0, 1024, Mode::Interrupt);
    g.setup_queue(1, 16, Mode::Interrupt);
    let dim = 48u32;
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
        beta: 0.0,
    };
    let cmd = launch_cmd("sgemm_f32", [1, 1, 1], [256, 1, 1], 48);
    let chain = Chain::command(&cmd)
        .bytes(abi::ByteValued::as_slice(&p))
        .completion();
    let stamp = vgpu_testkit::bare_chain(abi::OP_TIMESTAMP);
    // Each GEMM of queue 0 is followed by a timestamp, and queue 1's one
    // timestamp is there before queue 0 is kicked: the device's clock
    // says how many GEMMs ran before it, however this thread is
    // scheduled.
    let n = 200usize;
    for _ in 0..n {
        g.post(0, &chain);
        g.post(0, &stamp);
    }
    g.post(1, &stamp);
    g.kick(0);
    g.kick(1);
    let other = g.wait_used(1, Duration::from_secs(20)).expect("completion");
    assert_status(other.completion(), abi::STATUS_OK);
    let at = other.completion().result;
    let mut before = 0;
    for i in 0..2 * n {
        let used = g.wait_used(0, Duration::from_secs(20)).expect("completion");
        assert_status(used.completion(), abi::STATUS_OK);
        if i % 2 == 1 && used.completion().result < at {
            before += 1;
        }
    }
    assert!(
        before < n / 2,
        "queue 1 waited for {before} GEMMs of queue 0"
    );
}

#[test]
fn test_error_log_wraps_and_keeps_the_newest() {
    let (_s, mut g) = vgpu(1);
    g.setup_queue(0, 16, Mode::Interrupt);
    // Writes to ring registers of a running queue are logged with the
    // register offset as the detail.
    let regs = [
        abi::QREG_SIZE,
        abi::QREG_DESC,
        abi::QREG_AVAIL,
        abi::QREG_USED,
    ];
    let written: Vec<u64> = (0..21).map(|i| regs[i % 4]).collect();
    for &r in &written {
        g.qwrite32(0, r, 0);
    }
    assert_eq!(g.error_count(), 21);
    let log = g.errors_since(0);
    assert_eq!(log.len(), abi::ERROR_LOG_ENTRIES as usize);
    for (e, &r) in log.iter().zip(&written[21 - 16..]) {
        assert_eq!((e.code, e.queue, e.detail), (abi::ERR_REGISTER, 0, r));
    }
    assert_eq!(
        g.error_entry(20).detail,
        written[20],
        "newest at (count - 1) % 16"
    );
    assert_status(g.nop(0), abi::STATUS_OK);
}

#[test]
fn test_unmapping_guest_ram_under_a_running_queue_stops_it() {
    let (s, mut g) = vgpu(1);
    g.setup_queue(0, 16, Mode::Interrupt);
    assert_status(g.nop(0), abi::STATUS_OK);
    // Cleared first: the unmap itself may already stop the queue and
    // raise the error.
    g.clear_irqs();
    g.unmap_ram();
    g.write32(abi::REG_WAKE, 0);
    assert_ne!(wait_queue_error(&mut g, 0), abi::ERR_NONE);
    assert!(g.wait_irq(abi::MSIX_ERROR_VECTOR, Duration::from_secs(5)));
    assert!(s.alive());
    g.map_ram();
    g.disable_queue(0);
    g.setup_queue(0, 16, Mode::Interrupt);
    assert_status(g.nop(0), abi::STATUS_OK);
}

#[test]
fn test_long_chain_gets_a_completion() {
    let (_s, mut g) = vgpu(1);
    g.setup_queue(0, 128, Mode::Interrupt);
    // A module image spread over 70 one-byte descriptors.
    let cmd = abi::ModuleLoadCmd {
        hdr: CmdHeader {
            opcode: abi::OP_MODULE_LOAD,
            flags: 0,
        },
        format: abi::MODULE_FORMAT_PTX,
        reserved: 0,
        image_size: 70,
    };
    let mut chain = Chain::command(&cmd);
    for _ in 0..70 {
        chain = chain.bytes(b"x");
    }
    let used = g.submit(0, &chain.completion());
    assert_eq!(used.len, 32, "the completion was written");
    let c = used.completion();
    assert!(
        c.status == abi::STATUS_UNSUPPORTED || c.status == abi::STATUS_INVALID,
        "{c:?}"
    );
}

#[test]
fn test_misaligned_rings_fail_at_enable() {
    let (_s, mut g) = vgpu(1);
    let desc = g.alloc(16 * 16 + 64, 4096);
    let avail = g.alloc(64, 64);
    let used = g.alloc(256, 64);
    for (d, a, u) in [
        (desc + 8, avail, used),
        (desc, avail + 1, used),
        (desc, avail, used + 2),
    ] {
        let status = g.enable_queue_raw(0, 16, d, a, u, abi::QCONTROL_ENABLE);
        assert_eq!(status, abi::QSTATUS_ERROR);
        assert_eq!(g.queue_error(0), abi::ERR_QUEUE_CONFIG);
        g.qwrite32(0, abi::QREG_CONTROL, 0);
    }
}

#[test]
fn test_switching_a_running_queue_to_polled_keeps_its_position() {
    let (_s, mut g) = vgpu(1);
    g.setup_queue(0, 16, Mode::Interrupt);
    let addrs: Vec<u64> = (0..3).map(|_| g.alloc(8, 8)).collect();
    for (i, &a) in addrs.iter().enumerate() {
        assert_status(g.fence(0, a, i as u64 + 1, 0), abi::STATUS_OK);
        g.write(a, &[0; 8]);
    }
    g.qwrite32(
        0,
        abi::QREG_CONTROL,
        abi::QCONTROL_ENABLE | abi::QCONTROL_POLLED,
    );
    assert_eq!(g.queue_status(0), abi::QSTATUS_ENABLED);
    assert_status(g.nop(0), abi::STATUS_OK);
    std::thread::sleep(QUIET);
    for &a in &addrs {
        assert_eq!(g.read(a, 8), [0; 8], "a completed FENCE ran again");
    }
    assert_eq!(g.commands(), 4);
    assert_eq!(g.ring_used_idx(0), 4);
}
