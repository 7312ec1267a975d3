//! The partition host's runner: runs the queued runs the parent started
//! ([`crate::proto::Kind::Start`]) on a thread of their own, in order, so
//! the host answers a start at once and the next run is on its way to the
//! device while the device works on this one. The parent asks for each
//! run's results ([`crate::proto::Kind::Finish`]) in the order it started
//! them; any other request waits for every started run first.

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::debug;
use vgpu_backend::{Finished, OpError, Partition, QueuedDone};

use crate::guest_mem::Table;
use crate::host::run_steps;
use crate::proto::{Kind, Request};

pub use crate::proto::MAX_STARTED;

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
type Outcome = (Finished, u64);

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
            .spawn(move || {
                while let Some(job) = next(&rx, spin) {
                    let waited_ns = job.arrived.elapsed().as_nanos() as u64;
                    let mut p = lock(&partition);
                    let done = run_frame(&mut **p, &guest, &job.frame);
                    let used = p.memory_used();
                    drop(p);
                    if tx.send((Finished { waited_ns, done }, used)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Runner {
            jobs: Some(jobs),
            results,
            running: 0,
            ready: VecDeque::new(),
            thread: Some(thread),
            spin,
        })
    }

    /// The results of the oldest started runs that are done now, without
    /// waiting; what they leave the partition using, if any.
    pub(crate) fn take_done(&mut self) -> (Vec<Finished>, Option<u64>) {
        while self.running > 0 {
            match self.results.try_recv() {
                Ok(r) => {
                    self.ready.push_back(r);
                    self.running -= 1;
                }
                Err(_) => break,
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

    /// The oldest started run's results, waiting for them if need be.
    pub(crate) fn finish(&mut self) -> Result<Outcome, OpError> {
        if self.ready.is_empty() && self.running > 0 {
            self.receive();
        }
        self.ready
            .pop_front()
            .ok_or_else(|| OpError::Invalid("no run was started".into()))
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
                let gone = Finished {
                    waited_ns: 0,
                    done: Vec::new(),
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

/// Runs the steps of a started run's frame; every step fails with the
/// run's error when it cannot run at all.
fn run_frame(p: &mut dyn Partition, guest: &Table, frame: &[u8]) -> Vec<QueuedDone> {
    let steps = match Request::decode(Kind::Start as u16, frame) {
        Ok(Request::Start(steps)) => steps,
        // Checked before it was started.
        _ => return Vec::new(),
    };
    run_steps(p, guest, &steps).unwrap_or_else(|e| {
        steps
            .iter()
            .map(|_| QueuedDone {
                result: Err(e.clone()),
                end_ns: 0,
            })
            .collect()
    })
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
    use crate::proto::Step;
    use vgpu_backend::software::SoftwareBackend;
    use vgpu_backend::{Backend, PartitionSpec};

    #[test]
    fn test_at_most_four_started_and_finished_in_order() {
        let backend = SoftwareBackend::new(1 << 20, 1);
        let spec = PartitionSpec {
            name: "r".into(),
            memory: 1 << 20,
            compute_units: 1,
        };
        let p: Shared = Arc::new(Mutex::new(backend.create_partition(&spec).unwrap()));
        let mut r = Runner::new(Arc::clone(&p), Arc::default(), Duration::ZERO).unwrap();
        assert!(matches!(r.finish(), Err(OpError::Invalid(_))));
        let frame = |n: usize| Request::Start(vec![Step::Timestamp; n]).encode();
        {
            // The partition is busy: started runs wait for it.
            let _held = lock(&p);
            for n in 1..=MAX_STARTED {
                r.start(frame(n)).unwrap();
            }
            assert!(matches!(r.start(frame(1)), Err(OpError::Invalid(_))));
            assert_eq!(r.take_done().0, Vec::new());
        }
        for n in 1..=MAX_STARTED {
            let (f, used) = r.finish().unwrap();
            assert_eq!(f.done.len(), n, "in the order started");
            assert!(f.done.iter().all(|d| d.result.is_ok()));
            assert_eq!(used, 0);
        }
        assert!(matches!(r.finish(), Err(OpError::Invalid(_))));
        // A frame that is not a run fails nothing else.
        r.start(Request::Finish.encode()).unwrap();
        assert_eq!(r.finish().unwrap().0.done, Vec::new());
        r.start(frame(2)).unwrap();
        r.clear();
        assert!(matches!(r.finish(), Err(OpError::Invalid(_))));
    }
}
