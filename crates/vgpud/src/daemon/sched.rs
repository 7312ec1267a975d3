//! The scheduler settings that come from the configuration (the turn
//! logic itself is `vgpu_sched::SchedGate`).

use std::time::Duration;

use vgpu_sched::{Policy as SchedPolicy, SchedConfig, TenantParams};

use crate::config::{GpuConfig, Policy, VgpuConfig};

/// The scheduler of a GPU: under every policy a tenant granted the GPU
/// keeps it for consecutive commands for up to one slice while others
/// wait (so a hand-over between tenants' threads is paid once per slice,
/// not once per command).
pub(super) fn sched_config(g: &GpuConfig) -> SchedConfig {
    let mut c = sched_config_policy(g);
    c.turn = Duration::from_micros(g.slice_us());
    c
}

fn sched_config_policy(g: &GpuConfig) -> SchedConfig {
    SchedConfig::new(match g.policy {
        Policy::RoundRobin => SchedPolicy::RoundRobin {
            slice: Duration::from_micros(g.slice_us()),
        },
        Policy::Priority => SchedPolicy::Priority {
            aging: Duration::from_micros(g.slice_us() * 10),
        },
        Policy::Fair => SchedPolicy::FairShare,
    })
}

pub(super) fn tenant_params(v: &VgpuConfig) -> TenantParams {
    TenantParams {
        weight: v.weight,
        priority: v.priority,
        cap: v.cap,
    }
}
