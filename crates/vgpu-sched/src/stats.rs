//! Plain snapshot structures returned by [`Scheduler::stats`](crate::Scheduler::stats).

use std::time::Duration;

use crate::{Policy, TenantId, TenantParams};

/// A snapshot of one scheduler.
#[derive(Debug, Clone)]
pub struct SchedStats {
    /// The scheduler's policy.
    pub policy: Policy,
    /// The GPU as a whole.
    pub gpu: GpuStats,
    /// Registered tenants, by id.
    pub tenants: Vec<TenantStats>,
}

impl SchedStats {
    /// The tenant `id`, if registered.
    pub fn tenant(&self, id: TenantId) -> Option<&TenantStats> {
        self.tenants.iter().find(|t| t.id == id)
    }
}

/// Totals of one physical GPU since the scheduler was created.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuStats {
    /// Wall time since the scheduler was created.
    pub uptime: Duration,
    /// Device time reported by finished commands (including those of
    /// tenants removed since).
    pub busy: Duration,
    /// Wall time during which a grant was outstanding.
    pub held: Duration,
    /// `busy / uptime`.
    pub utilization: f64,
    /// The share of recent wall time the GPU was busy, 0..=1: device
    /// time decayed exponentially over [`crate::RECENT_LOAD_WINDOW`].
    pub recent_load: f64,
    /// Grants given.
    pub grants: u64,
    /// Grants finished (explicitly or by drop).
    pub commands: u64,
    /// Grants given to a tenant other than the previous grant's.
    pub switches: u64,
    /// Registered tenants.
    pub tenants: usize,
    /// Tenants waiting in `acquire` now.
    pub waiting: usize,
}

/// What a tenant is doing at the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantPhase {
    /// Neither waiting nor holding the GPU.
    Idle,
    /// Blocked in `acquire`.
    Waiting,
    /// Holds the grant.
    Holding,
}

/// Totals of one tenant since it was added.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantStats {
    /// The tenant.
    pub id: TenantId,
    /// Its current parameters.
    pub params: TenantParams,
    /// What it is doing now.
    pub phase: TenantPhase,
    /// Device time reported by its finished commands.
    pub busy: Duration,
    /// Its finished commands.
    pub commands: u64,
    /// Grants it was given.
    pub grants: u64,
    /// Acquires that its cap delayed.
    pub capped: u64,
    /// Bytes reported with [`Scheduler::record_bytes`](crate::Scheduler::record_bytes).
    pub bytes: u64,
    /// Time from `acquire` to grant.
    pub wait: WaitStats,
}

/// Distribution of queue wait times (from a bounded histogram).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WaitStats {
    /// Samples recorded (one per grant).
    pub samples: u64,
    /// Mean wait.
    pub mean: Duration,
    /// Median wait.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Longest wait.
    pub max: Duration,
}
