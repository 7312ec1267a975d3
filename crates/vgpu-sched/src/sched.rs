//! The scheduler proper: state, decisions, waiting and grants.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use log::{debug, info};

use crate::histogram::Histogram;
use crate::stats::{GpuStats, SchedStats, TenantPhase, TenantStats, WaitStats};
use crate::window::CapWindow;
use crate::{Policy, SchedConfig, SchedError, TenantId, TenantParams, MAX_WEIGHT};

/// Virtual-time units per nanosecond of charge at weight 1. With weights
/// at most `MAX_WEIGHT`, every charge advances a finish tag by at least 1.
const VT_SCALE: u128 = MAX_WEIGHT as u128;

/// Decides which tenant runs its next command on one physical GPU.
///
/// A cheap handle: clones share the same scheduler. `Send + Sync`.
#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock; if a caller's thread died
        // there anyway, the state is still consistent between calls.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Releases the lock, then delivers the wake-up decided under it.
fn unlock(mut st: MutexGuard<'_, State>) {
    let wake = st.wake.take();
    drop(st);
    if let Some(cv) = wake {
        cv.notify_one();
    }
}

struct State {
    config: SchedConfig,
    epoch: Instant,
    cap_window_ns: u64,
    tenants: BTreeMap<TenantId, Tenant>,
    /// The outstanding grant; the GPU is free when `None`.
    running: Option<Running>,
    /// The GPU is kept for a tenant that just finished, if the policy
    /// would pick it (see the crate documentation).
    hold: Option<Hold>,
    /// While the GPU is free and nobody may run yet: when to decide again.
    timer: Option<Instant>,
    /// The waiting tenant whose thread wakes up at `timer` to decide. It
    /// stays the keeper while it waits, so that a string of holds does not
    /// need a wake each.
    timekeeper: Option<TenantId>,
    /// A wake-up decided under the lock, delivered once it is released so
    /// that the woken thread does not run into the lock.
    wake: Option<Arc<Condvar>>,
    shutdown: bool,
    /// Source of grant serials, tenant instances and arrival order.
    serial: u64,
    last_granted: Option<TenantId>,
    /// Round robin: whose turn it is and how much of its slice it used.
    rr_current: Option<TenantId>,
    rr_used: Duration,
    /// Fair share: virtual time, the start tag of the latest grant.
    vtime: u128,
    gpu: GpuTotals,
}

#[derive(Default)]
struct GpuTotals {
    busy: Duration,
    held: Duration,
    grants: u64,
    commands: u64,
    switches: u64,
    recent: Recent,
}

/// How long ago device time still counts in [`GpuStats::recent_load`]:
/// the time constant of its exponential decay.
pub const RECENT_LOAD_WINDOW: Duration = Duration::from_secs(10);

/// Device time with an exponential decay: seconds, as of `at`.
#[derive(Default, Clone, Copy)]
struct Recent {
    acc: f64,
    at: Option<Instant>,
}

impl Recent {
    /// What is left of the device time at `now`.
    fn at(self, now: Instant) -> f64 {
        let Some(at) = self.at else { return 0.0 };
        let dt = now.saturating_duration_since(at).as_secs_f64();
        self.acc * (-dt / RECENT_LOAD_WINDOW.as_secs_f64()).exp()
    }

    fn add(&mut self, device_time: Duration, now: Instant) {
        self.acc = self.at(now) + device_time.as_secs_f64();
        self.at = Some(now);
    }

    /// The share of the window the GPU was busy, 0..=1: at a steady
    /// utilisation u the decayed sum settles at u times the window.
    fn load(self, now: Instant) -> f64 {
        (self.at(now) / RECENT_LOAD_WINDOW.as_secs_f64()).clamp(0.0, 1.0)
    }
}

struct Running {
    tenant: TenantId,
    instance: u64,
    serial: u64,
    granted_at: Instant,
    /// When its tenant started waiting for it.
    arrival: Instant,
    /// Device time charged to this grant's commands so far (its turn).
    turn_used: Duration,
}

