//! Memory shared in time on an oversubscribed GPU (`oversubscribe =
//! true`): the quotas of its vGPUs may add up to more than its memory.
//! A vGPU is resident (its partition holds its quota on the GPU) or
//! suspended (its memory out, its guest's work waiting). When a suspended
//! vGPU has work (its device says it is wanted), this thread resumes it,
//! first suspending the least recently active resident vGPU of the same
//! GPU where there is no room; a vGPU created there makes room the same
//! way. Nothing is lost: a suspended vGPU keeps its memory and its
//! guest's commands wait.
//!
//! A vGPU stays resident at least [`MIN_RESIDENCY`] before it may be
//! moved out for another, so that two busy tenants take turns in slices
//! of that length rather than thrash. One the operator suspended
//! (`vgpuctl suspend`) is held out until the operator resumes it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{info, warn};
use vgpu_backend::OpError;
use vgpu_device::{DeviceCounters, MemoryHandle};

use super::instance::MemoryMoves;

/// Least time a vGPU stays resident before another may take its room.
pub(super) const MIN_RESIDENCY: Duration = Duration::from_millis(250);

/// How often the thread looks again at vGPUs that wait for room.
const TICK: Duration = Duration::from_millis(50);

/// A vGPU of an oversubscribed GPU.
struct Tenant {
    gpu: String,
    memory: Arc<MemoryHandle>,
    counters: Arc<DeviceCounters>,
    moves: Arc<Mutex<MemoryMoves>>,
    /// Its commands when last looked at, and when they last moved.
    seen_commands: u64,
    last_active: Instant,
    /// Since when it is resident.
    resident_since: Instant,
    /// Suspended by the operator: never resumed for its work.
    held: bool,
}

#[derive(Default)]
struct State {
    tenants: BTreeMap<String, Tenant>,
    /// Suspended vGPUs whose guests have work, oldest first.
    wanted: VecDeque<String>,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

/// The residency of the vGPUs of oversubscribed GPUs, and the thread that
/// keeps it.
pub(super) struct Residency {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Residency {
    /// Starts the thread.
    pub(super) fn start() -> std::io::Result<Residency> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("vgpud-residency".into())
            .spawn(move || run(&s))?;
        Ok(Residency {
            shared,
            thread: Some(thread),
        })
    }

    /// What a vGPU's device calls when it is wanted (see
    /// `VgpuConfig::on_wanted`).
    pub(super) fn wanted_fn(&self, name: &str) -> Arc<dyn Fn() + Send + Sync> {
        let shared = Arc::clone(&self.shared);
        let name = name.to_string();
        Arc::new(move || {
            let mut st = vgpu_sys::lock(&shared.state);
            if !st.wanted.contains(&name) {
                st.wanted.push_back(name.clone());
            }
            shared.cv.notify_one();
        })
    }

    /// Takes a running vGPU of `gpu` into account.
    pub(super) fn add(
        &self,
        name: &str,
        gpu: &str,
        memory: Arc<MemoryHandle>,
        counters: Arc<DeviceCounters>,
        moves: Arc<Mutex<MemoryMoves>>,
    ) {
        let now = Instant::now();
        vgpu_sys::lock(&self.shared.state).tenants.insert(
            name.to_string(),
            Tenant {
                gpu: gpu.to_string(),
                seen_commands: counters.commands.load(std::sync::atomic::Ordering::Relaxed),
                memory,
                counters,
                moves,
                last_active: now,
                resident_since: now,
                held: false,
            },
        );
    }

    /// Forgets a vGPU that stops or goes.
    pub(super) fn remove(&self, name: &str) {
        let mut st = vgpu_sys::lock(&self.shared.state);
        st.tenants.remove(name);
        st.wanted.retain(|n| n != name);
    }

    /// Whether the operator holds the vGPU out; `None` for one not kept
    /// here (not on an oversubscribed GPU, or not running).
    pub(super) fn is_held(&self, name: &str) -> Option<bool> {
        vgpu_sys::lock(&self.shared.state)
            .tenants
            .get(name)
            .map(|t| t.held)
    }

    /// Holds a vGPU the operator suspended out (or lets it go again).
    pub(super) fn hold(&self, name: &str, held: bool) {
        let mut st = vgpu_sys::lock(&self.shared.state);
        if let Some(t) = st.tenants.get_mut(name) {
            t.held = held;
            if !held {
                t.resident_since = Instant::now();
            }
        }
    }

