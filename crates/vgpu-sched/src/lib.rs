//! The host-side command scheduler: which vGPU (tenant) may run its next
//! command on a shared physical GPU.
//!
//! One [`Scheduler`] serves one physical GPU. Each tenant has one worker
//! thread that takes commands from its guest queues; before running a
//! command on its backend partition it asks for the GPU:
//!
//! ```
//! use std::time::Duration;
//! use vgpu_sched::{Policy, SchedConfig, Scheduler, TenantId, TenantParams};
//!
//! let sched = Scheduler::new(SchedConfig::new(Policy::FairShare)).unwrap();
//! let vm = TenantId(1);
//! sched.add_tenant(vm, TenantParams { weight: 2, ..TenantParams::default() }).unwrap();
//!
//! // In the tenant's worker, for every command:
//! let grant = sched.acquire(vm).unwrap(); // blocks until the policy picks `vm`
//! let device_time = Duration::from_micros(250); // run the command, measure it
//! grant.finish(device_time);
//!
//! let stats = sched.stats();
//! assert_eq!(stats.tenants[0].commands, 1);
//! ```
//!
//! This crate knows nothing of PCI, sockets, rings or the GPU API: a
//! command is "whatever runs between [`Scheduler::acquire`] and
//! [`Grant::finish`]", and its cost is the device time the backend reports.
//!
//! # Model
//!
//! - **The GPU is exclusive.** At most one [`Grant`] is outstanding per
//!   scheduler; a grant is one command, or with [`Grant::renew`] a turn of
//!   consecutive commands of one tenant. Preemption happens only at
//!   command boundaries: every `acquire`, every finish and every renewal
//!   is a decision.
//! - **Turns.** Handing the GPU to another tenant's thread costs a futex
//!   wake and a context switch (6-10 µs on a small two-core host), more
//!   than a short command. A worker that renews its grant after each
//!   command keeps the GPU while nobody else waits, and while others wait
//!   for up to [`SchedConfig::turn`] of device time (round robin: the
//!   rest of its slice), so that hand-overs are paid once per turn and a
//!   command within a turn costs one uncontended lock. A turn ends early
//!   when the tenant reaches its cap or, under priority, when a tenant a
//!   whole level above it waits; the worker gives the GPU back with
//!   [`Grant::yield_turn`] when it runs out of commands. Under fair share
//!   a turn is one grant: its commands are charged one by one into the
//!   tenant's finish tag, and tenants waiting meanwhile keep the start
//!   tags they were queued with, so shares hold at every weight.
//!   A worker that has its next command at hand renews with
//!   [`Grant::renew_or_queue`]: when the turn ends the tenant is queued
//!   again in the same step, so a worker thread the host deschedules
//!   before it asks again keeps its place; it then waits with
//!   [`Scheduler::acquire_cancellable`] (which also lets a reset or
//!   shutdown of the caller interrupt the wait without losing the place
//!   in between looks) or leaves with [`Scheduler::dequeue`].
//! - **Cost is consumed device time**, as reported to [`Grant::finish`] (a
//!   grant dropped without `finish` is charged the wall time it was held).
//!   Every policy charges `max(device_time, min_charge)`
//!   ([`SchedConfig::min_charge`]), so a flood of zero-time commands still
//!   pays something and cannot hold the GPU forever. Because shares are
//!   counted in device time rather than in commands, a tenant launching long
//!   kernels gets no more of the GPU than one launching short ones at the
//!   same weight.
//! - **The gap after a finish.** A worker calls `finish` and then `acquire`
//!   for its next command; in between it is not waiting, so a naive
//!   scheduler would hand the GPU to someone else at every finish and a
//!   saturating tenant could never run two commands in a row (strict
//!   priority and weighted shares would both degrade to alternation). After
//!   a finish the scheduler therefore considers the finisher as if it were
//!   still waiting (arrived at its finish time) for
//!   [`SchedConfig::grace`]: if the policy would pick it, the GPU is kept
//!   free for it until it comes back or the grace runs out. A tenant the
//!   policy would not pick gains nothing, so the hold never overrides a
//!   decision. With round robin this is exactly "keep the turn while the
//!   slice is not used up". A worker that already has its next command can
//!   close the gap altogether with [`Grant::finish_and_acquire`].
//! - **Caps** ([`TenantParams::cap`]) combine with every policy: a capped
//!   tenant is eligible only while its device time over the last
//!   [`SchedConfig::cap_window`], plus its previous command's charge as the
//!   estimate of the next, fits in `cap * window`; this holds even when the
//!   GPU is otherwise idle. Its `acquire` sleeps until enough of its history
//!   has left the window. The window is kept in 64 buckets (fixed memory),
//!   which errs on the strict side by at most 1/64 of the window.
//!
//! # Policies
//!
//! [`Policy::RoundRobin`]: the tenant whose turn it is runs consecutive
//! commands until it has consumed `slice` of device time, then the next
//! waiting tenant in tenant-id order gets a fresh slice.
//!
//! [`Policy::Priority`]: the waiting tenant with the highest effective
//! priority runs, `priority + waited / aging`, so a waiting tenant gains one
//! priority level per `aging` interval and nothing starves. Ties go to the
//! earlier arrival.
//!
//! [`Policy::FairShare`]: start-time fair queueing (SFQ) over device time.
//! Each tenant has a virtual finish tag `F`. When it starts waiting its
//! request gets the start tag `S = max(V, F)`, where `V` is the start tag
//! of the most recent grant; the waiting tenant with the smallest `S` runs,
//! and when its command finishes `F = S + charge / weight`. A tenant that
//! was idle re-enters at the current virtual time, so idleness cannot be
//! banked as credit, and one that keeps up never falls behind. One
//! refinement: a tenant that comes back before a second grant went to
//! others since its finish (a worker thread the host descheduled for a
//! moment, past the grace) is measured against the virtual time at its
//! finish, so it keeps its place; the credit this allows is bounded by one
//! other command.
//!
//! Why SFQ rather than stride scheduling or deficit round robin:
//!
//! - The cost of a command is known only after it has run. SFQ orders by
//!   *start* tags, which need no cost, and charges the actual cost into the
//!   next finish tag. Weighted fair queueing by finish tags would need the
//!   cost up front, and DRR compares a quantum with the size of the next
//!   request before running it (with post-hoc charging it degenerates into
//!   a deficit that goes negative, and its granularity is a whole round of
//!   quanta, so latency grows with the number of tenants).
//! - Stride scheduling is the same virtual-time idea (pass += cost/weight),
//!   but leaves the treatment of clients that leave and rejoin to ad-hoc
//!   rules; SFQ's `S = max(V, F)` states it precisely: no credit is banked
//!   while idle and no debt is forgiven while busy.
//! - SFQ's fairness bound is per command: over any interval in which two
//!   tenants are both backlogged, their normalised device times
//!   `W_i / w_i` differ by at most `l_i / w_i + l_j / w_j`, where `l` is the
//!   longest command of each; its decisions are `O(tenants)` with no
//!   rounds or quanta to tune.
//!
//! # Waking
//!
//! One mutex guards the state, and every tenant has its own condition
//! variable. A decision wakes exactly the tenant it picks (one futex wake
//! per hand-over), instead of a `notify_all` that would wake every waiting
//! worker to find out that one of them won; with 16 tenants on a two-core
//! host that herd would cost more than the decision. The wake is delivered
//! after the lock is released, so the woken thread does not run into it,
//! and only to a thread that actually sleeps: a tenant granted the GPU on
//! its own call (no one else was ahead) costs no system call at all.
//!
//! When the GPU is free but nobody may run yet (everyone waiting is over
//! its cap, or the GPU is held for a finisher's grace), one waiting worker
//! is the time keeper: it sleeps with a timeout until the next instant the
//! decision can change and then decides again. The keeper stays in that
//! role while it waits, and is only woken if it would otherwise sleep past
//! the new instant. Nothing polls or spins.
//!
//! Costs: an uncontended acquire and finish is two trips through the mutex
//! (a few hundred nanoseconds), a renewal within a turn one trip. A
//! hand-over to another tenant's thread is a futex wake and a context
//! switch, about 10 µs on a small virtual machine; without turns, fair
//! share and priority among equals may switch tenants at every command,
//! with turns (and round-robin slices) once per turn.
//!
//! # Accounting
//!
//! [`Scheduler::stats`] returns per tenant the device time consumed,
//! commands, grants, how often a cap delayed it, bytes reported with
//! [`Scheduler::record_bytes`], and the distribution of its queue wait
//! (from `acquire` to grant) in a fixed-size log-linear histogram
//! (p50/p90/p99/max within about 3%); per GPU the busy time and
//! utilization over wall time, the wall time grants were held, grants and
//! switches between tenants. Memory per tenant is fixed; nothing grows with
//! the number of commands.