#[derive(Clone, Copy)]
struct Hold {
    tenant: TenantId,
    instance: u64,
    /// Finish time: the arrival the tenant is treated as having.
    since: Instant,
    seq: u64,
    until: Instant,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sleep {
    Awake,
    Until(Instant),
    Forever,
}

#[derive(Clone, Copy)]
enum Phase {
    Idle,
    Waiting {
        arrival: Instant,
        seq: u64,
        /// A cap has delayed this acquire (counted once).
        capped: bool,
    },
    Holding,
}

struct Tenant {
    /// Distinguishes a re-added tenant from the one a waiter waited for.
    instance: u64,
    params: TenantParams,
    cv: Arc<Condvar>,
    /// Whether its thread sleeps on `cv`, and until when.
    asleep: Sleep,
    phase: Phase,
    /// Fair share: start tag of the current request, finish tag of the last.
    vstart: u128,
    vfinish: u128,
    /// Fair share: virtual time and GPU grant count at its last finish.
    fin_vtime: u128,
    fin_grants: u64,
    /// Boxed: it is large and only read for capped tenants, so that
    /// scanning the tenants stays cheap.
    window: Box<CapWindow>,
    last_charge: Duration,
    busy: Duration,
    commands: u64,
    grants: u64,
    capped: u64,
    bytes: u64,
    wait: Histogram,
}

/// How a candidate compares under the policy; see [`Rank::beats`].
#[derive(Clone, Copy)]
enum Rank {
    /// Smaller wins: (round-robin class, id) or (start tag, arrival).
    Min(u128, u64),
    /// Larger effective priority wins, then the earlier arrival.
    Max(f64, u64),
}

impl Rank {
    fn beats(&self, other: &Rank) -> bool {
        match (self, other) {
            (Rank::Min(a, b), Rank::Min(c, d)) => (a, b) < (c, d),
            (Rank::Max(a, b), Rank::Max(c, d)) => a > c || (a == c && b < d),
            _ => false,
        }
    }
}

enum Pick {
    Grant(TenantId),
    /// Nobody may run now; decide again at this instant (if any). The
    /// second field is the waiting tenant the policy prefers, if any may
    /// run: the best time keeper, as it is likely the one to be granted.
    Wait(Option<Instant>, Option<TenantId>),
}

/// Fair share: the start tag tenant `t` gets when it starts waiting now,
/// with the GPU's virtual time `vtime` after `grants` grants.
///
/// A tenant that was idle re-enters at the current virtual time, so it
/// cannot bank credit. One back before a second grant went to others since
/// its finish (a worker the host descheduled for a moment) is measured
/// against the virtual time at its finish instead, so it keeps its place;
/// the credit this allows is at most one other command.
fn start_tag(t: &Tenant, vtime: u128, grants: u64) -> u128 {
    let base = if grants <= t.fin_grants.saturating_add(1) {
        t.fin_vtime
    } else {
        vtime
    };
    base.max(t.vfinish)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl State {
    fn next_serial(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }

    fn ns_since_epoch(&self, t: Instant) -> u64 {
        nanos(t.saturating_duration_since(self.epoch))
    }

    /// Wakes tenant `id`'s thread if it sleeps, once the lock is released.
    /// It then counts as awake: it will look at the state before it
    /// sleeps again, so it needs no second wake meanwhile.
    fn wake(&mut self, id: TenantId) {
        let Some(t) = self.tenants.get_mut(&id) else {
            return;
        };
        if t.asleep == Sleep::Awake {
            return;
        }
        t.asleep = Sleep::Awake;
        if let Some(old) = self.wake.replace(Arc::clone(&t.cv)) {
            old.notify_one();
        }
    }

    /// Decides, if the GPU is free: grants a waiting tenant, or arms the
    /// timer for when the decision may change. Called after every change.
    fn dispatch(&mut self, now: Instant) {
        self.timer = None;
        if self.shutdown || self.running.is_some() {
            return;
        }
        let (at, preferred) = match self.pick(now) {
            Pick::Grant(id) => return self.grant(id, now),
            Pick::Wait(None, _) => return,
            Pick::Wait(Some(at), preferred) => (at, preferred),
        };
        self.timer = Some(at);
        // A keeper that is awake reads the timer before it sleeps; one
        // asleep until no later than `at` wakes by itself and reads it.
        let covered = |t: &Tenant| match t.asleep {
            Sleep::Awake => true,
            Sleep::Until(d) => d <= at,
            Sleep::Forever => false,
        };
        let waiting = |t: &Tenant| matches!(t.phase, Phase::Waiting { .. });
        let current = self.timekeeper.filter(|id| {
            self.tenants
                .get(id)
                .is_some_and(|t| waiting(t) && covered(t))
        });
        if current.is_some() {
            return;
        }
        let keeper = preferred.or_else(|| {
            self.tenants
                .iter()
                .find(|(_, t)| waiting(t))
                .map(|(&id, _)| id)
        });
        self.timekeeper = keeper;
        if let Some(id) = keeper.filter(|id| self.tenants.get(id).is_some_and(|t| !covered(t))) {
            self.wake(id);
        }
    }

    /// The policy's choice among waiting tenants and the held finisher,
    /// leaving out tenants over their cap.
    fn pick(&mut self, now: Instant) -> Pick {
        let now_ns = self.ns_since_epoch(now);
        let hold = self.hold.filter(|h| {
            h.until > now
                && self
                    .tenants
                    .get(&h.tenant)
                    .is_some_and(|t| t.instance == h.instance && matches!(t.phase, Phase::Idle))
        });
        self.hold = hold;
        let mut next = hold.map(|h| h.until);
        let mut best: Option<(Rank, TenantId, bool)> = None;
        let mut best_waiting: Option<(Rank, TenantId)> = None;
        let mut any_waiting = false;
        for (&id, t) in self.tenants.iter_mut() {
            let (waiting, arrival, seq) = match t.phase {
                Phase::Waiting { arrival, seq, .. } => (true, arrival, seq),
                Phase::Idle => match hold {
                    Some(h) if h.tenant == id => (false, h.since, h.seq),
                    _ => continue,
                },
                Phase::Holding => continue,
            };
            any_waiting |= waiting;
            if let Some(cap) = t.params.cap.filter(|&c| c < 1.0) {
                let budget = (cap * self.cap_window_ns as f64) as u64;
                let est = nanos(t.last_charge).min(budget);
                if let Some(at_ns) = t.window.blocked_until(now_ns, budget, est) {
                    if let Phase::Waiting { capped, .. } = &mut t.phase {
                        if !*capped {
                            *capped = true;
                            t.capped += 1;
                        }
                        if let Some(at) = self.epoch.checked_add(Duration::from_nanos(at_ns)) {
                            next = Some(next.map_or(at, |n| n.min(at)));
                        }
                    }
                    continue;
                }
            }
            let rank = match self.config.policy {
                Policy::FairShare => {
                    let start = if waiting {
                        t.vstart
                    } else {
                        start_tag(t, self.vtime, self.gpu.grants)
                    };
                    Rank::Min(start, seq)
                }
                Policy::Priority { aging } => {
                    let waited = now.saturating_duration_since(arrival).as_secs_f64();
                    let effective = f64::from(t.params.priority) + waited / aging.as_secs_f64();
                    Rank::Max(effective, seq)
                }
                Policy::RoundRobin { slice } => {
                    let class = match self.rr_current {
                        Some(cur) if cur == id && self.rr_used < slice => 0,
                        Some(cur) if id > cur => 1,
                        Some(_) => 2,
                        None => 1,
                    };
                    Rank::Min(class, u64::from(id.0))
                }
            };
            if best.as_ref().is_none_or(|(b, _, _)| rank.beats(b)) {
                best = Some((rank, id, waiting));
            }
            if waiting && best_waiting.as_ref().is_none_or(|(b, _)| rank.beats(b)) {
                best_waiting = Some((rank, id));
            }
        }
        match best {
            _ if !any_waiting => Pick::Wait(None, None),
            Some((_, id, true)) => Pick::Grant(id),
            _ => Pick::Wait(next, best_waiting.map(|(_, id)| id)),
        }
    }

    fn grant(&mut self, id: TenantId, now: Instant) {
        let serial = self.next_serial();
        let Some(t) = self.tenants.get_mut(&id) else {
            return;
        };
        let Phase::Waiting { arrival, .. } = t.phase else {
            return;
        };
        t.phase = Phase::Holding;
        t.grants += 1;
        t.wait.record(now.saturating_duration_since(arrival));
        match self.config.policy {
            Policy::FairShare => self.vtime = self.vtime.max(t.vstart),
            Policy::RoundRobin { slice } => {
                if self.rr_current != Some(id) || self.rr_used >= slice {
                    self.rr_current = Some(id);
                    self.rr_used = Duration::ZERO;
                }
            }
            Policy::Priority { .. } => {}
        }
        self.running = Some(Running {
            tenant: id,
            instance: t.instance,
            serial,
            granted_at: now,
            arrival,
            turn_used: Duration::ZERO,
        });
        // The caller's own thread, or one that is about to look, needs no
        // wake-up.
        self.wake(id);
        self.hold = None;
        self.gpu.grants += 1;
        if self.last_granted.is_some_and(|prev| prev != id) {
            self.gpu.switches += 1;
        }
        self.last_granted = Some(id);
    }

    /// Ends grant `serial` that consumed `device_time`, then decides again.
    fn release(&mut self, serial: u64, device_time: Duration, now: Instant) {
        self.end_grant(serial, device_time, now);
        self.dispatch(now);
    }

    /// The tenant and instance grant `serial` was given to, while it is the
    /// running one.
    fn grant_holder(&self, serial: u64) -> Option<(TenantId, u64)> {
        self.running
            .as_ref()
            .filter(|r| r.serial == serial)
            .map(|r| (r.tenant, r.instance))
    }

    /// Ends grant `serial` that consumed `device_time`: accounting, and the
    /// hold for the finisher.
    fn end_grant(&mut self, serial: u64, device_time: Duration, now: Instant) {
        let Some((tenant, instance)) = self.grant_holder(serial) else {
            return;
        };
        self.charge(tenant, instance, device_time, now);
        self.close_grant(serial, now);
    }

    /// Accounts one command of `tenant` (of `instance`) that consumed
    /// `device_time`. Returns its charge, or `None` if the tenant is gone.
    fn charge(
        &mut self,
        tenant: TenantId,
        instance: u64,
        device_time: Duration,
        now: Instant,
    ) -> Option<Duration> {
        self.gpu.busy = self.gpu.busy.saturating_add(device_time);
        self.gpu.recent.add(device_time, now);
        self.gpu.commands += 1;
        let charge = device_time.max(self.config.min_charge);
        let now_ns = self.ns_since_epoch(now);
        let t = self
            .tenants
            .get_mut(&tenant)
            .filter(|t| t.instance == instance)?;
        t.busy = t.busy.saturating_add(device_time);
        t.commands += 1;
        t.last_charge = charge;
        t.window.record(now_ns, nanos(charge));
        match self.config.policy {
            Policy::FairShare => {
                let step = (charge.as_nanos().saturating_mul(VT_SCALE)
                    / u128::from(t.params.weight))
                .max(1);
                t.vfinish = t.vstart.saturating_add(step);
                t.fin_vtime = self.vtime;
                t.fin_grants = self.gpu.grants;
            }
            Policy::RoundRobin { .. } => {
                if self.rr_current == Some(tenant) {
                    self.rr_used = self.rr_used.saturating_add(charge);
                }
            }
            Policy::Priority { .. } => {}
        }
        Some(charge)
    }

    /// Frees the GPU held by grant `serial` (its commands are charged
    /// already) and holds it for the finisher for the grace.
    fn close_grant(&mut self, serial: u64, now: Instant) {
        let Some(run) = self.running.take_if(|r| r.serial == serial) else {
            return;
        };
        self.gpu.held = self
            .gpu
            .held
            .saturating_add(now.saturating_duration_since(run.granted_at));
        let seq = self.next_serial();
        if let Some(t) = self
            .tenants
            .get_mut(&run.tenant)
            .filter(|t| t.instance == run.instance)
        {
            t.phase = Phase::Idle;
            if !self.shutdown && !self.config.grace.is_zero() {
                self.hold = now.checked_add(self.config.grace).map(|until| Hold {
                    tenant: run.tenant,
                    instance: run.instance,
                    since: now,
                    seq,
                    until,
                });
            }
        }
    }

    /// Charges the command grant `serial` just ran and decides whether its
    /// tenant keeps the GPU for its next one (see [`Grant::renew`]). If
    /// not, the grant is closed and the GPU goes where the policy says.
    fn renew(&mut self, serial: u64, device_time: Duration, now: Instant, requeue: bool) -> bool {
        let Some((tenant, instance)) = self.grant_holder(serial) else {
            return false;
        };
        let keep = match self.charge(tenant, instance, device_time, now) {
            Some(charge) => {
                if let Some(run) = self.running.as_mut() {
                    run.turn_used = run.turn_used.saturating_add(charge);
                }
                self.turn_continues(tenant, now)
            }
            None => false,
        };
        if keep {
            if let (Policy::FairShare, Some(t)) =
                (self.config.policy, self.tenants.get_mut(&tenant))
            {
                // Its next command starts where this one finished. The
                // virtual time stays at the turn's start: the turn is one
                // grant, and waiting tenants were queued against it.
                t.vstart = t.vfinish;
            }
        } else {
            self.close_grant(serial, now);
            // Still has work: queued at once, so that however late its
            // thread comes back for the GPU, it never stopped asking.
            let registered = self
                .tenants
                .get(&tenant)
                .is_some_and(|t| t.instance == instance);
            if requeue && registered && self.enter(tenant, now).is_ok() {
                self.hold = None;
            }
            self.dispatch(now);
        }
        keep
    }

    /// Whether `tenant`, holding the GPU, may run its next command without
    /// a new decision: it is within its cap, and nobody waits or its turn
    /// is not used up (round robin: its slice) and, under priority, no
    /// waiting tenant is a whole level above it.
    fn turn_continues(&mut self, tenant: TenantId, now: Instant) -> bool {
        let (cap_window_ns, now_ns) = (self.cap_window_ns, self.ns_since_epoch(now));
        let Some(t) = self.tenants.get_mut(&tenant) else {
            return false;
        };
        if self.shutdown {
            return false;
        }
        if let Some(cap) = t.params.cap.filter(|&c| c < 1.0) {
            let budget = (cap * cap_window_ns as f64) as u64;
            let est = nanos(t.last_charge).min(budget);
            if t.window.blocked_until(now_ns, budget, est).is_some() {
                return false;
            }
        }
        let t = &self.tenants[&tenant];
        let turn_used = self.running.as_ref().map_or(Duration::MAX, |r| r.turn_used);
        let mut waiting = self
            .tenants
            .values()
            .filter(|o| matches!(o.phase, Phase::Waiting { .. }));
        // Within the turn no one else needs a look: the common case is
        // O(1).
        match self.config.policy {
            Policy::FairShare => turn_used < self.config.turn || waiting.next().is_none(),
            Policy::RoundRobin { slice } => {
                (self.rr_current == Some(tenant) && self.rr_used < slice)
                    || waiting.next().is_none()
            }
            Policy::Priority { aging } => {
                let above = f64::from(t.params.priority) + 1.0;
                let (mut any, mut higher) = (false, false);
                for o in waiting {
                    any = true;
                    if let Phase::Waiting { arrival, .. } = o.phase {
                        let waited = now.saturating_duration_since(arrival).as_secs_f64();
                        higher |=
                            f64::from(o.params.priority) + waited / aging.as_secs_f64() >= above;
                    }
                }
                !any || (turn_used < self.config.turn && !higher)
            }
        }
    }

    /// Takes tenant `id` (of `instance`) out of the queue, or hands back a
    /// grant it was given but never took up, uncharged; then decides again.
    fn withdraw(&mut self, id: TenantId, instance: u64, now: Instant) {
        let phase = self
            .tenants
            .get(&id)
            .filter(|t| t.instance == instance)
            .map(|t| t.phase);
        match phase {
            Some(Phase::Waiting { .. }) => {
                if let Some(t) = self.tenants.get_mut(&id) {
                    t.phase = Phase::Idle;
                }
            }
            Some(Phase::Holding) => {
                if let Some(serial) = self
                    .running
                    .as_ref()
                    .filter(|r| r.tenant == id)
                    .map(|r| r.serial)
                {
                    self.close_grant(serial, now);
                }
            }
            _ => {}
        }
        self.dispatch(now);
    }

    /// Makes tenant `id` wait for the GPU from `now`; returns its instance.
    fn enter(&mut self, id: TenantId, now: Instant) -> Result<u64, SchedError> {
        if self.shutdown {
            return Err(SchedError::Shutdown);
        }
        let seq = self.next_serial();
        let (vtime, grants) = (self.vtime, self.gpu.grants);
        let t = self
            .tenants
            .get_mut(&id)
            .ok_or(SchedError::UnknownTenant(id))?;
        if !matches!(t.phase, Phase::Idle) {
            return Err(SchedError::Busy(id));
        }
        t.phase = Phase::Waiting {
            arrival: now,
            seq,
            capped: false,
        };
        t.vstart = start_tag(t, vtime, grants);
        Ok(t.instance)
    }

    fn tenant_stats(&self, id: TenantId, t: &Tenant) -> TenantStats {
        TenantStats {
            id,
            params: t.params,
            phase: match t.phase {
                Phase::Idle => TenantPhase::Idle,
                Phase::Waiting { .. } => TenantPhase::Waiting,
                Phase::Holding => TenantPhase::Holding,
            },
            busy: t.busy,
            commands: t.commands,
            grants: t.grants,
            capped: t.capped,
            bytes: t.bytes,
            wait: WaitStats {
                samples: t.wait.count(),
                mean: t.wait.mean(),
                p50: t.wait.quantile(0.50),
                p90: t.wait.quantile(0.90),
                p99: t.wait.quantile(0.99),
                max: t.wait.max(),
            },
        }
    }
}

impl Scheduler {
    /// A scheduler for one GPU, with no tenants.
    pub fn new(config: SchedConfig) -> Result<Self, SchedError> {
        config.validate()?;
        let state = State {
            config,
            epoch: Instant::now(),
            cap_window_ns: nanos(config.cap_window),
            tenants: BTreeMap::new(),
            running: None,
            hold: None,
            timer: None,
            timekeeper: None,
            wake: None,
            shutdown: false,
            serial: 0,
            last_granted: None,
            rr_current: None,
            rr_used: Duration::ZERO,
            vtime: 0,
            gpu: GpuTotals::default(),
        };
        Ok(Scheduler {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
            }),
        })
    }

