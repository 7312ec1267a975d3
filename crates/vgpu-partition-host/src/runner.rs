//! The partition host's runner: runs the queued runs the parent started
//! ([`crate::proto::Kind::Start`]) on a thread of their own, so the host
//! answers a start at once and the next run is on its way to the device
//! while the device works on this one. Each run names a lane: runs of a
//! lane start and finish in order, on a lane of the partition (several
//! lanes may share one where it has fewer), and runs of different lanes
//! go to the device side by side. The parent gets the runs' results
//! ([`crate::proto::Kind::Finish`]) in the order they finish; any other
//! request waits for every started run first.

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::debug;
use vgpu_backend::{Finished, Finishing, OpError, Partition, QueuedDone, Started};

use crate::guest_mem::{Pinned, Table};
use crate::proto::{Kind, LaneRun, Request};
use crate::queued::with_queued;

pub use crate::proto::MAX_STARTED;

/// How long the runner waits for a run in flight before it looks for
/// started runs again: a run started on another lane meanwhile goes to
/// the device beside the one in flight, however long that one takes.
/// As long as a partition polls before it sleeps (the CUDA one's 50 µs),
/// so a run that ends meanwhile is seen at once.
const FINISH_LOOK: Duration = Duration::from_micros(50);

/// The partition, shared by the command loop and the runner (which holds
/// it for a run; the command loop waits for the runner before it uses it).
pub(crate) type Shared = Arc<Mutex<Box<dyn Partition>>>;

pub(crate) fn lock(p: &Shared) -> MutexGuard<'_, Box<dyn Partition>> {
    // A panic while running a step leaves the partition as it was.
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// A started run: its request frame as received, and when.
struct Job {
    frame: Vec<u8>,
    arrived: Instant,
}

/// A finished run and the partition's memory in use after it.
type Outcome = (LaneRun, u64);

pub(crate) struct Runner {
    jobs: Option<SyncSender<Job>>,
    results: Receiver<Outcome>,
    /// Started and not yet received back.
    running: usize,
    /// Received back, not yet asked for.
    ready: VecDeque<Outcome>,
    thread: Option<JoinHandle<()>>,
    spin: Duration,
}

impl Runner {
    /// The runner of `partition`; each side polls for up to `spin` for
    /// the other before it sleeps (as the host polls its socket).
    pub(crate) fn new(
        partition: Shared,
        guest: Arc<Table>,
        spin: Duration,
    ) -> std::io::Result<Runner> {
        let (jobs, rx) = mpsc::sync_channel::<Job>(MAX_STARTED);
        let (tx, results) = mpsc::sync_channel::<Outcome>(MAX_STARTED);
        let thread = std::thread::Builder::new()
            .name("vgpu-runner".into())
            .spawn(move || serve_runs(&rx, &tx, &partition, &guest, spin))?;
        Ok(Runner {
            jobs: Some(jobs),
            results,
            running: 0,
            ready: VecDeque::new(),
            thread: Some(thread),
            spin,
        })
    }

    /// The results of the started runs that are done now; where only one
    /// run is out, waiting up to `linger` for it (a short run with nothing
    /// around it is then answered in the exchange that started it). What
    /// they leave the partition using, if any.
    pub(crate) fn take_done(&mut self, linger: Duration) -> (Vec<LaneRun>, Option<u64>) {
        let linger = if self.running == 1 {
            linger
        } else {
            Duration::ZERO
        };
        let until = Instant::now() + linger;
        while self.running > 0 {
            let left = until.saturating_duration_since(Instant::now());
            let got = if left.is_zero() {
                self.results.try_recv().ok()
            } else {
                self.results.recv_timeout(left).ok()
            };
            match got {
                Some(r) => {
                    self.ready.push_back(r);
                    self.running -= 1;
                }
                None => break,
            }
        }
        let used = self.ready.back().map(|r| r.1);
        (self.ready.drain(..).map(|r| r.0).collect(), used)
    }