#![warn(missing_docs)]

mod gate;
mod histogram;
mod sched;
mod stats;
#[cfg(test)]
mod tests;
mod window;

use std::fmt;
use std::time::Duration;

pub use gate::{CommandGate, SchedGate};
pub use sched::{Grant, Scheduler, RECENT_LOAD_WINDOW};
pub use stats::{GpuStats, SchedStats, TenantPhase, TenantStats, WaitStats};

/// Identifies a tenant (a vGPU) within one scheduler; chosen by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantId(pub u32);

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tenant {}", self.0)
    }
}

/// How the scheduler picks the next tenant; one per physical GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Time-slice round robin: the tenant whose turn it is keeps the GPU
    /// for consecutive commands until it has consumed `slice` of device
    /// time (or stops asking for longer than [`SchedConfig::grace`]); then
    /// the next waiting tenant in tenant-id order gets a fresh slice.
    RoundRobin {
        /// Device time per turn, e.g. 2 ms.
        slice: Duration,
    },
    /// Strict priority with aging: the waiting tenant with the highest
    /// `priority + waited / aging` runs; ties go to the earlier arrival.
    Priority {
        /// Waiting this long raises a tenant's effective priority by one.
        aging: Duration,
    },
    /// Weighted fair share of device time by start-time fair queueing
    /// (see the crate documentation).
    FairShare,
}

