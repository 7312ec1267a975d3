//! The management API: HTTP/1.1 and JSON on a UNIX socket (mode 0600, so
//! whoever may open the socket may manage the daemon). `docs/api.md`
//! describes the endpoints.

pub mod http;

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use log::info;
use serde::{Deserialize, Deserializer};
use vgpu_api as json;
use vgpu_sys::socket::ClearError;

use crate::config::{BackendKind, Policy, Size, VgpuConfig};
use crate::daemon::{Daemon, DaemonError, GpuInfo, GpuStats, InstanceInfo, InstanceStats};
use http::{Request, Response, Server};

/// Prefix of every endpoint.
pub const API_PREFIX: &str = "/api/v1";

/// The management API server: listens on its socket until stopped or
/// dropped, then removes the socket.
pub struct ApiServer {
    path: PathBuf,
    /// Device and inode of our socket, so that only ours is removed.
    id: Option<(u64, u64)>,
    server: Server,
}

fn with_context(e: io::Error, what: String) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Removes a socket left by a process that died; refuses a live one and
/// anything that is not a socket.
fn clear_stale_socket(path: &Path) -> io::Result<()> {
    vgpu_sys::socket::clear_stale(path).map_err(|e| match e {
        ClearError::InUse => io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{} is in use (is another vgpud running?)", path.display()),
        ),
        ClearError::NotSocket => io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        ),
        ClearError::Remove(e) => e,
    })
}

/// Binds `path` with mode 0600 from the start: the socket is bound in a
/// fresh private (0700) directory, restricted, then linked to `path`, so
/// no one can connect through looser permissions in between. Refuses to
/// replace anything at `path` but a stale socket.
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.exists() {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| with_context(e, format!("cannot create {}", parent.display())))?;
    }
    clear_stale_socket(path)?;
    let tmp_dir = parent.join(format!(
        ".api-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = tmp_dir.join("s");
    // Left over by an earlier process that had our pid.
    let _ = fs::remove_file(&tmp);
    let _ = fs::remove_dir(&tmp_dir);
    DirBuilder::new()
        .mode(0o700)
        .create(&tmp_dir)
        .map_err(|e| with_context(e, format!("cannot create {}", tmp_dir.display())))?;
    let bound = (|| {
        let listener = UnixListener::bind(&tmp)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600))?;
        fs::hard_link(&tmp, path)?;
        Ok(listener)
    })();
    let _ = fs::remove_file(&tmp);
    let _ = fs::remove_dir(&tmp_dir);
    bound.map_err(|e| with_context(e, format!("cannot listen on {}", path.display())))
}