    /// Starts the run of `frame` (a [`Kind::Start`] request's payload,
    /// which decoded).
    pub(crate) fn start(&mut self, frame: Vec<u8>) -> Result<(), OpError> {
        if self.running + self.ready.len() >= MAX_STARTED {
            return Err(OpError::Invalid(format!(
                "more than {MAX_STARTED} runs started and not finished"
            )));
        }
        let job = Job {
            frame,
            arrived: Instant::now(),
        };
        // Never blocks: at most MAX_STARTED jobs are out.
        match self.jobs.as_ref().map(|j| j.send(job)) {
            Some(Ok(())) => {
                self.running += 1;
                Ok(())
            }
            _ => Err(OpError::Device("the runner thread is gone".into())),
        }
    }

    /// The results of the next started run to finish, waiting for them
    /// `within` at most (`None`: as long as it takes); `None` when none
    /// finished by then.
    pub(crate) fn finish(&mut self, within: Option<Duration>) -> Result<Option<Outcome>, OpError> {
        if self.ready.is_empty() && self.running > 0 {
            match within {
                None => self.receive(),
                Some(d) => match self.results.recv_timeout(d) {
                    Ok(r) => {
                        self.ready.push_back(r);
                        self.running -= 1;
                    }
                    Err(RecvTimeoutError::Timeout) => return Ok(None),
                    // The thread is gone: `receive` says so.
                    Err(RecvTimeoutError::Disconnected) => self.receive(),
                },
            }
        }
        match self.ready.pop_front() {
            Some(r) => Ok(Some(r)),
            None => Err(OpError::Invalid("no run was started".into())),
        }
    }

    /// Waits until every started run is done (their results kept).
    pub(crate) fn settle(&mut self) {
        while self.running > 0 {
            self.receive();
        }
    }

    /// Waits for every started run and forgets their results (a reset).
    pub(crate) fn clear(&mut self) {
        self.settle();
        self.ready.clear();
    }

