//! The `vgpuctl` command line, as a library so that its manual pages and
//! shell completions are generated from the same definitions.

use std::path::PathBuf;

use clap::{ArgGroup, Parser, Subcommand};

/// The API socket of the built-in configuration (runtime_dir /tmp/vgpud).
pub const DEFAULT_API: &str = "/tmp/vgpud/api.sock";

/// `vgpuctl`.
#[derive(Parser)]
#[command(name = "vgpuctl", version, about = "Manage vGPUs of a running vgpud")]
pub struct Cli {
    /// The daemon's API socket.
    #[arg(long, global = true, default_value = DEFAULT_API)]
    pub api: PathBuf,
    /// Print the daemon's JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Cmd,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Cmd {
    /// List the vGPUs.
    List,
    /// Show one vGPU: configuration and figures.
    Show {
        /// vGPU name.
        name: String,
    },
    /// Create and start a vGPU.
    Create {
        /// Name (letters, digits, '-', '_').
        #[arg(long)]
        name: String,
        /// The GPU to carve it from; "auto" (the default) lets the daemon
        /// pick one by its placement policy.
        #[arg(long, default_value = "auto")]
        gpu: String,
        /// vfio-user socket; relative paths are under the daemon's runtime_dir.
        #[arg(long)]
        socket: PathBuf,
        /// Device memory quota: bytes or 256MiB, 4GiB, ...
        #[arg(long)]
        memory: String,
        /// Compute units.
        #[arg(long)]
        compute_units: u32,
        /// Weight under the fair policy (default 1).
        #[arg(long)]
        weight: Option<u32>,
        /// Priority under the priority policy (default 0).
        #[arg(long, allow_negative_numbers = true)]
        priority: Option<i32>,
        /// Fixed share of GPU time, 0 < cap <= 1.
        #[arg(long)]
        cap: Option<f64>,
        /// Queues offered to the guest (default 4).
        #[arg(long)]
        queues: Option<u32>,
    },
    /// Stop a vGPU if it runs, and free its partition.
    Destroy {
        /// vGPU name.
        name: String,
    },
    /// Power a vGPU off: its VMM is disconnected, its device memory freed
    /// and its socket removed; its configuration and reservation stay.
    Stop {
        /// vGPU name.
        name: String,
    },
    /// Start a stopped vGPU again on the same socket.
    Start {
        /// vGPU name.
        name: String,
    },
    /// Suspend a running vGPU: it stops at a command boundary (its
    /// guest's work waits, nothing fails), its device memory moves out and
    /// its quota is free on the GPU until it is resumed.
    Suspend {
        /// vGPU name.
        name: String,
    },
    /// Resume a suspended vGPU: its memory comes back at the same device
    /// addresses and its guest's work goes on; refused while its GPU has
    /// not got its quota free.
    Resume {
        /// vGPU name.
        name: String,
    },
    /// Change a vGPU's memory quota or scheduling parameters while it runs.
    #[command(group(ArgGroup::new("change").required(true).multiple(true)))]
    Set {
        /// vGPU name.
        name: String,
        /// New device memory quota (bytes or 256MiB, 4GiB, ...): growing
        /// takes effect at once, shrinking below what the guest holds is
        /// refused; the guest sees the new size without a reboot.
        #[arg(long, group = "change")]
        memory: Option<String>,
        /// Weight under the fair policy.
        #[arg(long, group = "change")]
        weight: Option<u32>,
        /// Priority under the priority policy.
        #[arg(long, group = "change", allow_negative_numbers = true)]
        priority: Option<i32>,
        /// Fixed share of GPU time (0 < cap <= 1), or "none".
        #[arg(long, group = "change", value_parser = parse_cap)]
        cap: Option<Cap>,
    },
    /// Figures of every GPU and vGPU.
    Stats,
    /// The GPUs: capacity and what is allocated.
    Gpus,
    /// A live view of the vGPUs, refreshed every interval.
    Top {
        /// Print one frame and exit.
        #[arg(long)]
        once: bool,
        /// Seconds between frames (and over which rates are measured).
        #[arg(long, default_value_t = 1.0, value_parser = parse_interval)]
        interval: f64,
    },
}

/// A cap to set: a fraction, or none.
#[derive(Clone, Copy, Debug)]
pub struct Cap(pub Option<f64>);

fn parse_cap(s: &str) -> Result<Cap, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Cap(None));
    }
    s.parse::<f64>()
        .map(|c| Cap(Some(c)))
        .map_err(|_| format!("{s:?} is neither a fraction nor \"none\""))
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.05..=3600.0).contains(&x) => Ok(x),
        _ => Err("give seconds between 0.05 and 3600".into()),
    }
}
