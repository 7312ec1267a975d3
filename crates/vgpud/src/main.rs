//! `vgpud`: serves virtual PCI functions to VMMs over vfio-user sockets.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use clap::Parser;
use log::{error, info};
use vfio_user_server::sample::SampleDevice;
use vfio_user_server::Endpoint;
use vmm_sys_util::eventfd::EventFd;

use vgpud::api::ApiServer;
use vgpud::cli::{Cli, Cmd, Overrides};
use vgpud::config::{self, BackendKind, Config, Isolation};
use vgpud::confine::{self, Account, Role, SeccompMode};
use vgpud::daemon::Daemon;
use vgpud::metrics::MetricsServer;

/// Who the daemon runs as: checks the start against `config` and looks
/// the user up (before any filter: the lookup may read files and talk to
/// NSS services). `Some` when privileges are to be dropped.
fn account(config: &Config) -> Result<Option<Account>, String> {
    let d = &config.daemon;
    let account = match &d.user {
        Some(name) => Some(confine::lookup_user(name).map_err(|e| e.to_string())?),
        None => None,
    };
    match account {
        Some(a) if confine::is_root() => Ok(Some(a)),
        Some(a) => {
            // SAFETY: getuid cannot fail.
            let uid = unsafe { libc::getuid() };
            if a.uid == uid {
                Ok(None)
            } else {
                Err(format!(
                    "cannot become user {} (uid {}) without being started as root",
                    a.name, a.uid
                ))
            }
        }
        None if confine::is_root() && !d.allow_root => Err(
            "refusing to run as root: set daemon.user (or --user NAME) to drop privileges \
             after startup, or allow_root (--allow-root) to stay root"
                .into(),
        ),
        None => Ok(None),
    }
}