    fn receive(&mut self) {
        match next(&self.results, self.spin) {
            Some(r) => self.ready.push_back(r),
            None => {
                // The thread died with runs outstanding: each fails.
                debug!("partition host: the runner thread is gone");
                let gone = LaneRun {
                    lane: 0,
                    run: Finished {
                        waited_ns: 0,
                        done: Vec::new(),
                    },
                };
                for _ in 0..self.running {
                    self.ready.push_back((gone.clone(), 0));
                }
                self.running = 0;
                return;
            }
        }
        self.running -= 1;
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        // Ends the thread's loop once it has done what it holds.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A run the runner started on the partition.
struct OnPartition {
    /// The lane the parent started it on.
    lane: u32,
    started: Started,
    /// Its steps.
    steps: usize,
    /// How long it waited for the runs before it.
    waited: Duration,
}

/// The runner thread: takes each job as it comes and starts it on its
/// lane of the partition (the parent's lane modulo the partition's
/// lanes), keeping as many in flight on each as the partition can (its
/// `queue_depth`), all resolved against one pin of the guest memory
/// table, which it lets go of when nothing is in flight or an unmap
/// waits; sends each run's results as it finishes, in order within a
/// lane.
fn serve_runs(
    jobs: &Receiver<Job>,
    results: &SyncSender<Outcome>,
    partition: &Shared,
    guest: &Table,
    spin: Duration,
) {
    let (depth, lanes) = {
        let p = lock(partition);
        (p.queue_depth().clamp(1, MAX_STARTED), p.lanes().max(1))
    };
    let mut flight: Vec<VecDeque<OnPartition>> = (0..lanes).map(|_| VecDeque::new()).collect();
    let mut pin: Option<Pinned<'_>> = None;
    loop {
        // A run done when started goes as soon as its lane's runs before
        // it have.
        for lane in flight.iter_mut() {
            while lane
                .front()
                .is_some_and(|r| matches!(r.started, Started::Done(_)))
            {
                let run = lane.pop_front().expect("a run");
                if !send(partition, run, None, results) {
                    return;
                }
            }
        }
        let busy = flight.iter().any(|l| !l.is_empty());
        let job = if !busy {
            pin = None;
            match next(jobs, spin) {
                Some(j) => Some(j),
                None => return,
            }
        } else if flight.iter().any(|l| l.len() < depth) {
            // A run started meanwhile goes onto the device behind the
            // one in flight (or beside it); else the runs in flight are
            // looked at, FINISH_LOOK at a time, so that a short run's
            // results are on their way as soon as it is done (often in
            // time for the answer to the start that brought it).
            jobs.try_recv().ok()
        } else {
            None
        };
        let Some(job) = job else {
            if !finish_one(partition, &mut flight, results, Some(FINISH_LOOK)) {
                return;
            }
            continue;
        };
        if guest.writer_waiting() {
            // An unmap waits: what is in flight finishes, then it goes
            // first (a reader taking the lock again at once could keep
            // beating it to it), whether or not this thread still holds
            // the table.
            while flight.iter().any(|l| !l.is_empty()) {
                if !finish_one(partition, &mut flight, results, None) {
                    return;
                }
            }
            pin = None;
            while guest.writer_waiting() {
                std::thread::yield_now();
            }
        }
        let request = Request::decode(Kind::Start as u16, &job.frame);
        let lane = match &request {
            Ok(Request::Start { lane, .. }) => *lane,
            _ => 0,
        };
        let inner = lane as usize % lanes;
        while flight[inner].len() >= depth {
            if !finish_one(partition, &mut flight, results, None) {
                return;
            }
        }
        let pinned = pin.get_or_insert_with(|| guest.pin());
        let waited = job.arrived.elapsed();
        let mut p = lock(partition);
        let (started, steps) = start_frame(&mut **p, inner, pinned, request);
        drop(p);
        flight[inner].push_back(OnPartition {
            lane,
            started,
            steps,
            waited,
        });
    }
}

/// Waits for the partition to finish a run in flight (`within` at most,
/// when given) and sends its results, with those of the runs done when
/// started that follow it on its lane; false once the other side is gone.
fn finish_one(
    partition: &Shared,
    flight: &mut [VecDeque<OnPartition>],
    results: &SyncSender<Outcome>,
    within: Option<Duration>,
) -> bool {
    let finished = match within {
        None => lock(partition).finish_queued(),
        Some(d) => match lock(partition).finish_queued_within(d) {
            Finishing::Done(lane, f) => Some((lane, f)),
            Finishing::Pending => return true,
            Finishing::Idle => None,
        },
    };
    let busy = flight
        .iter()
        .position(|l| {
            l.front()
                .is_some_and(|r| matches!(r.started, Started::InFlight))
        })
        .unwrap_or(0);
    // Lost (each step of what was in flight fails): the oldest run of the
    // first busy lane takes it.
    let inner = match &finished {
        Some((l, _)) if flight.get(*l).is_some_and(|q| !q.is_empty()) => *l,
        _ => busy,
    };
    let Some(run) = flight[inner].pop_front() else {
        return true;
    };
    send(partition, run, Some(finished.map(|(_, f)| f)), results)
}

/// Sends `run`'s results: those it had when started, or `finished`, what
/// the partition gave for it (`None` inside: it lost it); false once the
/// other side is gone.
fn send(
    partition: &Shared,
    run: OnPartition,
    finished: Option<Option<Finished>>,
    results: &SyncSender<Outcome>,
) -> bool {
    let (done, waited) = match (run.started, finished) {
        (Started::Done(done), _) => (done, run.waited),
        (Started::InFlight, Some(Some(f))) => {
            (f.done, run.waited + Duration::from_nanos(f.waited_ns))
        }
        (Started::InFlight, _) => (
            QueuedDone::all_failed(run.steps, &OpError::Device("run lost".into())),
            run.waited,
        ),
    };
    let used = lock(partition).memory_used();
    let f = LaneRun {
        lane: run.lane,
        run: Finished {
            waited_ns: waited.as_nanos().try_into().unwrap_or(u64::MAX),
            done,
        },
    };
    results.send((f, used)).is_ok()
}

/// Starts the steps of a started run's `request` on lane `lane` against
/// `pinned`; every step fails with the run's error when it cannot start
/// at all. Returns how many steps it has.
fn start_frame(
    p: &mut dyn Partition,
    lane: usize,
    pinned: &Pinned<'_>,
    request: Result<Request<'_>, crate::proto::ProtoError>,
) -> (Started, usize) {
    let steps = match request {
        Ok(Request::Start { steps, .. }) => steps,
        // Checked before it was started.
        _ => return (Started::Done(Vec::new()), 0),
    };
    // `pinned` is kept until nothing is in flight.
    let started = with_queued(pinned, &steps, |queued| {
        p.start_queued(lane, queued, &|| false, true)
    })
    .unwrap_or_else(|e| Started::Done(QueuedDone::all_failed(steps.len(), &e)));
    (started, steps.len())
}

/// The next message of `rx`, polling for up to `spin` before sleeping;
/// `None` once the other side is gone.
fn next<T>(rx: &Receiver<T>, spin: Duration) -> Option<T> {
    if !spin.is_zero() {
        let since = Instant::now();
        let mut polls = 0u32;
        loop {
            match rx.try_recv() {
                Ok(v) => return Some(v),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => {}
            }
            polls = polls.wrapping_add(1);
            // Reading the clock costs more than a look at the channel.
            if polls.is_multiple_of(64) && since.elapsed() >= spin {
                break;
            }
            std::hint::spin_loop();
        }
    }
    rx.recv().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{MappedPiece, Step};
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use vgpu_backend::software::SoftwareBackend;
    use vgpu_backend::{
        Backend, DeviceFill, FunctionInfo, HostSink, HostSlice, HostSource, Launch, PartitionSpec,
        Queued, SliceMemory,
    };

    /// A software partition of 1 MiB.
    fn software() -> Box<dyn Partition> {
        let spec = PartitionSpec {
            name: "runner".into(),
            memory: 1 << 20,
            compute_units: 1,
        };
        SoftwareBackend::new(1 << 20, 1)
            .create_partition(&spec)
            .unwrap()
    }

    /// A started run of `n` timestamps on `lane`.
    fn stamps(lane: u32, n: usize) -> Vec<u8> {
        Request::Start {
            lane,
            steps: vec![Step::Timestamp; n],
        }
        .encode()
    }

    #[test]
    fn test_at_most_max_started_and_finished_in_order() {
        let p: Shared = Arc::new(Mutex::new(software()));
        let mut r = Runner::new(Arc::clone(&p), Arc::default(), Duration::ZERO).unwrap();
        assert!(matches!(r.finish(None), Err(OpError::Invalid(_))));
        {
            // The partition is busy: started runs wait for it.
            let _held = lock(&p);
            for n in 1..=MAX_STARTED {
                r.start(stamps(0, n)).unwrap();
            }
            assert!(matches!(r.start(stamps(0, 1)), Err(OpError::Invalid(_))));
            assert_eq!(r.take_done(Duration::from_millis(5)).0, Vec::new());
            // None can finish while the partition is held: a bounded
            // finish says so.
            assert!(matches!(r.finish(Some(Duration::from_millis(5))), Ok(None)));
        }
        for n in 1..=MAX_STARTED {
            let (f, used) = r.finish(None).unwrap().unwrap();
            assert_eq!(f.run.done.len(), n, "in the order started");
            assert!(f.run.done.iter().all(|d| d.result.is_ok()));
            assert_eq!(used, 0);
        }
        assert!(matches!(r.finish(None), Err(OpError::Invalid(_))));
        // A frame that is not a run fails nothing else.
        r.start(Request::Finish { within_us: 0 }.encode()).unwrap();
        assert_eq!(r.finish(None).unwrap().unwrap().0.run.done, Vec::new());
        r.start(stamps(0, 2)).unwrap();
        r.clear();
        assert!(matches!(r.finish(None), Err(OpError::Invalid(_))));
    }

    /// Runs of several lanes: each goes to its lane of the partition
    /// (lanes past the partition's share one), results come back as the
    /// partition finishes them, in order within a lane, each with its
    /// lane.
    #[test]
    fn test_runs_of_lanes_finish_as_the_partition_finishes_them() {
        let deferred = Deferred::new(software());
        let counts = (
            Arc::clone(&deferred.started),
            Arc::clone(&deferred.finished),
        );
        let p: Shared = Arc::new(Mutex::new(Box::new(deferred)));
        let mut r = Runner::new(Arc::clone(&p), Arc::default(), Duration::ZERO).unwrap();
        {
            // All are started before the runner takes any.
            let _held = lock(&p);
            // Lane 2 goes to the partition's lane 0, behind lane 0's run.
            for (lane, n) in [(0, 1), (1, 2), (2, 3), (1, 4)] {
                r.start(stamps(lane, n)).unwrap();
            }
        }
        let mut got = Vec::new();
        for _ in 0..4 {
            let (f, _) = r.finish(None).unwrap().unwrap();
            assert!(f.run.done.iter().all(|d| d.result.is_ok()));
            got.push((f.lane, f.run.done.len()));
        }
        assert_eq!(got, [(1, 2), (1, 4), (0, 1), (2, 3)]);
        assert_eq!(counts.0.load(Ordering::SeqCst), 4);
        assert_eq!(counts.1.load(Ordering::SeqCst), 4);
    }

    /// A run started on another lane while a long one is in flight goes
    /// to the device and comes back while the long one still runs: the
    /// runner does not sit in a wait for the long one.
    #[test]
    fn test_a_run_started_beside_a_long_one_finishes_first() {
        let deferred = Deferred::new(software());
        let hold = Arc::clone(&deferred.hold);
        hold.store(true, Ordering::SeqCst);
        let p: Shared = Arc::new(Mutex::new(Box::new(deferred)));
        let mut r = Runner::new(Arc::clone(&p), Arc::default(), Duration::ZERO).unwrap();
        r.start(stamps(0, 1)).unwrap();
        // The runner has nothing else to start: it waits on the long run.
        assert!(matches!(
            r.finish(Some(Duration::from_millis(50))),
            Ok(None)
        ));
        r.start(stamps(1, 2)).unwrap();
        let (f, _) = r
            .finish(Some(Duration::from_secs(5)))
            .unwrap()
            .expect("the run beside the long one finishes while it runs");
        assert_eq!((f.lane, f.run.done.len()), (1, 2));
        hold.store(false, Ordering::SeqCst);
        let (f, _) = r.finish(None).unwrap().unwrap();
        assert_eq!((f.lane, f.run.done.len()), (0, 1));
    }

    /// A step as [`Deferred`] keeps it.
    enum Kept {
        Stamp,
        Fill(DeviceFill),
        Upload(u64, Vec<HostSlice>),
        Download(u64, Vec<HostSlice>),
    }

    /// Keeps runs in flight as a GPU does: `start_queued` only notes the
    /// steps (a copy's guest memory as pointers), `finish_queued` runs
    /// them on a software partition, so a copy touches guest memory only
    /// when its run is finished, which must still be mapped then. It has
    /// two lanes, and finishes lane 1's runs first, as a GPU does where a
    /// run on another lane is done before one started earlier.
    struct Deferred {
        inner: Box<dyn Partition>,
        runs: [VecDeque<Vec<Kept>>; 2],
        /// Runs started, and runs finished.
        started: Arc<AtomicUsize>,
        finished: Arc<AtomicUsize>,
        /// While set, lane 0's runs do not finish (a long kernel).
        hold: Arc<AtomicBool>,
    }

    impl Deferred {
        fn new(inner: Box<dyn Partition>) -> Self {
            Deferred {
                inner,
                runs: Default::default(),
                started: Arc::default(),
                finished: Arc::default(),
                hold: Arc::default(),
            }
        }

        /// The lane whose run may finish now.
        fn ready_lane(&self) -> Option<usize> {
            (0..2)
                .rev()
                .find(|&l| !self.runs[l].is_empty() && (l > 0 || !self.hold.load(Ordering::SeqCst)))
        }
    }

    // SAFETY: the slices it keeps are only used while the runner keeps the
    // table pinned (what the test checks), from whichever thread.
    unsafe impl Send for Deferred {}

    impl Partition for Deferred {
        fn spec(&self) -> &PartitionSpec {
            self.inner.spec()
        }
        fn kernel_compute_units(&self) -> u32 {
            1
        }
        fn alloc(&mut self, size: u64, align: u64) -> Result<u64, OpError> {
            self.inner.alloc(size, align)
        }
        fn free(&mut self, addr: u64) -> Result<(), OpError> {
            self.inner.free(addr)
        }
        fn upload(&mut self, dst: u64, src: &dyn HostSource) -> Result<(), OpError> {
            self.inner.upload(dst, src)
        }
        fn download(&mut self, src: u64, dst: &dyn HostSink) -> Result<(), OpError> {
            self.inner.download(src, dst)
        }
        fn copy(&mut self, dst: u64, src: u64, size: u64) -> Result<(), OpError> {
            self.inner.copy(dst, src, size)
        }
        fn fill(&mut self, addr: u64, size: u64, pattern: u32) -> Result<(), OpError> {
            self.inner.fill(addr, size, pattern)
        }
        fn module_load(&mut self, _: u32, _: &[u8]) -> Result<u64, OpError> {
            Err(OpError::Unsupported("modules".into()))
        }
        fn module_unload(&mut self, _: u64) -> Result<(), OpError> {
            Err(OpError::Unsupported("modules".into()))
        }
        fn launch(&mut self, _: &Launch<'_>) -> Result<(), OpError> {
            Err(OpError::Unsupported("launches".into()))
        }
        fn run_queued(&mut self, steps: &[Queued<'_>], stop: &dyn Fn() -> bool) -> Vec<QueuedDone> {
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
            _: &dyn Fn() -> bool,
            held: bool,
        ) -> Started {
            assert!(
                held,
                "the runner keeps guest memory until the run is finished"
            );
            let kept = steps
                .iter()
                .map(|s| match s {
                    Queued::Timestamp => Kept::Stamp,
                    Queued::Fill(f) => Kept::Fill(*f),
                    Queued::Upload { dst, src } => Kept::Upload(*dst, src.slices().to_vec()),
                    Queued::Download { src, dst } => Kept::Download(*src, dst.slices().to_vec()),
                    _ => panic!("not in these tests"),
                })
                .collect();
            assert!(self.runs[lane].len() < 2, "lane {lane} is full");
            self.runs[lane].push_back(kept);
            self.started.fetch_add(1, Ordering::SeqCst);
            Started::InFlight
        }
        fn finish_queued_within(&mut self, within: Duration) -> Finishing {
            if self.ready_lane().is_none() {
                if self.runs.iter().all(VecDeque::is_empty) {
                    return Finishing::Idle;
                }
                std::thread::sleep(within);
                return Finishing::Pending;
            }
            match self.finish_queued() {
                Some((lane, f)) => Finishing::Done(lane, f),
                None => Finishing::Idle,
            }
        }
        fn finish_queued(&mut self) -> Option<(usize, Finished)> {
            // A held lane lets go within the test's patience, so that a
            // runner that waits for it alone fails the test, not hangs it.
            let patience = Instant::now() + Duration::from_secs(10);
            while self.ready_lane().is_none()
                && self.hold.load(Ordering::SeqCst)
                && Instant::now() < patience
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            let lane = (0..2).rev().find(|&l| !self.runs[l].is_empty())?;
            let run = self.runs[lane].pop_front()?;
            // Slow enough that an unmap racing with it would be seen.
            std::thread::sleep(Duration::from_millis(20));
            let done = run
                .into_iter()
                .map(|k| {
                    let result = match k {
                        Kept::Stamp => Ok(()),
                        Kept::Fill(f) => self.inner.fill(f.addr, f.size, f.pattern),
                        Kept::Upload(dst, s) => {
                            // SAFETY: the runner keeps the table pinned,
                            // so the slices stay mapped, until this run
                            // is finished.
                            let mem = unsafe { SliceMemory::new(&s) };
                            self.inner.upload(dst, &mem)
                        }
                        Kept::Download(src, s) => {
                            // SAFETY: as for an upload.
                            let mem = unsafe { SliceMemory::new(&s) };
                            self.inner.download(src, &mem)
                        }
                    };
                    QueuedDone { result, end_ns: 0 }
                })
                .collect();
            self.finished.fetch_add(1, Ordering::SeqCst);
            Some((lane, Finished { waited_ns: 0, done }))
        }
        fn max_active_clusters(&mut self, _: &Launch<'_>) -> Result<u32, OpError> {
            Ok(0)
        }
        fn function_info(&mut self, _: u64, _: &str) -> Result<FunctionInfo, OpError> {
            Err(OpError::Unsupported("modules".into()))
        }
        fn global_info(&mut self, _: u64, _: &str) -> Result<(u64, u64), OpError> {
            Err(OpError::Unsupported("modules".into()))
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
            _: u64,
            _: usize,
        ) -> Result<vgpu_backend::console::ConsoleText, OpError> {
            Ok(Default::default())
        }
        fn reset(&mut self) {
            self.runs = Default::default();
            self.inner.reset()
        }
        fn is_lost(&self) -> bool {
            false
        }
    }

    #[test]
    fn test_runs_in_flight_keep_guest_memory_until_finished() {
        let mut inner = software();
        let dev = inner.alloc(8192, 0).unwrap();
        let deferred = Deferred::new(inner);
        let (started, finished) = (
            Arc::clone(&deferred.started),
            Arc::clone(&deferred.finished),
        );
        let p: Shared = Arc::new(Mutex::new(Box::new(deferred)));
        let path = std::env::temp_dir().join(format!("vgpu-runner-{}", std::process::id()));
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file.set_len(1 << 16).unwrap();
        let file = Arc::new(file);
        let table = Arc::new(Table::default());
        table.map(1, &file, 0, 1 << 16, true, true).unwrap();
        file.write_all_at(b"runs in flight!!", 0).unwrap();
        // Long enough for the second run to be started behind the first.
        let mut r = Runner::new(p, Arc::clone(&table), Duration::from_millis(200)).unwrap();
        let piece = |offset, len| MappedPiece {
            mapping: 1,
            offset,
            len,
        };
        let up = Request::Start {
            lane: 0,
            steps: vec![Step::Upload {
                dst: dev,
                src: vec![piece(0, 16)],
            }],
        };
        let down = Request::Start {
            lane: 0,
            steps: vec![
                Step::Timestamp,
                Step::Download {
                    src: dev,
                    dst: vec![piece(4096, 16)],
                },
            ],
        };
        r.start(up.encode()).unwrap();
        r.start(down.encode()).unwrap();
        for n in [1, 2] {
            let (f, _) = r.finish(None).unwrap().unwrap();
            assert_eq!(f.run.done.len(), n);
            assert!(f.run.done.iter().all(|d| d.result.is_ok()), "{f:?}");
        }
        let mut got = [0u8; 16];
        file.read_exact_at(&mut got, 4096).unwrap();
        assert_eq!(&got, b"runs in flight!!");

        // An unmap waits for the run in flight that uses the memory; the
        // runner lets go of the table for it before it starts the next
        // run, which then finds the memory gone.
        r.start(up.encode()).unwrap();
        while started.load(Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        let unmap = {
            let (table, finished) = (Arc::clone(&table), Arc::clone(&finished));
            std::thread::spawn(move || {
                let gone = table.remove(1).is_some();
                (gone, finished.load(Ordering::SeqCst))
            })
        };
        // On a loaded machine the run may end, and the unmap with it,
        // before this thread looks: then the next run finds the memory
        // gone all the same.
        while !table.writer_waiting() && !unmap.is_finished() {
            std::thread::yield_now();
        }
        r.start(up.encode()).unwrap();
        let (gone, finished_then) = unmap.join().unwrap();
        assert!(gone);
        assert_eq!(
            finished_then, 3,
            "the unmap went through while a run used the memory"
        );
        let (f, _) = r.finish(None).unwrap().unwrap();
        assert!(f.run.done[0].result.is_ok(), "{f:?}");
        let (f, _) = r.finish(None).unwrap().unwrap();
        assert!(
            matches!(&f.run.done[0].result, Err(OpError::Invalid(_))),
            "{f:?}"
        );
    }
}