    /// The configuration it was created with.
    pub fn config(&self) -> SchedConfig {
        self.shared.lock().config
    }

    /// Registers a tenant. Under fair share it starts at the current
    /// virtual time: it neither owes nor is owed anything.
    pub fn add_tenant(&self, id: TenantId, params: TenantParams) -> Result<(), SchedError> {
        params.validate()?;
        let mut st = self.shared.lock();
        if st.shutdown {
            return Err(SchedError::Shutdown);
        }
        if st.tenants.contains_key(&id) {
            return Err(SchedError::DuplicateTenant(id));
        }
        let instance = st.next_serial();
        let tenant = Tenant {
            instance,
            params,
            cv: Arc::new(Condvar::new()),
            asleep: Sleep::Awake,
            phase: Phase::Idle,
            vstart: st.vtime,
            vfinish: st.vtime,
            fin_vtime: st.vtime,
            fin_grants: st.gpu.grants,
            window: Box::new(CapWindow::new(st.cap_window_ns)),
            last_charge: Duration::ZERO,
            busy: Duration::ZERO,
            commands: 0,
            grants: 0,
            capped: 0,
            bytes: 0,
            wait: Histogram::new(),
        };
        st.tenants.insert(id, tenant);
        debug!("sched: added {id}: {params:?}");
        Ok(())
    }

