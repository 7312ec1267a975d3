//! A clean shutdown of the daemon with guests at work: every command a
//! guest had submitted either runs (drained) or completes with
//! STATUS_CANCELLED; none disappears without a completion.

use std::time::{Duration, Instant};

use vgpu_testkit::abi::{self, ByteValued};
use vgpu_testkit::{Chain, Guest, GuestOptions, Mode};
use vgpud::config::Config;
use vgpud::daemon::Daemon;
use vmm_sys_util::tempdir::TempDir;

/// FILLs queued per guest.
const COMMANDS: usize = 100;
/// Bytes each FILL writes.
const FILL: u64 = 4 << 20;

/// A daemon of two vGPUs, each capped at `cap` of the GPU's time if given
/// (so that most of a guest's work is still waiting when the shutdown
/// begins, however fast this machine runs the first of it).
fn daemon(dir: &TempDir, grace_ms: u64, cap: Option<f64>) -> Daemon {
    let cap = cap.map_or(String::new(), |c| format!("cap = {c}\n"));
    let text = format!(
        r#"
[daemon]
runtime_dir = "{}"
metrics_address = ""
shutdown_grace_ms = {grace_ms}

[[gpu]]
name = "gpu0"
backend = "software"
memory = "256MiB"
compute_units = 2

[[vgpu]]
name = "a"
gpu = "gpu0"
socket = "a.sock"
memory = "64MiB"
compute_units = 1
{cap}
[[vgpu]]
name = "b"
gpu = "gpu0"
socket = "b.sock"
memory = "64MiB"
compute_units = 1
{cap}"#,
        dir.as_path().display()
    );
    let mut d = Daemon::new(Config::parse(&text, "test.toml").unwrap()).unwrap();
    d.start_all().unwrap();
    d
}

/// Queues [`COMMANDS`] FILLs on queue 0 and notifies the device.
fn queue_fills(g: &mut Guest) {
    g.setup_queue(0, 256, Mode::Interrupt);
    let buf = g.device_alloc(0, FILL);
    let cmd = abi::FillCmd {
        hdr: abi::CmdHeader {
            opcode: abi::OP_FILL,
            flags: 0,
        },
        addr: buf,
        size: FILL,
        pattern: 7,
        reserved: 0,
    };
    let chain = Chain::new().bytes(cmd.as_slice()).completion();
    for _ in 0..COMMANDS {
        g.post(0, &chain);
    }
    g.kick(0);
}

/// Shuts `d` down while both guests' FILLs are queued; returns every
/// guest's completion statuses, in order, and how long the shutdown took.
fn shut_down_busy(d: Daemon, dir: &TempDir) -> (Vec<Vec<u32>>, Duration) {
    let mut guests: Vec<Guest> = ["a.sock", "b.sock"]
        .iter()
        .map(|s| Guest::connect(&dir.as_path().join(s), GuestOptions::default()))
        .collect();
    for g in &mut guests {
        queue_fills(g);
    }
    let begun = Instant::now();
    let mut d = d;
    let shutdown = std::thread::spawn(move || {
        d.shutdown();
        begun.elapsed()
    });
    let took = shutdown.join().unwrap();
    // Guest RAM outlives the connection: every completion the device
    // wrote is there to read.
    let statuses = guests
        .iter_mut()
        .map(|g| {
            (0..COMMANDS)
                .map(|i| {
                    let u = g
                        .wait_used(0, Duration::from_millis(100))
                        .unwrap_or_else(|| panic!("command {i} vanished without a completion"));
                    u.completion().status
                })
                .collect()
        })
        .collect();
    let left: Vec<_> = std::fs::read_dir(dir.as_path()).unwrap().collect();
    assert!(left.is_empty(), "sockets left behind: {left:?}");
    (statuses, took)
}

#[test]
fn test_shutdown_drains_in_flight_commands() {
    let dir = TempDir::new_with_prefix("/tmp/vgpud-drain-").unwrap();
    let d = daemon(&dir, 60_000, None);
    let (statuses, took) = shut_down_busy(d, &dir);
    for s in statuses {
        assert!(s.iter().all(|&s| s == abi::STATUS_OK), "{s:?}");
    }
    // It waited for the work, not for the grace.
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn test_shutdown_cancels_what_the_grace_leaves() {
    let dir = TempDir::new_with_prefix("/tmp/vgpud-drain-").unwrap();
    let d = daemon(&dir, 0, Some(0.01));
    let (statuses, _) = shut_down_busy(d, &dir);
    for s in statuses {
        // What ran ran in order; everything after it was cancelled.
        let ran = s.iter().take_while(|&&s| s == abi::STATUS_OK).count();
        assert!(ran < COMMANDS, "nothing was cancelled: {s:?}");
        assert!(
            s[ran..].iter().all(|&s| s == abi::STATUS_CANCELLED),
            "{s:?}"
        );
    }
}
