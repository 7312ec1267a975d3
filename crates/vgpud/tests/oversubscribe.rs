//! An oversubscribed software GPU: two vGPUs whose quotas add up to
//! more than its memory work at once, each keeping and checking its own
//! data; the daemon moves one out while the other runs and back when it
//! has work. Nothing fails and nothing is lost. The guests are real
//! clients on the vGPUs' sockets.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use vgpu_testkit::{abi, fill_chain, Guest, GuestOptions, Mode};
use vgpud::config::{Config, VgpuConfig};
use vgpud::daemon::{Daemon, DaemonError, InstanceState};
use vmm_sys_util::tempdir::TempDir;

const MIB: u64 = 1 << 20;

/// A daemon with one oversubscribed software GPU of 64 MiB (host budget
/// 64 MiB more) and vGPUs `a` and `b` of 48 MiB each.
fn daemon() -> (Daemon, TempDir) {
    let dir = TempDir::new_with_prefix("/tmp/vgpud-oversubscribe-").unwrap();
    let text = format!(
        "[daemon]\nruntime_dir = \"{}\"\nmetrics_address = \"\"\n\
         [[gpu]]\nname = \"g\"\nbackend = \"software\"\nmemory = \"64MiB\"\ncompute_units = 4\n\
         oversubscribe = true\nhost_memory = \"64MiB\"\n\
         [[vgpu]]\nname = \"a\"\ngpu = \"g\"\nsocket = \"a.sock\"\nmemory = \"48MiB\"\ncompute_units = 1\n\
         [[vgpu]]\nname = \"b\"\ngpu = \"g\"\nsocket = \"b.sock\"\nmemory = \"48MiB\"\ncompute_units = 1\n",
        dir.as_path().display()
    );
    let mut d = Daemon::new(Config::parse(&text, "test.toml").unwrap()).unwrap();
    d.start_all().unwrap();
    (d, dir)
}

/// Rounds of: fill all of `len` bytes with the round's pattern, read it
/// back, check it; `len` is most of the quota, so the two tenants cannot
/// be resident at once.
fn tenant(socket: std::path::PathBuf, seed: u32, rounds: u32, start: Arc<Barrier>) -> u32 {
    let mut g = Guest::connect(&socket, GuestOptions::default());
    g.set_timeout(Duration::from_secs(120));
    g.setup_queue(0, 16, Mode::Interrupt);
    let len = 40 * MIB;
    let a = g.device_alloc(0, len);
    let sg = g.alloc_sg(&[len]);
    start.wait();
    for r in 0..rounds {
        let pattern = seed << 16 | r;
        assert_eq!(
            g.run(0, &fill_chain(a, len, pattern)).status,
            abi::STATUS_OK
        );
        // Another tenant's work may move this one out between the two.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(g.copy_from_device(0, a, &sg).status, abi::STATUS_OK);
        assert!(
            g.read_sg(&sg)
                .chunks_exact(4)
                .all(|w| w == pattern.to_le_bytes()),
            "tenant {seed:#x}: round {r} read back something else"
        );
    }
    assert_eq!(g.error_count(), 0);
    rounds
}

#[test]
fn two_tenants_twice_the_gpu_take_turns_and_lose_nothing() {
    let (d, dir) = daemon();
    // The second took the first's room at its creation.
    let states: Vec<InstanceState> = ["a", "b"]
        .iter()
        .map(|n| d.instance(n).unwrap().state)
        .collect();
    assert_eq!(states, [InstanceState::Suspended, InstanceState::Running]);
    let start = Arc::new(Barrier::new(2));
    let threads: Vec<_> = [("a", 0xa), ("b", 0xb)]
        .into_iter()
        .map(|(n, seed)| {
            let socket = dir.as_path().join(format!("{n}.sock"));
            let start = Arc::clone(&start);
            std::thread::spawn(move || tenant(socket, seed, 12, start))
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().expect("a tenant failed"), 12);
    }
    let (_, stats) = d.stats();
    for s in &stats {
        assert!(
            s.moves.evictions > 0 && s.moves.caused > 0,
            "{}: both took turns: {:?}",
            s.name,
            s.moves
        );
        assert_eq!(s.device.errors, 0, "{}", s.name);
    }
}

#[test]
fn quotas_past_the_gpu_and_its_host_budget_are_refused() {
    let (mut d, _dir) = daemon();
    let text = "[[gpu]]\nname = \"g\"\nbackend = \"software\"\nmemory = \"64MiB\"\ncompute_units = 4\n\
        [[vgpu]]\nname = \"c\"\ngpu = \"g\"\nsocket = \"c.sock\"\nmemory = \"48MiB\"\ncompute_units = 1\n";
    let c: VgpuConfig = Config::parse(text, "c.toml").unwrap().vgpus.remove(0);
    match d.create(c) {
        Err(DaemonError::DoesNotFit { message, .. }) => {
            assert!(message.contains("host budget"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    // 32 MiB more fits the budget: it takes its room from the others.
    let text = text.replace("48MiB", "32MiB");
    let c: VgpuConfig = Config::parse(&text, "c.toml").unwrap().vgpus.remove(0);
    d.create(c).unwrap();
    assert_eq!(d.instance("c").unwrap().state, InstanceState::Running);
}

#[test]
fn a_vgpu_the_operator_suspends_stays_out_until_resumed() {
    let (mut d, dir) = daemon();
    // a was moved out when b came; the operator holds it out.
    assert_eq!(d.instance("a").unwrap().state, InstanceState::Suspended);
    d.suspend("a").unwrap();
    assert!(matches!(d.suspend("a"), Err(DaemonError::State { .. })));
    // Its guest's work waits: the daemon does not move it in for it.
    let mut g = Guest::connect(&dir.as_path().join("a.sock"), GuestOptions::default());
    g.setup_queue(0, 16, Mode::Interrupt);
    g.post(0, &vgpu_testkit::bare_chain(abi::OP_NOP));
    g.kick(0);
    assert!(g.wait_used(0, Duration::from_millis(800)).is_none());
    assert_eq!(d.instance("a").unwrap().state, InstanceState::Suspended);
    // Resumed by the operator where there is room: b must go first.
    assert!(matches!(d.resume("a"), Err(DaemonError::DoesNotFit { .. })));
    d.suspend("b").unwrap();
    d.resume("a").unwrap();
    let used = g.wait_used(0, Duration::from_secs(30)).expect("completion");
    assert_eq!(used.completion().status, abi::STATUS_OK);
}