    /// Changes a tenant's weight, priority or cap; effective from the next
    /// decision, which is taken now if the GPU is free. A new weight applies
    /// to commands finished from now on.
    pub fn update_tenant(&self, id: TenantId, params: TenantParams) -> Result<(), SchedError> {
        params.validate()?;
        let mut st = self.shared.lock();
        let t = st
            .tenants
            .get_mut(&id)
            .ok_or(SchedError::UnknownTenant(id))?;
        t.params = params;
        debug!("sched: updated {id}: {params:?}");
        st.dispatch(Instant::now());
        unlock(st);
        Ok(())
    }

    /// Unregisters a tenant and returns its final figures. An `acquire` of
    /// it that is waiting returns [`SchedError::Removed`]; a grant it holds
    /// stays valid (the GPU is busy until it finishes) and is counted in
    /// the GPU's totals only.
    pub fn remove_tenant(&self, id: TenantId) -> Result<TenantStats, SchedError> {
        let mut st = self.shared.lock();
        let t = st
            .tenants
            .remove(&id)
            .ok_or(SchedError::UnknownTenant(id))?;
        t.cv.notify_all();
        let stats = st.tenant_stats(id, &t);
        debug!("sched: removed {id}");
        st.dispatch(Instant::now());
        unlock(st);
        Ok(stats)
    }

