//! The turn logic between a tenant's command loop and its [`Scheduler`]:
//! the [`CommandGate`] a command loop asks before each command, and
//! [`SchedGate`], which answers from the scheduler.

use std::sync::Mutex;
use std::time::Duration;

use crate::{Grant, Scheduler, TenantId};

/// Lets a host scheduler decide when a tenant's next command may run on
/// the shared GPU (preemption at command boundaries). Its caller knows no
/// scheduler: it asks before each command and reports each one's cost.
pub trait CommandGate: Send + Sync {
    /// Blocks until one command may run. `cancelled` is polled while
    /// waiting (a reset or queue change drops the command). Returns false
    /// when the command must not run.
    fn enter(&self, cancelled: &dyn Fn() -> bool) -> bool;
    /// The command that entered finished after `device_time`, moving
    /// `bytes` between guest or window memory and the device.
    fn leave(&self, device_time: Duration, bytes: u64);
    /// The worker has run out of commands for now (or stops): a gate that
    /// keeps the GPU for a tenant between its commands gives it back.
    fn idle(&self) {}
    /// Whether the next command may run now without waiting: while it
    /// may, the worker starts the next queued run before the one in
    /// flight is finished (a gate that cannot say keeps one in flight).
    fn holding(&self) -> bool {
        false
    }
}

/// Lets a tenant's commands onto its GPU when the scheduler says so,
/// keeping the GPU for the tenant's consecutive commands while its turn
/// lasts.
pub struct SchedGate {
    sched: Scheduler,
    tenant: TenantId,
    grant: Mutex<Slot>,
    /// Device time of commands that finished after our turn ended (a
    /// run started ahead while the turn held): charged with the first
    /// command of the next turn.
    owed: Mutex<Duration>,
}

/// Where a gate's tenant stands between commands.
enum Slot {
    /// Not queued and not holding the GPU.
    Free,
    /// Within a turn: the GPU is ours for the next command.
    Holding(Grant),
    /// The turn ended and the scheduler queued us for the next one.
    Queued,
}

impl SchedGate {
    /// The gate of `tenant`, already added to `sched`.
    pub fn new(sched: Scheduler, tenant: TenantId) -> Self {
        SchedGate {
            sched,
            tenant,
            grant: Mutex::new(Slot::Free),
            owed: Mutex::new(Duration::ZERO),
        }
    }
}

impl CommandGate for SchedGate {
    fn enter(&self, cancelled: &dyn Fn() -> bool) -> bool {
        let mut slot = self.grant.lock().unwrap_or_else(|e| e.into_inner());
        match &*slot {
            // Within a turn the GPU is still ours.
            Slot::Holding(_) => return true,
            // Queued since our last turn ended, or not at all: either way
            // acquire_cancellable waits from our place. A reset of this
            // vGPU is noticed within 5 ms however long we wait.
            Slot::Queued | Slot::Free => {}
        }
        *slot = Slot::Free;
        drop(slot);
        match self
            .sched
            .acquire_cancellable(self.tenant, Duration::from_millis(5), cancelled)
        {
            Ok(Some(g)) => {
                *self.grant.lock().unwrap_or_else(|e| e.into_inner()) = Slot::Holding(g);
                true
            }
            Ok(None) => false,
            Err(e) => {
                // Removed or shut down: make sure nothing stays held.
                log::debug!("vGPU tenant {}: {e}", self.tenant.0);
                self.sched.dequeue(self.tenant);
                false
            }
        }
    }

    fn leave(&self, device_time: Duration, bytes: u64) {
        {
            let mut slot = self.grant.lock().unwrap_or_else(|e| e.into_inner());
            // Keeps the GPU for the next command while the turn lasts;
            // when it ends we are queued for the next turn at once (the
            // worker calls `idle` if there is no next command).
            let mut owed = self.owed.lock().unwrap_or_else(|e| e.into_inner());
            if let Slot::Holding(g) = &mut *slot {
                if !g.renew_or_queue(device_time + std::mem::take(&mut *owed)) {
                    *slot = Slot::Queued;
                }
            } else {
                *owed += device_time;
            }
        }
        if bytes > 0 {
            let _ = self.sched.record_bytes(self.tenant, bytes);
        }
    }

    fn holding(&self) -> bool {
        matches!(
            *self.grant.lock().unwrap_or_else(|e| e.into_inner()),
            Slot::Holding(_)
        )
    }

    fn idle(&self) {
        let slot = std::mem::replace(
            &mut *self.grant.lock().unwrap_or_else(|e| e.into_inner()),
            Slot::Free,
        );
        match slot {
            Slot::Holding(g) => g.yield_turn(),
            Slot::Queued => self.sched.dequeue(self.tenant),
            Slot::Free => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SchedConfig, TenantParams};

    #[test]
    fn test_time_finished_outside_a_turn_is_charged_with_the_next() {
        let sched = Scheduler::new(SchedConfig::default()).unwrap();
        let tenant = TenantId(1);
        sched.add_tenant(tenant, TenantParams::default()).unwrap();
        let gate = SchedGate::new(sched.clone(), tenant);
        // A run that finished once the turn was over (here: before any).
        gate.leave(Duration::from_millis(5), 0);
        assert!(!gate.holding());
        let busy = |s: &Scheduler| s.stats().tenant(tenant).unwrap().busy;
        assert_eq!(busy(&sched), Duration::ZERO);
        assert!(gate.enter(&|| false));
        assert!(gate.holding());
        gate.leave(Duration::from_millis(1), 0);
        assert_eq!(busy(&sched), Duration::from_millis(6));
        gate.idle();
        assert!(!gate.holding());
    }
}