impl ApiServer {
    /// Listens on `path` (mode 0600; a stale socket there is replaced)
    /// and serves the API for `daemon` on its own threads.
    pub fn start(path: &Path, daemon: Arc<Mutex<Daemon>>) -> io::Result<ApiServer> {
        let listener = bind_private(path)?;
        let id = fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()));
        let api_path = path.to_path_buf();
        let handler = Arc::new(move |req: &Request| handle(&daemon, &api_path, req));
        let server = match Server::spawn("api", listener, handler) {
            Ok(s) => s,
            Err(e) => {
                let _ = fs::remove_file(path);
                return Err(with_context(e, "cannot start the API server".into()));
            }
        };
        info!("API listening on {}", path.display());
        Ok(ApiServer {
            path: path.to_path_buf(),
            id,
            server,
        })
    }

    /// The socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops serving and removes the socket.
    pub fn stop(&mut self) {
        self.server.stop();
        if let Some(id) = self.id.take() {
            let ours = fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == id);
            if ours {
                let _ = fs::remove_file(&self.path);
                info!("API stopped; {} removed", self.path.display());
            }
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The API's documents (`vgpu-api`) from the daemon's state: a vGPU's
/// configuration (sizes in bytes; accepted back by `PUT /api/v1/vgpus`).
fn config_json(v: &VgpuConfig) -> json::VgpuConfig {
    json::VgpuConfig {
        name: v.name.clone(),
        gpu: v.gpu.clone(),
        socket: v.socket.to_string_lossy().into_owned(),
        memory: v.memory.0,
        compute_units: v.compute_units,
        priority: v.priority,
        weight: v.weight,
        cap: v.cap,
        queues: v.queues,
        window: v.window.0,
        poll_us: v.poll_us,
        contexts: v.contexts,
        pci_vendor: v.pci_vendor,
        pci_device: v.pci_device,
    }
}

fn vgpu_stats_json(s: &InstanceStats) -> json::VgpuStats {
    json::VgpuStats {
        name: s.name.clone(),
        gpu: s.gpu.clone(),
        state: s.state.as_str().into(),
        memory_quota_bytes: s.memory_quota,
        memory_used_bytes: s.memory_used,
        memory_peak_bytes: s.memory_peak,
        contexts: s.contexts,
        context_starts: s.context_starts,
        context_start_seconds: s.context_start.as_secs_f64(),
        context_reuses: s.context_reuses,
        context_memory_bytes: s.context_memory,
        suspends: s.moves.suspends,
        evicted_bytes: s.moves.evicted,
        restore_seconds: s.moves.restore.as_secs_f64(),
        evictions: s.moves.evictions,
        caused_evictions: s.moves.caused,
        caused_eviction_seconds: s.moves.caused_time.as_secs_f64(),
        commands: s.commands,
        busy_seconds: s.busy.as_secs_f64(),
        bytes: s.bytes,
        queue_wait_p50_seconds: s.wait_p50.as_secs_f64(),
        queue_wait_p99_seconds: s.wait_p99.as_secs_f64(),
        capped: s.capped,
        device: s.device,
    }
}

fn vgpu_json(i: &InstanceInfo, stats: Option<&InstanceStats>) -> json::Vgpu {
    json::Vgpu {
        name: i.config.name.clone(),
        gpu: i.config.gpu.clone(),
        state: i.state.as_str().into(),
        socket_path: i.socket.to_string_lossy().into_owned(),
        config: config_json(&i.config),
        placement: i.placed.clone(),
        stats: stats.map(vgpu_stats_json),
    }
}

fn gpu_stats_json(g: &GpuStats) -> json::GpuStats {
    json::GpuStats {
        name: g.name.clone(),
        backend: g.backend.clone(),
        utilization: finite(g.utilization),
        recent_load: finite(g.recent_load),
        busy_seconds: g.busy.as_secs_f64(),
        switches: g.switches,
        commands: g.commands,
    }
}

fn gpu_json(g: &GpuInfo, stats: Option<&GpuStats>) -> json::Gpu {
    json::Gpu {
        name: g.config.name.clone(),
        backend: g.backend.clone(),
        policy: match g.config.policy {
            Policy::RoundRobin => "round-robin",
            Policy::Priority => "priority",
            Policy::Fair => "fair",
        }
        .into(),
        slice_us: g.config.slice_us(),
        device: (g.config.backend == BackendKind::Cuda).then_some(g.config.device),
        memory_bytes: g.memory_total,
        memory_allocated_bytes: g.memory_allocated,
        memory_free_bytes: g.memory_total.saturating_sub(g.memory_allocated),
        compute_units: g.compute_units_total,
        compute_units_allocated: g.compute_units_allocated,
        compute_units_free: g
            .compute_units_total
            .saturating_sub(g.compute_units_allocated),
        vgpus: g.vgpus.clone(),
        stats: stats.map(gpu_stats_json),
    }
}

/// JSON has no NaN or infinity.
fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// `PATCH /api/v1/vgpus/{name}`: the scheduling parameters and memory
/// quota to change.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ParamsPatch {
    /// A live resize: bytes, or a size such as `"8GiB"`.
    #[serde(default)]
    memory: Option<Size>,
    #[serde(default)]
    weight: Option<u32>,
    #[serde(default)]
    priority: Option<i32>,
    /// Absent: unchanged; `null`: no cap; a number: that cap.
    #[serde(default, deserialize_with = "present")]
    cap: Option<Option<f64>>,
}

/// Tells a field given as `null` from one not given.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<f64>>, D::Error> {
    Option::<f64>::deserialize(d).map(Some)
}

/// The status a daemon error is answered with.
fn status_of(e: &DaemonError) -> u16 {
    match e {
        DaemonError::NoInstance(_) => 404,
        DaemonError::NoGpu(_) | DaemonError::Invalid { .. } => 400,
        DaemonError::Exists(_)
        | DaemonError::State { .. }
        | DaemonError::SocketInUse { .. }
        | DaemonError::DoesNotFit { .. } => 409,
        DaemonError::Backend { .. } | DaemonError::Setup { .. } => 500,
    }
}

fn daemon_error(e: DaemonError) -> Response {
    Response::error(status_of(&e), e.to_string())
}

fn method_not_allowed(req: &Request, allow: &'static str) -> Response {
    Response::error(
        405,
        format!(
            "{} is not allowed on {} (allowed: {allow})",
            req.method, req.path
        ),
    )
    .with_header("Allow", allow)
}

fn body_error(e: serde_json::Error) -> Response {
    Response::error(400, format!("invalid request body: {e}"))
}

/// Answers one API request. `api_path` is the API's own socket, which no
/// vGPU may take.
pub fn handle(daemon: &Mutex<Daemon>, api_path: &Path, req: &Request) -> Response {
    let resp = route(daemon, api_path, req);
    if req.method != "GET" {
        info!("API: {} {}: {}", req.method, req.path, resp.status);
    }
    resp
}