    /// Blocks until the policy lets `tenant` run one command, and returns
    /// the grant for it. Fails if the tenant is unknown, already waiting or
    /// holding a grant, removed while waiting, or the scheduler shuts down.
    pub fn acquire(&self, tenant: TenantId) -> Result<Grant, SchedError> {
        loop {
            if let Some(grant) = self.acquire_until(tenant, None)? {
                return Ok(grant);
            }
        }
    }

    /// Like [`Scheduler::acquire`], but gives up after `timeout`:
    /// `Ok(None)` then, and the tenant is no longer waiting.
    pub fn acquire_timeout(
        &self,
        tenant: TenantId,
        timeout: Duration,
    ) -> Result<Option<Grant>, SchedError> {
        // A deadline too far to represent is no deadline.
        self.acquire_until(tenant, Instant::now().checked_add(timeout))
    }

    /// Like [`Scheduler::acquire`], but gives up when `cancelled` says so:
    /// it is asked every `poll` while waiting, without the scheduler's
    /// lock held. Between two looks the tenant stays queued, so its place
    /// (its start tag, its arrival) is kept however long it waits. A
    /// tenant already queued by [`Grant::renew_or_queue`] waits from that
    /// place. `Ok(None)` when cancelled; the tenant then no longer waits.
    pub fn acquire_cancellable(
        &self,
        id: TenantId,
        poll: Duration,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Option<Grant>, SchedError> {
        let mut st = self.shared.lock();
        // Queued by renew_or_queue, and maybe granted since.
        let running_arrival = st
            .running
            .as_ref()
            .filter(|r| r.tenant == id)
            .map(|r| r.arrival);
        let queued = st.tenants.get(&id).and_then(|t| match t.phase {
            Phase::Waiting { arrival, .. } => Some((t.instance, arrival)),
            Phase::Holding => running_arrival.map(|a| (t.instance, a)),
            Phase::Idle => None,
        });
        let (instance, arrival) = match queued {
            Some(q) => q,
            None => {
                let arrival = Instant::now();
                let instance = st.enter(id, arrival)?;
                st.dispatch(arrival);
                (instance, arrival)
            }
        };
        loop {
            let deadline = Instant::now().checked_add(poll);
            let (back, result) =
                wait_for_grant_or(&self.shared, st, id, instance, arrival, deadline, false);
            match result {
                Ok(None) => {}
                done => {
                    unlock(back);
                    return done;
                }
            }
            unlock(back);
            let give_up = cancelled();
            st = self.shared.lock();
            if give_up {
                st.withdraw(id, instance, Instant::now());
                unlock(st);
                return Ok(None);
            }
        }
    }

    /// Takes a tenant queued by [`Grant::renew_or_queue`] out of the queue
    /// (it had no next command after all); if it was granted the GPU
    /// meanwhile, the GPU is given back uncharged. Nothing happens to a
    /// tenant that is not queued.
    pub fn dequeue(&self, id: TenantId) {
        let mut st = self.shared.lock();
        if let Some(instance) = st.tenants.get(&id).map(|t| t.instance) {
            st.withdraw(id, instance, Instant::now());
        }
        unlock(st);
    }

    fn acquire_until(
        &self,
        id: TenantId,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>, SchedError> {
        let mut st = self.shared.lock();
        let arrival = Instant::now();
        let instance = st.enter(id, arrival)?;
        st.dispatch(arrival);
        let (st, result) = wait_for_grant(&self.shared, st, id, instance, arrival, deadline);
        unlock(st);
        result
    }
}

/// Waits until waiting tenant `id` (of `instance`, waiting since
/// `arrival`) is granted the GPU, removed, the scheduler shuts down or
/// `deadline` passes.
fn wait_for_grant<'a>(
    shared: &'a Arc<Shared>,
    st: MutexGuard<'a, State>,
    id: TenantId,
    instance: u64,
    arrival: Instant,
    deadline: Option<Instant>,
) -> (MutexGuard<'a, State>, Result<Option<Grant>, SchedError>) {
    wait_for_grant_or(shared, st, id, instance, arrival, deadline, true)
}

/// [`wait_for_grant`]; at `deadline` the tenant stops waiting if `leave`,
/// else it stays queued (the caller comes back for it).
fn wait_for_grant_or<'a>(
    shared: &'a Arc<Shared>,
    mut st: MutexGuard<'a, State>,
    id: TenantId,
    instance: u64,
    arrival: Instant,
    deadline: Option<Instant>,
    leave: bool,
) -> (MutexGuard<'a, State>, Result<Option<Grant>, SchedError>) {
    let mut cv: Option<Arc<Condvar>> = None;
    let result = loop {
        let phase = match st.tenants.get(&id) {
            Some(t) if t.instance == instance => t.phase,
            _ => break Err(SchedError::Removed(id)),
        };
        match phase {
            Phase::Holding => match st.running.as_ref().filter(|r| r.tenant == id) {
                Some(run) => {
                    break Ok(Some(Grant {
                        shared: Arc::clone(shared),
                        tenant: id,
                        instance,
                        serial: run.serial,
                        granted_at: run.granted_at,
                        started: run.granted_at,
                        waited: run.granted_at.saturating_duration_since(arrival),
                        done: false,
                    }))
                }
                None => break Err(SchedError::Removed(id)),
            },
            Phase::Idle => break Err(SchedError::Removed(id)),
            Phase::Waiting { .. } => {}
        }
        let now = Instant::now();
        if !leave && !st.shutdown && deadline.is_some_and(|d| d <= now) {
            break Ok(None);
        }
        if st.shutdown || deadline.is_some_and(|d| d <= now) {
            if let Some(t) = st.tenants.get_mut(&id) {
                t.phase = Phase::Idle;
            }
            if st.shutdown {
                break Err(SchedError::Shutdown);
            }
            st.dispatch(now);
            break Ok(None);
        }
        let timer = st.timer.filter(|_| st.timekeeper == Some(id));
        let wake = match (timer, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Deliver a wake-up decided on this thread before sleeping.
        if let Some(other) = st.wake.take() {
            other.notify_one();
        }
        let Some(t) = st.tenants.get_mut(&id) else {
            break Err(SchedError::Removed(id));
        };
        t.asleep = wake.map_or(Sleep::Forever, Sleep::Until);
        let cv = cv.get_or_insert_with(|| Arc::clone(&t.cv));
        st = match wake {
            Some(at) => {
                cv.wait_timeout(st, at.saturating_duration_since(now))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => cv.wait(st).unwrap_or_else(PoisonError::into_inner),
        };
        if let Some(t) = st.tenants.get_mut(&id).filter(|t| t.instance == instance) {
            t.asleep = Sleep::Awake;
        }
        let now = Instant::now();
        if st.running.is_none() && st.timer.is_some_and(|t| t <= now) {
            st.dispatch(now);
        }
    };
    (st, result)
}

impl Scheduler {
    /// Adds `bytes` to a tenant's byte counter (data its commands moved,
    /// as the caller counts it).
    pub fn record_bytes(&self, id: TenantId, bytes: u64) -> Result<(), SchedError> {
        let mut st = self.shared.lock();
        let t = st
            .tenants
            .get_mut(&id)
            .ok_or(SchedError::UnknownTenant(id))?;
        t.bytes = t.bytes.saturating_add(bytes);
        Ok(())
    }

    /// A snapshot of the GPU's and every tenant's figures.
    pub fn stats(&self) -> SchedStats {
        let st = self.shared.lock();
        let uptime = st.epoch.elapsed();
        let utilization = if uptime.is_zero() {
            0.0
        } else {
            st.gpu.busy.as_secs_f64() / uptime.as_secs_f64()
        };
        SchedStats {
            policy: st.config.policy,
            gpu: GpuStats {
                uptime,
                busy: st.gpu.busy,
                held: st.gpu.held,
                utilization,
                recent_load: st.gpu.recent.load(Instant::now()),
                grants: st.gpu.grants,
                commands: st.gpu.commands,
                switches: st.gpu.switches,
                tenants: st.tenants.len(),
                waiting: st
                    .tenants
                    .values()
                    .filter(|t| matches!(t.phase, Phase::Waiting { .. }))
                    .count(),
            },
            tenants: st
                .tenants
                .iter()
                .map(|(&id, t)| st.tenant_stats(id, t))
                .collect(),
        }
    }

    /// Stops granting: every waiting and later `acquire` returns
    /// [`SchedError::Shutdown`]. An outstanding grant may still finish.
    pub fn shutdown(&self) {
        let mut st = self.shared.lock();
        if st.shutdown {
            return;
        }
        st.shutdown = true;
        st.timer = None;
        st.timekeeper = None;
        st.hold = None;
        for t in st.tenants.values() {
            t.cv.notify_all();
        }
        info!("sched: shut down");
    }

    /// Whether [`Scheduler::shutdown`] was called.
    pub fn is_shutdown(&self) -> bool {
        self.shared.lock().shutdown
    }
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("Scheduler")
            .field("policy", &st.config.policy)
            .field("tenants", &st.tenants.len())
            .field("shutdown", &st.shutdown)
            .finish()
    }
}

/// The right to run one command on the GPU, from [`Scheduler::acquire`].
///
/// Call [`Grant::finish`] with the device time the command consumed.
/// Dropping it unfinished charges the wall time since it was granted.
#[must_use = "a grant holds the GPU until it is finished or dropped"]
pub struct Grant {
    shared: Arc<Shared>,
    tenant: TenantId,
    instance: u64,
    serial: u64,
    granted_at: Instant,
    /// When the current command started: the grant, or its last renewal.
    started: Instant,
    waited: Duration,
    done: bool,
}

impl Grant {
    /// The tenant it was granted to.
    pub fn tenant(&self) -> TenantId {
        self.tenant
    }

    /// When it was granted.
    pub fn granted_at(&self) -> Instant {
        self.granted_at
    }

    /// How long the `acquire` waited for it.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Releases the GPU, charging `device_time` (what the command actually
    /// consumed on the device, as the backend measured it).
    pub fn finish(mut self, device_time: Duration) {
        self.release(device_time);
    }

    /// Finishes this command like [`Grant::finish`] and, in the same step,
    /// waits for the GPU for the tenant's next command, like
    /// [`Scheduler::acquire`]: for a worker that already has its next
    /// command at hand. Between the two the tenant never stops waiting, so
    /// the policy sees it as backlogged throughout, no grace hold is needed
    /// and, if the policy picks it again, the GPU passes to it without
    /// waking any other thread.
    pub fn finish_and_acquire(mut self, device_time: Duration) -> Result<Grant, SchedError> {
        self.done = true;
        let shared = Arc::clone(&self.shared);
        let id = self.tenant;
        let mut st = shared.lock();
        let now = Instant::now();
        st.end_grant(self.serial, device_time, now);
        let entered = match st.tenants.get(&id) {
            Some(t) if t.instance == self.instance => st.enter(id, now),
            _ => Err(SchedError::Removed(id)),
        };
        st.dispatch(now);
        let (st, result) = match entered {
            Ok(instance) => wait_for_grant(&shared, st, id, instance, now, None),
            Err(e) => (st, Err(e)),
        };
        unlock(st);
        result.and_then(|g| g.ok_or(SchedError::Removed(id)))
    }

    /// Charges the command that just ran, like [`Grant::finish`], and
    /// keeps the GPU for the tenant's next command if its turn allows
    /// ([`SchedConfig::turn`]; the round-robin slice): then it returns
    /// true, the grant stays valid for one more command and no other
    /// thread was involved (one uncontended lock). Otherwise the GPU is
    /// released as by `finish` and it returns false; the grant is then
    /// spent and the next command needs [`Scheduler::acquire`]. A tenant
    /// that keeps its turn but has no next command gives the GPU back with
    /// [`Grant::yield_turn`].
    ///
    /// [`SchedConfig::turn`]: crate::SchedConfig::turn
    pub fn renew(&mut self, device_time: Duration) -> bool {
        self.renew_with(device_time, false)
    }

    /// Like [`Grant::renew`], for a worker that has its next command: when
    /// the turn ends, the tenant is queued again in the same step, as if
    /// it had called [`Scheduler::acquire`] at once, so that a worker
    /// thread the host deschedules before it asks again does not lose its
    /// place. It then waits with [`Scheduler::acquire_cancellable`], or
    /// leaves the queue with [`Scheduler::dequeue`] if it finds it has no
    /// next command after all. Returns whether the turn goes on.
    pub fn renew_or_queue(&mut self, device_time: Duration) -> bool {
        self.renew_with(device_time, true)
    }

    /// [`Grant::renew`] (`requeue` false) or [`Grant::renew_or_queue`].
    fn renew_with(&mut self, device_time: Duration, requeue: bool) -> bool {
        if self.done {
            return false;
        }
        let mut st = self.shared.lock();
        let now = Instant::now();
        let keep = st.renew(self.serial, device_time, now, requeue);
        unlock(st);
        if keep {
            self.started = now;
        } else {
            self.done = true;
        }
        keep
    }

    /// Releases the GPU without charging anything (the last command was
    /// charged by [`Grant::renew`]): for a tenant whose turn goes on but
    /// that has nothing more to run.
    pub fn yield_turn(mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let mut st = self.shared.lock();
        let now = Instant::now();
        st.close_grant(self.serial, now);
        st.dispatch(now);
        unlock(st);
    }

    fn release(&mut self, device_time: Duration) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let mut st = self.shared.lock();
        st.release(self.serial, device_time, Instant::now());
        unlock(st);
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if !self.done {
            self.release(self.started.elapsed());
        }
    }
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("tenant", &self.tenant)
            .field("granted_at", &self.granted_at)
            .field("waited", &self.waited)
            .finish()
    }
}