    /// Makes room on `gpu` for `for_whom` by suspending its least recently
    /// active resident vGPU (however briefly resident); returns whether
    /// one went.
    pub(super) fn evict_one(&self, gpu: &str, for_whom: &str) -> bool {
        let victim = {
            let mut st = vgpu_sys::lock(&self.shared.state);
            refresh(&mut st);
            pick_victim(&st, gpu, for_whom, Duration::ZERO)
        };
        victim.is_some_and(|v| evict(&self.shared, &v, None))
    }
}

impl Drop for Residency {
    fn drop(&mut self) {
        vgpu_sys::lock(&self.shared.state).stop = true;
        self.shared.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Notes which vGPUs ran commands since the last look.
fn refresh(st: &mut State) {
    let now = Instant::now();
    for t in st.tenants.values_mut() {
        let c = t
            .counters
            .commands
            .load(std::sync::atomic::Ordering::Relaxed);
        if c != t.seen_commands {
            t.seen_commands = c;
            t.last_active = now;
        }
    }
}

/// The resident vGPU of `gpu` (not `besides`) that was active least
/// recently, among those resident for `min` at least.
fn pick_victim(st: &State, gpu: &str, besides: &str, min: Duration) -> Option<String> {
    st.tenants
        .iter()
        .filter(|(n, t)| {
            n.as_str() != besides
                && t.gpu == gpu
                && !t.held
                && !t.memory.is_suspended()
                && t.resident_since.elapsed() >= min
        })
        .min_by_key(|(_, t)| t.last_active)
        .map(|(n, _)| n.clone())
}

/// Suspends `victim` for `cause` (a wanted vGPU, charged with the time;
/// `None`: a vGPU being created). Returns whether it went.
fn evict(shared: &Shared, victim: &str, cause: Option<&str>) -> bool {
    let Some(handle) = vgpu_sys::lock(&shared.state)
        .tenants
        .get(victim)
        .map(|t| Arc::clone(&t.memory))
    else {
        return false;
    };
    let t0 = Instant::now();
    match handle.suspend() {
        Ok(bytes) => {
            let took = t0.elapsed();
            let st = vgpu_sys::lock(&shared.state);
            if let Some(t) = st.tenants.get(victim) {
                let mut m = vgpu_sys::lock(&t.moves);
                m.suspends += 1;
                m.evictions += 1;
                m.evicted = bytes;
            }
            if let Some(c) = cause.and_then(|c| st.tenants.get(c)) {
                let mut m = vgpu_sys::lock(&c.moves);
                m.caused += 1;
                m.caused_time += took;
            }
            info!(
                "vGPU {victim}: moved out ({bytes} bytes in {took:.1?}) to make room for {}",
                cause.unwrap_or("a new vGPU")
            );
            true
        }
        Err(e) => {
            warn!("vGPU {victim}: could not be moved out: {e}");
            false
        }
    }
}

/// The thread: resumes wanted vGPUs, making room where there is none.
fn run(shared: &Shared) {
    loop {
        let name = {
            let mut st = vgpu_sys::lock(&shared.state);
            loop {
                if st.stop {
                    return;
                }
                refresh(&mut st);
                if let Some(n) = st.wanted.pop_front() {
                    break n;
                }
                st = shared
                    .cv
                    .wait_timeout(st, TICK)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
            }
        };
        if !serve(shared, &name) {
            // No room yet: it asks again once a resident vGPU may go.
            let mut st = vgpu_sys::lock(&shared.state);
            if st.tenants.contains_key(&name) && !st.wanted.contains(&name) {
                st.wanted.push_back(name);
            }
            let _ = shared.cv.wait_timeout(st, TICK);
        }
    }
}

/// Resumes wanted vGPU `name`, moving another out first where there is
/// no room; false when it must wait for room.
fn serve(shared: &Shared, name: &str) -> bool {
    let (handle, gpu) = {
        let st = vgpu_sys::lock(&shared.state);
        match st.tenants.get(name) {
            Some(t) if !t.held && t.memory.is_suspended() => (Arc::clone(&t.memory), t.gpu.clone()),
            // Gone, held out, or resident already.
            _ => return true,
        }
    };
    for _ in 0..2 {
        let t0 = Instant::now();
        match handle.resume() {
            Ok(bytes) => {
                let took = t0.elapsed();
                let mut st = vgpu_sys::lock(&shared.state);
                if let Some(t) = st.tenants.get_mut(name) {
                    t.resident_since = Instant::now();
                    t.last_active = t.resident_since;
                    let mut m = vgpu_sys::lock(&t.moves);
                    m.evicted = 0;
                    m.restore += took;
                }
                info!("vGPU {name}: moved back in ({bytes} bytes in {took:.1?}) for its work");
                return true;
            }
            Err(OpError::NoMemory { .. }) => {
                let victim = {
                    let mut st = vgpu_sys::lock(&shared.state);
                    refresh(&mut st);
                    pick_victim(&st, &gpu, name, MIN_RESIDENCY)
                };
                match victim {
                    Some(v) if evict(shared, &v, Some(name)) => {}
                    _ => return false,
                }
            }
            Err(e) => {
                warn!("vGPU {name}: could not be moved back in: {e}");
                return true;
            }
        }
    }
    false
}
