//! Queues over a partition with several lanes: each queue's runs go to a
//! lane of their own, so a run of one queue goes to the device beside a
//! run of another and completes while the other is still in flight;
//! nothing but queued runs reaches the partition while runs are in
//! flight, and each queue's completions stay in order.

mod common;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::{assert_status, MIB};
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{
    Finished, Finishing, FunctionInfo, HostSink, HostSource, Launch, OpError, Partition,
    PartitionSpec, Queued, QueuedDone, Started,
};
use vgpu_device::testing::{software_partition, test_config, TestVgpu};
use vgpu_testkit::abi;
use vgpu_testkit::{fill_chain, value_chain, Guest, Mode};

/// Whether lane 0's runs may finish, and the condition that says so.
type Release = Arc<(Mutex<bool>, Condvar)>;

/// A software partition with two lanes. A run is done when started (its
/// steps run at once, so no host memory is kept) and is finished on
/// request; runs of lane 0 only once the test releases them, so a
/// completion from lane 1 meanwhile shows the lanes went side by side.
struct TwoLanes {
    inner: Box<dyn Partition>,
    flying: [VecDeque<Vec<QueuedDone>>; 2],
    release: Release,
    /// Calls other than queued runs made while runs were in flight.
    violations: Arc<AtomicUsize>,
    /// Runs started on each lane.
    started: Arc<[AtomicUsize; 2]>,
    /// When not 0, the device time each run's steps take between them,
    /// in place of what the software partition measured.
    run_ns: u64,
}

