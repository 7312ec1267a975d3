//! The `vgpud` command line, as a library so that its manual pages and
//! shell completions are generated from the same definitions.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::confine::SeccompMode;

/// `vgpud`.
#[derive(Parser)]
#[command(
    name = "vgpud",
    version,
    about = "Virtual GPU functions over vfio-user"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Cmd,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Cmd {
    /// Run the daemon: start the GPUs and vGPUs of the configuration
    /// (the built-in one, two vGPUs on the software backend, without --config).
    Run {
        /// TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// What to take from the command line instead of the configuration.
        #[command(flatten)]
        overrides: Overrides,
    },
    /// Check a configuration file and print it as understood.
    CheckConfig {
        /// TOML configuration file.
        config: PathBuf,
    },
    /// Print the built-in configuration.
    DefaultConfig,
    /// Serve the built-in test device (a register BAR, a memory BAR, MSI-X).
    Testdev {
        /// UNIX socket to listen on.
        #[arg(long)]
        socket: PathBuf,
    },
}

/// Command-line overrides of the configuration's daemon settings.
#[derive(Args)]
pub struct Overrides {
    /// Directory for relative socket paths (overrides the configuration).
    #[arg(long)]
    pub runtime_dir: Option<PathBuf>,
    /// Management API socket (overrides `daemon.api_socket`).
    #[arg(long)]
    pub api_socket: Option<PathBuf>,
    /// Prometheus address, "" to disable (overrides `daemon.metrics_address`).
    #[arg(long)]
    pub metrics_address: Option<String>,
    /// Started as root: switch to this user once the sockets, runtime
    /// directory and devices are open (overrides `daemon.user`).
    #[arg(long)]
    pub user: Option<String>,
    /// Started as root without --user: keep running as root (without
    /// capabilities) instead of refusing.
    #[arg(long)]
    pub allow_root: bool,
    /// System calls outside the daemon's list: "strict" kills the
    /// process, "log" lets them through and the kernel logs them, "off"
    /// installs no filter (overrides `daemon.seccomp`).
    #[arg(long, value_name = "strict|log|off")]
    pub seccomp: Option<SeccompMode>,
}
