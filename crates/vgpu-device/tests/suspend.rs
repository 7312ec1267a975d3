//! Suspend and resume of a function's memory: the function stops at a
//! command boundary, the guest's submissions wait and none fails, the
//! GPU's memory is free for others meanwhile, and everything is back at
//! its address on resume.

mod common;

use std::time::Duration;

use common::MIB;
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{Backend, OpError};
use vgpu_device::testing::{software_partition, test_config, TestVgpu};
use vgpu_testkit::abi;
use vgpu_testkit::abi::SgEntry;
use vgpu_testkit::{fill_chain, Mode};

/// Whether all of the bytes at `addr` of the guest's device memory hold
/// `pattern`, read back through a copy into `sg`.
fn holds(g: &mut vgpu_testkit::Guest, addr: u64, sg: &[SgEntry], pattern: u32) -> bool {
    assert_eq!(g.copy_from_device(0, addr, sg).status, abi::STATUS_OK);
    g.read_sg(sg)
        .chunks_exact(4)
        .all(|w| w == pattern.to_le_bytes())
}

#[test]
fn test_submissions_wait_while_suspended_and_run_on_resume() {
    let backend = SoftwareBackend::new(32 * MIB, 2);
    let server = TestVgpu::start(
        test_config("suspend", 1),
        software_partition(&backend, "suspend", 16 * MIB, 2),
    );
    let memory = server.memory();
    let mut g = server.connect();
    g.setup_queue(0, 64, Mode::Interrupt);
    let a = g.device_alloc(0, 4 * MIB);
    let sg = g.alloc_sg(&[4 * MIB]);
    for round in 0..20u32 {
        let pattern = 0x5eed_0000 | round;
        assert_eq!(memory.suspend(), Ok(4 * MIB), "round {round}");
        assert!(memory.is_suspended());
        assert_eq!(backend.unclaimed().memory, 32 * MIB, "the memory is free");
        g.post(0, &fill_chain(a, 4 * MIB, pattern));
        g.kick(0);
        if round % 5 == 0 {
            // It waits: a suspended function completes nothing.
            assert!(g.wait_used(0, Duration::from_millis(200)).is_none());
        }
        assert_eq!(memory.resume(), Ok(4 * MIB));
        let used = g.wait_used(0, Duration::from_secs(30)).expect("completion");
        assert_eq!(used.completion().status, abi::STATUS_OK, "round {round}");
        assert!(holds(&mut g, a, &sg, pattern), "round {round}");
        assert_eq!(backend.unclaimed().memory, 16 * MIB);
    }
    assert_eq!(g.error_count(), 0, "nothing failed");
}

#[test]
fn test_a_resume_without_room_is_refused_and_the_function_stays_suspended() {
    let backend = SoftwareBackend::new(32 * MIB, 2);
    let server = TestVgpu::start(
        test_config("no-room", 1),
        software_partition(&backend, "no-room", 16 * MIB, 1),
    );
    let memory = server.memory();
    let mut g = server.connect();
    g.setup_queue(0, 16, Mode::Interrupt);
    let a = g.device_alloc(0, MIB);
    assert_eq!(g.run(0, &fill_chain(a, MIB, 7)).status, abi::STATUS_OK);
    memory.suspend().expect("suspend");
    // Another tenant takes what it gave back.
    let other = backend
        .create_partition(&vgpu_backend::PartitionSpec {
            name: "other".into(),
            memory: 24 * MIB,
            compute_units: 1,
        })
        .expect("the freed memory is there for others");
    assert!(matches!(
        memory.resume(),
        Err(OpError::NoMemory { requested, available }) if requested == 16 * MIB && available == 8 * MIB
    ));
    assert!(memory.is_suspended());
    g.post(0, &fill_chain(a, MIB, 8));
    g.kick(0);
    assert!(g.wait_used(0, Duration::from_millis(200)).is_none());
    drop(other);
    memory.resume().expect("room again");
    let used = g.wait_used(0, Duration::from_secs(30)).expect("completion");
    assert_eq!(used.completion().status, abi::STATUS_OK);
    let sg = g.alloc_sg(&[MIB]);
    assert!(holds(&mut g, a, &sg, 8));
}