impl TwoLanes {
    fn idle(&self) {
        if self.flying.iter().any(|l| !l.is_empty()) {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Partition for TwoLanes {
    fn spec(&self) -> &PartitionSpec {
        self.inner.spec()
    }
    fn kernel_compute_units(&self) -> u32 {
        self.inner.kernel_compute_units()
    }
    fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OpError> {
        self.idle();
        self.inner.alloc(size, align)
    }
    fn free(&mut self, addr: u64) -> Result<(), OpError> {
        self.idle();
        self.inner.free(addr)
    }
    fn upload(&mut self, dst: u64, src: &dyn HostSource) -> Result<(), OpError> {
        self.idle();
        self.inner.upload(dst, src)
    }
    fn download(&mut self, src: u64, dst: &dyn HostSink) -> Result<(), OpError> {
        self.idle();
        self.inner.download(src, dst)
    }
    fn copy(&mut self, dst: u64, src: u64, size: u64) -> Result<(), OpError> {
        self.idle();
        self.inner.copy(dst, src, size)
    }
    fn fill(&mut self, addr: u64, size: u64, pattern: u32) -> Result<(), OpError> {
        self.idle();
        self.inner.fill(addr, size, pattern)
    }
    fn module_load(&mut self, format: u32, image: &[u8]) -> Result<u64, OpError> {
        self.idle();
        self.inner.module_load(format, image)
    }
    fn module_unload(&mut self, module: u64) -> Result<(), OpError> {
        self.idle();
        self.inner.module_unload(module)
    }
    fn launch(&mut self, launch: &Launch<'_>) -> Result<(), OpError> {
        self.idle();
        self.inner.launch(launch)
    }
    fn run_queued(&mut self, steps: &[Queued<'_>], stop: &dyn Fn() -> bool) -> Vec<QueuedDone> {
        self.idle();
        self.inner.run_queued(steps, stop)
    }
    fn queue_depth(&self) -> usize {
        2
    }
    fn lanes(&self) -> usize {
        2
    }
    fn start_queued(
        &mut self,
        lane: usize,
        steps: &[Queued<'_>],
        stop: &dyn Fn() -> bool,
        _held: bool,
    ) -> Started {
        if lane >= 2 || self.flying[lane].len() >= 2 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        let mut done = self.inner.run_queued(steps, stop);
        if self.run_ns > 0 {
            let n = done.len() as u64;
            for (i, d) in done.iter_mut().enumerate() {
                d.end_ns = self.run_ns * (i as u64 + 1) / n;
            }
        }
        self.flying[lane % 2].push_back(done);
        self.started[lane % 2].fetch_add(1, Ordering::SeqCst);
        Started::InFlight
    }
    fn finish_queued(&mut self) -> Option<(usize, Finished)> {
        // Bounded, so a worker that waits on lane 0 first fails the test
        // instead of hanging it.
        match self.finish_queued_within(Duration::from_secs(20)) {
            Finishing::Done(lane, f) => Some((lane, f)),
            _ => None,
        }
    }
    fn finish_queued_within(&mut self, within: Duration) -> Finishing {
        let lane = if !self.flying[1].is_empty() {
            1
        } else if !self.flying[0].is_empty() {
            let (released, cv) = &*self.release;
            let guard = released.lock().unwrap();
            let (guard, _) = cv.wait_timeout_while(guard, within, |r| !*r).unwrap();
            if !*guard {
                return Finishing::Pending;
            }
            0
        } else {
            return Finishing::Idle;
        };
        match self.flying[lane].pop_front() {
            Some(done) => Finishing::Done(lane, Finished { waited_ns: 0, done }),
            None => Finishing::Idle,
        }
    }
    fn max_active_clusters(&mut self, launch: &Launch<'_>) -> Result<u32, OpError> {
        self.inner.max_active_clusters(launch)
    }
    fn function_info(&mut self, module: u64, entry: &str) -> Result<FunctionInfo, OpError> {
        self.inner.function_info(module, entry)
    }
    fn global_info(&mut self, module: u64, name: &str) -> Result<(u64, u64), OpError> {
        self.inner.global_info(module, name)
    }
    fn memory_used(&self) -> u64 {
        self.inner.memory_used()
    }
    fn set_memory(&mut self, memory: u64) -> Result<(), OpError> {
        self.inner.set_memory(memory)
    }
    fn suspend(&mut self) -> Result<u64, OpError> {
        self.inner.suspend()
    }
    fn resume(&mut self) -> Result<u64, OpError> {
        self.inner.resume()
    }
    fn console(
        &mut self,
        module: u64,
        max: usize,
    ) -> Result<vgpu_backend::console::ConsoleText, OpError> {
        self.inner.console(module, max)
    }
    fn reset(&mut self) {
        self.flying = Default::default();
        self.inner.reset()
    }
    fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }
}

struct Setup {
    _server: TestVgpu,
    guest: Guest,
    release: Release,
    violations: Arc<AtomicUsize>,
    started: Arc<[AtomicUsize; 2]>,
}

fn two_lanes() -> Setup {
    two_lanes_taking(0)
}

/// [`two_lanes`] whose runs each take `run_ns` of device time (0: what
/// they took).
fn two_lanes_taking(run_ns: u64) -> Setup {
    let backend = SoftwareBackend::new(16 * MIB, 1);
    let inner = software_partition(&backend, "lanes", 16 * MIB, 1);
    let release: Release = Arc::default();
    let violations = Arc::new(AtomicUsize::new(0));
    let started: Arc<[AtomicUsize; 2]> = Arc::default();
    let partition = TwoLanes {
        inner,
        flying: Default::default(),
        release: release.clone(),
        violations: violations.clone(),
        started: started.clone(),
        run_ns,
    };
    let server = TestVgpu::start(test_config("lanes", 2), Box::new(partition));
    let mut guest = server.connect();
    guest.enable_device();
    guest.setup_queue(0, 64, Mode::Interrupt);
    guest.setup_queue(1, 64, Mode::Interrupt);
    Setup {
        _server: server,
        guest,
        release,
        violations,
        started,
    }
}

fn let_go(release: &Release) {
    let (released, cv) = &**release;
    *released.lock().unwrap() = true;
    cv.notify_all();
}

#[test]
fn test_runs_of_two_queues_go_side_by_side_on_two_lanes() {
    let Setup {
        mut guest,
        release,
        violations,
        _server,
        ..
    } = two_lanes();
    let g = &mut guest;
    let a = g.device_alloc(0, 4096);
    let b = g.device_alloc(1, 4096);
    // Both queues' work is published before the device is told of
    // either, so one scan finds both.
    let head_a = g.post(0, &fill_chain(a, 4096, 0xaaaa_aaaa));
    let head_b = g.post(1, &fill_chain(b, 4096, 0xbbbb_bbbb));
    g.kick(0);
    g.kick(1);
    let used_b = g
        .wait_used(1, Duration::from_secs(10))
        .expect("queue 1's run completes while queue 0's is in flight");
    assert_eq!(used_b.id, u32::from(head_b));
    assert_status(used_b.completion.expect("completion"), abi::STATUS_OK);
    assert!(
        g.poll_used(0).is_none(),
        "queue 0's run is still in flight on its lane"
    );
    let_go(&release);
    let used_a = g
        .wait_used(0, Duration::from_secs(10))
        .expect("queue 0's run completes once its lane lets it");
    assert_eq!(used_a.id, u32::from(head_a));
    assert_status(used_a.completion.expect("completion"), abi::STATUS_OK);
    assert_eq!(g.download(0, a, 8), [0xaa; 8]);
    assert_eq!(g.download(1, b, 8), [0xbb; 8]);
    assert_eq!(violations.load(Ordering::SeqCst), 0);
}

#[test]
fn test_other_commands_wait_for_every_lane() {
    let Setup {
        mut guest,
        release,
        violations,
        _server,
        ..
    } = two_lanes();
    let g = &mut guest;
    let a = g.device_alloc(0, 4096);
    let other = g.device_alloc(1, 4096);
    // Queue 0: a run held in flight, then more runs; queue 1: a run, then
    // an allocation, which reaches the partition only once nothing is in
    // flight on either lane.
    let mut heads = Vec::new();
    for k in 0..3u32 {
        heads.push(g.post(0, &fill_chain(a, 4096, k * 0x0101_0101)));
    }
    let b = g.post(1, &fill_chain(other, 4096, 0x0505_0505));
    let alloc = g.post(
        1,
        &vgpu_testkit::Chain::command(&abi::MemAllocCmd {
            hdr: abi::CmdHeader {
                opcode: abi::OP_MEM_ALLOC,
                flags: 0,
            },
            size: 4096,
            align: 0,
        })
        .completion(),
    );
    g.kick(0);
    g.kick(1);
    let first = g
        .wait_used(1, Duration::from_secs(10))
        .expect("queue 1's run");
    assert_eq!(first.id, u32::from(b));
    let_go(&release);
    let second = g
        .wait_used(1, Duration::from_secs(10))
        .expect("the allocation");
    assert_eq!(second.id, u32::from(alloc));
    assert_status(second.completion.expect("completion"), abi::STATUS_OK);
    for head in heads {
        let u = g
            .wait_used(0, Duration::from_secs(10))
            .expect("queue 0's runs");
        assert_eq!(u.id, u32::from(head), "queue 0 completes in order");
        assert_status(u.completion.expect("completion"), abi::STATUS_OK);
    }
    assert_eq!(g.download(0, a, 4096), vec![2u8; 4096]);
    assert_eq!(g.download(1, other, 4096), vec![5u8; 4096]);
    assert_eq!(violations.load(Ordering::SeqCst), 0);
}

#[test]
fn test_value_commands_go_while_another_lane_is_busy() {
    let Setup {
        mut guest,
        release,
        violations,
        _server,
        ..
    } = two_lanes();
    let g = &mut guest;
    let a = g.device_alloc(0, 4096);
    let word = g.alloc(8, 8);
    // Queue 0: a run held in flight. Queue 1: a write, then a wait for a
    // word nobody writes yet: neither needs the partition, so both are
    // served while queue 0's run is in flight.
    g.post(0, &fill_chain(a, 4096, 0x0909_0909));
    let write = g.post(1, &value_chain(abi::OP_WRITE_VALUE, 0, word, 5));
    let wait = g.post(1, &value_chain(abi::OP_WAIT_VALUE, abi::WAIT_EQ, word, 6));
    g.kick(0);
    g.kick(1);
    let u = g
        .wait_used(1, Duration::from_secs(10))
        .expect("the write completes while queue 0's run is in flight");
    assert_eq!(u.id, u32::from(write));
    assert_eq!(g.read(word, 8), 5u64.to_le_bytes());
    assert!(g.poll_used(0).is_none(), "queue 0's run is still in flight");
    // The guest's CPU meets the wait.
    g.write(word, &6u64.to_le_bytes());
    let u = g
        .wait_used(1, Duration::from_secs(10))
        .expect("the wait completes once the word is 6");
    assert_eq!(u.id, u32::from(wait));
    let_go(&release);
    assert!(g.wait_used(0, Duration::from_secs(10)).is_some());
    assert_eq!(violations.load(Ordering::SeqCst), 0);
}

#[test]
fn test_work_submitted_while_a_run_is_in_flight_goes_beside_it() {
    let Setup {
        mut guest,
        release,
        violations,
        started,
        _server,
    } = two_lanes();
    let g = &mut guest;
    let a = g.device_alloc(0, 4096);
    let b = g.device_alloc(1, 4096);
    // Queue 0's run goes in flight first, alone...
    let head_a = g.post(0, &fill_chain(a, 4096, 0x0a0a_0a0a));
    g.kick(0);
    assert!(
        common::eventually(g, |_| started[0].load(Ordering::SeqCst) == 1),
        "queue 0's run was not started"
    );
    // ... then queue 1 gets work: it goes to the device while queue 0's
    // run is still in flight, and completes first.
    let head_b = g.post(1, &fill_chain(b, 4096, 0x0b0b_0b0b));
    g.kick(1);
    let u = g
        .wait_used(1, Duration::from_secs(10))
        .expect("queue 1's later run completes while queue 0's is in flight");
    assert_eq!(u.id, u32::from(head_b));
    assert!(g.poll_used(0).is_none(), "queue 0's run is still in flight");
    let_go(&release);
    let u = g
        .wait_used(0, Duration::from_secs(10))
        .expect("queue 0's run");
    assert_eq!(u.id, u32::from(head_a));
    assert_eq!(g.download(1, b, 4), [0x0b; 4]);
    assert_eq!(violations.load(Ordering::SeqCst), 0);
}

#[test]
fn test_runs_that_overlap_on_two_lanes_are_charged_their_union() {
    // Two runs of a second each, started together on two lanes: the
    // tenant held the device for about a second, not two.
    const RUN_NS: u64 = 1_000_000_000;
    let Setup {
        mut guest,
        release,
        _server,
        ..
    } = two_lanes_taking(RUN_NS);
    let g = &mut guest;
    let a = g.device_alloc(0, 4096);
    let b = g.device_alloc(1, 4096);
    g.post(0, &fill_chain(a, 4096, 1));
    g.post(1, &fill_chain(b, 4096, 2));
    g.kick(0);
    g.kick(1);
    let used_b = g
        .wait_used(1, Duration::from_secs(10))
        .expect("queue 1's run");
    let_go(&release);
    let used_a = g
        .wait_used(0, Duration::from_secs(10))
        .expect("queue 0's run");
    let (cb, ca) = (used_b.completion.unwrap(), used_a.completion.unwrap());
    assert_status(cb, abi::STATUS_OK);
    assert_status(ca, abi::STATUS_OK);
    // The first to finish is charged in full; the other only for the
    // time it ran past it (its start came after the first's, by however
    // long the worker took between the two starts).
    assert_eq!(cb.device_ns, RUN_NS);
    assert!(
        ca.device_ns < RUN_NS / 2,
        "the overlapping run was charged {} ns again",
        ca.device_ns
    );
}
