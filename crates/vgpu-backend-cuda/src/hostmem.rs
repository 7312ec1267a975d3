//! Guest memory registered with the driver (`cuMemHostRegister`), so that
//! uploads and downloads run on the copy engines straight from and to
//! guest pages.
//!
//! Registration pins every page and takes about 0.4 s for 8 GiB on an
//! H200 host, so it runs on a thread of the registry, never on the thread
//! that announces the memory (the VMM's event loop) nor on a command.
//! Until it completes, or when it fails, copies go through the staging
//! buffers. Registrations are made `PORTABLE` in the device's primary
//! context, so that they outlive the partition's own context (which a
//! reset recreates) and serve it in either mode.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use log::{info, warn};
use vgpu_backend::{HostMapping, HostMemory, HostSlice};

use crate::driver::{CUcontext, CuError, HostRegistration, PrimaryContext};
use crate::Shared;

/// Most mappings one partition keeps registered; more are served by the
/// staging path (a VMM may split guest RAM into many mappings, and each
/// registration costs the driver bookkeeping).
pub const MAX_REGISTRATIONS: usize = 256;

/// Default of [`crate::CudaBackend::set_max_registered`]: bytes of guest
/// memory one partition keeps registered at most.
pub const DEFAULT_MAX_REGISTERED: u64 = 64 << 30;

/// Smallest mapping worth registering: a copy goes straight to guest
/// memory only when its pieces average `DIRECT_MIN_SLICE`, which pieces of
/// small mappings (a VMM mapping guest RAM page by page behind a guest
/// IOMMU) rarely do.
pub const MIN_REGISTRATION: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Waiting for the registration thread.
    Queued,
    /// Being registered (the thread does not hold the lock meanwhile).
    Registering,
    /// Usable by copies.
    Registered,
    /// The driver refused it; copies use the staging path.
    Failed,
}

#[derive(Debug)]
struct Entry {
    addr: usize,
    len: usize,
    writable: bool,
    status: Status,
    /// The registration, while `status` is `Registered`.
    reg: Option<HostRegistration>,
}

#[derive(Default)]
struct State {
    entries: HashMap<u64, Entry>,
    queue: VecDeque<u64>,
    /// A registration thread is running.
    worker: bool,
    /// The primary context, retained on first use.
    ctx: Option<PrimaryContext>,
}

struct Inner {
    name: String,
    shared: Arc<Shared>,
    state: Mutex<State>,
    changed: Condvar,
}

// SAFETY: the raw handles, the retained primary context and the
// registrations (an address and that context), are process-wide driver
// objects usable from any thread (every call on them makes the context
// current on the calling thread first); they are behind the mutex.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}

/// A partition's registrations of guest memory. Cloning shares them.
#[derive(Clone)]
pub struct HostRegistry {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HostRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.lock();
        f.debug_struct("HostRegistry")
            .field("name", &self.inner.name)
            .field("entries", &st.entries.len())
            .finish()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The primary context, retained once per registry.
    fn context(&self, st: &mut State) -> Result<CUcontext, CuError> {
        if let Some(c) = &st.ctx {
            return Ok(c.handle());
        }
        let c = PrimaryContext::retain(self.shared.device)?;
        let handle = c.handle();
        st.ctx = Some(c);
        Ok(handle)
    }

    /// Registers `len` bytes at `addr`.
    fn register(
        &self,
        ctx: CUcontext,
        e: (usize, usize, bool),
    ) -> Result<HostRegistration, CuError> {
        let (addr, len, writable) = e;
        // SAFETY: `len` bytes at `addr` are a mapping of this process that
        // stays mapped until `unmapped` has unregistered it (the engine
        // unmaps only after its notice returns, and `unmapped` waits for
        // this registration to end; it unregisters only after removing the
        // entry, so no copy uses the memory any more). `ctx` is the
        // registry's primary context, released only after every
        // registration is gone.
        unsafe { HostRegistration::register(ctx, addr, len, writable) }
    }