fn route(daemon: &Mutex<Daemon>, api_path: &Path, req: &Request) -> Response {
    let lock = || daemon.lock().unwrap_or_else(PoisonError::into_inner);
    let segments: Vec<&str> = match req.path.strip_prefix(API_PREFIX) {
        Some(rest) if rest.starts_with('/') => rest[1..].split('/').collect(),
        _ => Vec::new(),
    };
    let method = req.method.as_str();
    match segments[..] {
        ["vgpus"] => match method {
            "GET" => list(&lock()),
            "PUT" => create(&mut lock(), api_path, &req.body),
            _ => method_not_allowed(req, "GET, PUT"),
        },
        ["vgpus", name] if !name.is_empty() => match method {
            "GET" => show(&lock(), name),
            "DELETE" => match lock().destroy(name) {
                Ok(()) => Response::empty(204),
                Err(e) => daemon_error(e),
            },
            "PATCH" => patch(&mut lock(), name, &req.body),
            _ => method_not_allowed(req, "GET, DELETE, PATCH"),
        },
        ["vgpus", name, action @ ("start" | "stop" | "suspend" | "resume")] if !name.is_empty() => {
            match method {
                "POST" => power(&mut lock(), name, action, &req.body),
                _ => method_not_allowed(req, "POST"),
            }
        }
        ["stats"] => match method {
            "GET" => {
                let (gpus, vgpus) = lock().stats();
                Response::json(
                    200,
                    &json::Stats {
                        gpus: gpus.iter().map(gpu_stats_json).collect(),
                        vgpus: vgpus.iter().map(vgpu_stats_json).collect(),
                    },
                )
            }
            _ => method_not_allowed(req, "GET"),
        },
        ["gpus"] => match method {
            "GET" => {
                let d = lock();
                let (stats, _) = d.stats();
                let gpus: Vec<json::Gpu> = d
                    .gpus()
                    .iter()
                    .map(|g| gpu_json(g, stats.iter().find(|s| s.name == g.config.name)))
                    .collect();
                Response::json(200, &gpus)
            }
            _ => method_not_allowed(req, "GET"),
        },
        _ => Response::error(404, format!("no endpoint {}", req.path)),
    }
}

fn list(d: &Daemon) -> Response {
    let all: Vec<json::Vgpu> = d.list().iter().map(|i| vgpu_json(i, None)).collect();
    Response::json(200, &all)
}

fn show(d: &Daemon, name: &str) -> Response {
    let Some(info) = d.instance(name) else {
        return daemon_error(DaemonError::NoInstance(name.to_string()));
    };
    let (_, stats) = d.stats();
    Response::json(
        200,
        &vgpu_json(&info, stats.iter().find(|s| s.name == name)),
    )
}

fn create(d: &mut Daemon, api_path: &Path, body: &[u8]) -> Response {
    let v: VgpuConfig = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return body_error(e),
    };
    let socket = d.socket_path(&v);
    if socket == api_path {
        return daemon_error(DaemonError::SocketInUse {
            name: v.name,
            socket,
            message: "this is the API socket".into(),
        });
    }
    let name = v.name.clone();
    if let Err(e) = d.create_checked(v) {
        return daemon_error(e);
    }
    match d.instance(&name) {
        Some(info) => Response::json(201, &vgpu_json(&info, None))
            .with_header("Location", format!("{API_PREFIX}/vgpus/{name}")),
        None => Response::error(500, "the vGPU vanished after its creation"),
    }
}

/// `POST /api/v1/vgpus/{name}/start` and `.../stop`; the body must be
/// empty (or `{}`): there is nothing to say.
fn power(d: &mut Daemon, name: &str, action: &str, body: &[u8]) -> Response {
    if d.instance(name).is_none() {
        return daemon_error(DaemonError::NoInstance(name.to_string()));
    }
    if !body.iter().all(u8::is_ascii_whitespace) {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Empty {}
        if let Err(e) = serde_json::from_slice::<Empty>(body) {
            return body_error(e);
        }
    }
    let done = match action {
        "start" => d.start(name),
        "suspend" => d.suspend(name).map(drop),
        "resume" => d.resume(name).map(drop),
        _ => d.stop(name),
    };
    if let Err(e) = done {
        return daemon_error(e);
    }
    match d.instance(name) {
        Some(info) => Response::json(200, &vgpu_json(&info, None)),
        None => daemon_error(DaemonError::NoInstance(name.to_string())),
    }
}

fn patch(d: &mut Daemon, name: &str, body: &[u8]) -> Response {
    if d.instance(name).is_none() {
        return daemon_error(DaemonError::NoInstance(name.to_string()));
    }
    let p: ParamsPatch = match serde_json::from_slice(body) {
        Ok(p) => p,
        Err(e) => return body_error(e),
    };
    let sched = p.weight.is_some() || p.priority.is_some() || p.cap.is_some();
    if !sched && p.memory.is_none() {
        return Response::error(
            400,
            "nothing to change: give memory, weight, priority or cap",
        );
    }
    // The scheduling parameters are checked first: a request refused for
    // them changes nothing, and the resize is the one step that can be
    // refused for what the guest holds.
    if sched {
        if let Err(e) = d.check_params(name, p.weight, p.priority, p.cap) {
            return daemon_error(e);
        }
    }
    if let Some(Size(bytes)) = p.memory {
        if let Err(e) = d.resize(name, bytes) {
            return daemon_error(e);
        }
    }
    if sched {
        if let Err(e) = d.update_params(name, p.weight, p.priority, p.cap) {
            return daemon_error(e);
        }
    }
    match d.instance(name) {
        Some(info) => Response::json(200, &vgpu_json(&info, None)),
        None => daemon_error(DaemonError::NoInstance(name.to_string())),
    }
}
