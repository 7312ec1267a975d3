//! Draining a function before the host goes away: commands in flight when
//! the drain begins still run, commands submitted later and those still
//! waiting at the deadline complete with STATUS_CANCELLED, and none
//! disappears without a completion.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{assert_status, status_name};
use vfio_user_server::{Endpoint, ServerError};
use vgpu_device::testing::{software_partition, test_config};
use vgpu_device::{DrainHandle, VgpuDevice};
use vgpu_sched::CommandGate;
use vgpu_testkit::abi;
use vgpu_testkit::{Chain, Guest, GuestOptions, Mode};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::tempdir::TempDir;

/// A scheduler stand-in that lets commands run only while open.
#[derive(Default)]
struct Gate {
    open: AtomicBool,
}

impl CommandGate for Gate {
    fn enter(&self, cancelled: &dyn Fn() -> bool) -> bool {
        while !self.open.load(Ordering::Acquire) {
            if cancelled() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    fn leave(&self, _: Duration, _: u64) {}
}

struct Served {
    guest: Guest,
    drain: DrainHandle,
    gate: Arc<Gate>,
    stop: EventFd,
    thread: Option<JoinHandle<Result<(), ServerError>>>,
    _dir: TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A vGPU whose commands pass through a [`Gate`] (open or not), with a
/// connected guest and queue 0 set up in `mode`.
fn serve(open: bool, mode: Mode) -> Served {
    let dir = TempDir::new_with_prefix("/tmp/vgpu-drain-").unwrap();
    let path = dir.as_path().join("vgpu.sock");
    let gate = Arc::new(Gate {
        open: AtomicBool::new(open),
    });
    let mut config = test_config("drain", 1);
    config.gate = Some(gate.clone());
    let backend = vgpu_backend::software::SoftwareBackend::new(64 << 20, 2);
    let device = VgpuDevice::new(config, software_partition(&backend, "drain", 64 << 20, 2))
        .expect("device");
    let drain = device.drain_handle().expect("drain handle");
    let endpoint = Endpoint::new("drain", &path, Box::new(device)).expect("endpoint");
    let stop = endpoint.stop_handle().unwrap();
    let thread = std::thread::spawn(move || endpoint.run());
    let mut guest = Guest::connect(&path, GuestOptions::default());
    guest.setup_queue(0, 64, mode);
    Served {
        guest,
        drain,
        gate,
        stop,
        thread: Some(thread),
        _dir: dir,
    }
}

fn nop() -> Chain {
    Chain::command(&abi::CmdHeader {
        opcode: abi::OP_NOP,
        flags: 0,
    })
    .completion()
}

/// Posts `n` NOPs on queue 0 and notifies the device.
fn post_nops(g: &mut Guest, n: usize) -> Vec<u16> {
    let heads = (0..n).map(|_| g.post(0, &nop())).collect();
    g.kick(0);
    heads
}

/// Waits for the completions of `heads`, in order; returns their statuses.
fn collect(g: &mut Guest, heads: &[u16]) -> Vec<u32> {
    heads
        .iter()
        .map(|&head| {
            let u = g
                .wait_used(0, Duration::from_secs(10))
                .unwrap_or_else(|| panic!("command {head} vanished without a completion"));
            assert_eq!(u.id, u32::from(head), "completions come in order");
            u.completion().status
        })
        .collect()
}

fn wait_idle(d: &DrainHandle) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.is_idle() {
        assert!(Instant::now() < deadline, "the drain never went idle");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn test_in_flight_commands_run_during_the_drain() {
    for mode in [Mode::Interrupt, Mode::Polled] {
        let mut s = serve(false, mode);
        // Submitted before the drain, held by the gate until after it began.
        let heads = post_nops(&mut s.guest, 8);
        std::thread::sleep(Duration::from_millis(20));
        s.drain.begin(Duration::from_secs(10));
        assert!(!s.drain.is_idle(), "work is waiting");
        s.gate.open.store(true, Ordering::Release);
        for st in collect(&mut s.guest, &heads) {
            assert_eq!(st, abi::STATUS_OK, "got {}", status_name(st));
        }
        wait_idle(&s.drain);
        assert_eq!(s.drain.counts(), (8, 0));
    }
}

#[test]
fn test_new_work_is_refused_with_a_status() {
    let mut s = serve(true, Mode::Interrupt);
    assert_status(s.guest.nop(0), abi::STATUS_OK);
    s.drain.begin(Duration::from_secs(10));
    wait_idle(&s.drain);
    let heads = post_nops(&mut s.guest, 5);
    for st in collect(&mut s.guest, &heads) {
        assert_eq!(st, abi::STATUS_CANCELLED, "got {}", status_name(st));
    }
    // A queue enabled during the drain holds only new work too.
    s.guest.disable_queue(0);
    s.guest.setup_queue(0, 16, Mode::Polled);
    let heads = post_nops(&mut s.guest, 3);
    for st in collect(&mut s.guest, &heads) {
        assert_eq!(st, abi::STATUS_CANCELLED, "got {}", status_name(st));
    }
    wait_idle(&s.drain);
    assert_eq!(s.drain.counts(), (8, 8));
}

#[test]
fn test_waiting_work_is_cancelled_at_the_deadline() {
    let mut s = serve(false, Mode::Interrupt);
    let heads = post_nops(&mut s.guest, 20);
    std::thread::sleep(Duration::from_millis(20));
    let grace = Duration::from_millis(100);
    let began = Instant::now();
    s.drain.begin(grace);
    let statuses = collect(&mut s.guest, &heads);
    let took = began.elapsed();
    for st in statuses {
        assert_eq!(st, abi::STATUS_CANCELLED, "got {}", status_name(st));
    }
    assert!(
        took >= grace,
        "cancelled after {took:?}, before the grace ran out"
    );
    wait_idle(&s.drain);
    assert_eq!(s.drain.counts(), (20, 20));
    // The function itself still answers (nothing was torn down).
    assert_eq!(s.guest.read32(abi::REG_MAGIC), abi::ABI_MAGIC);
}
