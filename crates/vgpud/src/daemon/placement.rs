//! Which GPU a vGPU with `gpu = "auto"` goes on: the daemon's
//! [`Placement`] policy over what each GPU has given out and how busy it
//! has been lately.

use crate::config::{Placement, Size};

/// What placement knows of one GPU.
#[derive(Clone, Debug)]
pub struct GpuLoad {
    /// The GPU's name.
    pub name: String,
    /// Its memory, bytes.
    pub memory_total: u64,
    /// The quotas of its vGPUs, bytes.
    pub memory_given: u64,
    /// How many vGPUs it has.
    pub vgpus: usize,
    /// Its recent load, 0..=1 (`GpuStats::recent_load`).
    pub recent_load: f64,
}

impl GpuLoad {
    fn free(&self) -> u64 {
        self.memory_total.saturating_sub(self.memory_given)
    }

    /// Lower is emptier: the recent load and the share of its memory
    /// given out count alike.
    fn fullness(&self) -> f64 {
        let given = if self.memory_total == 0 {
            1.0
        } else {
            self.memory_given as f64 / self.memory_total as f64
        };
        self.recent_load + given
    }

    fn describe(&self) -> String {
        format!(
            "recent load {:.2}, {} of {} not given out, {} vGPU(s)",
            self.recent_load,
            Size(self.free()),
            Size(self.memory_total),
            self.vgpus
        )
    }
}

/// The GPUs in `gpus` (configuration order) with room for `memory`, best
/// first under `policy`, each with why it was picked; and why each of the
/// others was not. The backend may still refuse the first (compute
/// units, its own pool): the caller tries the next.
pub fn rank(
    policy: Placement,
    gpus: &[GpuLoad],
    memory: u64,
) -> (Vec<(String, String)>, Vec<String>) {
    let mut full = Vec::new();
    let mut fit: Vec<&GpuLoad> = Vec::new();
    for g in gpus {
        if g.free() < memory {
            full.push(format!("{}: {}", g.name, g.describe()));
        } else {
            fit.push(g);
        }
    }
    let name = match policy {
        Placement::Spread => {
            // Stable: equal GPUs keep the configuration's order.
            fit.sort_by(|a, b| {
                a.fullness()
                    .total_cmp(&b.fullness())
                    .then(a.vgpus.cmp(&b.vgpus))
            });
            "spread"
        }
        Placement::Pack => "pack",
    };
    let ranked = fit
        .into_iter()
        .map(|g| (g.name.clone(), format!("{name}: {}", g.describe())))
        .collect();
    (ranked, full)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn gpu(name: &str, given: u64, vgpus: usize, load: f64) -> GpuLoad {
        GpuLoad {
            name: name.into(),
            memory_total: 4 * GIB,
            memory_given: given,
            vgpus,
            recent_load: load,
        }
    }

    fn order(policy: Placement, gpus: &[GpuLoad], memory: u64) -> Vec<String> {
        rank(policy, gpus, memory)
            .0
            .into_iter()
            .map(|r| r.0)
            .collect()
    }

    #[test]
    fn spread_prefers_the_idle_and_empty_and_keeps_order_on_ties() {
        let gpus = [
            gpu("a", GIB, 1, 0.0),
            gpu("b", 0, 0, 0.0),
            gpu("c", 0, 0, 0.5),
            gpu("d", 0, 0, 0.0),
        ];
        assert_eq!(order(Placement::Spread, &gpus, GIB), ["b", "d", "a", "c"]);
        // A busy GPU loses to one with more given out but idle.
        let gpus = [gpu("a", GIB, 1, 0.6), gpu("b", 2 * GIB, 2, 0.0)];
        assert_eq!(order(Placement::Spread, &gpus, GIB), ["b", "a"]);
        // Same fullness: fewer vGPUs first.
        let gpus = [gpu("a", GIB, 4, 0.0), gpu("b", GIB, 1, 0.0)];
        assert_eq!(order(Placement::Spread, &gpus, GIB), ["b", "a"]);
    }

    #[test]
    fn pack_fills_in_order_and_full_gpus_say_why() {
        let gpus = [
            gpu("a", 4 * GIB, 4, 0.0),
            gpu("b", 3 * GIB, 3, 0.9),
            gpu("c", 0, 0, 0.0),
        ];
        let (ranked, full) = rank(Placement::Pack, &gpus, GIB);
        let names: Vec<&str> = ranked.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(names, ["b", "c"]);
        assert!(
            ranked[0]
                .1
                .starts_with("pack: recent load 0.90, 1GiB of 4GiB"),
            "{}",
            ranked[0].1
        );
        assert_eq!(
            full,
            ["a: recent load 0.00, 0 of 4GiB not given out, 4 vGPU(s)"]
        );
        assert!(order(Placement::Pack, &gpus, 5 * GIB).is_empty());
    }
}
