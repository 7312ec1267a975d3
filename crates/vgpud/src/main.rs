//! `vgpud`: serves virtual PCI functions to VMMs over vfio-user sockets.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use clap::{Parser, Subcommand};
use log::{error, info};
use vfio_user_server::sample::SampleDevice;
use vfio_user_server::Endpoint;
use vmm_sys_util::eventfd::EventFd;

use vgpud::api::ApiServer;
use vgpud::config::{self, Config};
use vgpud::daemon::Daemon;
use vgpud::metrics::MetricsServer;

#[derive(Parser)]
#[command(
    name = "vgpud",
    version,
    about = "Virtual GPU functions over vfio-user"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the daemon: start the GPUs and vGPUs of the configuration
    /// (the built-in one, two vGPUs on the software backend, without --config).
    Run {
        /// TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Directory for relative socket paths (overrides the configuration).
        #[arg(long)]
        runtime_dir: Option<PathBuf>,
        /// Management API socket (overrides `daemon.api_socket`).
        #[arg(long)]
        api_socket: Option<PathBuf>,
        /// Prometheus address, "" to disable (overrides `daemon.metrics_address`).
        #[arg(long)]
        metrics_address: Option<String>,
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
struct Overrides {
    runtime_dir: Option<PathBuf>,
    api_socket: Option<PathBuf>,
    metrics_address: Option<String>,
}

fn run(config: Option<PathBuf>, overrides: Overrides) -> Result<(), String> {
    let mut config = match config {
        Some(path) => Config::load(&path).map_err(|e| e.to_string())?,
        None => Config::builtin(),
    };
    if let Some(dir) = overrides.runtime_dir {
        config.daemon.runtime_dir = dir;
    }
    if let Some(path) = overrides.api_socket {
        config.daemon.api_socket = Some(path);
    }
    if let Some(addr) = overrides.metrics_address {
        config.daemon.metrics_address = addr;
    }
    let metrics_addr = config
        .metrics_addr()
        .map_err(|e| format!("metrics address: {e}"))?;
    let api_path = config.api_socket_path();
    if config
        .vgpus
        .iter()
        .any(|v| config.socket_path(v) == api_path)
    {
        return Err(format!(
            "{} is both the API socket and a vGPU's socket",
            api_path.display()
        ));
    }
    let stop = EventFd::new(0).map_err(|e| format!("cannot create stop event: {e}"))?;
    install_signal_stop(stop.try_clone().map_err(|e| e.to_string())?)?;
    let mut daemon = Daemon::new(config).map_err(|e| e.to_string())?;
    daemon.start_all().map_err(|e| e.to_string())?;
    for i in daemon.list() {
        info!("vGPU {} ready at {}", i.config.name, i.socket.display());
    }
    let daemon = Arc::new(Mutex::new(daemon));
    let mut api = ApiServer::start(&api_path, daemon.clone()).map_err(|e| e.to_string())?;
    let mut metrics = match metrics_addr {
        Some(addr) => Some(MetricsServer::start(addr, daemon.clone()).map_err(|e| e.to_string())?),
        None => None,
    };
    // Blocks until SIGTERM or SIGINT.
    let _ = stop.read();
    info!("shutting down");
    // No new requests from here; then the instances and their sockets go.
    api.stop();
    if let Some(m) = metrics.as_mut() {
        m.stop();
    }
    daemon
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .shutdown();
    info!("stopped");
    Ok(())
}

fn serve_testdev(socket: PathBuf) -> Result<(), String> {
    let device = SampleDevice::new().map_err(|e| format!("cannot create test device: {e}"))?;
    let endpoint = Endpoint::new("testdev", &socket, Box::new(device)).map_err(|e| {
        format!(
            "{e}: {}",
            std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_default()
        )
    })?;
    let stop = endpoint
        .stop_handle()
        .map_err(|e| format!("cannot create stop event: {e}"))?;
    install_signal_stop(stop)?;
    info!("testdev: listening on {}", socket.display());
    endpoint.run().map_err(|e| e.to_string())?;
    info!("testdev: stopped");
    Ok(())
}

/// Stops the endpoint on SIGTERM or SIGINT: a thread waits for the signals
/// (blocked in every thread) and writes the endpoint's stop eventfd.
fn install_signal_stop(stop: vmm_sys_util::eventfd::EventFd) -> Result<(), String> {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the calls only modify it and the
    // calling thread's mask, which threads spawned later inherit.
    let rc = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err("cannot block termination signals".into());
    }
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: `set` is initialised and `sig` is a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                info!("signal {sig} received; stopping");
            }
            let _ = stop.write(1);
        })
        .map_err(|e| format!("cannot start signal thread: {e}"))?;
    Ok(())
}

/// Raises the soft open-file limit to the hard one: each client holds its
/// socket, guest memory files and eventfds, and a busy host serves many.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write `lim`, a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                log::warn!("cannot raise the open-file limit");
            }
        }
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    raise_fd_limit();
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Run {
            config,
            runtime_dir,
            api_socket,
            metrics_address,
        } => run(
            config,
            Overrides {
                runtime_dir,
                api_socket,
                metrics_address,
            },
        ),
        Cmd::CheckConfig { config } => Config::load(&config)
            .map(|c| println!("{c:#?}"))
            .map_err(|e| e.to_string()),
        Cmd::DefaultConfig => {
            print!("{}", config::DEFAULT_CONFIG);
            Ok(())
        }
        Cmd::Testdev { socket } => serve_testdev(socket),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}