/// Blocks SIGTERM and SIGINT in the calling thread and in every thread
/// started after it, so that only [`spawn_signal_stop`]'s thread takes them.
fn block_stop_signals() -> Result<libc::sigset_t, String> {
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
    Ok(set)
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
    if overrides.user.is_some() {
        config.daemon.user = overrides.user;
    }
    config.daemon.allow_root |= overrides.allow_root;
    if let Some(mode) = overrides.seccomp {
        config.daemon.seccomp = mode;
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
    let account = account(&config)?;
    if let Some(name) = &config.daemon.socket_group {
        let gid = confine::lookup_group(name).map_err(|e| format!("daemon.socket_group: {e}"))?;
        if !confine::in_group(gid, account.as_ref()) {
            return Err(format!(
                "daemon.socket_group: the daemon's user is not in group {name} (gid {gid}), \
                 so it cannot give it the sockets"
            ));
        }
        config.daemon.socket_gid = Some(gid);
    }
    let seccomp = config.daemon.seccomp;
    // Partition hosts (isolation "process") drive their GPUs; the daemon
    // needs the driver's calls only for a GPU it drives itself.
    let role = if config
        .gpus
        .iter()
        .any(|g| g.backend == BackendKind::Cuda && g.isolation() == Isolation::Thread)
    {
        Role::GpuHost
    } else {
        Role::Daemon
    };
    // Sockets and directories the daemon creates are never open to
    // others, not even between bind and chmod.
    // SAFETY: umask only sets the process's file creation mask.
    unsafe { libc::umask(0o027) };
    let signals = block_stop_signals()?;

    // What needs root: the runtime directory, a privileged metrics port,
    // device nodes (opened by the backends).
    if let Some(a) = &account {
        confine::prepare_runtime_dir(&config.daemon.runtime_dir, a).map_err(|e| e.to_string())?;
    }
    let metrics_listener = match metrics_addr {
        Some(addr) => Some(MetricsServer::bind(addr).map_err(|e| e.to_string())?),
        None => None,
    };
    // The backends start partition host launchers, which switch to this
    // account themselves: they are not the daemon's threads.
    config.daemon.account = account.clone();
    let mut daemon = Daemon::new(config).map_err(|e| e.to_string())?;
    match &account {
        Some(a) => {
            confine::drop_privileges(a).map_err(|e| e.to_string())?;
            info!("running as user {} (uid {}, gid {})", a.name, a.uid, a.gid);
        }
        None => confine::clear_capabilities().map_err(|e| e.to_string())?,
    }
    confine::install(role, seccomp).map_err(|e| e.to_string())?;
    info!("seccomp {seccomp:?} for {role:?}; no new privileges");
    let vgpu_role = Role::Vgpu {
        driver: role == Role::GpuHost,
    };
    daemon.set_serving_thread_hook(Arc::new(move || {
        confine::install(vgpu_role, seccomp).map_err(|e| e.to_string())
    }));

    let stop = EventFd::new(0).map_err(|e| format!("cannot create stop event: {e}"))?;
    spawn_signal_stop(
        signals,
        stop.try_clone().map_err(|e| e.to_string())?,
        Some(seccomp),
    )?;
    daemon.start_all().map_err(|e| e.to_string())?;
    for i in daemon.list() {
        info!("vGPU {} ready at {}", i.config.name, i.socket.display());
    }
    let daemon = Arc::new(Mutex::new(daemon));
    let mut api = ApiServer::start(&api_path, daemon.clone()).map_err(|e| e.to_string())?;
    let mut metrics = match metrics_listener {
        Some(listener) => Some(serve_metrics(listener, daemon.clone(), seccomp)?),
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

/// Starts the metrics server from a thread that first narrows itself to
/// [`Role::Metrics`], so the server's threads, which it starts, are held
/// to that role.
fn serve_metrics(
    listener: std::net::TcpListener,
    daemon: Arc<Mutex<Daemon>>,
    seccomp: SeccompMode,
) -> Result<MetricsServer, String> {
    std::thread::Builder::new()
        .name("metrics-start".into())
        .spawn(move || {
            confine::install(Role::Metrics, seccomp).map_err(|e| e.to_string())?;
            MetricsServer::serve(listener, daemon).map_err(|e| e.to_string())
        })
        .map_err(|e| format!("cannot start the metrics server: {e}"))?
        .join()
        .map_err(|_| "the metrics server's start panicked".to_string())?
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
    let signals = block_stop_signals()?;
    spawn_signal_stop(signals, stop, None)?;
    info!("testdev: listening on {}", socket.display());
    endpoint.run().map_err(|e| e.to_string())?;
    info!("testdev: stopped");
    Ok(())
}

/// Writes `stop` on SIGTERM or SIGINT (blocked by [`block_stop_signals`]
/// in every thread): a thread waits for them, confined to
/// [`Role::Signals`] under `seccomp` when given.
fn spawn_signal_stop(
    set: libc::sigset_t,
    stop: EventFd,
    seccomp: Option<SeccompMode>,
) -> Result<(), String> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(mode) = seccomp {
                let confined = confine::install(Role::Signals, mode).map_err(|e| e.to_string());
                let failed = confined.is_err();
                let _ = ready_tx.send(confined);
                if failed {
                    return;
                }
            } else {
                let _ = ready_tx.send(Ok(()));
            }
            let mut sig = 0;
            // SAFETY: `set` is initialised and `sig` is a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                info!("signal {sig} received; stopping");
            }
            let _ = stop.write(1);
        })
        .map_err(|e| format!("cannot start signal thread: {e}"))?;
    ready_rx
        .recv()
        .map_err(|_| "the signal thread ended at start".to_string())?
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
        Cmd::Run { config, overrides } => run(config, overrides),
        Cmd::CheckConfig { config } => std::fs::read_to_string(&config)
            .map_err(|e| format!("cannot read {}: {e}", config.display()))
            .and_then(|text| {
                let c = Config::parse(&text, &config.display().to_string())
                    .map_err(|e| e.to_string())?;
                print!("{}", c.to_annotated_toml(&text));
                Ok(())
            }),
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