#[test]
fn test_a_reset_while_suspended_leaves_it_suspended_and_usable_after() {
    let backend = SoftwareBackend::new(32 * MIB, 2);
    let server = TestVgpu::start(
        test_config("reset", 1),
        software_partition(&backend, "reset", 16 * MIB, 1),
    );
    let memory = server.memory();
    let mut g = server.connect();
    g.setup_queue(0, 16, Mode::Interrupt);
    g.device_alloc(0, MIB);
    memory.suspend().expect("suspend");
    // The VMM resets the function (a guest reboot): its memory is gone,
    // as in any reset, and it stays suspended.
    g.device_reset();
    assert!(memory.is_suspended());
    assert_eq!(backend.unclaimed().memory, 32 * MIB);
    memory.resume().expect("resume");
    g.enable_device();
    g.setup_queue(0, 16, Mode::Interrupt);
    assert_eq!(g.mem_used(), 0);
    let b = g.device_alloc(0, 2 * MIB);
    assert_eq!(g.run(0, &fill_chain(b, 2 * MIB, 9)).status, abi::STATUS_OK);
    let sg = g.alloc_sg(&[2 * MIB]);
    assert!(holds(&mut g, b, &sg, 9));
}

#[test]
fn test_a_suspend_in_the_middle_of_a_batch_loses_no_command() {
    let backend = SoftwareBackend::new(64 * MIB, 2);
    let server = TestVgpu::start(
        test_config("mid-batch", 1),
        software_partition(&backend, "mid-batch", 32 * MIB, 2),
    );
    let memory = server.memory();
    let mut g = server.connect();
    g.setup_queue(0, 128, Mode::Interrupt);
    let a = g.device_alloc(0, 8 * MIB);
    for round in 0..10u32 {
        // More than the worker takes from a ring at once, each long
        // enough that the suspend lands among them.
        let n = 48;
        for i in 0..n {
            g.post(0, &fill_chain(a, 8 * MIB, round << 8 | i));
        }
        g.kick(0);
        std::thread::sleep(Duration::from_millis(u64::from(round)));
        memory.suspend().expect("suspend");
        memory.resume().expect("resume");
        for i in 0..n {
            let used = g
                .wait_used(0, Duration::from_secs(30))
                .unwrap_or_else(|| panic!("round {round}: command {i} of {n} never completed"));
            assert_eq!(used.completion().status, abi::STATUS_OK);
        }
    }
    let sg = g.alloc_sg(&[8 * MIB]);
    assert!(
        holds(&mut g, a, &sg, 9 << 8 | 47),
        "the last fill is the last"
    );
}

#[test]
fn test_a_suspended_function_with_work_says_it_is_wanted() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    let backend = SoftwareBackend::new(32 * MIB, 2);
    let wanted = Arc::new(AtomicU32::new(0));
    let mut config = test_config("wanted", 1);
    let w = Arc::clone(&wanted);
    config.on_wanted = Some(Arc::new(move || {
        w.fetch_add(1, Ordering::SeqCst);
    }));
    let server = TestVgpu::start(config, software_partition(&backend, "wanted", 8 * MIB, 1));
    let memory = server.memory();
    let mut g = server.connect();
    g.setup_queue(0, 16, Mode::Interrupt);
    let a = g.device_alloc(0, MIB);
    memory.suspend().expect("suspend");
    // Idle while suspended: nobody is told anything.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(wanted.load(Ordering::SeqCst), 0);
    g.post(0, &fill_chain(a, MIB, 3));
    g.kick(0);
    let t = std::time::Instant::now();
    while wanted.load(Ordering::SeqCst) == 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "never wanted");
        std::thread::sleep(Duration::from_millis(5));
    }
    memory.resume().expect("resume");
    let used = g.wait_used(0, Duration::from_secs(30)).expect("completion");
    assert_eq!(used.completion().status, abi::STATUS_OK);
}

#[test]
fn test_a_vmm_that_reconnects_while_suspended_finds_a_suspended_function() {
    let backend = SoftwareBackend::new(32 * MIB, 2);
    let server = TestVgpu::start(
        test_config("reconnect", 1),
        software_partition(&backend, "reconnect", 8 * MIB, 1),
    );
    let memory = server.memory();
    {
        let mut g = server.connect();
        g.setup_queue(0, 16, Mode::Interrupt);
        g.device_alloc(0, MIB);
        memory.suspend().expect("suspend");
        // The VMM goes away (its QEMU restarts): the function is reset.
    }
    let mut g = server.connect();
    g.setup_queue(0, 16, Mode::Interrupt);
    assert_eq!(g.mem_used(), 0, "a reset function");
    assert_eq!(g.read64(abi::REG_MEM_SIZE), 8 * MIB, "its registers answer");
    g.post(0, &vgpu_testkit::bare_chain(abi::OP_NOP));
    g.kick(0);
    assert!(
        g.wait_used(0, Duration::from_millis(300)).is_none(),
        "still suspended"
    );
    assert!(memory.is_suspended());
    memory.resume().expect("resume");
    let used = g.wait_used(0, Duration::from_secs(30)).expect("completion");
    assert_eq!(used.completion().status, abi::STATUS_OK);
    assert!(server.alive());
}