/// Configuration of one scheduler (one physical GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedConfig {
    /// The policy.
    pub policy: Policy,
    /// How long the GPU is kept free for a tenant that just finished a
    /// command and that the policy would pick again (its slice is not used
    /// up, its priority or start tag still wins). Zero disables the hold.
    /// At most one second.
    pub grace: Duration,
    /// Sliding window over which caps are enforced. At least 1 ms.
    pub cap_window: Duration,
    /// Least device time a command is charged, however short it reports
    /// (policy and caps only; statistics report the real figure). Non-zero.
    pub min_charge: Duration,
    /// Under fair share and priority: device time a tenant granted the
    /// GPU may spend on consecutive commands through [`Grant::renew`]
    /// while others wait, before the policy decides again (round robin
    /// uses its slice instead). Zero: a new decision after every command.
    /// At most one second.
    pub turn: Duration,
}

impl SchedConfig {
    /// `policy` with the default grace (100 µs), cap window (100 ms),
    /// minimum charge (1 µs) and no turn.
    pub fn new(policy: Policy) -> Self {
        SchedConfig {
            policy,
            grace: Duration::from_micros(100),
            cap_window: Duration::from_millis(100),
            min_charge: Duration::from_micros(1),
            turn: Duration::ZERO,
        }
    }

    fn validate(&self) -> Result<(), SchedError> {
        let bad = |what: &str| Err(SchedError::InvalidConfig(what.to_string()));
        match self.policy {
            Policy::RoundRobin { slice } if slice.is_zero() => {
                return bad("round-robin slice must be non-zero")
            }
            Policy::Priority { aging } if aging.is_zero() => {
                return bad("priority aging interval must be non-zero")
            }
            _ => {}
        }
        if self.grace > MAX_GRACE {
            return bad("grace must be at most 1 s");
        }
        if self.turn > MAX_GRACE {
            return bad("turn must be at most 1 s");
        }
        if self.cap_window < MIN_CAP_WINDOW || self.cap_window > MAX_CAP_WINDOW {
            return bad("cap window must be between 1 ms and 1 h");
        }
        if self.min_charge.is_zero() {
            return bad("minimum charge must be non-zero");
        }
        Ok(())
    }
}

impl Default for SchedConfig {
    /// Fair share with the defaults of [`SchedConfig::new`].
    fn default() -> Self {
        SchedConfig::new(Policy::FairShare)
    }
}

const MAX_GRACE: Duration = Duration::from_secs(1);
const MIN_CAP_WINDOW: Duration = Duration::from_millis(1);
const MAX_CAP_WINDOW: Duration = Duration::from_secs(3600);

/// Largest accepted [`TenantParams::weight`].
pub const MAX_WEIGHT: u32 = 1 << 20;

/// A tenant's scheduling parameters; changeable live with
/// [`Scheduler::update_tenant`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantParams {
    /// Share of the GPU under [`Policy::FairShare`], relative to the other
    /// tenants' weights: `1..=MAX_WEIGHT`.
    pub weight: u32,
    /// Base priority under [`Policy::Priority`]; higher runs first.
    pub priority: i32,
    /// Fixed share: at most this fraction of GPU time over the cap window,
    /// enforced even when the GPU is otherwise idle. `None` or `Some(1.0)`:
    /// uncapped. Must be finite and in `(0, 1]`.
    pub cap: Option<f64>,
}

impl Default for TenantParams {
    /// Weight 1, priority 0, no cap.
    fn default() -> Self {
        TenantParams {
            weight: 1,
            priority: 0,
            cap: None,
        }
    }
}

impl TenantParams {
    fn validate(&self) -> Result<(), SchedError> {
        if self.weight == 0 || self.weight > MAX_WEIGHT {
            return Err(SchedError::InvalidWeight(self.weight));
        }
        if let Some(cap) = self.cap {
            // NaN fails both comparisons.
            if !(cap > 0.0 && cap <= 1.0) {
                return Err(SchedError::InvalidCap(cap));
            }
        }
        Ok(())
    }
}

/// Why a scheduler call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SchedError {
    /// No tenant with this id.
    #[error("{0} is not registered")]
    UnknownTenant(TenantId),
    /// A tenant with this id is already registered.
    #[error("{0} is already registered")]
    DuplicateTenant(TenantId),
    /// The tenant was removed while its `acquire` was waiting.
    #[error("{0} was removed")]
    Removed(TenantId),
    /// The tenant already has an `acquire` in progress or holds a grant.
    #[error("{0} already waits for or holds the GPU")]
    Busy(TenantId),
    /// The scheduler was shut down.
    #[error("the scheduler is shut down")]
    Shutdown,
    /// A weight of zero or above [`MAX_WEIGHT`].
    #[error("invalid weight {0}: must be 1..={MAX_WEIGHT}")]
    InvalidWeight(u32),
    /// A cap that is not a finite fraction in `(0, 1]`.
    #[error("invalid cap {0}: must be in (0, 1]")]
    InvalidCap(f64),
    /// An invalid [`SchedConfig`].
    #[error("invalid scheduler configuration: {0}")]
    InvalidConfig(String),
}