    /// The registration thread: registers queued entries until none is left.
    fn work(self: Arc<Self>) {
        loop {
            let (id, job, ctx) = {
                let mut st = self.lock();
                let Some(id) = st.queue.pop_front() else {
                    st.worker = false;
                    return;
                };
                let Some(e) = st.entries.get(&id) else {
                    continue;
                };
                let job = (e.addr, e.len, e.writable);
                let ctx = if crate::cuda_lost().is_some() {
                    None
                } else {
                    self.context(&mut st).ok()
                };
                if let Some(e) = st.entries.get_mut(&id) {
                    e.status = if ctx.is_some() {
                        Status::Registering
                    } else {
                        Status::Failed
                    };
                }
                (id, job, ctx)
            };
            let Some(ctx) = ctx else {
                self.changed.notify_all();
                continue;
            };
            let t = std::time::Instant::now();
            let r = self.register(ctx, job);
            let mut st = self.lock();
            // An entry being registered is not removed (`unmapped` waits),
            // so `orphan` stays None; were it not, the registration would
            // be undone, after the lock is released.
            let mut orphan = None;
            let r = match (r, st.entries.get_mut(&id)) {
                (Ok(reg), Some(e)) => {
                    e.status = Status::Registered;
                    e.reg = Some(reg);
                    Ok(())
                }
                (Ok(reg), None) => {
                    orphan = Some(reg);
                    Ok(())
                }
                (Err(err), Some(e)) => {
                    e.status = Status::Failed;
                    Err(err)
                }
                (Err(err), None) => Err(err),
            };
            drop(st);
            drop(orphan);
            self.changed.notify_all();
            match r {
                Ok(()) => info!(
                    "cuda backend: partition {:?}: {} bytes of guest memory registered in {:?}",
                    self.name,
                    job.1,
                    t.elapsed()
                ),
                Err(e) => warn!(
                    "cuda backend: partition {:?}: cannot register {} bytes of guest memory ({e}); copies of it are staged",
                    self.name, job.1
                ),
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        let Some(primary) = st.ctx.take() else {
            return;
        };
        // Whatever is still registered (a partition dropped with guest
        // memory mapped) is released with the registry.
        for e in st.entries.values_mut() {
            if let Some(reg) = e.reg.take() {
                let _ = reg.unregister();
            }
        }
        // Released after the registrations made in it.
        drop(primary);
    }
}

impl HostRegistry {
    pub(crate) fn new(shared: Arc<Shared>, name: &str) -> HostRegistry {
        HostRegistry {
            inner: Arc::new(Inner {
                name: name.to_string(),
                shared,
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
            }),
        }
    }

    /// Whether every slice lies inside a completed registration.
    pub(crate) fn covers(&self, slices: &[HostSlice]) -> bool {
        let st = self.inner.lock();
        slices.iter().all(|s| {
            st.entries.get(&s.mapping).is_some_and(|e| {
                let start = s.ptr as usize;
                e.status == Status::Registered
                    && start >= e.addr
                    && start
                        .checked_add(s.len)
                        .is_some_and(|end| end <= e.addr + e.len)
            })
        })
    }

    /// Waits up to `timeout` for the registration of mapping `id` to end;
    /// returns whether it is registered.
    pub fn wait_registered(&self, id: u64, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut st = self.inner.lock();
        loop {
            match st.entries.get(&id).map(|e| e.status) {
                Some(Status::Registered) => return true,
                Some(Status::Queued | Status::Registering) => {}
                Some(Status::Failed) | None => return false,
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            st = self
                .inner
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Number of mappings currently registered.
    pub fn registered(&self) -> usize {
        let st = self.inner.lock();
        st.entries
            .values()
            .filter(|e| e.status == Status::Registered)
            .count()
    }
}

impl HostMemory for HostRegistry {
    fn mapped(&self, m: HostMapping) {
        if m.len < MIN_REGISTRATION || m.addr.checked_add(m.len).is_none() {
            return;
        }
        let mut st = self.inner.lock();
        if st.entries.contains_key(&m.id) {
            return;
        }
        let held: u64 = st.entries.values().map(|e| e.len as u64).sum();
        let limit = self.inner.shared.max_registered.load(Ordering::Relaxed);
        if st.entries.len() >= MAX_REGISTRATIONS || held.saturating_add(m.len as u64) > limit {
            // Pinning allocates the file's pages: a VMM mapping a large
            // sparse file must not make this process allocate without bound.
            warn!(
                "cuda backend: partition {:?}: {} mappings ({held} bytes) registered already; {} more bytes stay staged",
                self.inner.name,
                st.entries.len(),
                m.len
            );
            return;
        }
        st.entries.insert(
            m.id,
            Entry {
                addr: m.addr,
                len: m.len,
                writable: m.writable,
                status: Status::Queued,
                reg: None,
            },
        );
        st.queue.push_back(m.id);
        if !st.worker {
            let inner = self.inner.clone();
            match std::thread::Builder::new()
                .name("vgpu-cuda-register".into())
                .spawn(move || inner.work())
            {
                Ok(_) => st.worker = true,
                Err(e) => {
                    warn!(
                        "cuda backend: partition {:?}: cannot start registering guest memory: {e}",
                        self.inner.name
                    );
                    st.queue.clear();
                    for e in st.entries.values_mut() {
                        if e.status == Status::Queued {
                            e.status = Status::Failed;
                        }
                    }
                }
            }
        }
    }

    fn unmapped(&self, id: u64) {
        let mut st = self.inner.lock();
        loop {
            match st.entries.get(&id).map(|e| e.status) {
                None => return,
                Some(Status::Registering) => {
                    st = self
                        .inner
                        .changed
                        .wait(st)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                Some(Status::Queued | Status::Failed) => {
                    st.entries.remove(&id);
                    st.queue.retain(|&q| q != id);
                    return;
                }
                Some(Status::Registered) => {
                    let Some(Entry {
                        len,
                        reg: Some(reg),
                        ..
                    }) = st.entries.remove(&id)
                    else {
                        return;
                    };
                    drop(st);
                    if let Err(err) = reg.unregister() {
                        warn!(
                            "cuda backend: partition {:?}: unregistering {} bytes of guest memory: {err}",
                            self.inner.name, len
                        );
                    }
                    return;
                }
            }
        }
    }
}
